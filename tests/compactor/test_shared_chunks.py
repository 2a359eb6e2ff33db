"""Incremental chunks give the lock away while another process has the database open.

A writer waiting for the lock sleeps in its busy handler and wakes at moments of its own;
1000-page chunks run back to back left it almost no chance to find the lock free (what it
cost the writer is in bench/RESULTS.md, from ``bench/writer.py``). While another
process has the database open, each chunk is sized to hold the lock about
``SHARED_CHUNK_LOCK_MAX_S`` and is followed by a gap several times as long.
"""

from __future__ import annotations

import math
import os
import time

import pytest

import smoosh.compactors.sqlite_incremental as sqlite_incremental
from compactor.contexts import RecordingContext
from compactor.dbfactory import db_stats, make_bloated_db
from compactor.test_sqlite_compactor import settings
from helpers.clocks import FakeClock
from helpers.locks import ChildConnection
from smoosh.compactors import SqliteCompactor
from smoosh.compactors.sqlite_incremental import last_write_age, yield_to_writer


def test_alone_the_chunks_keep_their_size_and_run_back_to_back(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "alone.db")
    stats = make_bloated_db(path, auto_vacuum="incremental", journal_mode="wal")
    slept: list[float] = []
    ctx = RecordingContext(on_pause=slept.append)
    SqliteCompactor(settings(incremental_chunk_pages=100)).compact(path, ctx)
    assert db_stats(path)["freelist_count"] == 0
    assert ctx.checkpoints == math.ceil(stats["freelist_count"] / 100)
    assert slept == []


def test_beside_an_application_the_chunks_shrink_to_the_lock_budget_and_leave_gaps(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "shared.db")
    stats = make_bloated_db(path, auto_vacuum="incremental", journal_mode="wal")
    # A budget no chunk of 100 pages can keep, whatever the disk: chunks shrink to a page or so.
    monkeypatch.setattr(sqlite_incremental, "SHARED_CHUNK_LOCK_MAX_S", 1e-6)
    slept: list[float] = []
    with ChildConnection(path) as app:  # the application: a WAL connection in another process
        app.execute("SELECT count(*) FROM docs")
        ctx = RecordingContext(on_pause=slept.append)
        SqliteCompactor(settings(incremental_chunk_pages=100)).compact(path, ctx)
        # Its writes still go through between (and after) the chunks
        app.execute("INSERT INTO docs (key, body) VALUES ('app', x'00')")
    assert db_stats(path)["freelist_count"] == 0
    assert ctx.checkpoints > 3 * math.ceil(stats["freelist_count"] / 100)
    # A gap after every chunk but the last, SHARED_CHUNK_GAP_FACTOR times the chunk's hold
    assert len(slept) == ctx.checkpoints - 1
    assert all(s > 0 for s in slept)


