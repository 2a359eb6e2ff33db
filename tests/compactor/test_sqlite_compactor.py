"""The SQLite compactor on real files: sizes, incremental and full compaction, upgrades, cleanup, cancellation.

Application connections (writers, readers, lock holders) run in child processes
(``ChildConnection``): the compactor in this process opens databases through apsw, and a
stdlib connection here would neither see its locks nor keep them (DESIGN §11).
"""

from __future__ import annotations

import os
import shutil
import threading
from types import SimpleNamespace

import pytest

from compactor.contexts import RecordingContext
from compactor.dbfactory import app_with_grown_wal, db_stats, integrity, make_bloated_db, row_count
from helpers.daemon import HANG_S
from helpers.locks import ChildConnection
from smoosh.compactors import Busy, Gone, InsufficientSpace, Interrupted, SqliteCompactor, compactor_for, load_compactors
from smoosh.compactors.base import Compactor, Sizes


def settings(**kw: object) -> SimpleNamespace:
    base = {"page_size": None, "auto_vacuum": None, "incremental_chunk_pages": 1000, "busy_timeout_s": 0.2}
    base.update(kw)
    return SimpleNamespace(**base)


def siblings(path: str) -> list[str]:
    return sorted(s for s in ("-wal", "-shm", "-journal") if os.path.exists(path + s))


# ---------------------------------------------------------------- keys and sizes


def test_claims_absolute_paths_and_cleanup_keys_only() -> None:
    c = SqliteCompactor()
    assert c.claims("/data/a.db")
    assert c.claims("cleanup:/data/a.db")
    assert not c.claims("relative/a.db")
    assert not c.claims("cleanup:relative.db")
    assert not c.claims("")
    assert not c.claims("cleanup:")
    assert not c.claims("/data/a\x00.db")
    assert isinstance(c, Compactor)


def test_load_compactors_puts_sqlite_first_and_compactor_for_picks_the_claimer() -> None:
    compactors = load_compactors(settings())
    assert isinstance(compactors[0], SqliteCompactor)
    assert compactor_for("/x.db", compactors) is compactors[0]
    assert compactor_for("not-a-path", compactors) is None


def test_sizes_of_a_wal_database_create_no_files(tmp_path) -> None:
    path = str(tmp_path / "a.db")
    stats = make_bloated_db(path, journal_mode="wal")
    c = SqliteCompactor(settings())
    sizes = c.sizes(path)
    assert sizes == Sizes(stats["file_bytes"], (stats["page_count"] - stats["freelist_count"]) * stats["page_size"], None)
    c.sizes(path, exact=True)
    assert siblings(path) == []


def test_sizes_read_a_live_wal_through_a_connection(tmp_path) -> None:
    # Given an application holding the database open with uncheckpointed deletes in its WAL
    path = str(tmp_path / "a.db")
    make_bloated_db(path, delete_fraction=0.0)
    with ChildConnection(path) as app:
        app.execute("PRAGMA wal_autocheckpoint=0")
        app.execute("DELETE FROM docs WHERE id % 2 = 0")
        sizes = SqliteCompactor(settings()).sizes(path)
        expected = app.execute("PRAGMA page_count")[0][0] - app.execute("PRAGMA freelist_count")[0][0]
        assert sizes is not None and sizes.active_bytes == expected * 4096


def test_exact_size_sees_the_fragmentation_the_estimate_misses(tmp_path) -> None:
    path = str(tmp_path / "a.db")
    make_bloated_db(path, rows=20000, row_bytes=100, delete_fraction=0.6, scattered=True)
    now = [1000.0]
    c = SqliteCompactor(settings(), exact_size_interval_s=3600, clock=lambda: now[0])
    cheap = c.sizes(path)
    assert c.exact_size_due(path)
    exact = c.sizes(path, exact=True)
    assert cheap is not None and exact is not None
    assert exact.file_bytes == cheap.file_bytes
    assert exact.file_bytes / exact.active_bytes > 1.5 * (cheap.file_bytes / cheap.active_bytes)
    assert not c.exact_size_due(path)
    # the remembered exact size stands in for the estimate while the file is unchanged
    assert c.sizes(path) == exact
    now[0] += 3600
    assert c.exact_size_due(path)
    assert c.sizes(path) == cheap


