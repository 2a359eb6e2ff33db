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
