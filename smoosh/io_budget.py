"""The process's I/O budget (``max_io_rate``): bytes charged as compactions write them, paid back over time.

Debt-based (DESIGN §11): a compaction *starts* only when the budget is not in debt; an
incremental compaction charges each chunk's bytes as it commits them and waits, before the
next chunk, until the debt is paid; a full VACUUM is charged as it ends, so its bytes are a
debt paid before the next start. Nothing is refused for being large: one VACUUM of 10 GB
runs, and the next start waits 10 GB / rate afterwards.

The debt is kept as one time, :meth:`IoBudget.paid_at`: charging ``n`` bytes at ``now``
moves it to ``max(paid_at, now) + n / rate``. A rate change (live reload) keeps the bytes
still owed and re-prices them at the new rate; an unlimited budget (rate None) owes nothing
and only counts. The clock is injected (the server's monotonic one, DESIGN §12: a debt is a
duration, not a date), so tests step it by hand. A clock that goes backwards anyway (a wall
clock handed in and set back) moves the debt back with it, never stretching it.

The budget also carries the process's **pace** of incremental chunks on a database another
process has open (:attr:`IoBudget.chunk_gap_factor`: the write lock stays free that many times
as long as a chunk held it), set by the daemon's backlog controller from the backlog and the
harm it sees; a budget nobody sets keeps :data:`DEFAULT_CHUNK_GAP_FACTOR`. Compactions count
on it the times they found the application holding the write lock (:meth:`IoBudget.note_lock_wait`),
one of the signs of harm the controller reads.

Ownership: one budget per process, made by its owner (the server, or ``smoosh worker``),
which alone changes the rate (:meth:`IoBudget.set_rate`) and the pace
(:meth:`IoBudget.set_chunk_gap_factor`). Compaction threads charge it and
wait on it, the server's loop reads it; every way in takes the budget's own lock.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Callable

__all__ = ["IoBudget", "UNLIMITED", "CHUNK", "START", "DEFAULT_CHUNK_GAP_FACTOR"]

#: The rate of a budget that never makes anyone wait (``max_io_rate`` unset or ``infinity``).
UNLIMITED: float | None = None
#: A :meth:`IoBudget.wait` of a compaction between two chunks.
CHUNK = "chunk"
#: A :meth:`IoBudget.wait` of a worker before it takes a job.
START = "start"
#: The pace of a budget whose owner never set one (``smoosh worker``, a compactor used alone):
#: after a shared chunk the lock stays free four times as long as the chunk held it.
DEFAULT_CHUNK_GAP_FACTOR = 4.0


class IoBudget:
    """Bytes per second for all the compactions of one process together.

    Parameters:
        rate_bytes_per_s: the budget; None (or ``math.inf``) is unlimited.
        clock: monotonic seconds (the owner's monotonic clock: tests inject theirs and step it).

    Raises:
        ValueError: a rate that is not a positive number.
    """

    def __init__(self, rate_bytes_per_s: float | None = UNLIMITED, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._cond = threading.Condition()
        self._rate = _checked(rate_bytes_per_s)
        self._paid_at = clock()
        self._last_now = self._paid_at
        self._charged_bytes = 0
        # One float, replaced whole by the owner and read without the lock by compaction threads.
        self._chunk_gap_factor = DEFAULT_CHUNK_GAP_FACTOR
        self._lock_waits = 0
        # Tokens of the threads asleep in wait() that have read the clock since the last wake():
        # wake() empties it, so "it is back in the set" means "it looked and must still wait".
        self._asleep: set[tuple[str, object]] = set()

    # -- the owner ---------------------------------------------------------------------------

    @property
    def rate_bytes_per_s(self) -> float | None:
        """The rate in force; None when unlimited."""
        return self._rate

    def set_rate(self, rate_bytes_per_s: float | None) -> None:
        """Change the rate now (live reload): bytes still owed are re-priced at the new rate.

        Waiting threads re-read the debt at once (a higher rate may have paid it already).

        Raises:
            ValueError: a rate that is not a positive number.
        """
        rate = _checked(rate_bytes_per_s)
        with self._cond:
            now = self._now_locked()
            owed_s = max(0.0, self._paid_at - now)
            if self._rate is None or rate is None:
                self._paid_at = now  # nothing was owed, or nothing is owed any more
            else:
                self._paid_at = now + owed_s * self._rate / rate
            self._rate = rate
        self.wake()

    @property
    def chunk_gap_factor(self) -> float:
        """After an incremental chunk on a shared database, the lock stays free this many times as long as the chunk held it."""
        return self._chunk_gap_factor

    def set_chunk_gap_factor(self, factor: float) -> None:
        """Set the pace (the backlog controller, every status interval); the next chunk's gap uses it.

        Raises:
            ValueError: a factor that is not a number >= 0.
        """
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 <= factor < math.inf:
            raise ValueError(f"chunk_gap_factor must be a number >= 0, not {factor!r}")
        self._chunk_gap_factor = float(factor)

    # -- compactions ---------------------------------------------------------------------------

    def note_lock_wait(self) -> None:
        """Count one wait of a compaction for a write lock the application held (a sign of harm)."""
        with self._cond:
            self._lock_waits += 1

    @property
    def lock_waits(self) -> int:
        """Lock waits noted since the process started."""
        with self._cond:
            return self._lock_waits

    def charge(self, nbytes: int) -> None:
        """Count ``nbytes`` written by a compaction: the debt grows by ``nbytes / rate`` seconds."""
        if nbytes <= 0:
            return
        with self._cond:
            self._charged_bytes += int(nbytes)
            if self._rate is not None:
                now = self._now_locked()
                self._paid_at = max(self._paid_at, now) + nbytes / self._rate

    def wait(self, stopped: Callable[[], bool], *, kind: str = CHUNK) -> bool:
        """Block until the budget is out of debt, or ``stopped()`` turns true.

        The wait is a timed wait until the moment the debt is paid (no polling). Whoever makes
        ``stopped()`` true must call :meth:`wake`, so the waiter sees it at once instead of
        waiting out the debt.

        Parameters:
            stopped: read before every sleep.
            kind: what waits (:data:`CHUNK`: a compaction between two chunks; :data:`START`:
                a worker before it accepts a job), for :meth:`waiting`.

        Returns:
            True when the debt is paid; False when ``stopped()`` ended the wait.
        """
        token = (kind, object())
        with self._cond:
            try:
                while True:
                    if stopped():
                        return False
                    # The clock is read first: reading it moves _paid_at back when the clock
                    # went back, so _paid_at read before it would count the step as debt.
                    now = self._now_locked()
                    remaining_s = self._paid_at - now
                    if remaining_s <= 0:
                        return True
                    self._asleep.add(token)
                    self._cond.wait(remaining_s)
                    self._asleep.discard(token)
            finally:
                self._asleep.discard(token)

    def wake(self) -> None:
        """Make every waiter re-read the clock and its stop condition (a stop, a rate change, a stepped test clock)."""
        with self._cond:
            self._asleep.clear()
            self._cond.notify_all()

    # -- readers (any thread) ------------------------------------------------------------------

    def paid_at(self) -> float | None:
        """The clock time the debt is paid; None when the budget is not in debt now."""
        with self._cond:
            now = self._now_locked()
            return self._paid_at if self._paid_at > now else None

    def debt_s(self) -> float:
        """Seconds until the debt is paid, by the budget's clock (0.0 when not in debt)."""
        with self._cond:
            now = self._now_locked()  # first: it may move _paid_at (see wait)
            return max(0.0, self._paid_at - now)

    def in_debt(self) -> bool:
        """Whether a compaction must wait before it starts (or writes its next chunk)."""
        return self.paid_at() is not None

    @property
    def charged_bytes(self) -> int:
        """Bytes charged since the process started (whatever the rate)."""
        with self._cond:
            return self._charged_bytes

    def waiting(self, kind: str = CHUNK) -> int:
        """Threads of ``kind`` asleep in :meth:`wait` now that have looked at the clock since the last :meth:`wake`.

        With :data:`CHUNK`: the compactions paused between two chunks.
        """
        with self._cond:
            return sum(1 for k, _ in self._asleep if k == kind)

    def _now_locked(self) -> float:
        now = self._clock()
        if now < self._last_now:
            # The clock went back: the debt goes back with it (it was a duration, not a date).
            self._paid_at -= self._last_now - now
        self._last_now = now
        return now


def _checked(rate: float | None) -> float | None:
    if rate is None or rate == math.inf:
        return None
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
        raise ValueError(f"max_io_rate must be a positive number of bytes per second, not {rate!r}")
    return float(rate)
