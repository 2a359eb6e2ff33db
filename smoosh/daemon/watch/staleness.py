"""The access table: which keys a channel accepted recently, so repeated events cost a dict lookup.

DESIGN §5.1: ``Server.enqueue(key)`` first asks ``is_fresh(key)``; a key some channel accepted
less than ``staleness`` ago is dropped right there, before validation, I/O or any lock shared
with the channels. This is the routing hot path (DESIGN §9: >= 1,000,000 lookups per second in
process), so ``is_fresh`` is one ``dict.get`` and one subtraction: no lock, no logging, no
metric objects.

Thread-safety rests on the GIL: single ``dict`` operations are atomic, so ``is_fresh`` and
``record`` need no lock. The cleaner iterates over a snapshot (``dict.copy()``) so a concurrent
``record`` never raises "dictionary changed size during iteration". Not ``list(d.items())``:
building that list allocates a tuple per entry, an allocation can start the garbage
collector, a collection can run Python code and so switch threads mid-iteration, and the
dict iterator then raises (seen once, in a full run of the suite). ``copy`` walks
the dict without that size check.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Callable

log = logging.getLogger(__name__)

#: Entries the table holds at most (DESIGN §8 ``access_max_size``); past it new keys are not throttled.
DEFAULT_MAX_SIZE = 250_000
#: Seconds between two cleaner passes, before jitter (CouchDB smoosh: 3 s).
CLEAN_INTERVAL_S = 3.0
#: Up to this many extra random seconds per cleaner pass, so many nodes do not clean in lockstep.
CLEAN_JITTER_S = 3.0
#: Seconds ``stop()`` waits for the cleaner thread to exit.
STOP_TIMEOUT_S = 5.0


class AccessTable:
    """Key -> time a channel last accepted it; answers "was this key accepted recently?".

    Parameters:
        staleness_s: a key accepted less than this many seconds ago is fresh; 0 turns the
            throttle off (nothing is ever fresh).
        max_size: at most this many keys are remembered; when full, new keys are simply not
            recorded (so not throttled), while keys already present are still updated.
        clock: monotonic seconds; injected by tests that step time.
        rng: source of the cleaner's jitter; injected by tests for determinism.

    Raises:
        ValueError: ``staleness_s`` negative or ``max_size`` negative.
    """

    def __init__(
        self,
        staleness_s: float,
        max_size: int = DEFAULT_MAX_SIZE,
        clock: Callable[[], float] = time.monotonic,
        *,
        rng: random.Random | None = None,
    ) -> None:
        if max_size < 0:
            raise ValueError(f"access table max_size must be >= 0, got {max_size!r}")
        # Read by the enqueue hot path directly (Intake.enqueue: no call frame between an
        # event and its drop); written only here.
        #: key -> when a channel last accepted it (``clock`` seconds).
        self.accepted: dict[str, float] = {}
        #: The staleness in force (seconds); changed by :meth:`set_staleness`.
        self.staleness_s = 0.0
        self.set_staleness(staleness_s)
        self._max_size = max_size
        #: Monotonic seconds (injected in tests).
        self.clock = clock
        self._rng = rng or random.Random()
        self._next_clean_at: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ hot path

    def is_fresh(self, key: str, now: float | None = None) -> bool:
        """Whether a channel accepted ``key`` less than ``staleness_s`` ago.

        The hot path: one dict lookup and one compare; no I/O, no lock, no logging.
        ``Intake.enqueue`` makes the same test inline (a call frame there cost a sixth of
        the path): a change here is a change there.

        Parameters:
            key: the raw key as the caller has it (the server also asks for its canonical form).
            now: the current time on the table's clock; None reads the clock.

        Returns:
            True when the key is fresh and the event can be dropped.
        """
        accepted_at = self.accepted.get(key)
        if accepted_at is None:
            return False
        return (self.clock() if now is None else now) - accepted_at < self.staleness_s

    def fresh_for_s(self, key: str) -> float:
        """Seconds until ``key`` is no longer fresh; 0 when it is not fresh now (not the hot path).

        Parameters:
            key: the key.

        Returns:
            The seconds left, or 0.0.
        """
        accepted_at = self.accepted.get(key)
        if accepted_at is None:
            return 0.0
        return max(0.0, accepted_at + self.staleness_s - self.clock())

    # ------------------------------------------------------------------ updates

    def record(self, key: str, now: float | None = None) -> bool:
        """Note that a channel accepted ``key`` now. Call it only when a channel took the key.

        Parameters:
            key: the key the channel accepted.
            now: the current time on the table's clock; None reads the clock.

        Returns:
            True if the key is now recorded; False when the table is full and the key is new,
            or the throttle is off (staleness 0).
        """
        if self.staleness_s <= 0:
            # Nothing can be fresh, so remembering keys would only cost memory.
            return False
        accepted = self.accepted
        if key not in accepted and len(accepted) >= self._max_size:
            return False
        accepted[key] = self.clock() if now is None else now
        return True

    def forget(self, key: str) -> None:
        """Drop ``key`` so its next event is examined (e.g. a retry after a backoff).

        Parameters:
            key: the key to forget; unknown keys are ignored.
        """
        self.accepted.pop(key, None)

    def forget_all(self) -> int:
        """Forget every key: each one's next event or scan is examined (an upgrade target changed).

        Returns:
            How many keys were forgotten.
        """
        count = len(self.accepted)
        self.accepted.clear()  # one dict operation: atomic for the hot path's readers (the GIL)
        return count

    def clean(self, now: float | None = None) -> int:
        """Drop every expired entry.

        Parameters:
            now: the current time on the table's clock; None reads the clock.

        Returns:
            The number of entries dropped.
        """
        now = self.clock() if now is None else now
        staleness_s = self.staleness_s
        accepted = self.accepted
        dropped = 0
        # Iterate over a snapshot: record() may add keys from other threads meanwhile.
        for key, accepted_at in accepted.copy().items():
            if now - accepted_at >= staleness_s:
                # Re-check the value: if record() refreshed the key since the snapshot, keep it.
                # (The get/pop pair can still lose to a record() in between; the cost is one
                # unthrottled duplicate event, which the channel ignores.)
                if accepted.get(key) == accepted_at:
                    accepted.pop(key, None)
                    dropped += 1
        return dropped

    def set_staleness(self, staleness_s: float) -> None:
        """Change the staleness live (config reload).

        Parameters:
            staleness_s: seconds; 0 turns the throttle off and empties the table.

        Raises:
            ValueError: ``staleness_s`` is negative.
        """
        if staleness_s < 0:
            raise ValueError(f"staleness must be >= 0 seconds, got {staleness_s!r}")
        self.staleness_s = float(staleness_s)
        if self.staleness_s == 0:
            self.accepted.clear()

    def set_max_size(self, max_size: int) -> None:
        """Change the most entries the table records (config reload); entries over it stay until they expire.

        Raises:
            ValueError: a negative size.
        """
        if max_size < 0:
            raise ValueError(f"access table max_size must be >= 0, got {max_size!r}")
        self._max_size = max_size

    @property
    def max_size(self) -> int:
        """The most entries the table records."""
        return self._max_size

    def __len__(self) -> int:
        return len(self.accepted)

    # ------------------------------------------------------------------ cleaner

    def tick(self, now: float) -> int:
        """Run the cleaner if its (jittered) time has come; the steppable form of the thread.

        Parameters:
            now: the current time on the table's clock.

        Returns:
            The number of entries dropped (0 when the cleaner was not due).
        """
        if self._next_clean_at is None:
            self._next_clean_at = now + self._next_delay_s()
            return 0
        if now < self._next_clean_at:
            return 0
        self._next_clean_at = now + self._next_delay_s()
        return self.clean(now)

    def next_due(self) -> float | None:
        """When the cleaner next wants a :meth:`tick` (on the table's clock), or None before the first."""
        return self._next_clean_at

    def start(self) -> None:
        """Start the background cleaner thread (idempotent)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._next_clean_at = None
        self._thread = threading.Thread(target=self._run, name="smoosh-access-cleaner", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop the cleaner thread and wait for it.

        Parameters:
            timeout_s: the longest to wait for the thread to exit.
        """
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)

    def _next_delay_s(self) -> float:
        return CLEAN_INTERVAL_S + self._rng.random() * CLEAN_JITTER_S

    def _run(self) -> None:
        self.tick(self.clock())
        while True:
            next_at = self._next_clean_at
            delay_s = CLEAN_INTERVAL_S if next_at is None else max(0.0, next_at - self.clock())
            if self._stop.wait(delay_s):
                return
            try:
                dropped = self.tick(self.clock())
                if dropped:
                    log.debug("access table cleaner dropped %d expired keys", dropped)
            except Exception:
                # One bad pass must not end the cleaner: the table would then grow to max_size.
                log.exception("access table cleaner pass failed")
