"""The I/O budget by itself: debt charged in bytes, paid back over an injected clock, re-priced on reload."""

from __future__ import annotations

import math
import sys
import threading
import time
from typing import Callable

import pytest

from helpers.clocks import FakeClock, recorded_sleeps
from helpers.daemon import HANG_S
from smoosh.io_budget import IoBudget
from smoosh.ioprio import IOPRIO_CLASS_IDLE, apply_io_priority, get_thread_ioprio

MiB = 1 << 20
#: Upper bound for any wait on another thread (seconds); a pass takes milliseconds.
WAIT_S = HANG_S  # a ceiling on a hang, never a measure of speed


def wait_until(predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.002)


def test_an_unlimited_budget_counts_bytes_and_never_owes() -> None:
    clock = FakeClock()
    budget = IoBudget(None, clock=clock)
    budget.charge(10 * MiB)
    budget.charge(5)
    assert (budget.charged_bytes, budget.in_debt(), budget.paid_at(), budget.debt_s()) == (10 * MiB + 5, False, None, 0.0)
    assert budget.wait(lambda: False) is True  # returns at once: there is nothing to wait for
    assert IoBudget(math.inf, clock=clock).rate_bytes_per_s is None


def test_a_charge_is_paid_back_at_the_rate_and_charges_queue_behind_each_other() -> None:
    clock = FakeClock(1000.0)
    budget = IoBudget(4 * MiB, clock=clock)
    budget.charge(2 * MiB)  # half a second of debt
    assert budget.paid_at() == 1000.5
    budget.charge(MiB)  # owed after the first: a quarter of a second more
    assert budget.paid_at() == 1000.75
    clock.now = 1000.7499
    assert budget.in_debt()
    clock.now = 1000.75
    assert not budget.in_debt() and budget.paid_at() is None
    clock.now = 1010.0  # idle time is not saved up: a charge now owes from now
    budget.charge(4 * MiB)
    assert budget.paid_at() == 1011.0
    assert budget.charged_bytes == 7 * MiB


def test_a_rate_change_reprices_what_is_still_owed() -> None:
    clock = FakeClock(0.0)
    budget = IoBudget(MiB, clock=clock)
    budget.charge(10 * MiB)  # 10 s at 1 MiB/s
    clock.now = 2.0  # 8 MiB still owed
    budget.set_rate(4 * MiB)
    assert budget.paid_at() == 4.0  # 8 MiB at 4 MiB/s
    budget.set_rate(None)  # unlimited: nothing is owed any more
    assert not budget.in_debt()
    budget.set_rate(2 * MiB)  # and limited again, from nothing owed
    assert not budget.in_debt()


def test_a_clock_set_back_moves_the_debt_back_with_it() -> None:
    clock = FakeClock(5000.0)
    budget = IoBudget(MiB, clock=clock)
    budget.charge(3 * MiB)
    clock.now = 4000.0  # a wall clock stepped back an hour must not stretch 3 s into an hour
    assert budget.paid_at() == 4003.0


DAY_S = 86_400.0


def test_a_clock_set_back_a_day_leaves_the_debt_what_it_was() -> None:
    # Given 3 s of debt, read once (the debt is read before the clock is looked at again)
    clock = FakeClock(DAY_S * 10)
    budget = IoBudget(MiB, clock=clock)
    budget.charge(3 * MiB)
    # When the clock goes back a day and the debt is asked for first thing
    clock.now -= DAY_S
    # Then it is still 3 s, not a day and 3 s
    assert budget.debt_s() == 3.0
    assert budget.paid_at() == DAY_S * 9 + 3.0


def test_a_waiter_that_looks_after_the_clock_went_back_a_day_sleeps_what_it_owes() -> None:
    # Given a waiter owing 3 s, whose timed sleeps the test records (a sleep is how long it
    # would wait if nobody woke it: the daemon wakes no one when a clock steps)
    clock = FakeClock(DAY_S * 10)
    budget = IoBudget(MiB, clock=clock)
    budget.charge(3 * MiB)
    sleeps_s = recorded_sleeps(budget._cond)
    result: list[bool] = []
    waiter = threading.Thread(target=lambda: result.append(budget.wait(lambda: False)), daemon=True)
    waiter.start()
    wait_until(lambda: budget.waiting() == 1)
    assert sleeps_s == [3.0]
    # When the clock goes back a day and the waiter looks at it again
    clock.now -= DAY_S
    budget.wake()
    wait_until(lambda: len(sleeps_s) == 2)
    # Then it sleeps the 3 s it still owes, not a day and 3 s
    assert sleeps_s[1] == 3.0 and result == []
    clock.now += 3.0
    budget.wake()
    waiter.join(WAIT_S)
    assert result == [True]


