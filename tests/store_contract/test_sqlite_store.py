"""The SQLite store beyond the contract: its file, group commit, several processes, lock errors."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from smoosh.store import open_store
from smoosh.store.errors import StoreError
from smoosh.store.sqlite import SqliteStore
from helpers.daemon import HANG_S

WORKER = str(Path(__file__).with_name("store_worker.py"))
#: Bound on waits for another thread or process (never reached when things work).
WAIT_S = HANG_S  # a ceiling on a hang, never a measure of speed


def _until(cond, timeout_s=WAIT_S):
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.002)


def _int(b):
    return int.from_bytes(b or b"\x00", "little")


@pytest.fixture
def store(path):
    s = SqliteStore(path)
    yield s
    s.close()


def test_store_is_one_wal_file_with_a_kv_table_without_rowid(store, path):
    store.transact(lambda tr: tr.set(b"a", b"1"))
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'kv'").fetchone()[0]
    assert "WITHOUT ROWID" in sql
    assert conn.execute("SELECT key, value FROM kv").fetchall() == [(b"a", b"1")]
    conn.close()


def test_open_store_url_opens_the_sqlite_file(path):
    with open_store(f"sqlite:{path}") as s:
        s.transact(lambda tr: tr.set(b"a", b"1"))
        assert s.url == f"sqlite:{path}"
    with SqliteStore(path) as s:
        assert s.create_transaction().get(b"a") == b"1"


def _hold_write_lock(path):
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    return conn


def _commit_in_thread(tr, results, name):
    def run():
        try:
            tr.commit()
            results[name] = tr.get_versionstamp()
        except StoreError as e:
            results[name] = e.code

    t = threading.Thread(target=run, daemon=True)  # a stuck commit fails the test, not the run
    t.start()
    return t


def _eight_commits_released_at_once(store, path):
    """Eight commits queued behind another connection's write lock, then the lock released."""
    blocker = _hold_write_lock(path)
    results: dict = {}
    threads = []
    for i in range(8):
        tr = store.create_transaction()
        tr.set(b"k%d" % i, b"v")
        threads.append(_commit_in_thread(tr, results, i))
    _until(lambda: store.stats.requests == 8)
    blocker.execute("COMMIT")
    return results, threads


def test_concurrent_commits_are_grouped_into_one_sqlite_transaction(store, path):
    before = store.stats.sqlite_commits
    results, threads = _eight_commits_released_at_once(store, path)
    for t in threads:
        t.join()
    stamps = [results[i] for i in range(8)]
    assert all(isinstance(s, bytes) for s in stamps)
    assert len(set(stamps)) == 8  # same commit version, distinct batch order
    assert len({s[:8] for s in stamps}) == 1
    assert store.stats.sqlite_commits - before == 1
    assert store.stats.store_commits == 8
    assert store.stats.max_group == 8


def test_a_lone_commit_runs_in_the_committing_thread(store):
    # No committer thread: one worker's commit costs no thread hand-off.
    before = {t.ident for t in threading.enumerate()}
    for i in range(3):
        store.transact(lambda tr, i=i: tr.set(b"k", b"%d" % i))
    assert {t.ident for t in threading.enumerate()} <= before
    assert store.stats.sqlite_commits >= 3


def test_waiting_commits_beyond_one_group_are_led_on_by_their_own_threads(store, path, monkeypatch):
    import smoosh.store._sqlite_commit as sqlite_commit

    monkeypatch.setattr(sqlite_commit, "MAX_GROUP", 3)
    before = store.stats.sqlite_commits
    results, threads = _eight_commits_released_at_once(store, path)
    for t in threads:
        t.join(WAIT_S)
    assert not any(t.is_alive() for t in threads), "a commit was left without a leader"
    assert all(isinstance(results[i], bytes) for i in range(8))
    assert store.stats.sqlite_commits - before == 3  # groups of 3, 3 and 2
    assert store.stats.max_group == 3


def test_close_lets_the_commits_under_way_finish(path):
    s = SqliteStore(path)
    blocker = _hold_write_lock(path)
    results: dict = {}
    tr = s.create_transaction()
    tr.set(b"late", b"1")
    too_late = s.create_transaction()
    too_late.set(b"too late", b"1")
    t = _commit_in_thread(tr, results, "late")
    _until(lambda: s.stats.requests == 1)
    closer = threading.Thread(target=s.close)
    closer.start()
    closer.join(0.2)
    assert closer.is_alive(), "close() returned while a commit was under way"
    with pytest.raises(StoreError) as e:
        too_late.commit()  # a commit that starts once close() began is refused
    assert e.value.code == 2000
    blocker.execute("COMMIT")
    t.join(WAIT_S)
    closer.join(WAIT_S)
    assert not closer.is_alive()
    assert isinstance(results["late"], bytes)
    with SqliteStore(path) as again:
        assert again.create_transaction().get(b"late") == b"1"
        assert again.create_transaction().get(b"too late") is None