@pytest.mark.parametrize("content", [None, b"", b"hello, not a database" * 100])
def test_missing_or_foreign_file_has_no_sizes_and_is_gone(tmp_path, content) -> None:
    path = str(tmp_path / "x.db")
    if content is not None:
        with open(path, "wb") as f:
            f.write(content)
    c = SqliteCompactor(settings())
    assert c.sizes(path) is None
    assert c.sizes("cleanup:" + path) is None
    assert c.cleanup_priority("cleanup:" + path) == 0.0
    assert not c.needs_upgrade(path)
    with pytest.raises(Gone):
        c.compact(path, RecordingContext())
    assert os.path.exists(path) == (content is not None)
    assert siblings(path) == []


def test_fifos_and_directories_are_not_databases(tmp_path) -> None:
    fifo = str(tmp_path / "fifo.db")
    os.mkfifo(fifo)
    c = SqliteCompactor(settings())
    assert c.sizes(fifo) is None  # and it returns at once instead of blocking on the FIFO
    assert c.sizes(str(tmp_path)) is None


# ---------------------------------------------------------------- compaction


@pytest.mark.parametrize("journal_mode", ["wal", "delete"])
def test_incremental_compaction_frees_pages_in_chunks_with_exact_progress(tmp_path, journal_mode) -> None:
    path = str(tmp_path / "inc.db")
    stats = make_bloated_db(path, auto_vacuum="incremental", journal_mode=journal_mode)
    assert stats["freelist_count"] > 300
    ctx = RecordingContext()
    result = SqliteCompactor(settings(incremental_chunk_pages=50)).compact(path, ctx)
    after = db_stats(path)
    assert after["freelist_count"] == 0
    assert after["file_bytes"] == (stats["page_count"] - stats["freelist_count"]) * stats["page_size"]
    assert result.size_before_bytes == stats["file_bytes"]
    assert result.size_after_bytes == after["file_bytes"]
    assert ctx.checkpoints >= stats["freelist_count"] // 50
    assert ctx.fractions == sorted(ctx.fractions) and ctx.fractions[-1] == 1.0
    assert len(set(ctx.fractions)) > 5  # exact per-chunk steps, not just 0 and 1
    assert integrity(path) == "ok" and row_count(path) == stats["rows"]
    assert not os.path.exists(path + "-wal") or os.path.getsize(path + "-wal") == 0


def test_interrupted_between_chunks_stops_with_the_finished_chunks_kept(tmp_path) -> None:
    path = str(tmp_path / "inc.db")
    stats = make_bloated_db(path, auto_vacuum="incremental")

    def stop_at_third(n: int) -> None:
        if n == 3:
            raise Interrupted("held")

    with pytest.raises(Interrupted):
        SqliteCompactor(settings(incremental_chunk_pages=50)).compact(path, RecordingContext(stop_at_third))
    after = db_stats(path)
    assert after["freelist_count"] == stats["freelist_count"] - 100
    assert integrity(path) == "ok" and row_count(path) == stats["rows"]


