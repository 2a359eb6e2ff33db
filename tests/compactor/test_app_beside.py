"""Issue 46: an application at its defaults beside a compaction waits, and never fails.

Django and SQLAlchemy at their defaults run deferred transactions with a busy timeout: a
transaction that meets another connection's lock at its first read waits in its busy handler;
one that meets it between its read and its write fails at once ("database is locked"). Each
test plays one lock pattern of the application in a process of its own (``ChildConnection``),
stepped statement by statement against a real compaction: nothing here waits on a guess of
how long something takes, except the one branch noted in
``test_an_application_transaction_starting_mid_vacuum_waits_at_its_first_read``, which decides
only what to send next, never whether the test passes.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest

from compactor.contexts import RecordingContext
from compactor.dbfactory import integrity, make_bloated_db, row_count
from helpers.locks import ChildConnection, ChildConnectionError
from smoosh.compactors import Busy, SqliteCompactor, sqlite_compact, sqlite_quiet
from smoosh.compactors.sqlite_openers import AppLook
from smoosh.config import SqliteConfig

#: Longest a stepped test waits for the other side (a hang's bound, never a speed budget).
HANG_S = 60.0
UPDATE = "UPDATE docs SET key = 'app' WHERE id = (SELECT max(id) FROM docs)"


class Compaction:
    """A compaction on a thread of its own, with a signal for each moment it waits on the application."""

    def __init__(self, path: str, monkeypatch: pytest.MonkeyPatch, *, wait_s: float = HANG_S,
                 ctx: RecordingContext | None = None, **settings: Any) -> None:
        # Set once it has found the application in a transaction at three looks in a row: it is
        # waiting for the transaction, not writing beside it.
        self.waiting = threading.Event()
        self.looks: list[AppLook] = []
        real = sqlite_quiet.app_look

        def look(p: str, wal: bool) -> AppLook:
            seen = real(p, wal)
            self.looks.append(seen)
            if len(self.looks) >= 3 and not any(x.quiet for x in self.looks[-3:]):
                self.waiting.set()
            return seen

        monkeypatch.setattr(sqlite_quiet, "app_look", look)
        self.compactor = SqliteCompactor(SqliteConfig(busy_timeout_s=wait_s, **settings))
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(path, ctx or RecordingContext()), daemon=True)
        self.thread.start()

    def _run(self, path: str, ctx: RecordingContext) -> None:
        try:
            self.result = self.compactor.compact(path, ctx)
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            self.error = exc

    def join(self) -> None:
        self.thread.join(HANG_S)
        assert not self.thread.is_alive(), "the compaction did not end"


@pytest.fixture
def rollback_db(tmp_path: Path) -> Iterator[str]:
    path = str(tmp_path / "app.db")
    make_bloated_db(path, journal_mode="delete")
    yield path


@pytest.mark.parametrize("auto_vacuum", ["none", "incremental"])
def test_a_transaction_between_its_read_and_its_write_is_never_caught_by_a_compaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, auto_vacuum: str
) -> None:
    # Given a rollback-journal database (SQLite's default, what Django starts with), and the
    # application in a deferred transaction that has read and not yet written
    path = str(tmp_path / "app.db")
    rows = make_bloated_db(path, journal_mode="delete", auto_vacuum=auto_vacuum)["rows"]
    with ChildConnection(path) as app:
        app.execute("BEGIN")
        app.execute("SELECT count(*) FROM docs")
        # When a compaction starts meanwhile
        compaction = Compaction(path, monkeypatch)
        assert compaction.waiting.wait(HANG_S)
        # Then it takes no lock while the transaction is open: the application's write and its
        # commit go through (an ordinary write lock, BEGIN IMMEDIATE, would fail them at once)
        app.execute(UPDATE)
        app.execute("COMMIT")
        compaction.join()
    # And the compaction ran once the application was quiet
    assert compaction.error is None and compaction.result.reclaimed_bytes > 0
    assert compaction.compactor.application()["waits"] >= 1
    assert (integrity(path), row_count(path)) == ("ok", rows)


def test_an_application_transaction_starting_mid_vacuum_waits_at_its_first_read(
    rollback_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a VACUUM under way (held at its first progress tick)
    at_tick, go_on = threading.Event(), threading.Event()

    class Held(RecordingContext):
        def progress(self, fraction: float) -> None:
            super().progress(fraction)
            if 0 < fraction < 1 and not at_tick.is_set():
                at_tick.set()
                go_on.wait(HANG_S)

    with ChildConnection(rollback_db) as app:
        compaction = Compaction(rollback_db, monkeypatch, ctx=Held())
        assert at_tick.wait(HANG_S)
        # When the application starts a read-then-write transaction
        app.execute("BEGIN")
        app.send("SELECT count(*) FROM docs")
        # Then its read waits in its busy handler (the compaction holds the database exclusively),
        # and nothing it does fails. (The branch only chooses what to send: were the read not
        # held, the write is sent while the VACUUM still holds its lock, and must not fail either.)
        if app.replied(0.2):
            app.reply()
            app.execute(UPDATE)
            go_on.set()
        else:
            go_on.set()
            app.reply()
            app.execute(UPDATE)
        app.execute("COMMIT")
        compaction.join()
    assert compaction.error is None and compaction.result.reclaimed_bytes > 0
    assert integrity(rollback_db) == "ok"


@pytest.mark.parametrize("settings", [{}, {"auto_vacuum": "incremental"}, {"analyze": True}],
                         ids=["vacuum", "upgrade", "vacuum-then-statistics"])
def test_the_lock_taken_at_a_quiet_moment_is_held_into_the_vacuum_and_let_go_by_its_end(
    rollback_db: str, monkeypatch: pytest.MonkeyPatch, settings: dict[str, Any]
) -> None:
    # Given another process that asks for the database's lock without waiting (busy timeout 0),
    # at the moment the compaction's VACUUM statement is about to run
    rows = row_count(rollback_db)
    held_at_vacuum: list[bool] = []  # at the VACUUM, and at the statistics
    with ChildConnection(rollback_db, timeout_s=0) as app:
        real_run = sqlite_compact.run

        def run(conn: Any, sql: str) -> None:
            if sql == "VACUUM" or sql.startswith("PRAGMA optimize"):
                try:
                    app.execute("SELECT count(*) FROM docs")
                    held_at_vacuum.append(False)
                except ChildConnectionError as exc:
                    held_at_vacuum.append("locked" in str(exc))
            real_run(conn, sql)

        monkeypatch.setattr(sqlite_compact, "run", run)
        # When a compaction runs
        compaction = Compaction(rollback_db, monkeypatch, **settings)
        compaction.join()
        # Then the lock it took at a quiet moment was still its own when the VACUUM started
        # (any statement that reads the database between the two would have let it go), and
        # when the statistics were taken after it,
        assert compaction.error is None and compaction.result.reclaimed_bytes > 0
        assert held_at_vacuum == [True] * (2 if settings.get("analyze") else 1)
        # and the compaction's end let it go and deleted its journal (the VACUUM's, or after the
        # statistics taken under the same lock): the application writes at once
        assert not os.path.exists(rollback_db + "-journal")
        app.execute("BEGIN IMMEDIATE")
        app.execute(UPDATE)
        app.execute("COMMIT")
    assert (integrity(rollback_db), row_count(rollback_db)) == ("ok", rows)


def test_a_reader_that_never_ends_makes_the_compaction_busy_naming_it(
    rollback_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ChildConnection(rollback_db) as app:
        app.execute("BEGIN")
        app.execute("SELECT count(*) FROM docs")
        # the compaction waits a short while (an application transaction lasts milliseconds)
        compaction = Compaction(rollback_db, monkeypatch, wait_s=0.3)
        compaction.join()
        assert isinstance(compaction.error, Busy)
        assert f"pid {app.proc.pid} " in str(compaction.error) and "in a read transaction" in str(compaction.error)
        app.execute(UPDATE)  # the application's own transaction is untouched
        app.execute("COMMIT")
    assert compaction.compactor.application()["gave_up"] == 1


def test_an_application_holding_the_database_exclusively_is_named(
    rollback_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 45's smaller point: an application in locking_mode = EXCLUSIVE keeps its lock
    with ChildConnection(rollback_db) as app:
        app.execute("PRAGMA locking_mode = EXCLUSIVE")
        app.execute(UPDATE)  # its first write takes the exclusive lock, kept from then on
        compaction = Compaction(rollback_db, monkeypatch, wait_s=0.3)
        compaction.join()
    assert isinstance(compaction.error, Busy)
    assert f"pid {compaction.looks[-1].writers[0]} " in str(compaction.error) and "writing" in str(compaction.error)


def test_a_wal_readers_snapshot_is_not_made_stale_by_a_compaction(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a WAL database and the application inside a read transaction that will write
    path = str(tmp_path / "wal.db")
    rows = make_bloated_db(path, journal_mode="wal")["rows"]
    with ChildConnection(path) as app:
        app.execute("BEGIN")
        app.execute("SELECT count(*) FROM docs")
        # When a compaction starts
        compaction = Compaction(path, monkeypatch)
        assert compaction.waiting.wait(HANG_S)
        # Then it commits nothing before the transaction ends: its snapshot stays current, so
        # its write goes through (after a commit of smoosh's it would fail: SQLITE_BUSY_SNAPSHOT)
        app.execute(UPDATE)
        app.execute("COMMIT")
        compaction.join()
    assert compaction.error is None and compaction.result.reclaimed_bytes > 0
    assert (integrity(path), row_count(path)) == ("ok", rows)


def test_a_long_wal_reader_does_not_stop_the_compaction(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A report or a backup reading for longer than the wait is no transaction about to write:
    # the compaction goes on beside it (and says the log is pinned, as before).
    path = str(tmp_path / "wal.db")
    make_bloated_db(path, journal_mode="wal")
    with ChildConnection(path) as app:
        app.execute("BEGIN")
        app.execute("SELECT count(*) FROM docs")
        compaction = Compaction(path, monkeypatch, wait_s=0.3)
        compaction.join()
        assert not isinstance(compaction.error, Busy)
        app.execute("COMMIT")
    assert compaction.compactor.application()["gave_up"] == 0
