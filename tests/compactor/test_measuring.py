"""Reading a database's size never drops the POSIX locks this process's own connections hold."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

from compactor.dbfactory import make_bloated_db
from smoosh.compactors.sqlite import SqliteCompactor
from smoosh.compactors.sqlite_file import in_use, is_in_use

WRITE_FROM_ANOTHER_PROCESS = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], timeout=0)
try:
    conn.execute("INSERT INTO docs (key, body) VALUES ('k', x'00')")
    conn.commit()
    print("wrote")
except sqlite3.OperationalError as e:
    print(e)
"""


def other_process_write(db: Path) -> str:
    out = subprocess.run([sys.executable, "-c", WRITE_FROM_ANOTHER_PROCESS, str(db)], capture_output=True, text=True, timeout=30)
    return out.stdout.strip()


def test_sizes_of_a_database_being_compacted_keep_its_write_lock(tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    make_bloated_db(str(db), journal_mode="delete")
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # the write lock a compaction holds; readers still read
    try:
        with in_use(str(db)):
            sizes = SqliteCompactor().sizes(str(db))
            assert sizes is not None and sizes.file_bytes > 0
            assert other_process_write(db) == "database is locked"
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_a_database_in_use_is_recognised_through_another_spelling_of_its_path(tmp_path: Path) -> None:
    # The registry holds realpaths: a key reached through a symlinked directory is the same file.
    db = tmp_path / "real" / "a.db"
    db.parent.mkdir()
    make_bloated_db(str(db), journal_mode="delete")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with in_use(str(db)):
            sizes = SqliteCompactor().sizes(str(tmp_path / "link" / "a.db"))
            assert sizes is not None and sizes.file_bytes > 0
            assert other_process_write(db) == "database is locked"
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_in_use_is_counted_and_released(tmp_path: Path) -> None:
    db = str(tmp_path / "a.db")
    with in_use(db):
        with in_use(db):
            assert is_in_use(db)
        assert is_in_use(db)
    assert not is_in_use(db)