@pytest.mark.parametrize("journal_mode", ["wal", "delete"])
def test_full_vacuum_shrinks_to_near_the_live_size_and_truncates_the_wal(tmp_path, journal_mode) -> None:
    path = str(tmp_path / "full.db")
    stats = make_bloated_db(path, journal_mode=journal_mode, scattered=True, rows=6000, row_bytes=300)
    with ChildConnection(path) as app:  # an idle application connection keeps the WAL file
        app.execute("SELECT count(*) FROM docs")
        ctx = RecordingContext()
        result = SqliteCompactor(settings()).compact(path, ctx)
        assert result.size_before_bytes == stats["file_bytes"]
        assert result.size_after_bytes == os.path.getsize(path) + (
            os.path.getsize(path + "-wal") if os.path.exists(path + "-wal") else 0
        )
        assert os.path.getsize(path) < 1.5 * stats["live_bytes"]
        assert result.reclaimed_bytes > 0.4 * stats["file_bytes"]
        if journal_mode == "wal":
            assert os.path.getsize(path + "-wal") == 0
        assert ctx.fractions[-1] == 1.0 and ctx.fractions == sorted(ctx.fractions)
    assert integrity(path) == "ok" and row_count(path) == stats["rows"]


@pytest.mark.parametrize("journal_mode", ["wal", "delete"])
def test_locked_database_gives_busy_within_the_busy_timeout(tmp_path, journal_mode) -> None:
    path = str(tmp_path / "busy.db")
    make_bloated_db(path, journal_mode=journal_mode)
    raised: list[BaseException] = []

    def compact() -> None:
        try:
            SqliteCompactor(settings(busy_timeout_s=0.2)).compact(path, RecordingContext())
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            raised.append(e)

    with ChildConnection(path) as app:
        app.execute("BEGIN IMMEDIATE")  # answers once the other process holds the write lock
        # The lock stays held until the compaction has given up: it must give up by itself
        attempt = threading.Thread(target=compact, daemon=True)
        attempt.start()
        attempt.join(HANG_S)
        assert not attempt.is_alive(), "the compaction waited for the lock beyond its busy timeout"
        app.execute("ROLLBACK")
    assert len(raised) == 1 and isinstance(raised[0], Busy), raised
    assert integrity(path) == "ok"


def test_busy_incremental_chunk_gives_busy(tmp_path) -> None:
    path = str(tmp_path / "inc.db")
    make_bloated_db(path, auto_vacuum="incremental")
    with ChildConnection(path) as app:

        def lock_at_second(n: int) -> None:
            if n == 2:
                app.execute("BEGIN IMMEDIATE")

        with pytest.raises(Busy):
            SqliteCompactor(settings(incremental_chunk_pages=50)).compact(path, RecordingContext(lock_at_second))
        app.execute("ROLLBACK")
    assert integrity(path) == "ok"


def test_cancel_from_another_thread_rolls_a_vacuum_back(tmp_path) -> None:
    path = str(tmp_path / "big.db")
    stats = make_bloated_db(path, rows=40000, row_bytes=400, scattered=True)
    ctx = RecordingContext()
    first_progress = threading.Event()
    cancelled = threading.Event()
    progress = ctx.progress

    def progress_then_wait(fraction: float) -> None:
        progress(fraction)
        if not first_progress.is_set():
            first_progress.set()
            cancelled.wait(5)  # the VACUUM is certainly mid-statement while we are cancelled

    ctx.progress = progress_then_wait  # type: ignore[method-assign]

    def canceller() -> None:
        first_progress.wait(5)
        ctx.cancel()
        cancelled.set()

    t = threading.Thread(target=canceller)
    t.start()
    with pytest.raises(Interrupted):
        SqliteCompactor(settings()).compact(path, ctx)
    t.join()
    assert os.path.getsize(path) == stats["file_bytes"]
    assert integrity(path) == "ok" and row_count(path) == stats["rows"]
    assert siblings(path) == []


def test_cancel_before_the_vacuum_starts_is_not_lost(tmp_path) -> None:
    path = str(tmp_path / "a.db")
    stats = make_bloated_db(path)
    ctx = RecordingContext()
    ctx.stop.set()
    with pytest.raises(Interrupted):
        SqliteCompactor(settings()).compact(path, ctx)
    assert os.path.getsize(path) == stats["file_bytes"]


