"""The SQLite store's file format: its schema, the reads its pieces share, SQLite errors as FoundationDB's.

The layout is described in :mod:`smoosh.store.sqlite`. Both the store and its group commit
(:mod:`smoosh.store._sqlite_commit`) re-read watched keys with :func:`read_values` and turn
SQLite's errors into the store's with :func:`store_error`.
"""

from __future__ import annotations

import sqlite3

from smoosh.store.errors import DATABASE_LOCKED, StoreError

#: Keys per ``IN (...)`` query when re-reading watched keys.
WATCH_READ_CHUNK = 500

_SCHEMA = """
CREATE TABLE IF NOT EXISTS kv(key BLOB PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta(name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS conflict_log(
    commit_version INTEGER NOT NULL, begin_key BLOB NOT NULL, end_key BLOB NOT NULL, commit_time REAL NOT NULL);
CREATE INDEX IF NOT EXISTS conflict_log_version ON conflict_log(commit_version);
INSERT OR IGNORE INTO meta(name, value) VALUES ('version', 0), ('pruned_through', 0);
"""


def create_schema(writer: sqlite3.Connection) -> None:
    """Create the tables of a new store file; an existing store is left as it is.

    Raises:
        sqlite3.Error: the file cannot be written, or is locked past the busy timeout.
    """
    # executescript() would COMMIT first: run the statements one by one under our lock,
    # so processes opening a new file at once create the schema once.
    writer.execute("BEGIN IMMEDIATE")
    try:
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                writer.execute(statement)
        writer.execute("COMMIT")
    except BaseException:
        writer.execute("ROLLBACK")
        raise


def _is_busy(e: sqlite3.Error) -> bool:
    code = getattr(e, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    msg = str(e)
    return "locked" in msg or "busy" in msg


def store_error(e: sqlite3.Error) -> BaseException:
    """FoundationDB's view of an SQLite error: lock contention is retryable 1038."""
    if _is_busy(e):
        return StoreError(DATABASE_LOCKED, f"SQLite store is locked: {e}")
    return e


def read_values(conn: sqlite3.Connection, keys: list[bytes]) -> dict[bytes, bytes | None]:
    """The committed value of each of ``keys`` (None: absent), as ``conn`` sees them now."""
    values: dict[bytes, bytes | None] = dict.fromkeys(keys)
    for i in range(0, len(keys), WATCH_READ_CHUNK):
        chunk = keys[i : i + WATCH_READ_CHUNK]
        marks = ",".join("?" * len(chunk))
        for key, value in conn.execute(f"SELECT key, value FROM kv WHERE key IN ({marks})", chunk):
            values[key] = value
    return values
