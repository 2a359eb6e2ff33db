"""Incremental chunks paced by the I/O budget: the real SQLite compactor, the worker's JobContext, a stepped clock.

With ``max_io_rate = R`` and chunks of ``C`` pages, each chunk is charged ``C * page_size``
bytes as it commits, and the next one starts at the clock time that debt is paid: never
earlier, and with the clock stepped to that moment, at once.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any, Callable

import pytest

from compactor.dbfactory import db_stats, integrity, make_bloated_db
from smoosh.compactors import Interrupted, SqliteCompactor
from smoosh.daemon.run.job_context import JobContext
from smoosh.io_budget import IoBudget
from helpers.clocks import FakeClock, recorded_sleeps
from helpers.daemon import HANG_S

CHUNK_PAGES = 50
#: Bytes per second: slow enough that every chunk leaves a debt of a fraction of a second.
RATE = 1_000_000.0
#: Upper bound for any wait on the compaction thread (seconds); a pass takes milliseconds.
WAIT_S = HANG_S  # a ceiling on a hang, never a measure of speed


class ChunkStarts:
    """The worker's context, recording the clock each time a chunk is let go (its start time)."""

    def __init__(self, ctx: JobContext, clock: FakeClock) -> None:
        self.ctx = ctx
        self.clock = clock
        self.starts: list[float] = []

    def progress(self, fraction: float) -> None:
        self.ctx.progress(fraction)

    def on_cancel(self, fn: Callable[[], None]) -> None:
        self.ctx.on_cancel(fn)

    def pause(self, seconds: float) -> None:
        self.ctx.pause(seconds)

    def checkpoint(self) -> None:
        self.ctx.checkpoint()
        self.starts.append(self.clock())


def wait_until(predicate: Callable[[], Any]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.002)


def settings() -> SimpleNamespace:
    return SimpleNamespace(page_size=None, auto_vacuum=None, incremental_chunk_pages=CHUNK_PAGES, busy_timeout_s=0.5)


def run_in_thread(compactor: SqliteCompactor, key: str, ctx: Any) -> tuple[threading.Thread, list[Any]]:
    outcome: list[Any] = []

    def body() -> None:
        try:
            outcome.append(compactor.compact(key, ctx))
        except Exception as exc:  # handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, outcome


@pytest.fixture
def db(tmp_path: Any) -> str:
    path = str(tmp_path / "inc.db")
    stats = make_bloated_db(path, auto_vacuum="incremental")
    assert stats["freelist_count"] > 4 * CHUNK_PAGES  # several chunks to pace
    return path


def test_each_chunk_starts_exactly_when_the_previous_chunks_debt_is_paid(db: str) -> None:
    # Given a budget of RATE bytes/s and a clock that moves only when the test steps it
    clock = FakeClock(10_000.0)
    t0 = clock.now
    budget = IoBudget(RATE, clock=clock)
    page_bytes, free_pages = db_stats(db)["page_size"], db_stats(db)["freelist_count"]
    compactor = SqliteCompactor(settings(), io_budget=budget)
    ctx = ChunkStarts(JobContext(budget), clock)
    thread, outcome = run_in_thread(compactor, db, ctx)

    # When the compaction runs, the test steps the clock to just before each paid moment, then to it
    steps = 0
    while True:
        wait_until(lambda: budget.waiting() == 1 or not thread.is_alive())
        if not thread.is_alive():
            break
        paid_at = budget.paid_at()
        assert paid_at is not None
        started = len(ctx.starts)
        clock.now = paid_at - 0.001
        budget.wake()
        wait_until(lambda: budget.waiting() == 1)  # it looked at the new time and went back to sleep
        assert len(ctx.starts) == started, "a chunk started before its debt was paid"
        clock.now = paid_at
        budget.wake()
        steps += 1
        assert steps < 100
    thread.join(WAIT_S)

    # Then every full chunk owed C * page_size bytes, and chunk k+1 started when chunk k's debt was paid
    assert not isinstance(outcome[0], Exception), outcome
    assert len(ctx.starts) >= 5
    chunk_s = CHUNK_PAGES * page_bytes / RATE
    expected = [t0 + k * chunk_s for k in range(len(ctx.starts))]
    assert ctx.starts == pytest.approx(expected, abs=1e-6)
    assert budget.charged_bytes == free_pages * page_bytes
    assert db_stats(db)["freelist_count"] == 0 and integrity(db) == "ok"


def test_a_stop_during_a_wait_ends_the_compaction_at_once(db: str) -> None:
    # Given a budget so slow that the first chunk's debt would take days
    budget = IoBudget(1.0, clock=FakeClock(10_000.0))
    compactor = SqliteCompactor(settings(), io_budget=budget)
    ctx = JobContext(budget)
    thread, outcome = run_in_thread(compactor, db, ctx)
    wait_until(lambda: budget.waiting() == 1)
    # When the worker stops the job while it waits
    ctx.stop("worker stopping")
    # Then the compaction ends now, interrupted at the chunk boundary, the file intact
    thread.join(WAIT_S)
    assert not thread.is_alive()
    assert isinstance(outcome[0], Interrupted) and str(outcome[0]) == "worker stopping"
    assert integrity(db) == "ok"


