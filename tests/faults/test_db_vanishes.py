"""A database deleted, truncated or replaced (atomic rename over it) while queued or mid-compaction.

The daemon never crashes, each such job ends (``gone``, ``failed`` or ``ok`` as the file
allows), nothing else is damaged, and keys enqueued afterwards are still compacted.
"""

from __future__ import annotations

import hashlib
import os
import urllib.request
from pathlib import Path
from typing import Any

from compactor.dbfactory import make_bloated_db, row_count
from faults.faultlib import damaged, start_daemon
from helpers.chunked import STALLED_AFTER_FIRST_CHUNK, chunk_section, chunked_db
from helpers.daemon import HANG_S, Daemon, free_port, wait_for, write_config


def record(d: Daemon, key: Path) -> dict[str, Any]:
    return {j["key"]: j for j in d.get("/jobs")["jobs"]}.get(str(key), {})


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def replace_with_compact_db(target: Path, scratch: Path) -> str:
    """Atomically rename a small, compact rollback-journal database over ``target``; its digest."""
    make_bloated_db(str(scratch), rows=50, delete_fraction=0.0, journal_mode="delete")
    os.replace(scratch, target)
    return digest(target)


def assert_later_keys_still_compacted(d: Daemon, base: Path) -> None:
    later = base / "dbs" / "later.db"
    make_bloated_db(str(later), rows=2000, delete_fraction=0.9)
    before = later.stat().st_size
    wait_for(lambda: record(d, later).get("state") == "finished", HANG_S, what="a later key's compaction", daemon=d)
    assert later.stat().st_size < before / 3
    assert damaged([later]) == {}


def test_databases_deleted_truncated_or_replaced_while_queued(tmp_path: Path, daemons: list[Daemon]) -> None:
    d = start_daemon(daemons, write_config(tmp_path, port=free_port()))
    assert d.post("/suspend", {}) [0] == 200
    dbs = {name: tmp_path / "dbs" / f"{name}.db" for name in ("deleted", "truncated", "emptied", "replaced", "kept")}
    for db in dbs.values():
        make_bloated_db(str(db), rows=2000, delete_fraction=0.9)
    wait_for(lambda: d.get("/status")["channels"]["ratio_dbs"]["waiting"]["size"] == len(dbs), HANG_S,
             what="all queued", daemon=d)
    kept_size = dbs["kept"].stat().st_size

    os.unlink(dbs["deleted"])
    os.truncate(dbs["truncated"], dbs["truncated"].stat().st_size // 2)
    os.truncate(dbs["emptied"], 0)
    replaced_digest = replace_with_compact_db(dbs["replaced"], tmp_path / "scratch.db")
    assert d.post("/resume", {})[0] == 200

    wait_for(lambda: record(d, dbs["kept"]).get("state") == "finished", HANG_S, what="the untouched key", daemon=d)
    # The cut file's compaction crashed: it waits out its backoff in the channel (deferred).
    wait_for(lambda: (lambda s: s["active"] == 0 and s["waiting"]["size"] == 0 and s["deferred"] <= 1)(
             d.get("/status")["channels"]["ratio_dbs"]), HANG_S, what="every other key to leave the queue", daemon=d)
    assert dbs["kept"].stat().st_size < kept_size / 3
    assert digest(dbs["replaced"]) == replaced_digest, "the compact replacement was rewritten"
    assert not dbs["deleted"].exists(), "a deleted database was recreated"
    assert dbs["emptied"].stat().st_size == 0
    assert damaged([dbs["kept"], dbs["replaced"]]) == {}
    assert_later_keys_still_compacted(d, tmp_path)
    assert d.stop() == 0


def test_databases_deleted_truncated_or_replaced_mid_compaction(tmp_path: Path, daemons: list[Daemon]) -> None:
    # Each compaction is stalled after its first chunk on the I/O budget (helpers.chunked) while
    # the fault hits it, then let go by a live edit that lifts the budget: hit in its middle
    # however fast or slow the disk.
    port = free_port()
    chunks = chunk_section(chunked_db(tmp_path / "sizing.db"))  # every database here is made alike

    def edit_config(stalled: bool) -> None:
        new = write_config(tmp_path, port=port, name="next.ini", channels=chunks,
                           extra_global=STALLED_AFTER_FIRST_CHUNK if stalled else "")
        os.replace(new, tmp_path / "smoosh.ini")  # as editors save: the daemon reloads it live
        wanted = 1 if stalled else "infinity"
        wait_for(lambda: d.get("/status")["io_budget"]["max_io_rate"] == wanted, HANG_S,
                 what=f"max_io_rate {wanted} in force", daemon=d)

    d = start_daemon(daemons, write_config(tmp_path, port=port, channels=chunks, extra_global=STALLED_AFTER_FIRST_CHUNK))

    def hit_mid_compaction(name: str, fault: Any) -> tuple[dict[str, Any], Path]:
        db = tmp_path / "dbs" / f"{name}.db"
        chunked_db(db)
        wait_for(lambda: d.get("/status")["io_budget"]["paused"] == 1 and record(d, db).get("state") == "running",
                 HANG_S, what=f"{name} stalled after its first chunk", daemon=d)
        fault(db)
        edit_config(stalled=False)
        wait_for(lambda: record(d, db).get("state") in ("finished", "crashing", "pending"), HANG_S,
                 what=f"the job of {name} to end", daemon=d)
        edit_config(stalled=True)
        return record(d, db), db

    def delete(db: Path) -> None:
        os.unlink(db)
        # The side files exist once the compaction's connection is open, which may be a
        # moment after /jobs says running.
        for suffix in ("-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)

    rec, db = hit_mid_compaction("deleted", delete)
    assert rec["state"] == "finished" and "gone" in rec["history"][0]["reason"]
    assert not db.exists()

    rec, db = hit_mid_compaction("truncated", lambda db: os.truncate(db, db.stat().st_size // 2))
    assert rec["state"] in ("finished", "crashing", "pending")  # whatever SQLite made of a cut file

    replaced_digest = ""

    def replace(db: Path) -> None:
        nonlocal replaced_digest
        replaced_digest = replace_with_compact_db(db, tmp_path / "scratch.db")

    rec, db = hit_mid_compaction("replaced", replace)
    assert rec["state"] == "finished"
    # Told truthfully: a replaced run, the new file's integrity in its reason, one ERROR line.
    assert rec["history"][0]["event"] == "replaced"
    assert rec["history"][0]["reason"].endswith("; the new file is intact (integrity_check: ok)")
    assert f"ERROR smoosh.daemon.record.outcomes: compaction of {str(db)!r} in ratio_dbs ended replaced: " in d.log()
    with urllib.request.urlopen(d.url + "/metrics", timeout=HANG_S) as reply:
        assert 'smoosh_compactions_total{channel="ratio_dbs",result="replaced"} 1.0' in reply.read().decode()
    assert damaged([db]) == {}
    assert row_count(str(db)) == 50
    assert digest(db) == replaced_digest, "the file renamed over the one being compacted was modified"

    assert d.proc.poll() is None, "the daemon died"
    edit_config(stalled=False)
    assert_later_keys_still_compacted(d, tmp_path)
    assert d.stop() == 0
