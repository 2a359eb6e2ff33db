"""kill -9 of `smoosh run` in the middle of a batch of small databases (issue 48).

A batch compacts its channel's small databases one after the other in one worker slot, under one
job in the store (its first database's): their history rows wait for the commit that finishes that
job after the last, or for a second at most while the batch waits on a database. So a daemon killed
while a batch waits on its (k+1)-th database leaves the first k's rows in the store and the batch's
job running: after a restart the job is taken back and every key the channel's checkpoint held is
re-checked, so the first k are not compacted again (nothing to reclaim), the one it was compacting
and those still waiting are, and no file is damaged.

The (k+1)-th database is held mid-compaction by its application: a read transaction in another
process (rollback journal), which the compaction waits out for a quiet moment (its busy timeout,
a minute here), until the test kills the daemon.
"""

from __future__ import annotations

import os
from pathlib import Path

from compactor.dbfactory import db_stats, integrity, make_bloated_db
from faults.faultlib import finished_in_store, patient_config, processes, start_daemon
from helpers.daemon import HANG_S, Daemon, wait_for
from helpers.locks import ChildConnection
from persist import read_checkpoint

__all__ = ["processes"]  # fixture

CHANNEL = "ratio_dbs"
#: Rows deleted per database: each its own priority, so the channel's order is this one.
DELETED = (0.9, 0.85, 0.8, 0.75, 0.7, 0.65)
#: The database the application holds: the batch has compacted the ones before it.
HELD = 3


def test_kill_9_mid_batch_compacts_again_only_the_databases_not_finished(
    tmp_path: Path, daemons: list[Daemon], processes: list,
) -> None:
    dbs = tmp_path / "dbs"
    config = patient_config(tmp_path)
    keys = []
    for i, deleted in enumerate(DELETED):
        key = str(dbs.resolve() / f"tenant{i}.db")
        make_bloated_db(key, rows=600, delete_fraction=deleted, journal_mode="delete")
        keys.append(key)
    done, held, waiting = keys[:HELD], keys[HELD], keys[HELD + 1:]
    state = tmp_path / "state"

    # Given the held database's application inside a read transaction
    with ChildConnection(held) as app:
        app.execute("BEGIN")
        app.execute("SELECT count(*) FROM docs")
        # ... and a daemon that queues every database, then starts the channel
        d1 = start_daemon(daemons, config)
        assert d1.post("/suspend", {"channel": CHANNEL})[0] == 200
        status, body = d1.post("/enqueue?wait=1", {"keys": keys})
        assert status == 200 and [r["outcome"] for r in body["results"]] == ["queued"] * len(keys), body
        assert d1.post("/resume", {"channel": CHANNEL})[0] == 200
        # When the batch has finished the first databases, durably, and waits on the held one
        wait_for(lambda: finished_in_store(state, "testnode") == set(done), HANG_S,
                 what="the first databases finished in the store", daemon=d1)
        wait_for(lambda: {j["key"]: j["state"] for j in d1.get("/jobs")["jobs"]}.get(held) == "running", HANG_S,
                 what="the held database's compaction", daemon=d1)
        # ... and the channel's checkpoint holds those still waiting (its in-flight key at the top)
        wait_for(lambda: set(waiting) <= set(read_checkpoint(state / f"{CHANNEL}.smooshq")), HANG_S,
                 what="a checkpoint with the waiting keys", daemon=d1)
        before = {key: os.stat(key).st_mtime_ns for key in keys}
        d1.kill()
        # (One batch: each database after the first went on in the slot of the one before it.)
        first = d1.log_path.read_text(errors="replace")
        assert [k for k in keys[1:HELD + 1] if "Job %r runs in the slot of" % k not in first] == []
        app.execute("ROLLBACK")

    # Then a daemon started again compacts the held database and those that waited
    d2 = start_daemon(daemons, config)
    wait_for(lambda: all(db_stats(k)["freelist_count"] == 0 for k in [held, *waiting]), HANG_S,
             what="the rest compacted after the restart", daemon=d2)
    wait_for(lambda: finished_in_store(state, "testnode") == set(keys), HANG_S, what="every finish recorded",
             daemon=d2)
    assert d2.stop() == 0
    # ... and none of the databases finished before the kill again
    after = {key: os.stat(key).st_mtime_ns for key in keys}
    assert [k for k in done if after[k] != before[k]] == []
    assert [k for k in [held, *waiting] if after[k] == before[k]] == []
    log = d2.log_path.read_text(errors="replace")
    assert [k for k in done if "compacted %r" % k in log] == []
    assert [k for k in [held, *waiting] if "compacted %r" % k not in log] == []
    # And nothing is damaged
    assert {key: integrity(key) for key in keys} == {key: "ok" for key in keys}
    assert integrity(str(state / "jobs.db")) == "ok"
