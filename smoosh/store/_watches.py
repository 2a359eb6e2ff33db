"""Watches for the embedded stores: a registry of armed watches, fired when a key's value changes.

A watch is *created* by ``tr.watch(key)`` (counted against the limit at once, as FoundationDB
counts outstanding watch futures) and *armed* when its transaction commits, with the baseline
value the transaction saw or wrote. From then on any committed value different from the
baseline fires it. Stores call :meth:`WatchRegistry.check` with current values: after each local
commit, and (SQLite) from a poller when another process has committed.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Iterable, Mapping

from smoosh.store.base import Watch
from smoosh.store.errors import OPERATION_CANCELLED, TOO_MANY_WATCHES, StoreError
from smoosh.store._mutations import RangeSet

log = logging.getLogger(__name__)


class StoreWatch(Watch):
    """One watch of an embedded store; settled exactly once (fired or failed)."""

    __slots__ = ("key", "baseline", "min_version", "_event", "_error", "_done", "_registry", "_callbacks")

    def __init__(self, registry: WatchRegistry, key: bytes) -> None:
        self.key = key
        self.baseline: bytes | None = None
        #: Commit version the store must have reached before a re-read may fire this watch
        #: (SQLite arms watches just before its COMMIT; a poller reading older data must skip them).
        self.min_version = 0
        self._event = threading.Event()
        self._error: StoreError | None = None
        self._done = False
        self._registry = registry
        self._callbacks: list[Callable[[], None]] | None = None

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the watch fires or ``timeout`` seconds pass; see :meth:`Watch.wait`."""
        if not self._event.wait(timeout):
            return False
        if self._error is not None:
            raise self._error
        return True

    def is_ready(self) -> bool:
        """Whether the watch has fired or failed."""
        return self._event.is_set()

    def cancel(self) -> None:
        """Stop watching; a later :meth:`wait` raises 1101 (a watch that already fired stays fired)."""
        self._registry.settle(self, OPERATION_CANCELLED)

    def on_settled(self, fn: Callable[[], None]) -> None:
        """See :meth:`Watch.on_settled`."""
        with self._registry._lock:
            if not self._done:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
                return
        fn()

    def __repr__(self) -> str:
        state = "pending" if not self._done else ("failed" if self._error else "fired")
        return f"<StoreWatch {self.key!r} {state}>"


class WatchRegistry:
    """Every outstanding watch of one store handle, by key. Thread-safe."""

    def __init__(self, max_watches: int) -> None:
        self.max_watches = max_watches
        # Reentrant: the finalizer of an abandoned transaction (run by the garbage collector,
        # possibly inside one of our own critical sections) settles its unarmed watches.
        self._lock = threading.RLock()
        self._armed: dict[bytes, set[StoreWatch]] = {}
        self._outstanding = 0

    def create(self, key: bytes) -> StoreWatch:
        """A new, unarmed watch; already failed with 1032 when the store has too many."""
        w = StoreWatch(self, key)
        with self._lock:
            if self._outstanding >= self.max_watches:
                w._done = True
                w._error = StoreError(TOO_MANY_WATCHES)
                w._event.set()
                return w
            self._outstanding += 1
        return w

    def arm(self, w: StoreWatch, baseline: bytes | None, min_version: int = 0) -> bool:
        """Start tracking ``w`` against ``baseline``; False if it was already settled (cancelled)."""
        with self._lock:
            if w._done:
                return False
            w.baseline = baseline
            w.min_version = min_version
            self._armed.setdefault(w.key, set()).add(w)
            return True

    def settle(self, w: StoreWatch, error_code: int | None = None) -> None:
        """Fire ``w`` (no code) or fail it with ``error_code``; a no-op once settled."""
        with self._lock:
            if w._done:
                return
            w._done = True
            self._outstanding -= 1
            peers = self._armed.get(w.key)
            if peers is not None:
                peers.discard(w)
                if not peers:
                    del self._armed[w.key]
            callbacks, w._callbacks = w._callbacks, None
        if error_code is not None:
            w._error = StoreError(error_code)
        w._event.set()
        for fn in callbacks or ():
            try:
                fn()
            except Exception:
                log.exception("a watch callback failed")

    def fail(self, watches: Iterable[StoreWatch], error_code: int) -> None:
        """Fail every watch of ``watches`` that is not settled yet."""
        for w in watches:
            self.settle(w, error_code)

    def has_armed(self) -> bool:
        """Whether any armed watch waits for a change."""
        return bool(self._armed)

    def armed_keys(self) -> list[bytes]:
        """The keys armed watches track."""
        with self._lock:
            return list(self._armed)

    def affected(self, points: Iterable[bytes], ranges: Iterable[tuple[bytes, bytes]]) -> set[bytes]:
        """Armed keys among ``points`` or inside ``ranges``: what a commit must re-check."""
        with self._lock:
            if not self._armed:
                return set()
            out = {k for k in points if k in self._armed}
            ranges = list(ranges)
            if ranges:
                rs = RangeSet()
                for b, e in ranges:
                    rs.add(b, e)
                out.update(k for k in self._armed if rs.contains(k))
            return out

    def check(self, values: Mapping[bytes, bytes | None], version: int | None = None) -> int:
        """Fire armed watches whose key's current value (from ``values``) differs from their baseline.

        Parameters:
            values: current committed values of some watched keys (None = absent).
            version: the commit version ``values`` were read at; watches armed for a later
                version are skipped. None checks every watch.

        Returns:
            How many watches fired.
        """
        to_fire = []
        with self._lock:
            for key, value in values.items():
                for w in self._armed.get(key, ()):
                    if (version is None or w.min_version <= version) and value != w.baseline:
                        to_fire.append(w)
        for w in to_fire:
            self.settle(w)
        return len(to_fire)

    def close(self) -> None:
        """Fail every armed watch with 1101 (the store handle is going away)."""
        with self._lock:
            armed = [w for ws in self._armed.values() for w in ws]
        self.fail(armed, OPERATION_CANCELLED)
