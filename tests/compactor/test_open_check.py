"""Issue 45: every file SQLite opens for a compaction is checked by identity as it is opened.

The outside trial's three races, each played here at the one moment that matters, stepped by
the test rather than timed: a ``-shm`` hard link to an outside file placed just before the
compaction's open (SQLite cuts a ``-shm`` it opens first), a ``-journal`` hard link planted
mid-VACUUM (the journal is opened at the copy back), and the database exchanged
(``renameat2(RENAME_EXCHANGE)``) with a link to an outside database between the look that chose
it and the open. ``test_open_races.py`` runs the same races as real processes, many times over.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import apsw
import pytest

from compactor.contexts import RecordingContext
from compactor.dbfactory import integrity, make_bloated_db, row_count
from helpers.exchange import exchange, exchange_works
from smoosh.compactors import Blocked, SqliteCompactor, sqlite_compact, sqlite_guard
from smoosh.compactors.base import Shared
from smoosh.compactors.sqlite_guard import NOT_MEANT
from smoosh.compactors.sqlite_open import canonical_roots, open_database, pragma

LOGGER = "smoosh.compactors.sqlite_open"
#: Longest a wedged test may take to say so (not a speed budget).
HANG_S = 60.0


def settings(**kw: Any) -> SimpleNamespace:
    base = {"page_size": None, "auto_vacuum": None, "incremental_chunk_pages": 50, "busy_timeout_s": 0.2}
    base.update(kw)
    return SimpleNamespace(**base)


def digest(path: Path | str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture
def fleet(tmp_path: Path) -> SimpleNamespace:
    """``dbs/`` (the root) and ``outside/``, with a file of 64 KiB of random bytes there."""
    dbs, outside = tmp_path / "dbs", tmp_path / "outside"
    dbs.mkdir()
    outside.mkdir()
    victim = outside / "victim"
    victim.write_bytes(os.urandom(64 * 1024))
    return SimpleNamespace(dbs=dbs, outside=outside, victim=victim, roots=canonical_roots([str(dbs)]))


def just_before_the_open(monkeypatch: pytest.MonkeyPatch, act: Callable[[], None]) -> None:
    """Run ``act`` after every check by path, as the compaction is about to open its file."""
    real = sqlite_compact.open_for_compaction

    def opening(*args: Any, **kwargs: Any) -> Any:
        act()
        return real(*args, **kwargs)

    monkeypatch.setattr(sqlite_compact, "open_for_compaction", opening)


def refused_once(caplog: pytest.LogCaptureFixture, path: Path, reason: str) -> None:
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == LOGGER]
    assert lines == [(logging.WARNING, f"Refused to compact the database {str(path)!r}: {reason}.")]


def shm_linked_before_the_open(fleet: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    """A WAL database ``w.db`` whose -shm name a hard link to the outside file takes just before
    its compaction's open; the database and the outside file's digest before."""
    db = fleet.dbs / "w.db"
    make_bloated_db(str(db), journal_mode="wal")
    before = digest(fleet.victim)
    just_before_the_open(monkeypatch, lambda: os.link(fleet.victim, f"{db}-shm"))
    return db, before


def test_a_shm_linked_to_an_outside_file_as_the_compaction_opens_is_refused_untouched(
    fleet: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a WAL database whose -shm name is free when its compaction checks its side files
    # When a hard link to an outside file takes the -shm name just before the open
    db, before = shm_linked_before_the_open(fleet, monkeypatch)
    with caplog.at_level(logging.WARNING, logger=LOGGER), pytest.raises(Blocked) as info:
        SqliteCompactor(settings(), roots=fleet.roots).compact(str(db), RecordingContext())
    # Then the open of the -shm is refused before SQLite could cut it, and said so once
    reason = "its -shm has 2 hard links (allow_hard_links opts a root in)"
    assert str(info.value) == reason
    assert digest(fleet.victim) == before
    refused_once(caplog, db, reason)
    os.unlink(f"{db}-shm")
    assert integrity(str(db)) == "ok"


def test_a_shm_link_taken_away_between_the_probe_and_its_check_is_refused_untouched(
    fleet: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a WAL database, and a hard link to an outside file planted as its -shm just before
    # the compaction opens it
    db, before = shm_linked_before_the_open(fleet, monkeypatch)
    # When the link is taken away again between the check's open of the name and its count of
    # the file's links (the outside file then has one link, and the check's descriptor names it)
    assert sqlite_guard.install()
    lib = sqlite_guard._lib
    assert lib is not None

    @ctypes.CFUNCTYPE(None, ctypes.c_char_p)
    def probed(path: bytes) -> None:
        if path == f"{db}-shm".encode() and os.path.exists(f"{db}-shm"):
            os.unlink(f"{db}-shm")

    lib.og_set_probed_hook(probed)
    try:
        with caplog.at_level(logging.WARNING, logger=LOGGER), pytest.raises(Blocked) as info:
            SqliteCompactor(settings(), roots=fleet.roots).compact(str(db), RecordingContext())
    finally:
        lib.og_set_probed_hook(None)
    # Then the -shm is refused before SQLite could cut the outside file, and said so once
    reason = "its -shm was unlinked or renamed as it was opened (a hard link planted and taken away again?)"
    assert str(info.value) == reason
    assert digest(fleet.victim) == before
    refused_once(caplog, db, reason)
    assert integrity(str(db)) == "ok"


def test_a_journal_linked_to_an_outside_file_mid_vacuum_is_refused_before_a_byte_is_written(
    fleet: SimpleNamespace, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a rollback-journal database, and a hard link to an outside file planted as its
    # journal's name at the VACUUM's first progress tick (the journal is opened at the copy back)
    db = fleet.dbs / "j.db"
    rows = make_bloated_db(str(db), journal_mode="delete")["rows"]
    before = digest(fleet.victim)
    planted: list[float] = []

    class Planting(RecordingContext):
        def progress(self, fraction: float) -> None:
            super().progress(fraction)
            if not planted:
                os.link(fleet.victim, f"{db}-journal")
                planted.append(fraction)

    # When it is compacted
    with caplog.at_level(logging.WARNING, logger=LOGGER), pytest.raises(Blocked) as info:
        SqliteCompactor(settings(), roots=fleet.roots).compact(str(db), Planting())
    # Then the journal's open was refused: the outside file is byte for byte what it was, and
    # the database (whose VACUUM rolled back) lost nothing
    reason = "its -journal has 2 hard links (allow_hard_links opts a root in)"
    assert planted and str(info.value) == reason
    assert digest(fleet.victim) == before
    refused_once(caplog, db, reason)
    os.unlink(f"{db}-journal")
    assert (integrity(str(db)), row_count(str(db))) == ("ok", rows)


def test_a_journal_that_is_not_a_regular_file_is_refused_as_it_opens(fleet: SimpleNamespace) -> None:
    db = fleet.dbs / "f.db"
    make_bloated_db(str(db), journal_mode="delete")

    class Planting(RecordingContext):
        def progress(self, fraction: float) -> None:
            super().progress(fraction)
            if not os.path.lexists(f"{db}-journal"):
                os.mkfifo(f"{db}-journal")

    with pytest.raises(Blocked) as info:
        SqliteCompactor(settings(), roots=fleet.roots).compact(str(db), Planting())
    assert str(info.value) == "its -journal is not a regular file"
    os.unlink(f"{db}-journal")
    assert integrity(str(db)) == "ok"


def test_a_database_exchanged_with_a_link_to_an_outside_database_before_its_open_is_refused(
    fleet: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    if not exchange_works(str(fleet.dbs)):
        pytest.skip("this file system cannot exchange two names (renameat2 RENAME_EXCHANGE)")
    # Given a database in the root, and a hard link in the root to a database outside it
    db, outside_db = fleet.dbs / "x.db", fleet.outside / "o.db"
    make_bloated_db(str(db), journal_mode="delete")
    make_bloated_db(str(outside_db), journal_mode="delete")
    os.link(outside_db, fleet.dbs / "evil.db")
    before = digest(outside_db)
    # When the two names are exchanged between the look that chose x.db and its open
    just_before_the_open(monkeypatch, lambda: exchange(str(db), str(fleet.dbs / "evil.db")))
    with caplog.at_level(logging.WARNING, logger=LOGGER), pytest.raises(Blocked) as info:
        SqliteCompactor(settings(), roots=fleet.roots).compact(str(db), RecordingContext())
    # Then the file the open found is not the one meant: refused, and the outside database is untouched
    assert str(info.value) == NOT_MEANT
    assert digest(outside_db) == before
    refused_once(caplog, db, NOT_MEANT)
    # And once the names are back, the database is compacted as usual
    monkeypatch.undo()
    exchange(str(db), str(fleet.dbs / "evil.db"))
    result = SqliteCompactor(settings(), roots=fleet.roots).compact(str(db), RecordingContext())
    assert result.reclaimed_bytes > 0
    assert digest(outside_db) == before


def test_an_open_that_means_another_inode_is_refused(fleet: SimpleNamespace) -> None:
    db = fleet.dbs / "m.db"
    make_bloated_db(str(db))
    st = os.stat(db)
    with pytest.raises(Shared) as info:
        open_database(str(db), "ro", timeout_s=0.1, roots=fleet.roots, meant=(st.st_dev, st.st_ino + 1))
    assert info.value.reason == NOT_MEANT
    conn = open_database(str(db), "ro", timeout_s=0.1, roots=fleet.roots, meant=(st.st_dev, st.st_ino))
    try:
        assert pragma(conn, "quick_check") == "ok"
    finally:
        conn.close()


def test_a_root_that_opts_in_to_hard_links_lets_a_linked_database_open(fleet: SimpleNamespace) -> None:
    db = fleet.dbs / "l.db"
    make_bloated_db(str(db))
    os.link(db, fleet.outside / "second-name.db")
    with pytest.raises(Shared):
        open_database(str(db), "ro", timeout_s=0.1, roots=fleet.roots)
    opted_in = canonical_roots([str(fleet.dbs)], allow_hard_links=[str(fleet.dbs)])
    conn = open_database(str(db), "ro", timeout_s=0.1, roots=opted_in)
    try:
        assert pragma(conn, "quick_check") == "ok"
    finally:
        conn.close()


def test_files_opened_outside_open_database_are_not_policed(tmp_path: Path) -> None:
    # Library code and SQLite's own temporary files open as SQLite asked: only user databases
    # opened through smoosh are registered for the check.
    db = tmp_path / "lib.db"
    make_bloated_db(str(db))
    os.link(db, tmp_path / "other-name.db")
    conn = apsw.Connection(str(db))
    try:
        assert conn.execute("SELECT count(*) FROM docs").fetchall()[0][0] > 0
    finally:
        conn.close()


def test_the_open_check_is_built_and_installed_here() -> None:
    # make test's environment compiles it; a user's without a compiler is told (see NOT_BUILT)
    assert sqlite_guard.installed()


def test_threads_opening_and_closing_wal_databases_never_wedge_on_the_check(fleet: SimpleNamespace) -> None:
    # SQLite opens a -shm holding its global mutex, and apsw closes connections holding the GIL:
    # a check that needed the GIL there wedged the process within seconds (seen with a Python
    # callback). Threads that open (registering the -shm's check), read and close WAL databases
    # side by side must all finish.
    paths = []
    for i in range(4):
        path = str(fleet.dbs / f"t{i}.db")
        make_bloated_db(path, rows=100, journal_mode="wal" if i % 2 else "delete")
        paths.append(path)
    errors: list[BaseException] = []

    def churn(k: int) -> None:
        try:
            for n in range(150):
                conn = open_database(paths[(k + n) % len(paths)], "rw", timeout_s=5.0, roots=fleet.roots)
                try:
                    conn.execute("SELECT count(*) FROM docs").fetchall()
                finally:
                    conn.close()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=churn, args=(k,), daemon=True) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG_S)
    assert not [t for t in threads if t.is_alive()], "opens and closes wedged"
    assert errors == []


def test_a_directory_swapped_for_a_symlink_mid_vacuum_gets_no_journal_outside_the_roots(
    fleet: SimpleNamespace, caplog: pytest.LogCaptureFixture
) -> None:
    # Given dbs/tenant/j.db, a rollback-journal database whose VACUUM is under way when dbs/tenant
    # is moved aside and replaced by a symlink to a directory outside the roots, where a second
    # link to the database waits (so SQLite's own check, that the name still reaches the file it
    # opened, passes); the journal is opened later, at the copy back, by its name
    tenant = fleet.dbs / "tenant"
    tenant.mkdir()
    db = tenant / "j.db"
    make_bloated_db(str(db), journal_mode="delete")
    swapped: list[bool] = []

    class Swapping(RecordingContext):
        def progress(self, fraction: float) -> None:
            super().progress(fraction)
            if not swapped:
                tenant.rename(fleet.dbs / "tenant.old")
                os.link(fleet.dbs / "tenant.old" / "j.db", fleet.outside / "j.db")
                tenant.symlink_to(fleet.outside, target_is_directory=True)
                swapped.append(True)

    with caplog.at_level(logging.WARNING, logger=LOGGER), pytest.raises(Blocked) as info:
        SqliteCompactor(settings(), roots=fleet.roots).compact(str(db), Swapping())
    # Then the journal's open is refused in the directory it would have landed in: nothing was
    # created outside the roots, and the database is intact where it now lives
    assert swapped and str(info.value) == "reaches its file through a symbolic link"
    assert sorted(os.listdir(fleet.outside)) == ["j.db", "victim"]
    assert integrity(str(fleet.dbs / "tenant.old" / "j.db")) == "ok"
