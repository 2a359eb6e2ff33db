"""A database renamed over while it is compacted: interrupted, rolled back, the new file checked (issue 18).

The rename happens inside the compaction, from its own progress or chunk callback, so it
lands at a known moment: during a VACUUM's build phase, or between two incremental chunks.
The application is a real connection in another process that opens the new file right after
the rename and writes to it during and after the compaction; what the README promises is
then checked: the compaction ends ``replaced`` at once, no journal of smoosh's is left beside
the new file, the application's rows are all there and the new file passes integrity_check.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from compactor.contexts import RecordingContext
from compactor.dbfactory import integrity, make_bloated_db, row_count
from helpers.locks import ChildConnection
from smoosh.compactors import Replaced, SqliteCompactor
from smoosh.compactors.sqlite_compact import REPLACEMENT_CHECK_TICKS
from smoosh.config.sections import SqliteConfig

WRITE = "INSERT INTO docs (key, body) VALUES ('app', randomblob(100))"


def digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


class RenamingContext(RecordingContext):
    """Renames ``new`` over ``path`` at the first progress report, then has the application write to it."""

    def __init__(self, path: str, new: str) -> None:
        super().__init__()
        self.path = path
        self.new = new
        self.app: ChildConnection | None = None
        self.reports_at_rename = -1

    def progress(self, fraction: float) -> None:
        super().progress(fraction)
        if self.app is None and fraction > 0:
            os.replace(self.new, self.path)
            self.reports_at_rename = len(self.fractions)
            self.app = ChildConnection(self.path)
            self.app.execute(WRITE)


def test_a_database_renamed_over_mid_vacuum_is_reported_replaced_and_the_new_file_stays_whole(tmp_path: Path) -> None:
    # Given a bloated rollback-journal database, and a compact one about to be renamed over it
    path = str(tmp_path / "app.db")
    new = str(tmp_path / "new.db")
    make_bloated_db(path, rows=3000, delete_fraction=0.6, journal_mode="delete")
    make_bloated_db(new, rows=50, delete_fraction=0.0, journal_mode="delete")
    ctx = RenamingContext(path, new)
    try:
        # When the rename lands during the VACUUM, and the application opens and writes the new file
        with pytest.raises(Replaced) as caught:
            SqliteCompactor(SqliteConfig(busy_timeout_s=1.0)).compact(path, ctx)
        # Then the VACUUM was interrupted within a few progress ticks and rolled back
        assert ctx.app is not None
        assert len(ctx.fractions) - ctx.reports_at_rename <= REPLACEMENT_CHECK_TICKS
        err = caught.value
        assert err.rolled_back and err.integrity == "ok"
        assert str(err) == (
            f"{path} was replaced (renamed over) while it was being compacted: the compaction was interrupted"
            " and rolled back; the new file is intact (integrity_check: ok)"
        )
        # And no journal of smoosh's sits beside the new file
        assert not os.path.exists(path + "-journal")
        # And the application goes on writing to the new file, which stays whole
        for _ in range(10):
            ctx.app.execute(WRITE)
    finally:
        if ctx.app is not None:
            ctx.app.close()
    assert integrity(path) == "ok"
    assert row_count(path) == 50 + 11


def test_a_database_renamed_over_between_incremental_chunks_is_left_untouched(tmp_path: Path) -> None:
    # Given an incremental database compacted one page per chunk
    path = str(tmp_path / "inc.db")
    new = str(tmp_path / "new.db")
    make_bloated_db(path, rows=3000, delete_fraction=0.8, journal_mode="delete", auto_vacuum="incremental")
    make_bloated_db(new, rows=50, delete_fraction=0.0, journal_mode="delete")
    new_digest = digest(new)

    def rename_before_third_chunk(n: int) -> None:
        if n == 3:
            os.replace(new, path)

    # When another file is renamed over it between two chunks
    with pytest.raises(Replaced) as caught:
        SqliteCompactor(SqliteConfig(incremental_chunk_pages=1)).compact(path, RecordingContext(rename_before_third_chunk))
    # Then no further chunk ran: the new file is byte for byte what was renamed in, and whole
    assert caught.value.rolled_back and caught.value.integrity == "ok"
    assert digest(path) == new_digest
    assert not os.path.exists(path + "-journal")
    assert integrity(path) == "ok"


def test_the_verdict_on_the_new_file_says_plainly_whether_it_is_corrupt(tmp_path: Path) -> None:
    # The ERROR line used to carry SQLite's header "*** in database main ***" and nothing else.
    from smoosh.compactors.sqlite_identity import replaced_error

    path = str(tmp_path / "db.db")
    make_bloated_db(path, rows=2000, delete_fraction=0.0, journal_mode="delete")
    intact = replaced_error(path, None, 1.0, rolled_back=True)
    assert str(intact).endswith("; the new file is intact (integrity_check: ok)")
    with open(path, "r+b") as f:  # scribble over an interior page of the table's b-tree
        f.seek(4096 * 3)
        f.write(b"\xff" * 4096)
    corrupt = replaced_error(path, None, 1.0, rolled_back=True)
    assert corrupt.integrity not in ("ok", None) and "*** in database" not in corrupt.integrity
    assert str(corrupt).endswith(f"; the new file is CORRUPT (integrity_check: {corrupt.integrity})")
    os.remove(path)
    gone = replaced_error(path, None, 1.0, rolled_back=False)
    assert "; the new file could not be checked (" in str(gone)
