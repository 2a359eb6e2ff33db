"""A full VACUUM gives up before an application's writers would: ``[smoosh.sqlite] max_lock_hold``.

One VACUUM statement holds the write lock from start to end; an application writer waits in its
own busy handler, invisible to smoosh, and fails at its busy timeout. Where another process has
the WAL database open (its lock on the ``-shm`` file, in ``/proc/locks``), the VACUUM is rolled
back as soon as it could no longer end within ``max_lock_hold`` of taking the lock, and the
database is reported busy. Its last phase (the copy back over the file) never calls out, so the
ticking phase gets ``max_lock_hold / (1 + copy_back_ratio)`` (2.0 until VACUUMs have finished).
The compactor's clock is injected: here each reading moves it on, so the limit is reached after
a known number of progress ticks, without sleeping.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from compactor.contexts import RecordingContext
from compactor.dbfactory import db_stats, integrity, make_bloated_db, row_count
from helpers.locks import ChildConnection
from smoosh.compactors import Busy, SqliteCompactor
from smoosh.compactors.sqlite_openers import others_have_open
from smoosh.compactors.sqlite_open import open_database

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/locks is Linux only")


class SteppingClock:
    """A monotonic clock that moves ``step_s`` at every reading (a VACUUM reads it once per progress tick)."""

    def __init__(self, step_s: float) -> None:
        self.now = 0.0
        self.step_s = step_s

    def __call__(self) -> float:
        self.now += self.step_s
        return self.now


def compactor(max_lock_hold_s: float, clock: SteppingClock) -> SqliteCompactor:
    settings = SimpleNamespace(page_size=None, auto_vacuum=None, incremental_chunk_pages=1000, busy_timeout_s=1.0,
                               max_lock_hold_s=max_lock_hold_s)
    return SqliteCompactor(settings, clock=clock)


@pytest.fixture
def db(tmp_path: Path) -> str:
    path = str(tmp_path / "app.db")
    make_bloated_db(path, rows=8000, journal_mode="wal")  # a VACUUM of well over 5 progress ticks
    return path


def test_a_vacuum_of_a_database_another_process_has_open_gives_up_at_max_lock_hold(db: str) -> None:
    # Given an application process holding the WAL database open (idle, between transactions)
    before = db_stats(db)
    rows = row_count(db)
    with ChildConnection(db) as app:
        app.execute("SELECT count(*) FROM docs")
        # When smoosh VACUUMs it with max_lock_hold = 1 s and a clock moving 0.1 s per tick
        ctx = RecordingContext()
        with pytest.raises(Busy) as caught:
            compactor(1.0, SteppingClock(0.1)).compact(db, ctx)
        # Then it gave up at the first tick 1 / (1 + 2.0) s after the first one: the 5th
        assert len(ctx.fractions) == 5
        # ... saying why and what the operator can do, and the application writes at once
        assert str(caught.value) == (
            f"{db} is open in another process and its VACUUM would hold the write lock longer than "
            "max_lock_hold (1s): rolled back before its writers' busy timeout (give it a window when the "
            "application is closed, raise [smoosh.sqlite] max_lock_hold, or use auto_vacuum = INCREMENTAL)"
        )
        app.execute("INSERT INTO docs (key, body) VALUES ('k', x'00')")
    # ... and the VACUUM was rolled back: nothing reclaimed, nothing lost
    assert db_stats(db)["page_count"] == before["page_count"] and row_count(db) == rows + 1
    assert integrity(db) == "ok"


def test_with_no_other_process_the_vacuum_runs_to_its_end_however_long(db: str) -> None:
    before = db_stats(db)["file_bytes"]
    result = compactor(1.0, SteppingClock(0.5)).compact(db, RecordingContext())
    assert result.size_after_bytes < before and integrity(db) == "ok"


def test_max_lock_hold_zero_means_no_limit(db: str) -> None:
    with ChildConnection(db) as app:
        app.execute("SELECT count(*) FROM docs")
        result = compactor(0.0, SteppingClock(0.5)).compact(db, RecordingContext())
    assert result.reclaimed_bytes > 0 and integrity(db) == "ok"


def test_others_have_open_sees_other_processes_only_and_never_drops_our_own_locks(db: str, tmp_path: Path) -> None:
    own = open_database(db, "rw", timeout_s=1.0)
    try:
        own.execute("SELECT count(*) FROM docs").fetchall()  # this process maps the -shm: its own lock
        assert others_have_open(db) is False
        with ChildConnection(db) as app:
            app.execute("SELECT count(*) FROM docs")
            assert others_have_open(db) is True
        assert others_have_open(db) is False
        # The check reads /proc/locks and never opens the -shm file: closing a descriptor of
        # it would have dropped this process's own lock, which the kernel still lists.
        st = os.stat(db + "-shm")
        inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        with open("/proc/locks") as f:
            mine = [line for line in f if inode in line and line.split()[4] == str(os.getpid())]
        assert mine
    finally:
        own.close()
    rollback = str(tmp_path / "rollback.db")
    make_bloated_db(rollback, rows=10, journal_mode="delete")
    assert others_have_open(rollback) is None  # an idle rollback-journal connection leaves no trace


class StoppedOnceClock:
    """A monotonic clock that jumps ``stop_s`` once, at its ``at``-th reading: smoosh SIGSTOPped
    mid-VACUUM (the monotonic clock runs on while a process is stopped)."""

    def __init__(self, at: int, stop_s: float) -> None:
        self.readings = 0
        self.at, self.stop_s = at, stop_s
        self.now = 0.0

    def __call__(self) -> float:
        self.readings += 1
        self.now += 0.0001 + (self.stop_s if self.readings == self.at else 0.0)
        return self.now


@pytest.mark.parametrize("journal_mode", ["delete", "wal"])
def test_a_vacuum_resumed_after_a_stop_gives_up_its_lock_at_once_and_says_why(
    tmp_path: Path, journal_mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Rollback mode too: nothing tells whether an application has the file open there, but a
    # minute of every writer blocked is worth ending either way.
    path = str(tmp_path / "app.db")
    make_bloated_db(path, rows=8000, journal_mode=journal_mode)
    before, rows = db_stats(path), row_count(path)
    clock = StoppedOnceClock(at=3, stop_s=60.0)
    with caplog.at_level("WARNING", logger="smoosh.compactors.sqlite_compact"):
        with pytest.raises(Busy) as info:
            compactor(0.0, clock).compact(path, RecordingContext())  # no max_lock_hold at all
    assert str(info.value) == f"{path}: smoosh was stopped for 60.0 s mid-VACUUM, holding its write lock; rolled back"
    assert [r.getMessage() for r in caplog.records] == [
        f"smoosh was stopped or starved for 60.0 s while its VACUUM of {path!r} held the database's write lock "
        "(SIGSTOP, a freezer, a debugger or a paused VM?); the VACUUM gave up and rolled back so the application's "
        "writers can go on."
    ]
    assert db_stats(path)["page_count"] == before["page_count"]  # rolled back
    assert integrity(path) == "ok" and row_count(path) == rows


def test_a_heartbeat_that_wakes_late_says_the_process_was_stopped_and_what_ran(caplog: pytest.LogCaptureFixture) -> None:
    # Any phase, the silent copy back of a VACUUM and an incremental chunk included: the worker's
    # heartbeat thread sleeps between heartbeats, and only a stopped process wakes it late.
    import threading

    from smoosh.daemon.run.heartbeat import STALLED_S, Heartbeat

    running = [SimpleNamespace(key="/srv/dbs/a.db"), SimpleNamespace(key="/srv/dbs/b.db")]
    beat = Heartbeat(threading.RLock(), runs=lambda: running, stopping=lambda: False, jobs=None, store=None,
                     node="n", job_type="smoosh:n", signals="direct", job_timeout_s=lambda: 30.0, hold_poll_s=1.0,
                     clock=lambda: 0.0)
    with caplog.at_level("WARNING", logger="smoosh.daemon.run.worker"):
        beat.woke(100.0, 100.0 + STALLED_S / 2)  # a busy machine: not a stop
        beat.woke(100.0, 162.5)  # SIGSTOP for a minute, then SIGCONT
    assert [r.getMessage() for r in caplog.records] == [
        "smoosh was stopped or starved for 62.5 s (SIGSTOP, a freezer, a debugger or a paused VM?) while it "
        "compacted '/srv/dbs/a.db', '/srv/dbs/b.db'; a compaction holding a database's write lock kept the "
        "application's writers waiting that long (under systemd, WatchdogSec= ends such a stop)."
    ]
