"""A clock a test moves by hand, injected where smoosh takes ``clock=``."""

from __future__ import annotations

import threading


class FakeClock:
    """Seconds that move only when the test says; thread-safe (servers read it from their threads)."""

    #: Where a clock starts unless told: a plausible wall-clock time (November 2023).
    START = 1_700_000_000.0

    def __init__(self, now: float = START) -> None:
        self._now = now
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    @property
    def now(self) -> float:
        """The time the clock shows."""
        return self()

    @now.setter
    def now(self, value: float) -> None:
        self.set(value)

    def set(self, now: float) -> None:
        """Show ``now`` from here on."""
        with self._lock:
            self._now = now

    def advance(self, seconds: float) -> None:
        """Move the clock on by ``seconds``."""
        with self._lock:
            self._now += seconds


class SteppedClocks:
    """A wall clock and a monotonic clock a test moves by hand, for ``clock=`` of a server.

    Time passing (:meth:`advance`) moves both; a step of the wall clock (:meth:`step_wall`:
    NTP, a VM resync, ``date -s``) moves only the wall clock. Called, it reads the wall clock,
    so a smoosh that takes one clock for everything runs on the wall clock, stepped.
    """

    #: Where the monotonic clock starts unless told (any origin will do: it is not a date).
    MONOTONIC_START = 1_000.0

    def __init__(self, wall: float = FakeClock.START, monotonic: float = MONOTONIC_START) -> None:
        self.wall = FakeClock(wall)
        self.monotonic = FakeClock(monotonic)
        self._lock = threading.Lock()

    def __call__(self) -> float:
        return self.wall()

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass: both clocks move on."""
        with self._lock:
            self.wall.advance(seconds)
            self.monotonic.advance(seconds)

    def step_wall(self, seconds: float) -> None:
        """Step the wall clock by ``seconds`` (negative: back); monotonic time does not move."""
        with self._lock:
            self.wall.advance(seconds)


def recorded_sleeps(cond: threading.Condition) -> list[float | None]:
    """Record the timeout of every timed wait on ``cond`` from now on, in the list returned.

    A timed wait's timeout is how long its thread would sleep if nobody woke it: what a test
    about a clock that steps needs to see (when a clock steps, nobody wakes anyone), without
    sleeping that long itself.
    """
    sleeps_s: list[float | None] = []
    timed_wait = cond.wait

    def recorded_wait(timeout: float | None = None) -> bool:
        sleeps_s.append(timeout)
        return timed_wait(timeout)

    cond.wait = recorded_wait  # type: ignore[method-assign]
    return sleeps_s
