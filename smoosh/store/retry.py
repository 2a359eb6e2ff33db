"""The pieces of FoundationDB's retry loop that every store shares: backoff and retry counts.

The loop itself is :meth:`smoosh.store.base.Store.transact`. FoundationDB's ``on_error``
sleeps before each retry: the delay starts at 10 ms, doubles with every retry of the same
transaction and never exceeds ``max_retry_delay`` (1 s by default); the sleep is a random
fraction of it, so a crowd of conflicting clients does not retry in lockstep.
:class:`Backoff` is that schedule for the embedded stores (on ``fdb:`` the binding's
``on_error`` sleeps itself). :class:`RetryStats` counts what the loop retried, so tests and
soak runs can show that every retry stayed bounded.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

#: First retry delay (seconds), FoundationDB's ``DEFAULT_BACKOFF``.
INITIAL_RETRY_DELAY_S = 0.01
#: Ceiling of the retry delay (seconds), FoundationDB's ``max_retry_delay`` default.
MAX_RETRY_DELAY_S = 1.0
#: Factor the delay grows by after each retry (FoundationDB's ``BACKOFF_GROWTH_RATE``).
BACKOFF_GROWTH = 2.0


class Backoff:
    """Exponential backoff with full jitter, as FoundationDB's ``on_error`` sleeps.

    Parameters:
        max_delay_s: ceiling of the delay (``max_retry_delay``).
        sleep: how to wait (tests pass a recorder).
        rng: the jitter's randomness.
    """

    def __init__(
        self,
        max_delay_s: float = MAX_RETRY_DELAY_S,
        *,
        sleep: Callable[[float], None] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.max_delay_s = max_delay_s
        self.delay_s = min(INITIAL_RETRY_DELAY_S, max_delay_s)
        self._sleep = sleep
        self._rng = rng

    def next_delay_s(self) -> float:
        """The wait before the next retry (a random fraction of the current delay); grows the delay."""
        rng = self._rng or random
        wait_s = self.delay_s * rng.random()
        self.delay_s = min(self.delay_s * BACKOFF_GROWTH, self.max_delay_s)
        return wait_s

    def wait(self, cap_s: float | None = None) -> float:
        """Sleep the next delay (at most ``cap_s``); returns the seconds slept."""
        wait_s = self.next_delay_s()
        if cap_s is not None:
            wait_s = max(0.0, min(wait_s, cap_s))
        if wait_s > 0:
            (self._sleep or time.sleep)(wait_s)
        return wait_s


@dataclass
class RetryStats:
    """What one store handle's retry loops retried (all threads; cheap: only retries count).

    Attributes:
        retries: retries made, all calls together.
        by_code: retries per error code.
        maybe_committed: retries after an error that may have come after a commit.
        max_retries: the most retries one call needed before it ended.
        gave_up: calls that ended on a retryable error (retry limit or timeout).
    """

    retries: int = 0
    by_code: dict[int, int] = field(default_factory=dict)
    maybe_committed: int = 0
    max_retries: int = 0
    gave_up: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record_retry(self, code: int, maybe_committed: bool) -> None:
        """Count one retry after error ``code``."""
        with self._lock:
            self.retries += 1
            self.by_code[code] = self.by_code.get(code, 0) + 1
            if maybe_committed:
                self.maybe_committed += 1

    def record_end(self, retries: int, gave_up: bool = False) -> None:
        """Count the end of a call that retried ``retries`` times."""
        with self._lock:
            self.max_retries = max(self.max_retries, retries)
            if gave_up:
                self.gave_up += 1

    def snapshot(self) -> dict[str, object]:
        """A copy of the counters, for logs and tests."""
        with self._lock:
            return {
                "retries": self.retries,
                "by_code": dict(self.by_code),
                "maybe_committed": self.maybe_committed,
                "max_retries": self.max_retries,
                "gave_up": self.gave_up,
            }
