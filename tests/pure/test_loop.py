"""The one loop abstraction: tasks ticked when due or woken, messages in order, calls answered, crashes survived."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

from smoosh.loop import CRASH_PAUSE_S, Loop, LoopStopped
from helpers.daemon import HANG_S


class Recorder:
    """A task that records its ticks and asks for the next one ``every`` seconds later (None: never)."""

    def __init__(self, every: float | None = None, fail: bool = False) -> None:
        self.ticks: list[float] = []
        self.every = every
        self.fail = fail
        self.resets = 0

    def tick(self, now: float) -> float | None:
        self.ticks.append(now)
        if self.fail:
            raise RuntimeError("boom")
        return None if self.every is None else now + self.every

    def reset(self) -> None:
        self.resets += 1


def test_a_task_is_ticked_at_once_then_only_when_due() -> None:
    loop = Loop("t", clock=lambda: 0.0)
    task = Recorder(every=10.0)
    loop.add(task, "recorder")
    assert loop.run_once(100.0) == 110.0
    assert loop.run_once(105.0) == 110.0  # not due: not ticked
    assert loop.run_once(110.0) == 120.0
    assert task.ticks == [100.0, 110.0]


def test_a_task_that_waits_for_a_wake_is_ticked_only_when_woken() -> None:
    loop = Loop("t", clock=lambda: 0.0)
    task = Recorder(every=None)
    loop.add(task, "recorder")
    assert loop.run_once(1.0) is None
    assert loop.run_once(2.0) is None
    loop.wake(task)
    loop.run_once(3.0)
    assert task.ticks == [1.0, 3.0]


def test_messages_run_in_order_before_the_ticks_and_a_failing_one_is_logged(caplog: Any) -> None:
    loop = Loop("t", clock=lambda: 0.0)
    order: list[str] = []

    class Task:
        def tick(self, now: float) -> None:
            order.append("tick")

    loop.add(Task(), "task")
    loop.post(lambda: order.append("first"))
    loop.post(lambda: 1 / 0)
    loop.post(lambda: order.append("second"))
    with caplog.at_level(logging.ERROR, logger="smoosh.loop"):
        loop.run_once(0.0)
    assert order == ["first", "second", "tick"]
    assert "t: a message failed" in caplog.text


def test_a_crashing_task_is_reset_logged_and_ticked_again_after_a_pause(caplog: Any) -> None:
    loop = Loop("t", clock=lambda: 0.0)
    bad, good = Recorder(fail=True), Recorder(every=1.0)
    loop.add(bad, "bad")
    loop.add(good, "good")
    with caplog.at_level(logging.ERROR, logger="smoosh.loop"):
        loop.run_once(50.0)
    assert good.ticks == [50.0]  # the crash did not stop the other task
    assert bad.resets == 1
    assert f"t: bad failed; ticking it again in {CRASH_PAUSE_S:.0f} s" in caplog.text
    loop.run_once(50.0 + CRASH_PAUSE_S / 2)
    assert bad.ticks == [50.0]
    loop.run_once(50.0 + CRASH_PAUSE_S)
    assert bad.ticks == [50.0, 50.0 + CRASH_PAUSE_S]


def test_the_thread_sleeps_until_woken_and_call_runs_on_it() -> None:
    loop = Loop("t-thread")
    woken = threading.Event()

    class Task:
        def __init__(self) -> None:
            self.threads: list[str] = []

        def tick(self, now: float) -> None:
            self.threads.append(threading.current_thread().name)
            woken.set()
            return None

    task = Task()
    loop.add(task, "task")
    loop.start()
    try:
        assert woken.wait(HANG_S)
        woken.clear()
        loop.wake(task)
        assert woken.wait(HANG_S)
        assert set(task.threads) == {"t-thread"}
        assert loop.call(lambda: threading.current_thread().name, 5) == "t-thread"
        with pytest.raises(ZeroDivisionError):
            loop.call(lambda: 1 / 0, 5)
    finally:
        loop.stop()
    assert not loop.is_alive()


def test_call_from_inside_an_iteration_runs_inline_instead_of_deadlocking() -> None:
    loop = Loop("t-inline")
    loop.start()
    try:
        # A test stepping run_once while the thread runs: a message that calls the loop
        # again must not wait for the thread, which waits for this iteration.
        answers: list[int] = []
        loop.post(lambda: answers.append(loop.call(lambda: 42, 5)))
        loop.run_once()
        assert answers == [42]
    finally:
        loop.stop()


def test_a_call_to_a_stopping_loop_is_refused() -> None:
    loop = Loop("t-stop")
    loop.start()
    release = threading.Event()
    loop.post(lambda: release.wait(5))
    loop._stopping = True  # what stop() sets first
    try:
        with pytest.raises(LoopStopped):
            loop.call(lambda: None, 1)
    finally:
        release.set()
        loop.stop()


def test_a_loop_told_no_clock_keeps_its_timers_on_the_monotonic_clock() -> None:
    # A wall clock set back a day would keep every task of the loop asleep for that day.
    assert Loop("t-default").clock is time.monotonic


def wait_until(condition: Any) -> bool:
    """Poll ``condition`` until it holds (a ceiling that only bounds a hang)."""
    deadline = time.monotonic() + HANG_S
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def test_news_that_may_wait_still_wakes_a_loop_asleep_with_no_due_time() -> None:
    loop = Loop("t")
    loop.start()
    try:
        assert wait_until(lambda: loop._waiting)  # asleep, nothing due: it would sleep forever
        ran = threading.Event()
        loop.post(ran.set, within_s=0.01)
        # Then it runs: the loop's wait was longer than the news may wait
        assert ran.wait(HANG_S)
    finally:
        loop.stop()


def test_news_that_may_wait_rides_on_the_next_wake_up_of_a_loop_that_expects_one() -> None:
    # Given a loop (its clock stands still) told to wake within 1000 s, asleep until then
    loop = Loop("t", clock=lambda: 0.0)
    loop.start()
    try:
        loop.call(lambda: loop.expect(1000.0))
        assert wait_until(lambda: loop._waiting)
        order: list[str] = []
        # When news that may wait 2000 s is posted, then it does not wake the loop
        loop.post(lambda: order.append("news"), within_s=2000.0)
        assert order == []
        # ... and runs, first, with the next message that does
        done = threading.Event()
        loop.post(lambda: (order.append("wake"), done.set()))
        assert done.wait(HANG_S)
        assert order == ["news", "wake"]
    finally:
        loop.stop()


def test_news_that_may_wait_posted_to_a_loop_awake_runs_before_it_sleeps() -> None:
    loop = Loop("t", clock=lambda: 0.0)
    ran = threading.Event()

    class Poster:
        def tick(self, now: float) -> float | None:
            loop.post(ran.set, within_s=1.0)  # posted while the loop is awake: no wake-up needed
            return None

    loop.add(Poster(), "poster")
    loop.start()
    try:
        assert ran.wait(HANG_S)
    finally:
        loop.stop()
