"""The one loop abstraction: tasks ticked when due or woken, messages in order, calls answered, crashes survived."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

from smoosh.loop import CRASH_PAUSE_S, HELP_ITERATIONS, Loop, LoopStopped
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


class Iterations:
    """Records which thread runs each of ``loop``'s iterations (the thread's, a helper's)."""

    def __init__(self, loop: Loop) -> None:
        self.threads: list[str] = []
        run_once = loop.run_once

        def recorded(now: float | None = None) -> float | None:
            self.threads.append(threading.current_thread().name)
            return run_once(now)

        loop.run_once = recorded  # type: ignore[method-assign]


def asleep(loop: Loop) -> Loop:
    """``loop`` started, once its thread sleeps with nothing due (it would sleep forever)."""
    loop.start()
    assert wait_until(lambda: loop._waiting)
    return loop


def helped_news_left_alone(loop: Loop) -> list[str]:
    """Post news helped and help, on this thread; the news must not have run here.

    Returns the names of the threads the news runs on (filled in when it runs).
    """
    ran_on: list[str] = []
    loop.post(lambda: ran_on.append(threading.current_thread().name), helped=True)
    loop.help()
    assert ran_on == []
    return ran_on


def test_helped_news_runs_on_the_helper_with_the_ticks_it_wakes_and_the_loop_sleeps_on() -> None:
    # Given a loop asleep with nothing due, and a task that only ticks when woken
    loop = Loop("t-help")
    task = Recorder()
    loop.add(task, "recorder", due=None)
    asleep(loop)
    iterations = Iterations(loop)
    ran_on: list[str] = []
    try:
        # When news is posted helped, then it waits for its helper
        loop.post(lambda: (ran_on.append(threading.current_thread().name), loop.wake(task)), helped=True)
        assert ran_on == [] and loop._waiting
        # ... and help() runs it here, with the tick it woke, in one iteration
        loop.help()
        me = threading.current_thread().name
        assert ran_on == [me] and len(task.ticks) == 1
        assert iterations.threads == [me]
        # ... while the loop's thread never woke
        assert loop._waiting
    finally:
        loop.stop()
    assert iterations.threads[0] == me


def test_help_leaves_news_to_a_loop_that_is_awake() -> None:
    # Given a loop whose thread is inside a tick that waits for the test
    loop = Loop("t-awake")
    entered, release = threading.Event(), threading.Event()

    class Busy:
        def tick(self, now: float) -> float | None:
            entered.set()
            release.wait(HANG_S)
            return None

    loop.add(Busy(), "busy")
    loop.start()
    try:
        assert entered.wait(HANG_S)
        # When news is posted helped and its poster helps, then help() does nothing here
        ran_on = helped_news_left_alone(loop)
        # ... and the thread takes it before it sleeps again
        release.set()
        assert wait_until(lambda: ran_on)
        assert ran_on == ["t-awake"]
    finally:
        release.set()
        loop.stop()


def test_help_during_another_iteration_hands_the_news_to_the_loop() -> None:
    # Given a loop asleep, and a helper on another thread inside a message that waits
    loop = asleep(Loop("t-other"))
    entered, release = threading.Event(), threading.Event()
    loop.post(lambda: (entered.set(), release.wait(HANG_S)) and None, helped=True)
    helper = threading.Thread(target=loop.help, name="first-helper")
    helper.start()
    try:
        assert entered.wait(HANG_S)
        # When more news is posted helped and its poster helps while that iteration runs, then
        # help() returns at once without running it
        ran_on = helped_news_left_alone(loop)
        # ... and it still runs, not here
        release.set()
        assert wait_until(lambda: ran_on)
        assert ran_on == ["first-helper"] or ran_on == ["t-other"]
    finally:
        release.set()
        helper.join(HANG_S)
        loop.stop()


def test_a_helper_that_makes_a_task_due_sooner_wakes_the_loop_to_sleep_less() -> None:
    # Given a loop asleep with nothing due, and a task that, woken, asks to tick again soon
    loop = Loop("t-due")
    again = threading.Event()

    class Soon:
        ticks = 0

        def tick(self, now: float) -> float | None:
            self.ticks += 1
            if self.ticks == 1:
                return now + 0.01
            again.set()
            return None

    task = Soon()
    loop.add(task, "soon", due=None)
    asleep(loop)
    try:
        # When a helper's iteration wakes the task
        loop.post(lambda: loop.wake(task), helped=True)
        loop.help()
        assert task.ticks == 1
        # Then the loop's thread, asleep "forever", is woken to tick it at its due time
        assert again.wait(HANG_S)
    finally:
        loop.stop()


def test_a_helper_runs_a_few_iterations_then_hands_the_rest_to_the_loop() -> None:
    # Given a loop asleep, and a task that wakes itself from its tick, ten times
    loop = Loop("t-more")
    ran_on: list[str] = []
    done = threading.Event()

    class Again:
        def tick(self, now: float) -> float | None:
            ran_on.append(threading.current_thread().name)
            if len(ran_on) < 10:
                loop.wake(self)  # from inside an iteration: ticked in the next one
            else:
                done.set()
            return None

    task = Again()
    loop.add(task, "again", due=None)
    asleep(loop)
    try:
        # When a helper helps with news that wakes it
        loop.post(lambda: loop.wake(task), helped=True)
        loop.help()
        # Then it ran HELP_ITERATIONS of the ticks, and the loop's thread the rest
        me = threading.current_thread().name
        assert ran_on[:HELP_ITERATIONS] == [me] * HELP_ITERATIONS
        assert done.wait(HANG_S)
        assert ran_on[HELP_ITERATIONS:] == ["t-more"] * (10 - HELP_ITERATIONS)
    finally:
        loop.stop()


def test_help_without_the_loops_thread_leaves_the_news_to_run_once() -> None:
    # Given a loop stepped by the test (no thread)
    loop = Loop("t-stepped", clock=lambda: 0.0)
    ran: list[int] = []
    # When news is posted helped and help() is called
    loop.post(lambda: ran.append(1), helped=True)
    loop.help()
    # Then only the test's step runs it
    assert ran == []
    loop.run_once()
    assert ran == [1]
