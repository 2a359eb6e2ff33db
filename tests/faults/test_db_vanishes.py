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
from helpers.daemon import Daemon, free_port, wait_for, write_config



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
    wait_for(lambda: record(d, later).get("state") == "finished", 30, what="a later key's compaction", daemon=d)
    assert later.stat().st_size < before / 3
    assert damaged([later]) == {}


def test_databases_deleted_truncated_or_replaced_while_queued(tmp_path: Path, daemons: list[Daemon]) -> None:
    d = start_daemon(daemons, write_config(tmp_path, port=free_port()))
    assert d.post("/suspend", {}) [0] == 200
    dbs = {name: tmp_path / "dbs" / f"{name}.db" for name in ("deleted", "truncated", "emptied", "replaced", "kept")}
    for db in dbs.values():
        make_bloated_db(str(db), rows=2000, delete_fraction=0.9)
    wait_for(lambda: d.get("/status")["channels"]["ratio_dbs"]["waiting"]["size"] == len(dbs), 20,
             what="all queued", daemon=d)
    kept_size = dbs["kept"].stat().st_size

    os.unlink(dbs["deleted"])
    os.truncate(dbs["truncated"], dbs["truncated"].stat().st_size // 2)
    os.truncate(dbs["emptied"], 0)
    replaced_digest = replace_with_compact_db(dbs["replaced"], tmp_path / "scratch.db")
    assert d.post("/resume", {})[0] == 200

    wait_for(lambda: record(d, dbs["kept"]).get("state") == "finished", 30, what="the untouched key", daemon=d)
    # The cut file's compaction crashed: it waits out its backoff in the channel (deferred).
    wait_for(lambda: (lambda s: s["active"] == 0 and s["waiting"]["size"] == 0 and s["deferred"] <= 1)(
             d.get("/status")["channels"]["ratio_dbs"]), 30, what="every other key to leave the queue", daemon=d)
    assert dbs["kept"].stat().st_size < kept_size / 3
    assert digest(dbs["replaced"]) == replaced_digest, "the compact replacement was rewritten"
    assert not dbs["deleted"].exists(), "a deleted database was recreated"
    assert dbs["emptied"].stat().st_size == 0
    assert damaged([dbs["kept"], dbs["replaced"]]) == {}
    assert_later_keys_still_compacted(d, tmp_path)
    assert d.stop() == 0


def test_databases_deleted_truncated_or_replaced_mid_compaction(tmp_path: Path, daemons: list[Daemon]) -> None:
    # One-page incremental chunks: each compaction lasts long enough to be hit in the middle.
    d = start_daemon(daemons, write_config(tmp_path, port=free_port(),
                                           channels="[smoosh.sqlite]\nincremental_chunk_pages = 1\n"))

    def hit_mid_compaction(name: str, fault: Any) -> tuple[dict[str, Any], Path]:
        db = tmp_path / "dbs" / f"{name}.db"
        make_bloated_db(str(db), rows=15000, delete_fraction=0.8, auto_vacuum="incremental")
        wait_for(lambda: record(d, db).get("state") == "running", 30, what=f"{name} running", daemon=d, every_s=0.02)
        fault(db)
        wait_for(lambda: record(d, db).get("state") in ("finished", "crashing", "pending"), 60,
                 what=f"the job of {name} to end", daemon=d)
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
    with urllib.request.urlopen(d.url + "/metrics", timeout=10) as reply:
        assert 'smoosh_compactions_total{channel="ratio_dbs",result="replaced"} 1.0' in reply.read().decode()
    assert damaged([db]) == {}
    assert row_count(str(db)) == 50
    assert digest(db) == replaced_digest, "the file renamed over the one being compacted was modified"

    assert d.proc.poll() is None, "the daemon died"
    assert_later_keys_still_compacted(d, tmp_path)
    assert d.stop() == 0
