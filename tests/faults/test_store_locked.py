"""The job store locked by another process for longer than its busy timeout: retries, no crash, recovery."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from compactor.dbfactory import make_bloated_db
from faults.faultlib import damaged, processes, start_daemon
from helpers.daemon import HANG_S, Daemon, free_port, wait_for, write_config

__all__ = ["processes"]  # fixture

_HOLDER = textwrap.dedent(
    """
    import sqlite3, sys
    conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
    conn.execute("BEGIN EXCLUSIVE")   # in WAL mode: the write lock; every writer waits
    print("locked", flush=True)
    sys.stdin.readline()              # until the test says so
    conn.execute("ROLLBACK")
    print("released", flush=True)
    """
)


def job_state(d: Daemon, key: Path) -> str | None:
    return {j["key"]: j for j in d.get("/jobs")["jobs"]}.get(str(key), {}).get("state")


def test_a_store_locked_for_seconds_delays_work_without_a_crash_and_work_resumes(
    tmp_path: Path, daemons: list[Daemon], processes: list
) -> None:
    config = write_config(tmp_path, port=free_port())
    d = start_daemon(daemons, config)
    store_file = tmp_path / "state" / "jobs.db"
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(store_file)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    processes.append(holder)
    assert holder.stdin is not None and holder.stdout is not None
    assert holder.stdout.readline().strip() == "locked"

    # While the store is locked (until the daemon's transactions have met the lock past the
    # store's busy timeout and gone to the retry loop): the admin API answers and accepts work.
    db = tmp_path / "dbs" / "queued-meanwhile.db"
    make_bloated_db(str(db), rows=400, delete_fraction=0.9)
    code, body = d.post("/enqueue", {"keys": [str(db)]})
    assert code == 202 and body["accepted"] == 1
    wait_for(lambda: "database is locked" in d.log(), HANG_S, what="the retry loop to meet the lock", daemon=d)
    assert d.get("/status")["node"] == "testnode"  # answered with the lock still held
    holder.stdin.write("release\n")
    holder.stdin.flush()
    assert holder.stdout.readline().strip() == "released"
    holder.wait(HANG_S)

    # Afterwards: the daemon lived through it, said why it waited, and the work went on.
    wait_for(lambda: job_state(d, db) == "finished", HANG_S, what="the compaction after the lock", daemon=d)
    assert d.proc.poll() is None
    assert damaged([db, store_file]) == {}
    assert db.stat().st_size < 200_000
    assert d.stop() == 0
