"""Issue 18: every open of a database re-checks the roots and never follows a symlink.

A key is canonical and inside ``roots`` when it is enqueued; what these tests do to the file
system afterwards (a database or a directory swapped for a symlink to a file outside the
roots) must never let smoosh read or write the outside file. Each test hashes the outside
file (and its side files) before and after.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import apsw
import pytest

from compactor.contexts import RecordingContext
from compactor.dbfactory import db_stats, integrity, make_bloated_db, row_count
from helpers.locks import ChildConnection
from smoosh.compactors import Blocked, Gone, Refused, SqliteCompactor, load_compactors
from smoosh.compactors.sqlite_file import read_state
from smoosh.compactors.sqlite_open import NO_ROOTS, NOT_CANONICAL, THROUGH_SYMLINK, open_database

LOGGER = "smoosh.compactors.sqlite_open"


def settings(**kw: Any) -> SimpleNamespace:
    base = {"page_size": None, "auto_vacuum": None, "incremental_chunk_pages": 50, "busy_timeout_s": 0.2}
    base.update(kw)
    return SimpleNamespace(**base)


def fingerprint(path: Path) -> dict[str, str | None]:
    """SHA-256 of a file and of each of its side files (None where there is none)."""
    out: dict[str, str | None] = {}
    for suffix in ("", "-wal", "-shm", "-journal"):
        p = Path(f"{path}{suffix}")
        out[suffix or "db"] = hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else None
    return out


@pytest.fixture
def fleet(tmp_path: Path) -> SimpleNamespace:
    """``dbs/`` (the root) and ``outside/victim.db``, a bloated database outside the roots."""
    dbs, outside = tmp_path / "dbs", tmp_path / "outside"
    dbs.mkdir()
    outside.mkdir()
    victim = outside / "victim.db"
    make_bloated_db(str(victim))
    return SimpleNamespace(dbs=dbs, outside=outside, victim=victim, roots=[str(dbs)])


def refusals(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER]


def assert_logged_once(caplog: pytest.LogCaptureFixture, path: Path | str, reason: str) -> None:
    # A security event: one WARNING per refusal, as a sentence, with no traceback.
    records = refusals(caplog)
    assert [(r.levelno, r.getMessage()) for r in records] == [
        (logging.WARNING, f"Refused to open the database {str(path)!r}: {reason}.")
    ]
    assert records[0].exc_info is None


# ---------------------------------------------------------------- the attack


@pytest.mark.parametrize("auto_vacuum", ["none", "incremental"])
def test_a_queued_database_swapped_for_a_symlink_is_refused_and_the_outside_file_is_untouched(
    fleet: SimpleNamespace, caplog: pytest.LogCaptureFixture, auto_vacuum: str
) -> None:
    # Given dbs/q.db, queued while it was an ordinary database inside the roots
    make_bloated_db(str(fleet.victim), auto_vacuum=auto_vacuum)
    queued = fleet.dbs / "q.db"
    make_bloated_db(str(queued))
    compactor = SqliteCompactor(settings(), roots=fleet.roots)
    assert compactor.sizes(str(queued)) is not None
    # When it is replaced by a symlink to a database outside the roots, then compacted
    queued.unlink()
    queued.symlink_to(fleet.victim)
    before = fingerprint(fleet.victim)
    with caplog.at_level(logging.WARNING, logger=LOGGER), pytest.raises(Refused) as info:
        compactor.compact(str(queued), RecordingContext())
    # Then it is refused as gone, and the outside file's bytes never changed
    assert isinstance(info.value, Gone)
    assert (info.value.path, info.value.reason) == (str(queued), THROUGH_SYMLINK)
    assert str(info.value) == f"refused to open {queued}: {THROUGH_SYMLINK}"
    assert fingerprint(fleet.victim) == before
    assert_logged_once(caplog, queued, THROUGH_SYMLINK)


@pytest.mark.parametrize("roots_given", [True, False], ids=["roots", "no-roots"])
def test_a_directory_swapped_for_a_symlink_is_refused_and_the_outside_file_is_untouched(
    fleet: SimpleNamespace, caplog: pytest.LogCaptureFixture, roots_given: bool
) -> None:
    # Given dbs/tenant/victim.db queued, then dbs/tenant replaced by a symlink to outside/
    tenant = fleet.dbs / "tenant"
    tenant.mkdir()
    queued = tenant / "victim.db"
    make_bloated_db(str(queued))
    compactor = SqliteCompactor(settings(), roots=fleet.roots if roots_given else None)
    queued.unlink()
    tenant.rmdir()
    tenant.symlink_to(fleet.outside, target_is_directory=True)
    before = fingerprint(fleet.victim)
    # When it is compacted: the header read follows a directory symlink, SQLite's open does not
    with caplog.at_level(logging.WARNING, logger=LOGGER), pytest.raises(Refused) as info:
        compactor.compact(str(queued), RecordingContext())
    # Then it is refused (NOFOLLOW applies with or without roots) and nothing outside changed
    assert info.value.reason == THROUGH_SYMLINK
    assert fingerprint(fleet.victim) == before
    assert_logged_once(caplog, queued, THROUGH_SYMLINK)


def test_a_path_outside_the_roots_is_refused_before_any_open(
    fleet: SimpleNamespace, caplog: pytest.LogCaptureFixture
) -> None:
    compactor = SqliteCompactor(settings(), roots=fleet.roots)
    before = fingerprint(fleet.victim)
    with caplog.at_level(logging.WARNING, logger=LOGGER), pytest.raises(Refused) as info:
        compactor.compact(str(fleet.victim), RecordingContext())
    reason = f"outside roots ({fleet.dbs})"
    assert info.value.reason == reason
    assert fingerprint(fleet.victim) == before
    assert_logged_once(caplog, fleet.victim, reason)
    # Before any open: a missing file outside the roots is refused, not found missing (Gone).
    with pytest.raises(Refused):
        compactor.compact(str(fleet.outside / "missing.db"), RecordingContext())
    assert compactor.sizes(str(fleet.victim)) is None


def test_the_roots_check_is_lexical_with_the_separator_and_wants_normalised_paths(tmp_path: Path) -> None:
    data, data2 = tmp_path / "data", tmp_path / "data2"
    data.mkdir()
    data2.mkdir()
    make_bloated_db(str(data2 / "x.db"))
    make_bloated_db(str(data / "x.db"))
    compactor = SqliteCompactor(settings(), roots=[str(data)])
    with pytest.raises(Refused, match=r"outside roots"):  # /data2 is not inside /data
        compactor.compact(str(data2 / "x.db"), RecordingContext())
    sneaky = f"{data}/../data2/x.db"  # inside /data as a string prefix, outside once resolved
    with pytest.raises(Refused) as info:
        compactor.compact(sneaky, RecordingContext())
    assert info.value.reason == NOT_CANONICAL
    for not_canonical in (f"{data}//x.db", f"{data}/./x.db", "relative/x.db"):
        with pytest.raises(Refused) as info:
            open_database(not_canonical, "ro", timeout_s=0.1)
        assert info.value.reason == NOT_CANONICAL
    assert compactor.compact(str(data / "x.db"), RecordingContext()).reclaimed_bytes > 0


@pytest.mark.parametrize(("journal_mode", "side"), [("delete", "-journal"), ("wal", "-wal"), ("wal", "-shm")])
def test_a_side_file_swapped_for_a_symlink_is_never_written_through(
    fleet: SimpleNamespace, journal_mode: str, side: str
) -> None:
    # A side file that is a symlink is refused before the database is opened: blocked (an
    # operator can remove the link; the database itself is still there), never a journal
    # written to, or a "hot journal" replayed from, outside.
    queued = fleet.dbs / "q.db"
    stats = make_bloated_db(str(queued), journal_mode=journal_mode)
    Path(f"{queued}{side}").symlink_to(fleet.victim)
    before = fingerprint(fleet.victim)
    with pytest.raises(Blocked) as info:
        SqliteCompactor(settings(), roots=fleet.roots).compact(str(queued), RecordingContext())
    assert str(info.value) == f"its {side} is a symbolic link"
    assert fingerprint(fleet.victim) == before
    Path(f"{queued}{side}").unlink()
    assert integrity(str(queued)) == "ok" and row_count(str(queued)) == stats["rows"]


def test_no_roots_at_all_refuses_every_path(fleet: SimpleNamespace) -> None:
    # An empty list is not "unrestricted" (that is None): the server refuses every key then too.
    compactor = SqliteCompactor(settings(), roots=[])
    with pytest.raises(Refused) as info:
        compactor.compact(str(fleet.victim), RecordingContext())
    assert info.value.reason == NO_ROOTS


# ---------------------------------------------------------------- the cheap questions


def test_the_questions_about_a_swapped_path_answer_nothing_and_touch_nothing_outside(
    fleet: SimpleNamespace, caplog: pytest.LogCaptureFixture
) -> None:
    # Given an outside database with a big live WAL (held by its application) and an upgrade
    # target it misses, and dbs/q.db and dbs/q.db-wal swapped for symlinks to them
    with ChildConnection(fleet.victim) as app:
        app.execute("PRAGMA wal_autocheckpoint=0")
        app.execute("UPDATE docs SET body = randomblob(1000)")
        queued = fleet.dbs / "q.db"
        queued.symlink_to(fleet.victim)
        Path(f"{queued}-wal").symlink_to(f"{fleet.victim}-wal")
        compactor = SqliteCompactor(settings(page_size=8192), roots=fleet.roots, wal_max_size_bytes=1)
        before = fingerprint(fleet.victim)
        key, cleanup = str(queued), "cleanup:" + str(queued)
        # When smoosh asks about it, then it learns nothing from the outside file
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            assert compactor.sizes(key) is None
            assert compactor.sizes(key, exact=True) is None
            assert compactor.sizes(cleanup) is None
            assert compactor.needs_upgrade(key) is False
            assert compactor.cleanup_priority(cleanup) == 0.0
            assert compactor.read_state(key) is None
            # and a cleanup job (a WAL checkpoint) would not truncate the outside WAL
            with pytest.raises(Refused):
                compactor.compact(cleanup, RecordingContext())
        assert fingerprint(fleet.victim) == before
        assert len(refusals(caplog)) == 7 and all(r.levelno == logging.WARNING for r in refusals(caplog))
    assert integrity(str(fleet.victim)) == "ok"


def test_the_header_read_refuses_a_symlink(fleet: SimpleNamespace) -> None:
    link = fleet.dbs / "link.db"
    link.symlink_to(fleet.victim)
    assert read_state(str(fleet.victim), 0.2) is not None
    with pytest.raises(Refused) as info:
        read_state(str(link), 0.2)
    assert info.value.reason == THROUGH_SYMLINK
    dangling = fleet.dbs / "dangling.db"
    dangling.symlink_to(fleet.outside / "nothing.db")
    with pytest.raises(Refused):
        read_state(str(dangling), 0.2)
    assert not (fleet.outside / "nothing.db").exists()


# ---------------------------------------------------------------- ordinary work goes on


@pytest.mark.parametrize("journal_mode", ["wal", "delete"])
@pytest.mark.parametrize("auto_vacuum", ["none", "incremental"])
def test_an_ordinary_database_inside_the_roots_still_compacts(
    tmp_path: Path, journal_mode: str, auto_vacuum: str
) -> None:
    # The root is named through a symlink: roots are canonicalised, keys are realpaths.
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "rootlink").symlink_to(real, target_is_directory=True)
    path = str(real / "a.db")
    stats = make_bloated_db(path, journal_mode=journal_mode, auto_vacuum=auto_vacuum)
    compactor = SqliteCompactor(settings(), roots=[str(tmp_path / "rootlink")])
    assert compactor.roots == (str(real),)
    ctx = RecordingContext()
    result = compactor.compact(path, ctx)
    after = db_stats(path)
    assert after["freelist_count"] == 0 and after["journal_mode"] == journal_mode
    assert result.reclaimed_bytes > 0.4 * stats["file_bytes"]
    if auto_vacuum == "incremental":
        assert ctx.checkpoints >= stats["freelist_count"] // 50  # chunked, not one VACUUM
    assert integrity(path) == "ok" and row_count(path) == stats["rows"]


def test_roots_change_live_and_load_compactors_passes_them_on(fleet: SimpleNamespace) -> None:
    compactor = load_compactors(settings(), roots=[str(fleet.dbs)])[0]
    assert isinstance(compactor, SqliteCompactor) and compactor.roots == (str(fleet.dbs),)
    assert compactor.sizes(str(fleet.victim)) is None
    compactor.set_roots([str(fleet.dbs), str(fleet.outside)])
    assert compactor.sizes(str(fleet.victim)) is not None
    compactor.set_roots(None)
    assert compactor.roots is None and compactor.sizes(str(fleet.victim)) is not None
    with pytest.raises(ValueError, match="absolute"):
        compactor.set_roots(["relative/dir"])
    with pytest.raises(ValueError, match="sequence"):
        compactor.set_roots(str(fleet.dbs))  # type: ignore[arg-type]


def test_open_database_never_creates_a_file(fleet: SimpleNamespace) -> None:
    missing = fleet.dbs / "missing.db"
    for mode in ("ro", "rw"):
        with pytest.raises(apsw.CantOpenError):
            open_database(str(missing), mode, timeout_s=0.1, roots=fleet.roots)
    assert sorted(os.listdir(fleet.dbs)) == []