def test_an_unlimited_budget_never_waits_and_still_counts_what_was_written(db: str) -> None:
    budget = IoBudget(None, clock=FakeClock(10_000.0))  # the clock never moves: any wait would hang
    page_bytes = db_stats(db)["page_size"]
    freed = db_stats(db)["freelist_count"]
    compactor = SqliteCompactor(settings(), io_budget=budget)
    thread, outcome = run_in_thread(compactor, db, JobContext(budget))
    thread.join(WAIT_S)
    assert not thread.is_alive() and not isinstance(outcome[0], Exception), outcome
    assert budget.charged_bytes == freed * page_bytes
    assert budget.waiting() == 0 and db_stats(db)["freelist_count"] == 0


def test_a_worker_takes_no_job_while_the_budget_is_in_debt_and_takes_it_when_paid(db: str) -> None:
    # Given a stand-alone worker whose process budget owes 5 s, and a job pending for it
    from smoosh.daemon.run.worker import Worker
    from smoosh.jobs import Jobs
    from smoosh.store import open_store

    clock = FakeClock(10_000.0)
    budget = IoBudget(RATE, clock=clock)
    budget.charge(int(5 * RATE))
    store = open_store("memory:")
    jobs = Jobs(store)
    jobs.set_type_timeout("smoosh:n", 30)
    worker = Worker(jobs, store, "smoosh:n", [SqliteCompactor(settings(), io_budget=budget)], node="n",
                    io_budget=budget, clock=clock)
    try:
        jobs.add("smoosh:n", db, {"channel": "c", "key": db, "priority": 5.0, "progress": 0.0})
        worker.start()
        # When the worker looks: it waits for the budget, the job stays pending
        wait_until(lambda: budget.waiting(kind="start") == 1)
        assert jobs.get_job_state("smoosh:n", db) == "pending"
        # Then once the clock reaches the paid moment, it takes the job and compacts it (its
        # chunks paced in turn: the test moves the clock to each paid moment)
        clock.now += 5.0
        budget.wake()

        def done() -> bool:
            return jobs.get_job_state("smoosh:n", db) == "finished"

        while not done():
            wait_until(lambda: budget.waiting() == 1 or done())
            paid_at = budget.paid_at()
            if paid_at is not None:
                clock.now = paid_at
            budget.wake()
        assert jobs.get_job_data("smoosh:n", db)["result"] == "ok"
    finally:
        worker.stop(5)
        jobs.close()
        store.close()


def test_a_clock_set_back_a_day_mid_compaction_holds_it_back_no_more_than_a_chunk(db: str) -> None:
    # Given a paced compaction whose budget runs on a clock that can go back (a budget handed a
    # wall clock), slow enough that no wait runs out by itself during the test; the sleeps of
    # the compaction thread are recorded (a sleep is how long it waits if nobody wakes it:
    # nobody does when a clock steps)
    rate = 1024.0
    clock = FakeClock(10 * 86_400.0)
    budget = IoBudget(rate, clock=clock)
    sleeps_s = recorded_sleeps(budget._cond)
    compactor = SqliteCompactor(settings(), io_budget=budget)
    ctx = ChunkStarts(JobContext(budget), clock)
    thread, outcome = run_in_thread(compactor, db, ctx)
    wait_until(lambda: budget.waiting() == 1)
    chunk_s = budget.debt_s()
    assert sleeps_s == [chunk_s]

    # When the clock goes back a day and the compaction thread looks at it
    clock.now -= 86_400.0
    budget.wake()
    wait_until(lambda: len(sleeps_s) == 2)

    # Then it sleeps what the chunk still owes, not a day more (a paced compaction that sat at
    # 31% for the length of the step, holding its slot); and it goes on, paced, to the end
    assert sleeps_s[1] is not None and sleeps_s[1] <= chunk_s
    while thread.is_alive():
        wait_until(lambda: budget.waiting() == 1 or not thread.is_alive())
        clock.now += budget.debt_s()
        budget.wake()
    thread.join(WAIT_S)
    assert not isinstance(outcome[0], Exception), outcome
    assert max(s for s in sleeps_s if s is not None) <= chunk_s
    assert db_stats(db)["freelist_count"] == 0 and integrity(db) == "ok"


@pytest.mark.parametrize("how", ["stop", "hold"])
def test_the_pause_between_two_chunks_ends_at_once_on_a_stop_or_a_hold(how: str) -> None:
    # The gap after a shared chunk can be seconds at a small backlog's pace: a stop (or a
    # hold) must not wait it out. The pause returns; the next checkpoint acts on it.
    ctx = JobContext(IoBudget())
    returned = threading.Event()

    def gap() -> None:
        ctx.pause(HANG_S)
        returned.set()

    thread = threading.Thread(target=gap)
    thread.start()
    assert not returned.wait(0.05)  # it is pausing
    if how == "stop":
        ctx.stop("shutdown")
    else:
        ctx.set_held(True)
    assert returned.wait(HANG_S)
    thread.join(HANG_S)
    if how == "stop":
        with pytest.raises(Interrupted):
            ctx.checkpoint()
    else:
        assert ctx.held


def test_a_pause_with_nothing_to_end_it_lasts_its_length() -> None:
    ctx = JobContext(IoBudget())
    started = time.monotonic()
    ctx.pause(0.02)
    assert time.monotonic() - started >= 0.02
