"""The job store locked by another process for longer than its busy timeout: retries, no crash, recovery."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

from compactor.dbfactory import make_bloated_db
from faults.faultlib import damaged, processes, start_daemon
from helpers.daemon import Daemon, free_port, wait_for, write_config
from smoosh.store.sqlite import DEFAULT_BUSY_TIMEOUT_S

__all__ = ["processes"]  # fixture

#: Seconds the other process holds the store's write lock: longer than the store's busy
#: timeout, so the daemon's transactions see SQLITE_BUSY and go through the retry loop.
HOLD_S = DEFAULT_BUSY_TIMEOUT_S + 2.0

_HOLDER = textwrap.dedent(
    """
    import sqlite3, sys, time
    conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
    conn.execute("BEGIN EXCLUSIVE")   # in WAL mode: the write lock; every writer waits
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
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
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(store_file), str(HOLD_S)],
                              stdout=subprocess.PIPE, text=True)
    processes.append(holder)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    locked_at = time.monotonic()

    # While the store is locked: the admin API answers at once and accepts work.
    db = tmp_path / "dbs" / "queued-meanwhile.db"
    make_bloated_db(str(db), rows=400, delete_fraction=0.9)
    code, body = d.post("/enqueue", {"keys": [str(db)]})
    assert code == 202 and body["accepted"] == 1
    while time.monotonic() - locked_at < HOLD_S - 1:
        t0 = time.monotonic()
        assert d.get("/status")["node"] == "testnode"
        assert time.monotonic() - t0 < 1.0, "/status blocked on the locked store"
        time.sleep(0.5)
    assert holder.stdout.readline().strip() == "released"
    holder.wait(10)

    # Afterwards: the daemon lived through it, said why it waited, and the work went on.
    wait_for(lambda: job_state(d, db) == "finished", 60, what="the compaction after the lock", daemon=d)
    assert d.proc.poll() is None
    assert "database is locked" in d.log()  # the retry loop says why it waits
    assert damaged([db, store_file]) == {}
    assert db.stat().st_size < 200_000
    assert d.stop() == 0
