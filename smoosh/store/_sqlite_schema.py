"""The SQLite store's file format: its schema, the reads its pieces share, SQLite errors as FoundationDB's.

The layout is described in :mod:`smoosh.store.sqlite`. Both the store and its group commit
(:mod:`smoosh.store._sqlite_commit`) re-read watched keys with :func:`read_values` and turn
SQLite's errors into the store's with :func:`store_error`; the commit log's rows are written
with :func:`encode_writes` and read with :func:`decode_writes`.

The commit log holds one row per SQLite transaction (a group of store commits): its version
is the row's integer key, so the newest version is the table's last row, and writing it
touches one page. Older files kept a ``meta`` version row and one indexed ``conflict_log``
row per written range (three more pages per commit); :func:`create_schema` moves such a file
to this layout once, under the write lock, and drops the old table so that a process still
running the old code fails loudly rather than miss the new processes' conflicts.
"""

from __future__ import annotations

import sqlite3
import time

import msgpack

from smoosh.store.base import TRANSACTION_SIZE_LIMIT_BYTES
from smoosh.store.errors import DATABASE_LOCKED, StoreError

#: Keys per ``IN (...)`` query when re-reading watched keys.
WATCH_READ_CHUNK = 500

_SCHEMA = """
CREATE TABLE IF NOT EXISTS kv(key BLOB PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta(name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS commit_log(version INTEGER PRIMARY KEY, commit_time REAL NOT NULL, writes BLOB NOT NULL);
INSERT OR IGNORE INTO meta(name, value) VALUES ('pruned_through', 0);
"""

#: The newest commit version (0 for a new file: its log is empty).
SELECT_VERSION = "SELECT coalesce(max(version), 0) FROM commit_log"
#: The newest commit version and the newest pruned one, in one statement.
SELECT_VERSION_AND_PRUNED = (
    "SELECT (SELECT coalesce(max(version), 0) FROM commit_log), (SELECT value FROM meta WHERE name = 'pruned_through')"
)

_EMPTY_WRITES = msgpack.packb([[], []], use_bin_type=True)


def create_schema(writer: sqlite3.Connection) -> None:
    """Create the tables of a new store file, or move an older file to this layout.

    Raises:
        sqlite3.Error: the file cannot be written, or is locked past the busy timeout.
    """
    # executescript() would COMMIT first: run the statements one by one under our lock,
    # so processes opening a new file at once create the schema once.
    writer.execute("BEGIN IMMEDIATE")
    try:
        old = writer.execute("SELECT 1 FROM sqlite_master WHERE name = 'conflict_log'").fetchone()
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                writer.execute(statement)
        if old is not None:
            _migrate(writer)
        writer.execute("COMMIT")
    except BaseException:
        writer.execute("ROLLBACK")
        raise


def _migrate(writer: sqlite3.Connection) -> None:
    """Carry an older file's commit counter into the commit log and drop its conflict log.

    Versions keep growing from the old counter. Every transaction whose read version
    predates the move is refused (1007, as a transaction older than the log): its conflicts
    were recorded in the old table, which nothing checks any more.
    """
    row = writer.execute("SELECT value FROM meta WHERE name = 'version'").fetchone()
    version = row[0] if row else 0
    if version:
        writer.execute(
            "INSERT OR IGNORE INTO commit_log(version, commit_time, writes) VALUES (?, ?, ?)", (version, time.time(), _EMPTY_WRITES)
        )
    writer.execute("UPDATE meta SET value = max(value, ?) WHERE name = 'pruned_through'", (version,))
    writer.execute("DELETE FROM meta WHERE name = 'version'")
    writer.execute("DROP TABLE conflict_log")


def encode_writes(points: list[bytes], ranges: list[tuple[bytes, bytes]]) -> bytes:
    """A commit log row's ``writes``: the keys and the ranges a group of commits wrote."""
    return msgpack.packb([points, ranges], use_bin_type=True)


def decode_writes(raw: bytes) -> tuple[set[bytes], list[tuple[bytes, bytes]]]:
    """The keys and ranges of a commit log row, decoded with its lengths bounded.

    Raises:
        ValueError: the row is not one :func:`encode_writes` wrote.
    """
    try:
        points, ranges = msgpack.unpackb(
            raw,
            max_bin_len=TRANSACTION_SIZE_LIMIT_BYTES,
            max_str_len=0,
            max_array_len=TRANSACTION_SIZE_LIMIT_BYTES,
            max_map_len=0,
            max_ext_len=0,
        )
        return set(points), [(b, e) for b, e in ranges]
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise ValueError(f"damaged commit log row: {e}") from e


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
