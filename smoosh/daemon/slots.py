"""The global ``max_jobs`` gate, fair across channels (DESIGN §5.6, §7).

Per-channel concurrency alone cannot bound a node's total I/O, so every start takes one of
``max_jobs`` slots first. When channels compete for the last slots, the one that has waited
longest goes first: a channel refused a slot joins a line, and a free slot goes to whoever
is ahead in it, so a busy channel that asks every 0.2 s can never starve a quieter one (an
``upgrade`` channel, say) that asked earlier.

A channel in line must keep asking: one that stops (it was suspended, left its window or ran
out of work) leaves the line after ``waiter_ttl_s`` without asking, so it never holds a slot
back from the others. Channels ask from their loop, which runs every 0.2 s, so the default
TTL of 5 s is many missed asks, not a race.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

__all__ = ["SlotGate", "DEFAULT_WAITER_TTL_S"]

#: Seconds a channel keeps its place in line without asking again.
DEFAULT_WAITER_TTL_S = 5.0


class SlotGate:
    """Counts running compactions against a limit and hands free slots out oldest-waiter first.

    Parameters:
        limit: the number of slots (``max_jobs``); may be changed live through :attr:`limit`.
        waiter_ttl_s: how long a refused channel stays in line without asking again.
        clock: monotonic seconds (tests step one by hand).
    """

    def __init__(
        self,
        limit: int,
        *,
        waiter_ttl_s: float = DEFAULT_WAITER_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self._ttl_s = waiter_ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._busy = 0
        # channel -> [first refused at, last asked at]; dicts keep insertion order, so the
        # line is also in arrival order.
        self._line: dict[str, list[float]] = {}

    @property
    def busy(self) -> int:
        """Slots taken now."""
        return self._busy

    def acquire(self, channel: str) -> bool:
        """Take a slot for ``channel``; False (and a place in line) when none is free for it.

        A slot is free for ``channel`` when more slots are free than channels ahead of it.
        """
        now = self._clock()
        with self._lock:
            self._expire_locked(now)
            mine = self._line.get(channel)
            since = now if mine is None else mine[0]
            ahead = sum(1 for name, (s, _) in self._line.items() if name != channel and s < since)
            if self.limit - self._busy > ahead:
                self._line.pop(channel, None)
                self._busy += 1
                return True
            if mine is None:
                self._line[channel] = [now, now]
            else:
                mine[1] = now
            return False

    def release(self, channel: str) -> None:
        """Give back a slot ``channel`` took (never below zero)."""
        with self._lock:
            self._busy = max(0, self._busy - 1)

    def waiting(self) -> list[str]:
        """Channels in line now, longest-waiting first."""
        now = self._clock()
        with self._lock:
            self._expire_locked(now)
            return sorted(self._line, key=lambda name: self._line[name][0])

    def _expire_locked(self, now: float) -> None:
        stale = [name for name, (_, last) in self._line.items() if now - last > self._ttl_s]
        for name in stale:
            del self._line[name]
