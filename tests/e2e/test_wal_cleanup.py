"""The cleanup channel, fed: a WAL past wal_max_size is truncated, a vanished database's leftovers removed (issue 16).

One real `smoosh run` watches a directory. The application is two connections in child
processes: one stays open (as a server's connection pool does), one writes a WAL well past
`wal_max_size` without checkpointing and then closes. Nobody enqueues anything by hand: the
daemon sees the `-wal` events, queues `cleanup:<db>` and truncates the log to zero bytes while
the application still has it open. A second database, deleted after its application crashed,
left its `-wal` and `-shm` behind: its cleanup key removes them.
"""

from __future__ import annotations

import os
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from compactor.dbfactory import integrity, make_bloated_db, row_count
from helpers.daemon import HANG_S, Daemon, free_port, wait_for, write_config
from helpers.locks import ChildConnection


def _jobs(d: Daemon) -> dict[str, dict[str, Any]]:
    return {j["key"]: j for j in d.get("/jobs")["jobs"]}


def _metrics(d: Daemon) -> str:
    with urllib.request.urlopen(d.url + "/metrics", timeout=10) as r:
        return r.read().decode()


def test_a_wal_past_wal_max_size_is_truncated_and_counted_like_a_compaction(tmp_path: Path, daemons: list[Daemon]) -> None:
    base = Path(os.path.realpath(tmp_path))
    # Only the upgrade channel for databases (no targets: it never takes one), so what runs is the cleanup
    config = write_config(base, port=free_port(), extra_global="wal_max_size = 256KiB\ndb_channels = upgrade_dbs")
    db = base / "dbs" / "tenant.db"
    make_bloated_db(str(db), delete_fraction=0.0)
    d = Daemon(config)
    daemons.append(d)
    d.wait_ready()
    cleanup = f"cleanup:{db}"

    with ChildConnection(db) as pool:
        pool.execute("SELECT count(*) FROM docs")  # an open connection keeps the -wal in place
        # Given a writer that fills the WAL past wal_max_size, checkpointing nothing, then closes
        with ChildConnection(db) as writer:
            writer.execute("PRAGMA wal_autocheckpoint=0")
            writer.execute("UPDATE docs SET body = randomblob(1000)")
        wal = Path(str(db) + "-wal")
        assert wal.stat().st_size > 1024 * 1024

        # Then the daemon queues its cleanup key by itself and truncates the WAL to 0 bytes
        done = wait_for(lambda: _jobs(d).get(cleanup, {}).get("state") == "finished" and wal.stat().st_size == 0,
                        HANG_S, what="the cleanup of the WAL", daemon=d)
        assert done
        job = _jobs(d)[cleanup]
        assert job["channel"] == "index_cleanup"
        reclaimed = int(re.fullmatch(r"reclaimed (\d+) bytes", job["history"][0]["reason"])[1])
        assert reclaimed > 1024 * 1024
        # never deleted: the application still has it open
        assert wal.exists()
        assert str(db) not in _jobs(d)  # the database itself was not compacted
        (count,) = pool.execute("SELECT count(*) FROM docs")[0]
        assert count == 2000

    # And it is counted and logged like any compaction
    metrics = _metrics(d)
    assert re.search(r'smoosh_compactions_total\{channel="index_cleanup",result="ok"\} 1\.0', metrics), metrics
    counted = re.search(r'smoosh_reclaimed_bytes_total\{channel="index_cleanup"\} (\S+)', metrics)
    assert counted is not None and float(counted[1]) == reclaimed, metrics
    assert "index_cleanup" in d.get("/status")["channels"]
    assert d.stop() == 0
    log = d.log_path.read_text()
    assert re.search(rf"compacted {re.escape(repr(cleanup))} in index_cleanup in [\d.]+ s: \d+ -> \d+ bytes, "
                     rf"reclaimed {reclaimed} bytes", log), log[-4000:]
    assert integrity(str(db)) == "ok" and row_count(str(db)) == 2000


