"""The SQLite store's group commit: one SQLite transaction for the commits that wait together,
each member keeping its own conflict check and its own answer, and nothing acknowledged lost."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from smoosh.store.errors import StoreError
from smoosh.store.sqlite import SqliteStore

WORKER = str(Path(__file__).with_name("store_worker.py"))
#: Bound on waits for another thread or process (never reached when things work).
WAIT_S = 30.0
#: Commits the killed process must have acknowledged before the kill.
ACKS_BEFORE_KILL = 400


def _until(cond: Any, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.002)


@pytest.fixture
def store(path: str) -> Any:
    s = SqliteStore(path)
    yield s
    s.close()


def _commit_all_in_one_group(store: SqliteStore, path: str, transactions: list[Any]) -> list[Any]:
    """Queue the commits of ``transactions`` in this order behind another connection's write
    lock, then release it: they commit as one group. Returns each one's stamp or error code."""
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    results: list[Any] = [None] * len(transactions)

    def commit(i: int) -> None:
        try:
            transactions[i].commit()
            results[i] = transactions[i].get_versionstamp()
        except StoreError as e:
            results[i] = e.code

    threads = []
    for i in range(len(transactions)):
        before = store.stats.requests
        threads.append(threading.Thread(target=commit, args=(i,), daemon=True))
        threads[-1].start()
        _until(lambda before=before: store.stats.requests > before)  # queue order = list order
    blocker.execute("COMMIT")
    blocker.close()
    for t in threads:
        t.join(WAIT_S)
    return results


def test_a_conflict_inside_a_group_fails_only_its_own_transaction(store: SqliteStore, path: str) -> None:
    # Given keys x and y, and five transactions that will commit together in this order
    store.transact(lambda tr: [tr.set(b"x", b"0"), tr.set(b"y", b"0")])
    t1, t2, t3, t4, t5 = (store.create_transaction() for _ in range(5))
    t1.set(b"x", t1.get(b"x") + b"+1")  # reads and writes x
    t2.get(b"x")  # read x before t1's commit: t1, earlier in the group, wrote it
    t2.set(b"z", b"from t2")
    t3.set(b"y", t3.get(b"y") + b"+3")  # independent of t1 and t2
    t4.get(b"w")  # reads nothing anyone writes; a blind write of x
    t4.set(b"x", b"from t4")
    t5.get(b"y")  # read y before t3's commit
    t5.set(b"q", b"from t5")
    before = store.stats.sqlite_commits
    # When they commit as one group
    results = _commit_all_in_one_group(store, path, [t1, t2, t3, t4, t5])
    # Then only the two that read what an earlier member wrote fail, each with 1020
    assert [r if isinstance(r, int) else "ok" for r in results] == ["ok", 1020, "ok", "ok", 1020]
    assert store.stats.sqlite_commits - before == 1
    assert len({r[:8] for r in results if isinstance(r, bytes)}) == 1  # one version, distinct order
    tr = store.create_transaction()
    assert (tr.get(b"x"), tr.get(b"y"), tr.get(b"z"), tr.get(b"q")) == (b"from t4", b"0+3", None, None)
    # And each failed one succeeds alone when run again
    t2.reset()
    t2.get(b"x")
    t2.set(b"z", b"from t2")
    t2.commit()
    assert store.create_transaction().get(b"z") == b"from t2"


def test_a_crash_mid_group_loses_no_acknowledged_commit(path: str) -> None:
    # Given a process committing from eight threads at once, printing each key once its
    # commit returned (so its commits are acknowledged, and grouped)
    SqliteStore(path).close()
    proc = subprocess.Popen([sys.executable, WORKER, "hammer", path, "8"], stdout=subprocess.PIPE, text=True)
    acked: list[bytes] = []
    grouped = False
    try:
        assert proc.stdout is not None
        while len(acked) < ACKS_BEFORE_KILL or not grouped:
            line = proc.stdout.readline()
            assert line, f"the committing process ended early ({proc.poll()})"
            key, max_group = line.split()
            acked.append(bytes.fromhex(key))
            grouped = grouped or int(max_group) > 1
            assert len(acked) < 50 * ACKS_BEFORE_KILL, "no commits were ever grouped"
    finally:
        # When it is killed with SIGKILL in the middle of its groups
        os.kill(proc.pid, signal.SIGKILL)
        rest, _ = proc.communicate(timeout=WAIT_S)
    # (lines already in the pipe were printed after their commits returned: acknowledged too)
    acked += [bytes.fromhex(line.split()[0]) for line in rest.splitlines() if len(line.split()) == 2]
    assert proc.returncode == -signal.SIGKILL
    # Then every acknowledged commit is in the reopened store, and the store goes on
    with SqliteStore(path) as s:
        tr = s.create_transaction()
        missing = [k for k in acked if tr.get(k) is None]
        assert missing == []
        s.transact(lambda t: t.set(b"after", b"1"))
        assert s.create_transaction().get(b"after") == b"1"
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()


