"""Builds bloated SQLite files for compaction tests (plain functions; reused by the end-to-end tests).

Import it as ``from compactor.dbfactory import make_bloated_db`` (``tests/`` is on sys.path,
see tests/conftest.py).

Every connection here is apsw's, the library smoosh's compactor opens user databases with:
tests run compactions in their own process, and a stdlib ``sqlite3`` connection to the same
file there would neither see the compactor's locks nor keep them (DESIGN §11). An application
connection that must stay open belongs in another process (``helpers.locks.ChildConnection``).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

import apsw
from helpers.locks import ChildConnection

__all__ = ["make_bloated_db", "db_stats", "integrity", "row_count", "DEFAULT_ROWS", "DEFAULT_ROW_BYTES"]

#: Rows inserted by default (with the default row size: about 2.3 MB before the delete).
DEFAULT_ROWS = 2000
#: Random BLOB bytes per row by default.
DEFAULT_ROW_BYTES = 1000
#: Multiplier of the deterministic hash that picks scattered rows (Knuth's).
_HASH = 2654435761


def _connect(path: str, *, create: bool = False) -> apsw.Connection:
    flags = apsw.SQLITE_OPEN_READWRITE | (apsw.SQLITE_OPEN_CREATE if create else 0)
    conn = apsw.Connection(path, flags=flags)
    conn.set_busy_timeout(5000)
    return conn


def _value(conn: apsw.Connection, sql: str, bindings: Any = None) -> Any:
    # fetchall: apsw runs a statement as its cursor is stepped, so step it to its end.
    return conn.execute(sql, bindings).fetchall()[0][0]


def _remove(path: str) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        try:
            os.remove(path + suffix)
        except FileNotFoundError:
            pass


def make_bloated_db(
    path: str,
    *,
    rows: int = DEFAULT_ROWS,
    row_bytes: int = DEFAULT_ROW_BYTES,
    delete_fraction: float = 0.6,
    journal_mode: str = "wal",
    auto_vacuum: str = "none",
    scattered: bool = False,
    page_size: int | None = None,
) -> dict:
    """Create (replacing) a SQLite file with ``rows`` rows, then delete a fraction of them.

    Parameters:
        path: the database file (its -wal/-shm/-journal are removed first).
        rows: rows inserted into ``docs(id INTEGER PRIMARY KEY, key TEXT, body BLOB)``.
        row_bytes: random BLOB bytes per row.
        delete_fraction: fraction of rows deleted afterwards.
        journal_mode: "wal" or "delete" (persistent in the file).
        auto_vacuum: "none", "full" or "incremental".
        scattered: delete rows picked by a hash of the id (partly empty pages, which only a
            full VACUUM reclaims) instead of the oldest ids (whole free pages).
        page_size: the page size, or None for SQLite's default.

    Returns:
        ``db_stats(path)`` after the delete, plus ``rows`` left and ``live_bytes`` (rows x row_bytes).
        The file is closed cleanly: no -wal or -shm is left behind.
    """
    _remove(path)
    conn = _connect(path, create=True)
    try:
        if page_size is not None:
            conn.execute(f"PRAGMA page_size={int(page_size)}").fetchall()
        conn.execute(f"PRAGMA auto_vacuum={auto_vacuum.upper()}").fetchall()
        conn.execute(f"PRAGMA journal_mode={journal_mode.upper()}").fetchall()
        conn.execute("CREATE TABLE docs(id INTEGER PRIMARY KEY, key TEXT NOT NULL, body BLOB NOT NULL)")
        conn.execute(
            "INSERT INTO docs(key, body) "
            "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < ?) "
            "SELECT hex(randomblob(8)), randomblob(?) FROM n",
            (rows, row_bytes),
        ).fetchall()
        if scattered:
            conn.execute("DELETE FROM docs WHERE ((id * ?) % 1000) < ?", (_HASH, int(delete_fraction * 1000))).fetchall()
        else:
            conn.execute("DELETE FROM docs WHERE id <= ?", (int(rows * delete_fraction),)).fetchall()
        left = _value(conn, "SELECT count(*) FROM docs")
    finally:
        conn.close()
    stats = db_stats(path)
    stats["rows"] = left
    stats["live_bytes"] = left * row_bytes
    return stats


def make_corrupt_db(path: str) -> None:
    """A bloated SQLite file whose header is sound and whose pages are not: its VACUUM fails with
    ``CorruptError: database disk image is malformed`` (the one corrupt database of a fleet).

    Its pages are half empty, scattered: the slack channel takes it, not the ratio channel.
    """
    make_bloated_db(path, rows=3000, delete_fraction=0.5, scattered=True)
    with open(path, "r+b") as f:
        f.seek(4096 * 3)
        f.write(b"\xff" * 4096 * 2)


def db_stats(path: str) -> dict:
    """File bytes and the page pragmas of a database (opened and closed cleanly)."""
    conn = _connect(path)
    try:
        pragmas = {
            name: _value(conn, f"PRAGMA {name}")
            for name in ("page_size", "page_count", "freelist_count", "auto_vacuum", "journal_mode")
        }
    finally:
        conn.close()
    return {"file_bytes": os.path.getsize(path), **pragmas}


def integrity(path: str) -> str:
    """``PRAGMA integrity_check`` of a database ("ok" when intact)."""
    conn = _connect(path)
    try:
        return "\n".join(row[0] for row in conn.execute("PRAGMA integrity_check").fetchall())
    finally:
        conn.close()


def row_count(path: str) -> int:
    """Rows in the ``docs`` table a bloated database holds."""
    conn = _connect(path)
    try:
        return _value(conn, "SELECT count(*) FROM docs")
    finally:
        conn.close()


@contextlib.contextmanager
def app_with_grown_wal(path: str) -> Iterator[int]:
    """A WAL database whose application rewrote every row and holds it open, never checkpointing.

    Yields the size of its ``-wal`` (bytes) while the application's process keeps it open.
    """
    make_bloated_db(path, delete_fraction=0.0)
    with ChildConnection(path) as app:
        app.execute("PRAGMA wal_autocheckpoint=0")
        app.execute("UPDATE docs SET body = randomblob(1000)")
        yield os.path.getsize(path + "-wal")