def test_the_gap_after_a_shared_chunk_is_the_budgets_pace_times_the_chunks_hold(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The daemon's backlog controller sets the pace on the process's I/O budget; a chunk
    # reads it before each gap, so a change reaches a compaction that is already running.
    from smoosh.io_budget import IoBudget

    path = str(tmp_path / "paced.db")
    make_bloated_db(path, auto_vacuum="incremental", journal_mode="wal")
    monkeypatch.setattr(sqlite_incremental, "SHARED_CHUNK_LOCK_MAX_S", 1e-6)
    budget = IoBudget()
    budget.set_chunk_gap_factor(10.0)
    held: list[float] = []
    real_chunk = sqlite_incremental._chunk

    def chunk(*args: object) -> object:
        done = real_chunk(*args)  # type: ignore[arg-type]
        if done is not None:
            held.append(done[2])  # the seconds it held the lock
        return done

    slept: list[float] = []

    def pause(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 3:
            budget.set_chunk_gap_factor(1000.0)  # the controller saw harm mid-compaction

    monkeypatch.setattr(sqlite_incremental, "_chunk", chunk)
    with ChildConnection(path) as app:
        app.execute("SELECT count(*) FROM docs")
        compactor = SqliteCompactor(settings(incremental_chunk_pages=100))
        compactor.set_io_budget(budget)
        compactor.compact(path, RecordingContext(on_pause=pause))
    assert db_stats(path)["freelist_count"] == 0
    assert len(slept) == len(held) - 1 > 3
    assert slept[:3] == pytest.approx([10.0 * h for h in held[:3]])
    # From the fourth gap on, the new pace, bounded by the longest gap a stop may wait out
    cap = sqlite_incremental.MAX_CHUNK_GAP_S
    assert slept[3:] == pytest.approx([min(cap, 1000.0 * h) for h in held[3:-1]])


def test_a_chunk_that_finds_the_application_holding_the_write_lock_notes_a_lock_wait_on_the_budget(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The backlog controller reads these waits as harm (the application was writing when
    # smoosh wanted the lock) and slows the pace.
    import threading

    from helpers.daemon import HANG_S
    from smoosh.io_budget import IoBudget

    path = str(tmp_path / "contended.db")
    make_bloated_db(path, auto_vacuum="incremental", journal_mode="wal")
    from smoosh.compactors import sqlite_quiet

    asked = threading.Event()
    real_look = sqlite_quiet.app_look

    def look(path: str, wal: bool):  # type: ignore[no-untyped-def]
        seen = real_look(path, wal)
        if seen.writers:
            asked.set()  # the chunk wants the lock, and waits for the application's write to end
        return seen

    monkeypatch.setattr(sqlite_quiet, "app_look", look)
    budget = IoBudget()
    errors: list[BaseException] = []
    with ChildConnection(path) as app:
        app.execute("BEGIN IMMEDIATE")  # the application is in the middle of a write
        compactor = SqliteCompactor(settings(incremental_chunk_pages=100, busy_timeout_s=HANG_S))
        compactor.set_io_budget(budget)

        def compact() -> None:
            try:
                compactor.compact(path, RecordingContext())
            except BaseException as exc:  # reported below
                errors.append(exc)

        thread = threading.Thread(target=compact)
        thread.start()
        assert asked.wait(HANG_S)
        # The chunk wants the lock the application holds: it waits for a quiet moment, which
        # cannot come before the COMMIT below, so it waits at least this long, however slow the machine.
        time.sleep(2 * sqlite_incremental.LOCK_WAIT_HARM_S)
        app.execute("COMMIT")
        thread.join(HANG_S)
    assert not thread.is_alive() and errors == []
    assert db_stats(path)["freelist_count"] == 0
    assert budget.lock_waits == 1  # the first chunk waited; the others found the lock free


class SteppedPause:
    """A pause that moves an injected clock by what it is asked (or by nothing: a stopped context)."""

    def __init__(self, clock: FakeClock, *, stopped: bool = False) -> None:
        self.clock, self.stopped = clock, stopped
        self.asked: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.asked.append(seconds)
        if not self.stopped:
            self.clock.advance(seconds)


def test_a_chunk_yields_to_a_write_seen_just_now_until_it_is_old_enough() -> None:
    clock = FakeClock(0.0)
    written_at = -0.001  # the application committed a millisecond ago
    pause = SteppedPause(clock)
    waited = yield_to_writer(lambda: clock() - written_at, pause, clock=clock, recent_s=0.003, max_s=0.05)
    assert pause.asked == [pytest.approx(0.002)]
    assert waited == pytest.approx(0.002)


def test_a_writer_that_never_pauses_holds_a_chunk_back_no_longer_than_the_bound() -> None:
    clock = FakeClock(0.0)
    pause = SteppedPause(clock)
    waited = yield_to_writer(lambda: 0.0, pause, clock=clock, recent_s=0.003, max_s=0.05)  # always writing
    assert waited == pytest.approx(0.05)
    assert sum(pause.asked) == pytest.approx(0.05)


def test_no_recent_write_or_an_unknown_one_costs_no_wait() -> None:
    clock = FakeClock(0.0)
    pause = SteppedPause(clock)
    assert yield_to_writer(lambda: 1.0, pause, clock=clock, recent_s=0.003, max_s=0.05) == 0.0
    assert yield_to_writer(lambda: None, pause, clock=clock, recent_s=0.003, max_s=0.05) == 0.0
    assert pause.asked == []


def test_a_stop_that_ends_the_pause_ends_the_yield_at_once() -> None:
    clock = FakeClock(0.0)
    pause = SteppedPause(clock, stopped=True)  # ctx.pause returns at once once stopped or held
    yield_to_writer(lambda: 0.0, pause, clock=clock, recent_s=0.003, max_s=0.05)
    assert len(pause.asked) == 1


def test_a_real_writers_commit_is_seen_and_the_compactions_own_write_is_not(tmp_path) -> None:
    path = str(tmp_path / "app.db")
    make_bloated_db(path, auto_vacuum="incremental", journal_mode="wal")
    old = time.time() - 3600
    for name in (path, path + "-wal"):
        if os.path.exists(name):
            os.utime(name, (old, old))
    assert last_write_age(path) == pytest.approx(3600, abs=60)  # nobody wrote for an hour
    own = time.time_ns()
    with ChildConnection(path) as app:  # the application, in a process of its own, commits
        app.execute("INSERT INTO docs (key, body) VALUES ('app', x'00')")
        seen = last_write_age(path, own)
        assert seen is not None and seen < 3600
        clock = FakeClock(0.0)
        pause = SteppedPause(clock)
        yield_to_writer(lambda: last_write_age(path, own), pause, clock=clock, recent_s=3600, max_s=0.05)
        assert pause.asked  # seen as recent: the chunk waited
        # What this process writes after that commit is its own: no wait for it
        assert last_write_age(path, time.time_ns() + 10**9) is None


def test_beside_a_writer_that_never_pauses_the_compaction_yields_before_each_chunk_and_still_ends(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "busy.db")
    make_bloated_db(path, auto_vacuum="incremental", journal_mode="wal")
    monkeypatch.setattr(sqlite_incremental, "last_write_age", lambda *a: 0.0)  # a write seen just now, always
    slept: list[float] = []
    with ChildConnection(path) as app:
        app.execute("SELECT count(*) FROM docs")
        ctx = RecordingContext(on_pause=slept.append)
        SqliteCompactor(settings(incremental_chunk_pages=100)).compact(path, ctx)
    assert db_stats(path)["freelist_count"] == 0  # never starved
    # A wait before every chunk (this pause returns at once, so each wait asks again until its
    # bound: the bound itself is stepped on an injected clock above)
    yields = [s for s in slept if 0 < s <= sqlite_incremental.YIELD_RECENT_S]
    assert len(yields) >= ctx.checkpoints
