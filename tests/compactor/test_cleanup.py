"""Cleanup keys on real files: a big WAL truncated, a database's leftovers removed, a WAL with its database kept.

The application is a child process (``ChildConnection``); an application that crashed is one
killed with SIGKILL, which leaves its ``-wal`` and ``-shm`` behind exactly as a real crash does.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

from compactor.contexts import RecordingContext
from compactor.dbfactory import app_with_grown_wal, integrity, make_bloated_db, row_count
from helpers.locks import ChildConnection
from smoosh.compactors import Gone, SqliteCompactor
from smoosh.compactors.base import Sizes

import pytest

#: The first bytes of a wal-index as SQLite writes it on a little-endian machine (version 3007000).
SHM_HEADER = (3007000).to_bytes(4, "little")


def settings(**kw: object) -> SimpleNamespace:
    base = {"page_size": None, "auto_vacuum": None, "incremental_chunk_pages": 1000, "busy_timeout_s": 0.2}
    base.update(kw)
    return SimpleNamespace(**base)


def crash_with_rows_in_the_wal(path: str, rows: int = 300) -> int:
    """An application inserts ``rows`` rows without checkpointing, then dies (SIGKILL); the row count after."""
    with ChildConnection(path) as app:
        app.execute("PRAGMA wal_autocheckpoint=0")
        app.execute("BEGIN")
        for _ in range(rows):
            app.execute("INSERT INTO docs(key, body) VALUES (hex(randomblob(8)), randomblob(1000))")
        app.execute("COMMIT")
        (count,) = app.execute("SELECT count(*) FROM docs")[0]
        app.proc.kill()
        app.proc.wait()
    return int(count)


def test_a_leftover_wal_whose_database_is_gone_is_removed(tmp_path) -> None:
    # Given an application that crashed with transactions in its WAL, then its database deleted alone
    path = str(tmp_path / "t.db")
    make_bloated_db(path, delete_fraction=0.0)
    crash_with_rows_in_the_wal(path)
    assert os.path.getsize(path + "-wal") > 0 and os.path.exists(path + "-shm")
    os.remove(path)
    left_bytes = os.path.getsize(path + "-wal") + os.path.getsize(path + "-shm")
    c = SqliteCompactor(settings(), roots=[str(tmp_path)])
    key = "cleanup:" + path

    # Then its cleanup key has work and says how much
    assert c.leftovers(path) == [path + "-wal", path + "-shm"]
    assert c.cleanup_priority(key) == 1.0
    assert c.sizes(key) == Sizes(left_bytes, 0)

    # When the cleanup runs, the leftovers are gone, and the result counts their bytes
    result = c.compact(key, RecordingContext())
    assert not os.path.lexists(path + "-wal") and not os.path.lexists(path + "-shm")
    assert (result.size_before_bytes, result.size_after_bytes) == (left_bytes, 0)
    assert c.cleanup_priority(key) == 0.0
    with pytest.raises(Gone):
        c.compact(key, RecordingContext())  # nothing left: gone, like any missing database


def test_a_wal_beside_its_database_is_never_removed_and_its_transactions_are_kept(tmp_path) -> None:
    # Given a crashed application whose last commits live only in the WAL
    path = str(tmp_path / "t.db")
    make_bloated_db(path, delete_fraction=0.0)
    rows = crash_with_rows_in_the_wal(path)
    wal_bytes = os.path.getsize(path + "-wal")
    c = SqliteCompactor(settings(), roots=[str(tmp_path)], wal_max_size_bytes=wal_bytes // 2)

    # Then none of its side files is a leftover
    assert c.leftovers(path) == []
    assert c.cleanup_priority("cleanup:" + path) == 1.0  # the WAL is over wal_max_size: checkpointed

    # When the cleanup runs
    c.compact("cleanup:" + path, RecordingContext())

    # Then every committed row is in the database: the WAL was checkpointed, not thrown away
    assert row_count(path) == rows
    assert integrity(path) == "ok"
    assert not os.path.exists(path + "-wal") or os.path.getsize(path + "-wal") == 0


def test_a_side_file_that_is_not_a_regular_file_is_no_leftover(tmp_path) -> None:
    path = str(tmp_path / "t.db")
    outside = tmp_path / "elsewhere"
    outside.write_bytes(b"x" * 4096)
    os.symlink(outside, path + "-wal")
    os.mkdir(path + "-journal")
    (tmp_path / "t.db-shm").write_bytes(SHM_HEADER + b"\0" * (32768 - len(SHM_HEADER)))
    c = SqliteCompactor(settings(), roots=[str(tmp_path)])
    assert c.leftovers(path) == [path + "-shm"]
    c.compact("cleanup:" + path, RecordingContext())
    assert os.path.islink(path + "-wal") and outside.read_bytes() == b"x" * 4096
    assert os.path.isdir(path + "-journal")
    assert not os.path.exists(path + "-shm")


def test_a_file_merely_named_like_a_side_file_is_no_leftover(tmp_path) -> None:
    # Another application's files, named like side files of a database that does not exist
    path = str(tmp_path / "server")
    (tmp_path / "server-journal").write_text("2026-11-24 a log line\n")
    (tmp_path / "server-wal").write_bytes(b"")
    (tmp_path / "server-shm").write_bytes(b"\0" * 32768)
    c = SqliteCompactor(settings(), roots=[str(tmp_path)])
    assert c.leftovers(path) == []
    with pytest.raises(Gone):  # nothing of SQLite's here: no database, no leftovers
        c.compact("cleanup:" + path, RecordingContext())
    assert sorted(os.listdir(tmp_path)) == ["server-journal", "server-shm", "server-wal"]
    # while what SQLite itself leaves is recognised by its first bytes
    (tmp_path / "server-wal").write_bytes(bytes.fromhex("377f0682") + b"\0" * 28)
    assert c.leftovers(path) == [path + "-wal"]


def test_a_name_that_still_exists_has_no_leftovers_even_as_a_dangling_symlink(tmp_path) -> None:
    path = str(tmp_path / "t.db")
    os.symlink(tmp_path / "nowhere.db", path)
    (tmp_path / "t.db-wal").write_bytes(b"\0" * 4096)
    c = SqliteCompactor(settings(), roots=[str(tmp_path)])
    assert c.leftovers(path) == []
    assert c.cleanup_priority("cleanup:" + path) == 0.0
    assert os.path.exists(path + "-wal")


def test_leftovers_outside_the_roots_are_not_touched(tmp_path) -> None:
    inside, outside = tmp_path / "in", tmp_path / "out"
    inside.mkdir()
    outside.mkdir()
    path = str(outside / "t.db")
    (outside / "t.db-wal").write_bytes(b"\0" * 4096)
    c = SqliteCompactor(settings(), roots=[str(inside)])
    assert c.leftovers(path) == []
    assert c.cleanup_priority("cleanup:" + path) == 0.0
    assert os.path.exists(path + "-wal")


def test_a_database_asks_for_its_cleanup_key_once_its_wal_passed_half_of_wal_max_size(tmp_path) -> None:
    # Half: the job then has time to find a moment with no reader before the log reaches the limit
    path = str(tmp_path / "w.db")
    with app_with_grown_wal(path) as wal_bytes:
        assert SqliteCompactor(settings(), wal_max_size_bytes=2 * wal_bytes - 2).cleanup_key(path) == "cleanup:" + path
        assert SqliteCompactor(settings(), wal_max_size_bytes=2 * wal_bytes).cleanup_key(path) is None
        assert SqliteCompactor(settings(), wal_max_size_bytes=2 * wal_bytes - 2).cleanup_priority("cleanup:" + path) == 1.0
        assert SqliteCompactor(settings(), wal_max_size_bytes=2 * wal_bytes).cleanup_priority("cleanup:" + path) == 0.0
        assert SqliteCompactor(settings(), wal_max_size_bytes=1).cleanup_key("cleanup:" + path) is None
