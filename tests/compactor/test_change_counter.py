"""``changes`` from SQLite's file change counter: commits since smoosh last compacted the database.

The commits are real write transactions of an application in a child process (its stdlib
``sqlite3`` must not share this process with the compactor's apsw, DESIGN §11).
"""

from __future__ import annotations

import os
import struct
from types import SimpleNamespace

from compactor.contexts import RecordingContext
from compactor.dbfactory import make_bloated_db
from helpers.locks import ChildConnection
from smoosh.compactors import SqliteCompactor
from smoosh.compactors.sqlite_file import read_state


def settings(**kw: object) -> SimpleNamespace:
    base = {"page_size": None, "auto_vacuum": None, "incremental_chunk_pages": 1000, "busy_timeout_s": 0.2}
    base.update(kw)
    return SimpleNamespace(**base)


def commit(path: str, times: int) -> None:
    """``times`` write transactions of an application, each its own commit."""
    with ChildConnection(path) as app:
        for _ in range(times):
            app.execute("UPDATE docs SET key = hex(randomblob(8)) WHERE id = (SELECT max(id) FROM docs)")


def header_counter(path: str) -> int:
    with open(path, "rb") as f:
        return struct.unpack(">I", f.read(28)[24:28])[0]


def test_changes_count_the_commits_since_smoosh_compacted_the_database(tmp_path) -> None:
    path = str(tmp_path / "a.db")
    make_bloated_db(path, journal_mode="delete")
    c = SqliteCompactor(settings())
    # Never compacted by this compactor: unknown, so min_changes holds nothing back
    assert c.sizes(path).changes is None
    c.compact(path, RecordingContext())
    assert c.sizes(path).changes == 0
    commit(path, 7)
    assert c.sizes(path).changes == 7
    assert c.sizes(path, exact=True).changes == 7
    commit(path, 3)
    assert c.sizes(path).changes == 10
    # A new compaction starts the count again
    c.compact(path, RecordingContext())
    assert c.sizes(path).changes == 0


def test_the_count_survives_the_counter_wrapping(tmp_path) -> None:
    path = str(tmp_path / "a.db")
    make_bloated_db(path, journal_mode="delete")
    c = SqliteCompactor(settings())
    c.compact(path, RecordingContext())
    # The counter is 32 bits and wraps: set it just below 2**32 as the last compaction's value
    with open(path, "r+b") as f:
        f.seek(24)
        f.write(struct.pack(">I", 2**32 - 2))
        f.seek(92)
        f.write(struct.pack(">I", 2**32 - 2))  # version-valid-for follows the counter
    c.compact(path, RecordingContext())
    remembered = header_counter(path)
    commit(path, 5)
    assert header_counter(path) == (remembered + 5) % 2**32
    assert c.sizes(path).changes == 5


def test_a_wal_database_has_no_count(tmp_path) -> None:
    # SQLite leaves the counter alone in WAL mode: counting from it would say "0 changes"
    # forever and hold the database back from every channel with min_changes.
    path = str(tmp_path / "w.db")
    make_bloated_db(path, journal_mode="wal")
    c = SqliteCompactor(settings())
    c.compact(path, RecordingContext())
    commit(path, 5)
    assert read_state(path, 0.2).change_counter is None
    assert c.sizes(path).changes is None


def test_a_file_renamed_over_the_compacted_one_has_no_count(tmp_path) -> None:
    path = str(tmp_path / "a.db")
    other = str(tmp_path / "b.db")
    make_bloated_db(path, journal_mode="delete")
    make_bloated_db(other, journal_mode="delete")
    c = SqliteCompactor(settings())
    c.compact(path, RecordingContext())
    os.replace(other, path)
    assert c.sizes(path).changes is None