def test_group_member_that_conflicts_fails_alone(store, path):
    store.transact(lambda tr: tr.set(b"x", b"0"))
    t1, t2, t3 = (store.create_transaction() for _ in range(3))
    for tr in (t1, t2):
        tr.set(b"x", tr.get(b"x") + b"+")  # both read x: the second to commit must fail
    t3.get(b"y")
    t3.set(b"y", b"independent")
    blocker = _hold_write_lock(path)
    results: dict = {}
    threads = []
    for name, tr in (("t1", t1), ("t2", t2), ("t3", t3)):
        threads.append(_commit_in_thread(tr, results, name))
        _until(lambda n=len(threads): store.stats.requests >= 1 + n)  # keep queue order
    blocker.execute("COMMIT")
    for t in threads:
        t.join()
    assert isinstance(results["t1"], bytes)
    assert results["t2"] == 1020
    assert isinstance(results["t3"], bytes)
    assert store.stats.conflicts == 1
    tr = store.create_transaction()
    assert (tr.get(b"x"), tr.get(b"y")) == (b"0+", b"independent")


def test_two_handles_on_one_file_see_each_others_conflicts(path):
    with SqliteStore(path) as a, SqliteStore(path) as b:
        ta = a.create_transaction()
        ta.get(b"k")
        ta.set(b"out", b"")
        b.transact(lambda tr: tr.set(b"k", b"from b"))
        with pytest.raises(StoreError) as e:
            ta.commit()
        assert e.value.code == 1020
        tb = b.create_transaction()
        tb.get(b"other")
        tb.set(b"other", b"")
        a.transact(lambda tr: tr.set(b"k", b"from a again"))
        tb.commit()  # a heartbeat on one key never aborts a transaction on another


