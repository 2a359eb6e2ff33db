"""Per-key debouncing of file events, with a recheck hold for keys no channel took.

DESIGN §5.1: a key is examined once it has had no events for ``quiet_s`` (a WAL database
emits more than one event per commit; peers_perf §4.6 counts ~8 per commit in rollback
mode). A key no channel took is not examined again for ``recheck_interval_s``; events during
that hold are suppressed but remembered, and cause exactly one more look when the hold ends
(so the final state of a file is always examined).

Every key is in at most one state::

    pending    events seen, waiting for quiet_s without events      -> due() returns it
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
        in_flight_timeout_s: float = IN_FLIGHT_TIMEOUT_S,
    ) -> None:
        for name, value in (
            ("quiet_s", quiet_s),
            ("recheck_interval_s", recheck_interval_s),
            ("in_flight_timeout_s", in_flight_timeout_s),
        ):
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value!r}")
        self._quiet_s = float(quiet_s)
        self._recheck_interval_s = float(recheck_interval_s)
        self._in_flight_timeout_s = float(in_flight_timeout_s)
        self._lock = threading.Lock()
        #: key -> time of the burst's last event (insertion order = time order).
        self._pending: dict[str, float] = {}
        #: key -> [handed out at, dirty] (insertion order = time order).
        self._in_flight: dict[str, list] = {}
        #: key -> [hold ends at, dirty] (insertion order = time order).
        self._held: dict[str, list] = {}

    def set_recheck_interval(self, recheck_interval_s: float) -> None:
        """Change the hold for keys no channel took (config reload); applies to new holds.

        Parameters:
            recheck_interval_s: seconds, >= 0.

        Raises:
            ValueError: a negative interval.
        """
        if recheck_interval_s < 0:
            raise ValueError(f"recheck_interval_s must be >= 0, got {recheck_interval_s!r}")
        self._recheck_interval_s = float(recheck_interval_s)

    def event(self, key: str, now: float) -> None:
        """Note a file event for ``key``.

        Parameters:
            key: the canonical path the event is about.
            now: the current time (the caller's clock, the same one passed to ``due``).
        """
        with self._lock:
            hold = self._held.get(key)
            if hold is not None:
                hold[1] = True
                return
            flight = self._in_flight.get(key)
            if flight is not None:
                flight[1] = True
                return
            pending = self._pending
            # Re-insert at the end so the dict stays ordered by last event time.
            pending.pop(key, None)
            pending[key] = now

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
            pending = self._pending
            cutoff = now - self._quiet_s
            while pending:
                key, last = next(iter(pending.items()))
                if last > cutoff:
                    break
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

    def result(self, key: str, taken: bool, now: float) -> None:
        """Report whether a channel took ``key`` after ``due`` handed it out.

        Taken: the key is forgotten here (the access table throttles it from now on). Not
        taken: the key is held for ``recheck_interval_s``; events during the hold (or while
        it was being examined) cause one more look when the hold ends.

        Parameters:
            key: a key ``due`` returned (others are accepted and treated the same way).
            taken: whether a channel accepted the key.
            now: the current time.
        """
        with self._lock:
            flight = self._in_flight.pop(key, None)
            if taken:
                return
            dirty = bool(flight and flight[1])
            self._pending.pop(key, None)
            self._held.pop(key, None)
            self._held[key] = [now + self._recheck_interval_s, dirty]

    def __len__(self) -> int:
        """The number of keys tracked in any state."""
        with self._lock:
            return len(self._pending) + len(self._in_flight) + len(self._held)

    def counts(self) -> dict[str, int]:
        """Keys per state, for status and tests: ``{"pending", "in_flight", "held"}``."""
        with self._lock:
            return {"pending": len(self._pending), "in_flight": len(self._in_flight), "held": len(self._held)}
