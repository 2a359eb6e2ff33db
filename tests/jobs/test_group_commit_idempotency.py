"""A "may have committed" error seen by one member of an SQLite commit group is retried
idempotently: that member's call returns what its committed attempt did, the others are not
disturbed."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from smoosh.jobs import Jobs
from smoosh.store.errors import COMMIT_UNKNOWN_RESULT
from smoosh.store.faulty import FaultyStore
from smoosh.store.sqlite import SqliteStore

T = "t"
WORKERS = 4
#: Bound on waits for another thread (never reached when things work).
WAIT_S = 30.0


def _until(cond: Any) -> None:
    deadline = time.monotonic() + WAIT_S
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.002)


def test_commit_unknown_seen_by_one_member_of_a_group_is_retried_idempotently(tmp_path: Path) -> None:
    # Given four pending jobs, and four accepts whose commits wait together behind another
    # connection's write lock, one of which will be told 1021 after it really committed
    path = str(tmp_path / "jobs.db")
    inner = SqliteStore(path)
    store = FaultyStore(inner, seed=1, rate=0.0)
    jobs = Jobs(store, monitors=False)
    try:
        jobs.set_type_timeout(T, 30)
        for i in range(WORKERS):
            jobs.add(T, f"job{i}", {"i": i})
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        store.inject(COMMIT_UNKNOWN_RESULT, after_commit=True)
        before = inner.stats.requests
        taken: list[Any] = []
        threads = [threading.Thread(target=lambda: taken.append(jobs.accept(T, timeout=WAIT_S)), daemon=True)
                   for _ in range(WORKERS)]
        for t in threads:
            t.start()
        _until(lambda: inner.stats.requests >= before + WORKERS)
        # When the lock is released and the group commits
        blocker.execute("COMMIT")
        blocker.close()
        for t in threads:
            t.join(WAIT_S)
        # Then the four accepts took the four jobs, each once: the one told 1021 read its
        # transaction id and returned the job its committed attempt took, not a fifth accept
        assert sorted(job.id for job, _ in taken) == [f"job{i}" for i in range(WORKERS)]
        assert store.faults.after_commit == {COMMIT_UNKNOWN_RESULT: 1}
        assert jobs.txids.replays == 1
        assert inner.stats.max_group >= 2  # the commits were grouped (one may have conflicted and retried)
        assert {jobs.get_job_state(T, f"job{i}") for i in range(WORKERS)} == {"running"}
        assert jobs.pending_count(T) == 0
        # And every run can be finished by its holder
        for job, data in taken:
            jobs.finish(job, {**data, "result": "ok"})
        assert {jobs.get_job_state(T, f"job{i}") for i in range(WORKERS)} == {"finished"}
    finally:
        jobs.close()
        store.close()