def _crash_then_delete(db: Path) -> list[Path]:
    """An application that crashed with commits in its WAL, and its database then deleted alone."""
    make_bloated_db(str(db), delete_fraction=0.0)
    with ChildConnection(db) as app:
        app.execute("PRAGMA wal_autocheckpoint=0")
        app.execute("UPDATE docs SET body = randomblob(1000)")
        app.proc.kill()
        app.proc.wait()
    db.unlink()
    leftovers = [Path(str(db) + "-wal"), Path(str(db) + "-shm")]
    assert all(p.exists() for p in leftovers)
    return leftovers


@pytest.mark.parametrize("fed_by", ["enqueue", "start-up scan"])
def test_the_leftovers_of_a_deleted_database_are_removed_by_its_cleanup_key(
    tmp_path: Path, daemons: list[Daemon], fed_by: str
) -> None:
    base = Path(os.path.realpath(tmp_path))
    config = write_config(base, port=free_port())
    db = base / "dbs" / "gone.db"
    # Given a crashed application's leftovers, their database deleted
    leftovers = _crash_then_delete(db)
    d = Daemon(config)
    daemons.append(d)
    d.wait_ready()

    if fed_by == "enqueue":
        # When an operator enqueues its cleanup key
        status, body = d.post("/enqueue", {"keys": [f"cleanup:{db}"]})
        assert (status, body["accepted"]) == (202, 1)
    # (otherwise nobody does: the daemon's start-up scan finds them; no file event ever would)

    # Then the leftovers are removed, and the run counted like a compaction
    wait_for(lambda: not any(p.exists() for p in leftovers), HANG_S, what="the leftovers removed", daemon=d)
    # (Its last event may be a second run's drop: the start-up scan can queue the key too, and a
    # run after the removal finds nothing to do.)
    wait_for(lambda: "finished" in [e["event"] for e in _jobs(d).get(f"cleanup:{db}", {}).get("history", [])],
             HANG_S, what="the run recorded", daemon=d)
    assert re.search(r'smoosh_compactions_total\{channel="index_cleanup",result="ok"\} 1\.0', _metrics(d))
    assert d.stop() == 0
    assert f"removed {str(db) + '-wal'!r}: its database {str(db)!r} no longer exists" in d.log_path.read_text()


def _pinned_metrics(d: Daemon) -> dict[str, float]:
    return {line.split()[0]: float(line.split()[1]) for line in _metrics(d).splitlines()
            if line.startswith("smoosh_wal_pinned_")}


def test_how_long_a_wal_has_been_pinned_survives_a_restart(tmp_path: Path, daemons: list[Daemon]) -> None:
    # Given a WAL past wal_max_size that a reader pins inside a read transaction
    base = Path(os.path.realpath(tmp_path))
    config = write_config(base, port=free_port(), extra_global="wal_max_size = 256KiB\ndb_channels = upgrade_dbs")
    db = base / "dbs" / "tenant.db"
    make_bloated_db(str(db), delete_fraction=0.0)
    cleanup = f"cleanup:{db}"
    with ChildConnection(db) as reader:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM docs")
        with ChildConnection(db) as writer:
            writer.execute("PRAGMA wal_autocheckpoint=0")
            writer.execute("UPDATE docs SET body = randomblob(1000)")
        first = Daemon(config)
        daemons.append(first)
        first.wait_ready()
        # ... whose cleanup the daemon finds blocked, and counts as pinned
        wait_for(lambda: _jobs(first).get(cleanup, {}).get("result") == "blocked", HANG_S,
                 what="the cleanup blocked by the reader", daemon=first)
        before = _pinned_metrics(first)
        assert before["smoosh_wal_pinned_databases"] == 1.0 and before["smoosh_wal_pinned_seconds"] > 0
        # When the daemon restarts while the reader still holds the log
        assert first.stop() == 0
        again = Daemon(config)
        daemons.append(again)
        again.wait_ready()
        # Then the log is still counted pinned, and its age goes on from before the restart
        after = _pinned_metrics(again)
        assert after["smoosh_wal_pinned_databases"] == 1.0
        assert after["smoosh_wal_pinned_seconds"] >= before["smoosh_wal_pinned_seconds"]
        assert after["smoosh_wal_pinned_bytes"] == float(os.path.getsize(str(db) + "-wal"))
        reader.execute("COMMIT")
    assert again.stop() == 0
