"""Issue 45: a database still being copied under its final name is not compacted, and is never called corrupt.

The trial of the issue: a slow copy of a healthy database under its final name was examined
mid-copy, compacted, and reported ``CorruptError: database disk image is malformed``. Here the
copy is a real process writing a real database a piece at a time (``helpers.slow_copy``),
stepped by the test; the compactor is the daemon's.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import apsw
import pytest

from compactor.contexts import RecordingContext
from compactor.dbfactory import integrity, make_bloated_db, make_corrupt_db, row_count
from helpers.slow_copy import SlowCopy
from smoosh.compactors import Busy, SqliteCompactor
from smoosh.compactors.sqlite_open import open_database
from smoosh.paths import NAME_MAX_BYTES, SQLITE_MAX_PATH_BYTES, name_refusal

LOGGER = "smoosh.compactors.sqlite_file"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_database_still_being_copied_waits_until_it_is_whole(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    src, dst = tmp_path / "src.db", tmp_path / "tenant.db"
    stats = make_bloated_db(str(src), journal_mode="delete")
    compactor = SqliteCompactor()
    copy = SlowCopy(str(src), str(dst), 4)
    try:
        # Given a copy a quarter done: the header (written first) promises four times the file
        copy.step()
        caplog.set_level(logging.INFO, logger=LOGGER)
        # When the examination looks at it, twice, and a compaction is started on it all the same
        looks = [compactor.look(str(dst), strict=False) for _ in range(2)]
        assert compactor.sizes(str(dst)) is None
        before = digest(dst)
        with pytest.raises(Busy) as info:
            compactor.compact(str(dst), RecordingContext())
        # Then it is not a database to measure yet, the compaction did not touch it, and it is
        # said once, with both sizes, as a copy not finished: never as corrupt
        expected = (f"shorter than its header says ({stats['file_bytes'] // 4} of {stats['file_bytes']} bytes) with no "
                    "SQLite journal beside it: still being copied (or cut short)? It is compacted once it is whole")
        assert [look.problem for look in looks] == [expected, expected]
        assert str(info.value) == f"{dst} is {expected}"
        assert digest(dst) == before
        lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
        assert lines == [f"Not examining {str(dst)!r} yet: {expected}."]
        # When the copy is done
        copy.finish()
    finally:
        copy.close()
    # Then it is examined and compacted like any database, whole
    assert compactor.look(str(dst), strict=False).problem is None
    result = compactor.compact(str(dst), RecordingContext())
    assert result.reclaimed_bytes > 0
    assert integrity(str(dst)) == "ok" and row_count(str(dst)) == stats["rows"]


def test_a_copy_over_a_database_mid_vacuum_is_reported_busy_and_the_copy_arrives_whole(tmp_path: Path) -> None:
    # A compaction starts on a whole database; a copy of another one is started over it (``cp``
    # cuts the file, then writes the header first) as the VACUUM reads it.
    src, dst = tmp_path / "new.db", tmp_path / "tenant.db"
    make_bloated_db(str(src), journal_mode="delete", rows=4000)
    make_bloated_db(str(dst), journal_mode="delete")
    copies: list[SlowCopy] = []

    class CopyStartsMidVacuum(RecordingContext):
        def progress(self, fraction: float) -> None:
            super().progress(fraction)
            if not copies:
                copies.append(SlowCopy(str(src), str(dst), 4))
                copies[0].step()

    try:
        with pytest.raises(Busy) as info:
            SqliteCompactor().compact(str(dst), CopyStartsMidVacuum())
        # SQLite read the copy's bytes and called them malformed; smoosh says what happened
        assert isinstance(info.value.__cause__, apsw.CorruptError)
        assert str(info.value).startswith(f"{dst} is shorter than its header says (")
        assert "written outside SQLite's locks while it was compacted (still being copied?)" in str(info.value)
        copies[0].finish()
    finally:
        for copy in copies:
            copy.close()
    # And the rolled-back VACUUM cost the copy nothing
    assert digest(dst) == digest(src)
    assert integrity(str(dst)) == "ok"


def test_a_damaged_database_is_still_reported_as_damaged(tmp_path: Path) -> None:
    db = tmp_path / "damaged.db"
    make_corrupt_db(str(db))
    with pytest.raises(apsw.CorruptError):
        SqliteCompactor().compact(str(db), RecordingContext())


def test_sqlite_opens_a_path_exactly_as_long_as_the_key_check_allows_and_no_longer(tmp_path: Path) -> None:
    # The limits name_refusal states are SQLite's own: the longest path and the longest name
    # SQLite can open with its journal compact; one byte more and SQLite cannot open them.
    base = str(tmp_path)
    while len(base) < SQLITE_MAX_PATH_BYTES - 80:
        base = os.path.join(base, "d" * 20)
    os.makedirs(base)
    longest = os.path.join(base, "x" * (SQLITE_MAX_PATH_BYTES - len("-journal") - len(base) - 1))
    assert len(longest) == SQLITE_MAX_PATH_BYTES - len("-journal") and name_refusal(longest) is None
    make_bloated_db(longest, journal_mode="delete")
    assert SqliteCompactor().compact(longest, RecordingContext()).reclaimed_bytes > 0
    os.rename(longest, longest + "x")
    assert name_refusal(longest + "x") is not None
    with pytest.raises(apsw.CantOpenError):
        open_database(longest + "x", "rw", timeout_s=0.0).execute("BEGIN IMMEDIATE; DELETE FROM docs; COMMIT")

    name = tmp_path / ("n" * (NAME_MAX_BYTES - len("-journal")))
    make_bloated_db(str(name), journal_mode="delete")
    assert name_refusal(str(name)) is None
    assert SqliteCompactor().compact(str(name), RecordingContext()).reclaimed_bytes > 0
    longer = tmp_path / (name.name + "n")
    os.rename(name, longer)
    assert name_refusal(str(longer)) is not None
    with pytest.raises(apsw.CantOpenError):
        open_database(str(longer), "rw", timeout_s=0.0).execute("BEGIN IMMEDIATE; DELETE FROM docs; COMMIT")
