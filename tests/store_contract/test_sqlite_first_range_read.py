"""The SQLite store's first read of a transaction being a range read: one statement, the snapshot held."""

from __future__ import annotations

import sqlite3

import pytest

from smoosh.store.sqlite import SqliteStore


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "jobs.db")


@pytest.fixture
def store(path):
    s = SqliteStore(path)
    yield s
    s.close()


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