class _FailingCommit:
    """The writer connection, with its next COMMIT failing: before it ran, or after it ran."""

    def __init__(self, conn: sqlite3.Connection, *, after: bool) -> None:
        self._conn = conn
        self._after = after
        self.failed = False

    def execute(self, sql: str, *args: Any) -> Any:
        if sql == "COMMIT" and not self.failed:
            self.failed = True
            if self._after:
                self._conn.execute(sql, *args)
            raise sqlite3.OperationalError("disk I/O error")
        return self._conn.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
def test_a_failed_commit_gets_the_answer_the_file_gives(store: SqliteStore, path: str, after: bool) -> None:
    # Given a COMMIT that fails, having committed (after) or not (before)
    store.transact(lambda tr: tr.set(b"k", b"old"))
    committer = store._committer
    committer._writer = _FailingCommit(committer._writer, after=after)  # type: ignore[assignment]
    tr = store.create_transaction()
    tr.get(b"k")
    tr.set(b"k", b"new")
    # When the transaction commits, it gets one certain answer: the file's
    if after:
        tr.commit()
        assert tr.get_versionstamp()
        assert store.create_transaction().get(b"k") == b"new"
    else:
        with pytest.raises(sqlite3.OperationalError):
            tr.commit()
        assert store.create_transaction().get(b"k") == b"old"
    # And the store commits on afterwards
    store.transact(lambda t: t.set(b"k", b"later"))
    assert store.create_transaction().get(b"k") == b"later"


def test_versions_keep_growing_across_processes_taking_turns(path: str) -> None:
    # Two handles on one file take turns: each commit's version follows the other's, and a
    # handle that assumed its next version finds the other's commit instead and reads it
    with SqliteStore(path) as a, SqliteStore(path) as b:
        stamps = []
        for i in range(6):
            s = (a, b)[i % 2]
            tr = s.create_transaction()
            tr.get(b"n")
            tr.set(b"n", b"%d" % i)
            tr.commit()
            stamps.append(tr.get_versionstamp())
        assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)
        assert a.stats.foreign_catch_ups >= 2 and b.stats.foreign_catch_ups >= 2
        # And each handle, which last assumed its own next version, still sees the other's
        # commit that came after its read: a conflict
        for reader, writer in ((a, b), (b, a)):
            stale = reader.create_transaction()
            stale.get(b"n")
            stale.set(b"m", b"")
            writer.transact(lambda tr: tr.set(b"n", b"later"))
            assert pytest.raises(StoreError, stale.commit).value.code == 1020


def test_a_store_file_of_the_earlier_layout_opens_and_counts_on(path: str) -> None:
    # Given a file with the earlier layout: a version row in meta and a conflict_log table
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript(
        """
        PRAGMA journal_mode=WAL;
        CREATE TABLE kv(key BLOB PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID;
        CREATE TABLE meta(name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
        CREATE TABLE conflict_log(
            commit_version INTEGER NOT NULL, begin_key BLOB NOT NULL, end_key BLOB NOT NULL, commit_time REAL NOT NULL);
        CREATE INDEX conflict_log_version ON conflict_log(commit_version);
        INSERT INTO meta VALUES ('version', 41), ('pruned_through', 3);
        INSERT INTO kv VALUES (x'61', x'31');
        """
    )
    conn.close()
    # When it is opened and committed to
    with SqliteStore(path) as s:
        assert s.create_transaction().get(b"a") == b"1"
        tr = s.create_transaction()
        tr.set(b"b", b"2")
        tr.commit()
        # Then its versions go on from the old counter, and the old log is gone
        assert int.from_bytes(tr.get_versionstamp()[:8], "big") == 42
    conn = sqlite3.connect(path)
    tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    conn.close()
    assert "conflict_log" not in tables and "commit_log" in tables


def test_finished_transactions_leave_no_read_transaction_behind(store: SqliteStore, path: str) -> None:
    # Snapshots end with their transaction (committed, read-only, reset or cancelled): the
    # WAL can be checkpointed to nothing afterwards
    store.transact(lambda tr: tr.set(b"a", b"1"))
    for end in ("commit", "read_only", "reset", "cancel"):
        tr = store.create_transaction()
        assert tr.get_range(b"", b"\xff")
        if end == "commit":
            tr.set(b"a", b"2")
            tr.commit()
        elif end == "read_only":
            tr.commit()
        else:
            getattr(tr, end)()
    conn = sqlite3.connect(path)
    busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    conn.close()
    assert busy == 0