def test_separate_processes_incrementing_one_key_lose_no_update(store, path, tmp_path):
    n = 40
    go = tmp_path / "go"
    procs = [
        subprocess.Popen([sys.executable, WORKER, "incr", path, b"n".hex(), str(n), str(go)], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    go.touch()
    runs = []
    for p in procs:
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 0
        runs.append(int(out))
    assert _int(store.create_transaction().get(b"n")) == 2 * n
    assert sum(runs) > 2 * n, "the processes never conflicted: the test did not exercise retries"


def test_watch_fires_for_a_commit_that_lands_before_the_poller_thread_starts(path, monkeypatch):
    # The interleaving a blocked accept once lost: the watch is armed and checked (no change
    # yet), another connection commits, and only then does the poller thread begin.
    with SqliteStore(path) as s:
        s.transact(lambda tr: tr.set(b"w", b"1"))
        start_poller = s._ensure_poller
        monkeypatch.setattr(s, "_ensure_poller", lambda: None)
        tr = s.create_transaction()
        w = tr.watch(b"w")
        tr.commit()  # read-only: armed and checked here, poller start deferred
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("UPDATE kv SET value = x'32' WHERE key = x'77'")
        other.close()
        assert not w.is_ready()
        start_poller()
        assert w.wait(WAIT_S)


def test_the_poller_rereads_for_other_handles_commits_and_skips_its_own(path, monkeypatch):
    # data_version moves with this handle's own commits too; those already woke their watches
    # at commit, so the poller re-reads armed keys only when another handle committed.
    with SqliteStore(path) as s, SqliteStore(path) as other:
        s.transact(lambda tr: tr.set(b"w", b"1"))
        monkeypatch.setattr(s, "_ensure_poller", lambda: None)  # the test steps the poller
        monkeypatch.setattr(s, "_poller", threading.current_thread())  # own commits are recorded
        tr = s.create_transaction()
        w = tr.watch(b"w")
        tr.commit()
        conn = s._connect()
        try:
            changed, last, version = s._poll_once(conn, None, None)
            assert changed  # no baseline yet: the first poll re-reads
            for i in range(5):
                s.transact(lambda tr: tr.set(b"own", bytes([i])))
            changed, last, version = s._poll_once(conn, last, version)
            assert not changed and not w.is_ready()
            other.transact(lambda tr: tr.set(b"w", b"2"))
            s.transact(lambda tr: tr.set(b"own", b"x"))  # ours after theirs: still re-read
            changed, last, version = s._poll_once(conn, last, version)
            assert changed and w.wait(WAIT_S)
            tr = s.create_transaction()
            w2 = tr.watch(b"own")
            tr.commit()
            raw = sqlite3.connect(path, isolation_level=None)  # a write past the store's counter
            raw.execute("UPDATE kv SET value = x'33' WHERE key = x'6f776e'")
            raw.close()
            assert s._poll_once(conn, last, version)[0] and w2.wait(WAIT_S)
        finally:
            conn.close()
            monkeypatch.setattr(s, "_poller", None)


def test_watch_fires_when_another_process_commits(store, path):
    store.transact(lambda tr: tr.set(b"w", b"1"))
    tr = store.create_transaction()
    w = tr.watch(b"w")
    tr.commit()
    subprocess.run([sys.executable, WORKER, "set", path, b"w".hex(), b"2".hex()], check=True, timeout=60)
    assert w.wait(WAIT_S)


def test_write_lock_held_too_long_is_retryable_database_locked(path):
    with SqliteStore(path, busy_timeout_s=0.05) as s:
        blocker = _hold_write_lock(path)
        tr = s.create_transaction()
        tr.set(b"a", b"1")
        with pytest.raises(StoreError) as e:
            tr.commit()
        assert e.value.code == 1038 and e.value.retryable
        blocker.execute("ROLLBACK")
        tr.reset()
        tr.set(b"a", b"1")
        tr.commit()


def test_read_snapshot_is_held_until_the_transaction_ends(store, path):
    store.transact(lambda tr: tr.set(b"a", b"old"))
    tr = store.create_transaction()
    assert tr.get(b"a") == b"old"
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("UPDATE kv SET value = x'6e6577' WHERE key = x'61'")
    other.close()
    assert tr.get(b"a") == b"old"
    tr.cancel()
    assert store.create_transaction().get(b"a") == b"new"


def test_abandoned_transaction_releases_its_snapshot_and_fails_its_watches(store, path):
    import gc

    tr = store.create_transaction()
    tr.get(b"a")
    w = tr.watch(b"a")
    del tr
    gc.collect()
    with pytest.raises(StoreError) as e:
        w.wait(1)
    assert e.value.code == 1025
    # No read transaction pins the WAL any more: a full checkpoint can complete.
    store.transact(lambda t: t.set(b"a", b"1"))
    conn = sqlite3.connect(path)
    busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    conn.close()
    assert busy == 0


def test_a_key_read_again_in_one_transaction_costs_no_statement_and_sees_its_snapshot(store, path):
    store.transact(lambda tr: (tr.set(b"a", b"1"), tr.set(b"b", b"1")))
    statements: list[str] = []
    seen: list[bytes | None] = []

    def body(tr):
        seen.append(tr.snapshot.get(b"a"))  # the first read holds the snapshot
        seen.append(tr.snapshot.get(b"b"))
        conn = tr._snapshot()._conn  # the pooled connection this snapshot reads on
        conn.set_trace_callback(statements.append)
        try:
            # Another handle commits meanwhile: the snapshot must not see it
            other = sqlite3.connect(path, isolation_level=None)
            other.execute("UPDATE kv SET value = ? WHERE key = ?", (b"2", b"b"))
            other.close()
            seen.append(tr.snapshot.get(b"b"))
            seen.append(tr.snapshot.get(b"a"))
        finally:
            conn.set_trace_callback(None)

    store.transact(body)
    # Then the reads again answer as the first ones did, and ask SQLite nothing
    assert seen == [b"1", b"1", b"1", b"1"]
    assert statements == []


# ---------------------------------------------------------------- a first read that is a range read
# One statement takes the read version, holds the snapshot and returns the first chunk.


def _fill(store, keys):
    def body(tr):
        for k in keys:
            tr.set(k, b"old-" + k)

    store.transact(body)


def _change_behind(path):
    """Another connection changes every row and adds one: a held snapshot sees none of it."""
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("UPDATE kv SET value = x'6e6577'")
    other.execute("INSERT INTO kv(key, value) VALUES (x'6230', x'6e6577')")
    other.close()


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize(
    "limit, count",
    [
        (1, 5),  # the first chunk (two pairs) is full: later chunks follow on the held snapshot
        (3, 2),  # fewer pairs than the chunk: the pads end it
        (0, 3),  # no limit: a whole chunk asked for
        (2, 0),  # an empty range
    ],
)
def test_a_first_range_read_is_one_statement_and_holds_the_snapshot(store, path, reverse, limit, count):
    keys = [b"a%d" % i for i in range(count)]
    _fill(store, keys)
    expected = [(k, b"old-" + k) for k in (reversed(keys) if reverse else keys)]
    tr = store.create_transaction()
    statements: list[str] = []
    tr._snapshot()._conn.set_trace_callback(statements.append)  # the snapshot's pooled connection
    got = tr.get_range(b"a", b"b", limit=limit, reverse=reverse)
    assert got == (expected[:limit] if limit else expected)
    assert len(statements) == 1
    _change_behind(path)
    # Still the snapshot of the first read: its rows, and no key added since.
    assert tr.get_range(b"a", b"c", reverse=reverse) == expected
    assert tr.get(b"b0") is None
    tr.cancel()
    after = store.create_transaction()
    assert after.get(b"b0") == b"new"
    assert all(v == b"new" for _, v in after.get_range(b"a", b"b"))
    after.cancel()


def test_the_snapshot_of_a_first_range_read_is_released_at_commit(store, path):
    _fill(store, [b"a0", b"a1"])
    tr = store.create_transaction()
    assert len(tr.get_range(b"a", b"b", limit=1)) == 1
    tr.set(b"c", b"1")
    tr.commit()
    # No read transaction pins the WAL: a full checkpoint completes.
    conn = sqlite3.connect(path)
    busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    conn.close()
    assert busy == 0