def test_not_enough_free_space_is_blocked_before_anything_is_opened(tmp_path) -> None:
    from smoosh.compactors import Blocked
    from smoosh.compactors.sqlite_compact import vacuum_needs
    from smoosh.compactors.sqlite_file import read_state
    from smoosh.disk_room import DiskRoom, MinFree, _Fs

    path = str(tmp_path / "a.db")
    stats = make_bloated_db(path)
    needs = vacuum_needs(path, read_state(path, 1.0), str(tmp_path))
    # Its live size, not twice the file: a fifth of the file is live here.
    assert needs == {str(tmp_path): pytest.approx(1.1 * (stats["page_count"] - stats["freelist_count"]) * stats["page_size"],
                                                  abs=64 * stats["page_size"] + 1)}
    tight = DiskRoom(MinFree(bytes=1000), statvfs=lambda d: _Fs(free_bytes=needs[str(tmp_path)], total_bytes=10**9))
    with pytest.raises(InsufficientSpace) as info:
        SqliteCompactor(settings(), disk_room=tight, temp_dir=str(tmp_path)).compact(path, RecordingContext())
    assert isinstance(info.value, Blocked)
    assert str(info.value) == (f"not enough free disk space in {tmp_path}: a compaction writes {needs[str(tmp_path)]} "
                               f"bytes there; {needs[str(tmp_path)]} free, 0 reserved by running compactions, 1000 "
                               "kept by min_free_space")
    assert os.path.getsize(path) == stats["file_bytes"] and tight.reserved_bytes() == 0
    roomy = DiskRoom(MinFree(bytes=1000), statvfs=lambda d: _Fs(free_bytes=needs[str(tmp_path)] + 1000, total_bytes=10**9))
    assert SqliteCompactor(settings(), disk_room=roomy, temp_dir=str(tmp_path)).compact(path, RecordingContext()).reclaimed_bytes > 0
    assert roomy.reserved_bytes() == 0


# ---------------------------------------------------------------- upgrades


@pytest.mark.parametrize("journal_mode", ["wal", "delete"])
def test_upgrade_to_incremental_auto_vacuum(tmp_path, journal_mode) -> None:
    path = str(tmp_path / "up.db")
    stats = make_bloated_db(path, journal_mode=journal_mode)
    c = SqliteCompactor(settings(auto_vacuum="incremental"))
    assert c.needs_upgrade(path)
    c.compact(path, RecordingContext())
    after = db_stats(path)
    assert after["auto_vacuum"] == 2 and after["journal_mode"] == journal_mode
    assert not c.needs_upgrade(path)
    assert integrity(path) == "ok" and row_count(path) == stats["rows"]


@pytest.mark.parametrize("journal_mode", ["wal", "delete"])
def test_upgrade_page_size_keeps_the_journal_mode(tmp_path, journal_mode) -> None:
    path = str(tmp_path / "up.db")
    stats = make_bloated_db(path, journal_mode=journal_mode)
    c = SqliteCompactor(settings(page_size=8192))
    assert c.needs_upgrade(path)
    c.compact(path, RecordingContext())
    after = db_stats(path)
    assert after["page_size"] == 8192 and after["journal_mode"] == journal_mode
    assert not c.needs_upgrade(path)
    assert integrity(path) == "ok" and row_count(path) == stats["rows"]


def test_page_size_upgrade_of_a_wal_database_in_use_needs_exclusive_access(tmp_path) -> None:
    path = str(tmp_path / "up.db")
    make_bloated_db(path, journal_mode="wal")
    with ChildConnection(path) as app:
        app.execute("SELECT count(*) FROM docs")
        with pytest.raises(Busy, match="needs exclusive access"):
            SqliteCompactor(settings(page_size=8192)).compact(path, RecordingContext())
        assert app.execute("PRAGMA journal_mode")[0][0] == "wal"
    after = db_stats(path)
    assert after["page_size"] == 4096 and after["journal_mode"] == "wal"
    assert integrity(path) == "ok"


