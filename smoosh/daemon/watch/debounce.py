"""Per-key debouncing of file events, with a recheck hold for keys no channel took.

DESIGN §5.1: a key is examined once it has had no events for ``quiet_s`` (a WAL database
emits more than one event per commit; peers_perf §4.6 counts ~8 per commit in rollback
mode), and under a steady stream of events at the latest ``max_wait_s`` after its first
unexamined one: a database written without pause is still examined. A key no channel took is not examined again for ``recheck_interval_s``; events during
that hold are suppressed but remembered, and cause exactly one more look when the hold ends
(so the final state of a file is always examined).

Every key is in at most one state::

    pending    events seen, waiting for quiet_s without events      -> due() returns it
               (or for max_wait_s since its first event)
    in flight  returned by due(), waiting for the caller's result()  -> events only mark it dirty
    held       result(taken=False): no look until the hold ends      -> dirty? one more look

Memory stays bounded by the keys with recent activity: a key leaves ``pending`` when due,
leaves ``in flight`` at its result (or after ``IN_FLIGHT_TIMEOUT_S`` if the caller never
answers) and leaves ``held`` when the hold ends. Each state is a dict kept in time order (a
key is re-inserted at the end when its time moves), so ``due()`` looks only at the keys that
are due plus one: O(due), not O(keys), even with a million pending keys after a scan.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)

#: Seconds without events before a key is examined (DESIGN §5.1).
DEFAULT_QUIET_S = 1.0
#: Seconds a key that no channel took is held before it can be examined again (DESIGN §8 recheck_interval).
DEFAULT_RECHECK_INTERVAL_S = 10.0
#: Seconds after which a key handed out by due() but never answered by result() is released.
IN_FLIGHT_TIMEOUT_S = 600.0


class Debouncer:
    """Turns bursts of file events into single looks at a key; steppable and thread-safe.

    Parameters:
        quiet_s: seconds without events before a key is due.
        recheck_interval_s: seconds a key is held after ``result(key, taken=False, ...)``.
        in_flight_timeout_s: seconds after which an unanswered due key is released.

    Raises:
        ValueError: a negative interval.
    """

    def __init__(
        self,
        quiet_s: float = DEFAULT_QUIET_S,
        recheck_interval_s: float = DEFAULT_RECHECK_INTERVAL_S,
        *,
        max_wait_s: float | None = None,
        in_flight_timeout_s: float = IN_FLIGHT_TIMEOUT_S,
    ) -> None:
        max_wait_s = recheck_interval_s if max_wait_s is None else max_wait_s
        for name, value in (
            ("quiet_s", quiet_s),
            ("recheck_interval_s", recheck_interval_s),
            ("max_wait_s", max_wait_s),
            ("in_flight_timeout_s", in_flight_timeout_s),
        ):
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value!r}")
        self._quiet_s = float(quiet_s)
        self._recheck_interval_s = float(recheck_interval_s)
        self._max_wait_s = float(max(max_wait_s, quiet_s))
        self._in_flight_timeout_s = float(in_flight_timeout_s)
        self._lock = threading.Lock()
        #: key -> time of the burst's last event (insertion order = time order).
        self._pending: dict[str, float] = {}
        #: key -> time of the burst's first event (insertion order = time order; never moved).
        self._first: dict[str, float] = {}
        #: key -> [handed out at, dirty] (insertion order = time order).
        self._in_flight: dict[str, list] = {}
        #: key -> [hold ends at, dirty] (insertion order = time order).
        self._held: dict[str, list] = {}

    def set_recheck_interval(self, recheck_interval_s: float) -> None:
        """Change the hold for keys no channel took, and the longest wait of a key under a
        steady stream of events (config reload); applies to new holds and bursts.

        Parameters:
            recheck_interval_s: seconds, >= 0.

        Raises:
            ValueError: a negative interval.
        """
        if recheck_interval_s < 0:
            raise ValueError(f"recheck_interval_s must be >= 0, got {recheck_interval_s!r}")
        self._recheck_interval_s = float(recheck_interval_s)
        self._max_wait_s = max(float(recheck_interval_s), self._quiet_s)

    def event(self, key: str, now: float) -> bool:
        """Note a file event for ``key``.

        Parameters:
            key: the canonical path the event is about.
            now: the current time (the caller's clock, the same one passed to ``due``).

        Returns:
            True when the key started a new burst: :meth:`next_due` may now be earlier, so a
            caller that sleeps until it should wake (later events only move it later).
        """
        with self._lock:
            hold = self._held.get(key)
            if hold is not None:
                hold[1] = True
                return False
            flight = self._in_flight.get(key)
            if flight is not None:
                flight[1] = True
                return False
            pending = self._pending
            # Re-insert at the end so the dict stays ordered by last event time.
            new = pending.pop(key, None) is None
            if new:
                self._first[key] = now
            pending[key] = now
            return new

    def due(self, now: float) -> list[str]:
        """The keys to examine now; each is handed out once and is then "in flight".

        A key is due when it has had no events for ``quiet_s``, or when its hold ended and
        events arrived during the hold. The caller must answer each with ``result``.

        Parameters:
            now: the current time.

        Returns:
            The due keys, oldest first.
        """
        out: list[str] = []
        with self._lock:
            in_flight = self._in_flight
            held = self._held
            while held:
                key, (until, dirty) = next(iter(held.items()))
                if until > now:
                    break
                del held[key]
                if dirty:
                    out.append(key)
            pending, first = self._pending, self._first
            cutoff = now - self._quiet_s
            while pending:
                key, last = next(iter(pending.items()))
                if last > cutoff:
                    break
                del pending[key]
                del first[key]
                out.append(key)
            # A steady stream of events never lets a key fall quiet: bounded by its first one.
            cutoff = now - self._max_wait_s
            while first:
                key, since = next(iter(first.items()))
                if since > cutoff:
                    break
                del first[key]
                del pending[key]
                out.append(key)
            for key in out:
                in_flight.pop(key, None)
                in_flight[key] = [now, False]
            # Release keys whose result never came, so a lost callback cannot mute a key forever.
            expire = now - self._in_flight_timeout_s
            while in_flight:
                key, (since, _dirty) = next(iter(in_flight.items()))
                if since > expire:
                    break
                del in_flight[key]
                log.warning(
                    "no result for %r within %.0f s of its examination; releasing it",
                    key,
                    self._in_flight_timeout_s,
                )
        return out

    def result(self, key: str, taken: bool, now: float) -> bool:
        """Report whether a channel took ``key`` after ``due`` handed it out.

        Taken: the key is forgotten here (the access table throttles it from now on). Not
        taken: the key is held for ``recheck_interval_s``; events during the hold (or while
        it was being examined) cause one more look when the hold ends.

        Parameters:
            key: a key ``due`` returned (others are accepted and treated the same way).
            taken: whether a channel accepted the key.
            now: the current time.

        Returns:
            True when the key is now held (:meth:`next_due` may be earlier).
        """
        with self._lock:
            flight = self._in_flight.pop(key, None)
            if taken:
                return False
            dirty = bool(flight and flight[1])
            if self._pending.pop(key, None) is not None:
                del self._first[key]
            self._held.pop(key, None)
            self._held[key] = [now + self._recheck_interval_s, dirty]
            return True

    def is_busy(self, key: str) -> bool:
        """Whether ``key`` has events waiting to settle, or is being examined for them."""
        with self._lock:
            return key in self._pending or key in self._in_flight

    def next_due(self) -> float | None:
        """The earliest time :meth:`due` may return a key (None: nothing pending or held)."""
        with self._lock:
            dues = []
            if self._pending:
                dues.append(next(iter(self._pending.values())) + self._quiet_s)
                dues.append(next(iter(self._first.values())) + self._max_wait_s)
            if self._held:
                dues.append(next(iter(self._held.values()))[0])
            if self._in_flight:
                dues.append(next(iter(self._in_flight.values()))[0] + self._in_flight_timeout_s)
            return min(dues) if dues else None

    def __len__(self) -> int:
        """The number of keys tracked in any state."""
        with self._lock:
            return len(self._pending) + len(self._in_flight) + len(self._held)

    def counts(self) -> dict[str, int]:
        """Keys per state, for status and tests: ``{"pending", "in_flight", "held"}``."""
        with self._lock:
            return {"pending": len(self._pending), "in_flight": len(self._in_flight), "held": len(self._held)}
