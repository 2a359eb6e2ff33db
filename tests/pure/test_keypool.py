"""The examine pool: keys run in arrival order, a failing key never stops a thread."""

from __future__ import annotations

import threading

import pytest

from smoosh.daemon.keypool import KeyPool
from helpers.daemon import HANG_S


def test_keys_run_in_arrival_order_and_a_failure_does_not_stop_the_thread() -> None:
    seen: list[str] = []
    done = threading.Event()

    def fn(key: str) -> None:
        seen.append(key)
        if key == "bad":
            raise RuntimeError("boom")
        if key == "last":
            done.set()

    pool = KeyPool(fn, 1, "t")
    pool.start()
    for key in ("a", "bad", "b", "last"):
        assert pool.submit(key)
    assert done.wait(HANG_S)
    assert seen == ["a", "bad", "b", "last"]
    pool.stop()


def test_stop_returns_the_keys_never_taken_and_refuses_new_ones() -> None:
    gate = threading.Event()
    started = threading.Event()

    def fn(key: str) -> None:
        started.set()
        gate.wait(5)

    pool = KeyPool(fn, 1, "t")
    pool.start()
    pool.submit("running")
    assert started.wait(HANG_S)
    pool.submit("x")
    pool.submit("y")
    assert pool.backlog() == 2
    assert pool.stop() == ["x", "y"]
    assert pool.submit("z") is False
    gate.set()


def test_at_least_one_thread() -> None:
    with pytest.raises(ValueError, match="threads must be >= 1, not 0"):
        KeyPool(lambda key: None, 0, "t")


def test_what_after_item_submits_runs_next_on_its_thread_and_one_more_item_wakes_another() -> None:
    # Given a pool of two threads whose after_item submits the next item once, then two
    ran_on: dict[str, str] = {}
    done = threading.Event()
    after_calls: list[str] = []

    together = threading.Barrier(2, timeout=HANG_S)

    def fn(key: str) -> None:
        ran_on[key] = threading.current_thread().name
        if key in ("third", "fourth"):
            together.wait()  # both at once: on two threads
        if len(ran_on) == 4:
            done.set()

    def after_item() -> None:
        after_calls.append(threading.current_thread().name)
        if len(after_calls) == 1:
            assert pool.submit("second")  # taken by this thread as it returns
        elif len(after_calls) == 2:
            assert pool.submit("third")  # this thread's
            assert pool.submit("fourth")  # one more than the threads in after_item: another thread

    pool = KeyPool(fn, 2, "t", after_item=after_item)
    pool.start()
    assert pool.submit("first")
    # Then the second runs on the thread that submitted it, with no thread started for it
    assert done.wait(HANG_S)
    assert ran_on["first"] == ran_on["second"] == after_calls[0] == after_calls[1]
    # ... and of the third and fourth, one runs there and the other on a thread of its own
    assert ran_on["first"] in (ran_on["third"], ran_on["fourth"]) and ran_on["third"] != ran_on["fourth"]
    pool.stop()


def test_an_after_item_that_fails_is_logged_and_the_thread_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    done = threading.Event()

    def after_item() -> None:
        raise RuntimeError("boom")

    pool = KeyPool(lambda key: done.set() if key == "b" else None, 1, "t", after_item=after_item)
    pool.start()
    assert pool.submit("a") and pool.submit("b")
    assert done.wait(HANG_S)
    pool.stop()
    assert "t: after an item" in caplog.text