def test_no_upgrade_targets_means_no_upgrade(tmp_path) -> None:
    path = str(tmp_path / "a.db")
    make_bloated_db(path, page_size=1024)
    assert not SqliteCompactor(settings()).needs_upgrade(path)
    assert SqliteCompactor(settings(page_size=1024, auto_vacuum="none")).needs_upgrade(path) is False


# ---------------------------------------------------------------- cleanup keys


def test_cleanup_key_truncates_a_big_wal(tmp_path) -> None:
    path = str(tmp_path / "w.db")
    with app_with_grown_wal(path) as wal_bytes:
        c = SqliteCompactor(settings(), wal_max_size_bytes=wal_bytes // 2)
        key = "cleanup:" + path
        assert c.cleanup_priority(key) == 1.0
        assert c.sizes(key) == Sizes(wal_bytes, 0)
        assert c.cleanup_priority(path) == 0.0
        result = c.compact(key, RecordingContext())
        assert os.path.getsize(path + "-wal") == 0
        assert result.reclaimed_bytes >= wal_bytes - 4096
        assert c.cleanup_priority(key) == 0.0
    assert integrity(path) == "ok"


def test_cleanup_held_up_by_a_reader_is_blocked_naming_it(tmp_path, monkeypatch) -> None:
    import smoosh.compactors.sqlite_wal as sqlite_wal
    from smoosh.compactors import Blocked

    monkeypatch.setattr(sqlite_wal, "READERS_WAIT_S", 0.0)  # no waiting for the reader to let go
    path = str(tmp_path / "w.db")
    with app_with_grown_wal(path), ChildConnection(path) as reader:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM docs")
        compactor = SqliteCompactor(settings(busy_timeout_s=0.1), wal_max_size_bytes=1)  # the log is past it
        with pytest.raises(Blocked) as info:
            compactor.compact("cleanup:" + path, RecordingContext())
        assert f"; held by pid {reader.proc.pid} (" in str(info.value)
        assert [p for p, _size, _since in compactor.pinned_wals()] == [path]
        reader.execute("COMMIT")
        compactor.compact("cleanup:" + path, RecordingContext())
        assert compactor.pinned_wals() == []


def test_the_footprint_before_counts_the_wal_beside_the_database(tmp_path) -> None:
    # Given a WAL database whose application grew its -wal and keeps it open, idle
    path = str(tmp_path / "grown.db")
    with app_with_grown_wal(path) as wal_bytes:
        before = os.path.getsize(path) + wal_bytes
        # When it is compacted, then what it gave back is counted from the database and its -wal
        result = SqliteCompactor(settings()).compact(path, RecordingContext())
        assert wal_bytes > 0 and result.size_before_bytes == before
        assert result.size_after_bytes == os.path.getsize(path) + os.path.getsize(path + "-wal")


@pytest.mark.parametrize("journal_mode", ["wal", "delete"])
def test_a_connection_in_wal_mode_keeps_its_wal_file_while_open(tmp_path, journal_mode) -> None:
    # What the compactor's shortcut rests on (sqlite_wal.has_wal_file): no -wal beside a
    # database it holds open means its connection is not in WAL mode, so no pragma is asked
    from smoosh.compactors import sqlite_compact, sqlite_wal
    from smoosh.compactors.sqlite_open import close_quietly, pragma

    path = str(tmp_path / "db.db")
    make_bloated_db(path, journal_mode=journal_mode, rows=200)
    conn = sqlite_compact.open_for_compaction(path, None, 1.0)
    try:
        assert sqlite_wal.has_wal_file(path) == (pragma(conn, "journal_mode") == "wal") == (journal_mode == "wal")
        conn.execute("VACUUM")
        assert sqlite_wal.has_wal_file(path) == (journal_mode == "wal")
    finally:
        close_quietly(conn)
