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
