"""kill -9 of `smoosh run` after a `VACUUM` ended and before its finish reached the job store.

Between a compaction's end and the commit that records its finish there is a window (the
finish waits for the store, or rides on the next claim's commit); a daemon killed in it leaves
the job running in the store with its database already compact. The restart takes the job
back into its channel, and the run's re-check finds nothing left to reclaim: the database is
not compacted a second time, its run is dropped with that reason, nothing is damaged.

The window is held open for the test, not hit by luck: the database's application holds a read
transaction, which the compaction waits out for a quiet moment (its busy timeout, a minute
here); the job store is locked by another process before the application lets go, so the
`VACUUM` runs to its end and the finish cannot be written until the test kills the daemon.
"""

from __future__ import annotations

import os
from pathlib import Path

from compactor.dbfactory import db_stats, integrity, make_bloated_db
from faults.faultlib import finished_in_store, patient_config, processes, start_daemon
from helpers.daemon import HANG_S, Daemon, wait_for
from helpers.locks import ChildConnection
from smoosh.daemon.history import NOTHING_TO_DO_REASON

__all__ = ["processes"]  # fixture


def row(d: Daemon, key: str) -> dict:
    return {j["key"]: j for j in d.get("/jobs")["jobs"]}.get(key, {})


def test_kill_9_between_a_vacuums_end_and_its_finish_does_not_compact_it_again(
    tmp_path: Path, daemons: list[Daemon], processes: list,
) -> None:
    config = patient_config(tmp_path)
    key = str((tmp_path / "dbs").resolve() / "tenant.db")
    make_bloated_db(key, rows=600, delete_fraction=0.9, journal_mode="delete")
    state = tmp_path / "state"

    # Given a compaction waiting for its application's read transaction to end
    with ChildConnection(key) as app:
        app.execute("BEGIN")
        app.execute("SELECT count(*) FROM docs")
        d1 = start_daemon(daemons, config)
        status, body = d1.post("/enqueue?wait=1", {"keys": [key]})
        assert status == 200 and [r["outcome"] for r in body["results"]] == ["queued"], body
        wait_for(lambda: row(d1, key).get("state") == "running", HANG_S, what="the compaction to start", daemon=d1)
        # ... and the job store locked by another process (in WAL mode: every writer waits)
        store = ChildConnection(state / "jobs.db", timeout_s=30)
        processes.append(store.proc)
        store.execute("BEGIN EXCLUSIVE")
        # When the application lets go, the VACUUM runs to its end
        app.execute("ROLLBACK")
    wait_for(lambda: db_stats(key)["freelist_count"] == 0, HANG_S, what="the VACUUM to end", daemon=d1)
    compacted = os.stat(key).st_mtime_ns
    # ... and the daemon is killed before its finish is written
    d1.kill()
    store.execute("ROLLBACK")
    store.close()
    assert key not in finished_in_store(state, "testnode")  # its finish never reached the store

    # Then the restart takes the job back, finds nothing left to reclaim and drops the run
    d2 = start_daemon(daemons, config)
    wait_for(lambda: row(d2, key).get("state") == "dropped", HANG_S, what="the taken-back run's end", daemon=d2)
    assert [(e["event"], e["reason"]) for e in row(d2, key)["history"]][0] == ("dropped", NOTHING_TO_DO_REASON)
    assert d2.stop() == 0
    # ... without compacting the database again (not a byte written) or damaging anything
    assert os.stat(key).st_mtime_ns == compacted
    assert "compacted %r" % key not in d2.log_path.read_text(errors="replace")
    assert integrity(key) == "ok"
    assert integrity(str(state / "jobs.db")) == "ok"
