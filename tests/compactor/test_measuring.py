"""Reading a database's size never drops the POSIX locks this process's own connections hold.

The lock holders here stand for a compaction of this process, so they are opened the way the
compactor opens its databases (apsw, through ``open_database``): a lock taken by another
SQLite library in this process would be dropped by any close of ours (DESIGN §11), which
is exactly what smoosh must never do to its own compactions. Application connections live
in child processes (``helpers.locks.ChildConnection``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import apsw

from compactor.dbfactory import make_bloated_db
from helpers.locks import ChildConnection, other_process_write
from smoosh.compactors.sqlite import DBSTAT_QUERY, SqliteCompactor
from smoosh.compactors.sqlite_file import in_use, is_in_use, read_quietly
from smoosh.compactors.sqlite_open import open_database, run


def hold_write_lock(db: Path) -> apsw.Connection:
    """The write lock a compaction of this process holds (readers still read)."""
    holder = open_database(str(db), "rw", timeout_s=0.0)
    run(holder, "BEGIN IMMEDIATE")
    return holder


def release(holder: apsw.Connection) -> None:
    run(holder, "ROLLBACK")
    holder.close()


def test_sizes_of_a_database_being_compacted_keep_its_write_lock(tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    make_bloated_db(str(db), journal_mode="delete")
    holder = hold_write_lock(db)
    try:
        with in_use(str(db)):
            sizes = SqliteCompactor().sizes(str(db))
            assert sizes is not None and sizes.file_bytes > 0
            assert other_process_write(db) == "database is locked"
    finally:
        release(holder)


def test_a_database_in_use_reached_through_a_symlinked_directory_is_refused_and_keeps_its_lock(
    tmp_path: Path,
) -> None:
    # The registry holds realpaths, so the header read knows the file is held and does not
    # open it raw (its close would drop the lock); the connection it would use instead
    # refuses the symlinked directory: no size, and the compaction's lock stays.
    db = tmp_path / "real" / "a.db"
    db.parent.mkdir()
    make_bloated_db(str(db), journal_mode="delete")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    holder = hold_write_lock(db)
    try:
        with in_use(str(db)):
            assert SqliteCompactor().sizes(str(tmp_path / "link" / "a.db")) is None
            assert other_process_write(db) == "database is locked"
    finally:
        release(holder)


def test_in_use_is_counted_and_released(tmp_path: Path) -> None:
    db = str(tmp_path / "a.db")
    with in_use(db):
        with in_use(db):
            assert is_in_use(db)
        assert is_in_use(db)
    assert not is_in_use(db)



def test_exact_sizes_of_a_database_being_compacted_keep_its_write_lock(tmp_path: Path) -> None:
    # The exact pass opens the file (immutably when nobody writes): its close must not drop
    # the lock this process's compaction holds.
    db = tmp_path / "a.db"
    make_bloated_db(str(db), journal_mode="delete")
    holder = hold_write_lock(db)
    try:
        with in_use(str(db)):
            sizes = SqliteCompactor().sizes(str(db), exact=True)
            assert sizes is not None and 0 < sizes.active_bytes < sizes.file_bytes
            assert other_process_write(db) == "database is locked"
    finally:
        release(holder)


def dbstat_through_a_normal_connection(db: Path) -> int:
    conn = open_database(str(db), "ro", timeout_s=1.0)
    try:
        return int(run(conn, DBSTAT_QUERY)[0][0])
    finally:
        conn.close()


def test_a_quiet_read_measures_what_a_normal_connection_measures_and_leaves_no_files(tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    make_bloated_db(str(db), journal_mode="wal", scattered=True)
    before = sorted(p.name for p in tmp_path.iterdir())
    row = read_quietly(str(db), DBSTAT_QUERY)
    assert row is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == before == ["a.db"]
    assert row[0] == dbstat_through_a_normal_connection(db)


def test_a_quiet_read_is_refused_while_someone_may_write(tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    make_bloated_db(str(db), journal_mode="wal")
    with ChildConnection(db) as writer:  # the application, in its own process
        writer.execute("INSERT INTO docs (key, body) VALUES ('k', x'00')")  # keeps the -wal open
        assert (tmp_path / "a.db-wal").exists()
        assert read_quietly(str(db), DBSTAT_QUERY) is None
        # The exact size still comes, through a normal read-only connection, WAL included.
        sizes = SqliteCompactor().sizes(str(db), exact=True)
        assert sizes is not None and sizes.active_bytes > 0
    journal = tmp_path / "b.db"
    make_bloated_db(str(journal), journal_mode="delete")
    # A journal holding a transaction (its header's magic) means someone is writing ...
    (tmp_path / "b.db-journal").write_bytes(bytes.fromhex("d9d505f920a163d7") + bytes(504))
    assert read_quietly(str(journal), DBSTAT_QUERY) is None
    # ... an empty one (journal_mode = TRUNCATE between transactions) or a zeroed one (PERSIST) does not
    for left in (b"", bytes(512)):
        (tmp_path / "b.db-journal").write_bytes(left)
        assert read_quietly(str(journal), DBSTAT_QUERY) is not None


def test_a_quiet_read_that_saw_the_file_change_is_thrown_away(tmp_path: Path, monkeypatch: Any) -> None:
    import smoosh.compactors.sqlite_file as sqlite_file

    db = tmp_path / "a.db"
    make_bloated_db(str(db), journal_mode="delete")
    real = sqlite_file._quiet_signature
    calls: list[int] = []

    def changing(path: str) -> Any:
        calls.append(1)
        sig = real(path)
        return sig if len(calls) == 1 else (sig[0], sig[1], sig[2] + 1)  # a write landed meanwhile

    monkeypatch.setattr(sqlite_file, "_quiet_signature", changing)
    assert read_quietly(str(db), DBSTAT_QUERY) is None
    assert len(calls) == 2
