"""Notifier and type monitor: turn job changes into subscription events.

The type monitor watches ``(WATCHES_ACTIVITY, type)``, which accept, update, finish, remove
and re-enqueue rewrite, and wakes the notifier (at most once per hold-off). The notifier
then reads the current row of every subscribed job (in AIMD batches) and delivers events:
a running subscriber hears every new run stamp (each ``update``), others hear state changes
only; "finished" and "not_found" end a subscription. ``subscribe`` also wakes the notifier,
so a change between the subscriber's read and its registration is never missed.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable

from smoosh.store.base import Store, Transaction, Watch
from smoosh.store.errors import StoreError
from smoosh.jobs import model
from smoosh.jobs.batching import BATCH_RETRY_LIMIT, MAX_CONSECUTIVE_FAILURES, BatchPolicy, is_batch_error
from smoosh.jobs.encoding import JobType, decode_data
from smoosh.jobs.model import NOT_FOUND_STATE, RUNNING_STATE, Keys
from smoosh.jobs.subscription import FINAL_STATES, Hub, Subscription

log = logging.getLogger(__name__)

#: Longest interval (seconds) between two wake-ups of the notifier (couch_jobs' 50 ms hold-off).
HOLDOFF_S = 0.05
#: Shortest interval (seconds) between two wake-ups of the notifier.
MIN_HOLDOFF_S = 0.001
#: The hold-off is this many times the notifier's last pass (between the two above). A fixed
#: 50 ms let a daemon hear of its workers' finishes at most 20 times a second: one compaction
#: per slot every 50 ms when each takes a few. Scaled to what a pass costs, the notifier still
#: spends at most about a tenth of its time reading, however many jobs are subscribed.
HOLDOFF_PER_PASS = 10.0
#: Longest wait (seconds) on one watch before it is re-armed (a safety net for lost watches).
WATCH_REFRESH_S = 5.0


@dataclass
class _Registered:
    # Weak: a subscription its owner dropped without close() is forgotten (couch_jobs drops
    # the subscriptions of a subscriber process that died) instead of being read forever.
    sub: weakref.ref[Subscription]
    state: str
    seq: Any


class Notifier:
    """Delivers events to the subscriptions of one type; :meth:`step` does one pass."""

    def __init__(self, store: Store, keys: Keys, job_type: JobType, hub: Hub, *, batch: BatchPolicy | None = None) -> None:
        self.store = store
        self.keys = keys
        self.job_type = job_type
        self.hub = hub
        self.batch = batch or BatchPolicy()
        self.batch_size = self.batch.initial
        self._subs: dict[str, dict[int, _Registered]] = {}
        #: Seconds the last pass took (written by the notifier's thread; the type monitor reads it).
        self.last_pass_s = 0.0
        #: Called to have :meth:`step` run soon (set by the owner to its runner's kick).
        self.kick: Callable[[], None] = lambda: None

    # -- registry (thread-safe) -------------------------------------------------------------

    def register(self, sub: Subscription, state: str, seq: Any) -> None:
        """Start delivering events of ``sub``'s job, as seen from ``(state, seq)``."""
        with self.hub.cond:
            self._subs.setdefault(sub.id, {})[id(sub)] = _Registered(weakref.ref(sub), state, seq)
        self.kick()

    def unregister(self, sub: Subscription) -> None:
        with self.hub.cond:
            entries = self._subs.get(sub.id)
            if entries is not None:
                entries.pop(id(sub), None)
                if not entries:
                    del self._subs[sub.id]

    def subscription_count(self) -> int:
        with self.hub.cond:
            return sum(len(entries) for entries in self._subs.values())

    # -- the role ---------------------------------------------------------------------------

    def reset(self) -> None:
        """Subscriptions survive a crash: the next pass compares them with the store again."""
        self.batch_size = self.batch.initial

    def wake(self) -> None:
        """The runner's kick interrupts the wait; nothing inside a step blocks."""

    def step(self) -> None:
        started = time.monotonic()
        self.notify_subscribers()
        self.last_pass_s = time.monotonic() - started
        return None

    def notify_subscribers(self) -> int:
        """Read every subscribed job and deliver what changed; returns events delivered."""
        with self.hub.cond:
            self._forget_dropped()
            ids = sorted(self._subs)
        if not ids:
            return 0
        rows = self._read_rows(ids)
        delivered = 0
        with self.hub.cond:
            for job_id, row in rows.items():
                delivered += self._notify_job(job_id, row)
        return delivered

    def _forget_dropped(self) -> None:
        for job_id in list(self._subs):
            entries = self._subs[job_id]
            for key in [k for k, reg in entries.items() if reg.sub() is None]:
                del entries[key]
            if not entries:
                del self._subs[job_id]

    def _read_rows(self, ids: list[str]) -> dict[str, model.JobRow | None]:
        rows: dict[str, model.JobRow | None] = {}
        start = 0
        failures = 0
        while start < len(ids):
            limit = self.batch_size
            chunk = ids[start : start + limit]
            try:
                rows.update(self.store.transact(lambda tr: self._read_batch(tr, chunk), retry_limit=BATCH_RETRY_LIMIT))
            except StoreError as e:
                if not is_batch_error(e):
                    raise
                failures += 1
                self.batch_size = self.batch.shrink(limit)
                log.debug("notifier batch of %d for type %r failed (%s); batch size now %d",
                          limit, self.job_type, e, self.batch_size)
                if failures >= MAX_CONSECUTIVE_FAILURES:
                    raise
                continue
            failures = 0
            start += len(chunk)
            self.batch_size = self.batch.grow(limit)
        return rows

    def _read_batch(self, tr: Transaction, ids: list[str]) -> dict[str, model.JobRow | None]:
        """The current rows of ``ids`` (snapshot reads: a notifier never conflicts with anyone)."""
        return {job_id: model.get_row(tr.snapshot, self.keys, self.job_type, job_id) for job_id in ids}

    def _notify_job(self, job_id: str, row: model.JobRow | None) -> int:
        entries = self._subs.get(job_id)
        if not entries:
            return 0
        if row is None:
            state, seq, data = NOT_FOUND_STATE, None, None
        else:
            state, seq = row.state, row.seq
            data = None
        delivered = 0
        for key, reg in list(entries.items()):
            sub = reg.sub()
            if sub is None:
                del entries[key]
                continue
            if state == RUNNING_STATE and reg.state == RUNNING_STATE:
                # A running subscriber hears every update: the run stamp grows on each one.
                if reg.seq is not None and _stamp_key(seq) <= _stamp_key(reg.seq):
                    continue
            elif state == reg.state:
                continue
            if data is None and row is not None:
                data = decode_data(row.data)
            sub._deliver((self.job_type, job_id, state, data))
            delivered += 1
            if state in FINAL_STATES:
                del entries[key]
            else:
                reg.state, reg.seq = state, seq
        if not entries:
            del self._subs[job_id]
        return delivered