@pytest.mark.parametrize("rate", [0, -1, "5", True, math.nan])
def test_a_rate_that_is_not_positive_is_refused_by_name(rate: object) -> None:
    with pytest.raises(ValueError, match="max_io_rate must be a positive number of bytes per second, not"):
        IoBudget(rate)  # type: ignore[arg-type]


def test_a_waiter_wakes_when_the_stepped_clock_reaches_the_paid_moment_and_not_before() -> None:
    clock = FakeClock(0.0)
    budget = IoBudget(MiB, clock=clock)
    budget.charge(3 * MiB)
    result: list[bool] = []
    waiter = threading.Thread(target=lambda: result.append(budget.wait(lambda: False)))
    waiter.start()
    wait_until(lambda: budget.waiting() == 1)
    clock.now = 2.999
    budget.wake()
    wait_until(lambda: budget.waiting() == 1)  # it looked at 2.999 and went back to sleep
    assert result == []
    clock.now = 3.0
    budget.wake()
    waiter.join(WAIT_S)
    assert result == [True] and budget.waiting() == 0


def test_a_stop_ends_a_wait_at_once_without_waiting_out_the_debt() -> None:
    budget = IoBudget(1.0, clock=FakeClock(0.0))
    budget.charge(10**9)  # about 32 years at one byte a second
    stop = threading.Event()
    result: list[bool] = []
    waiter = threading.Thread(target=lambda: result.append(budget.wait(stop.is_set)))
    waiter.start()
    wait_until(lambda: budget.waiting() == 1)
    stop.set()
    budget.wake()
    waiter.join(WAIT_S)
    assert result == [False]


def test_a_higher_rate_on_reload_releases_a_waiter_at_once() -> None:
    clock = FakeClock(0.0)
    budget = IoBudget(1.0, clock=clock)
    budget.charge(MiB)
    result: list[bool] = []
    waiter = threading.Thread(target=lambda: result.append(budget.wait(lambda: False)))
    waiter.start()
    wait_until(lambda: budget.waiting() == 1)
    budget.set_rate(None)
    waiter.join(WAIT_S)
    assert result == [True]


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ioprio_set is Linux only")


@linux_only
def test_idle_io_priority_is_set_on_the_calling_thread_and_put_back() -> None:
    # Linux keeps the I/O class per thread: another thread's stays as it was.
    seen: dict[str, tuple[int, int]] = {}

    def compaction_thread() -> None:
        before = get_thread_ioprio()
        restore = apply_io_priority("idle")
        seen["during"] = get_thread_ioprio()
        restore()
        seen["after"] = get_thread_ioprio()
        seen["before"] = before

    main_class = get_thread_ioprio()
    t = threading.Thread(target=compaction_thread)
    t.start()
    t.join(WAIT_S)
    assert seen["during"][0] == IOPRIO_CLASS_IDLE
    assert seen["after"] == seen["before"]
    assert get_thread_ioprio() == main_class and main_class[0] != IOPRIO_CLASS_IDLE


@linux_only
def test_normal_io_priority_changes_nothing() -> None:
    before = get_thread_ioprio()
    apply_io_priority("normal")()
    assert get_thread_ioprio() == before


def test_the_pace_of_shared_chunks_is_the_default_until_its_owner_sets_it_and_refuses_a_bad_value() -> None:
    from smoosh.io_budget import DEFAULT_CHUNK_GAP_FACTOR, IoBudget

    budget = IoBudget()
    assert budget.chunk_gap_factor == DEFAULT_CHUNK_GAP_FACTOR
    budget.set_chunk_gap_factor(16)
    assert budget.chunk_gap_factor == 16.0
    for bad in (-1, float("inf"), float("nan"), True, "4"):
        with pytest.raises(ValueError, match="chunk_gap_factor must be a number >= 0, not "):
            budget.set_chunk_gap_factor(bad)  # type: ignore[arg-type]
    assert budget.chunk_gap_factor == 16.0