def _stamp_key(seq: Any) -> tuple[bytes, int]:
    """Order run stamps (complete Versionstamps); anything else sorts first."""
    tr_version = getattr(seq, "tr_version", None)
    if tr_version is None:
        return (b"", -1)
    return (bytes(tr_version), seq.user_version)


class TypeMonitor:
    """Watches ``(WATCHES_ACTIVITY, type)`` and calls ``on_change`` (at most once per hold-off).

    The hold-off is ``holdoff_s``, or, given ``pass_cost_s`` (the notifier's last pass, in
    seconds), :data:`HOLDOFF_PER_PASS` times that pass, between :data:`MIN_HOLDOFF_S` and
    ``holdoff_s``.

    It never blocks its loop: each step reads the stamp and arms a watch whose callback
    kicks the monitor (:attr:`kick`, set by its runner), so many types share one thread.
    The watch is re-armed every ``watch_refresh_s`` anyway, a safety net for a lost one.
    """

    def __init__(
        self,
        store: Store,
        keys: Keys,
        job_type: JobType,
        on_change: Callable[[], None],
        *,
        holdoff_s: float = HOLDOFF_S,
        pass_cost_s: Callable[[], float] | None = None,
        watch_refresh_s: float = WATCH_REFRESH_S,
    ) -> None:
        self.store = store
        self.keys = keys
        self.job_type = job_type
        self.on_change = on_change
        self.holdoff_s = holdoff_s
        self.pass_cost_s = pass_cost_s
        self.watch_refresh_s = watch_refresh_s
        self._lock = threading.Lock()
        self._watch: Watch | None = None
        self._stopping = False
        #: Called (from the thread that settles the watch) to have :meth:`step` run soon.
        self.kick: Callable[[], None] = lambda: None
        self.reset()

    def reset(self) -> None:
        # Unknown stamp: the first pass after a (re)start always wakes the notifier once.
        self.stamp: Any = object()
        self.notified_at = float("-inf")
        self._owed = False

    def wake(self) -> None:
        """Stop: cancel the armed watch."""
        with self._lock:
            self._stopping = True
            watch, self._watch = self._watch, None
        if watch is not None:
            watch.cancel()

    def _read_and_watch(self, tr: Transaction) -> tuple[Any, Watch]:
        return model.read_activity_stamp(tr, self.keys, self.job_type), tr.watch(self.keys.watches_activity(self.job_type))

    def step(self) -> float:
        """Notify the notifier if the stamp moved (hold-off permitting) and re-arm the watch."""
        stamp, watch = self.store.transact(self._read_and_watch)
        with self._lock:
            old, self._watch = self._watch, None if self._stopping else watch
        if old is not None:
            old.cancel()
        if self._stopping:
            watch.cancel()
            return self.watch_refresh_s
        # Only the current watch kicks: the one cancelled above (or at a stop) must not.
        watch.on_settled(lambda: self._fired(watch))
        if stamp != self.stamp:
            self.stamp = stamp
            self._owed = True
        if self._owed:
            since_s = time.monotonic() - self.notified_at
            holdoff_s = self.holdoff()
            if since_s < holdoff_s:
                return holdoff_s - since_s  # the hold-off ends: notify then
            self._owed = False
            self.notified_at = time.monotonic()
            self.on_change()
        return self.watch_refresh_s

    def holdoff(self) -> float:
        """Seconds the notifier is held off after it was woken (see the class docstring)."""
        if self.pass_cost_s is None:
            return self.holdoff_s
        return min(self.holdoff_s, max(MIN_HOLDOFF_S, HOLDOFF_PER_PASS * self.pass_cost_s()))

    def _fired(self, watch: Watch) -> None:
        with self._lock:
            current = watch is self._watch and not self._stopping
        if current:
            self.kick()
