"""The intake: from "this key changed" to a key queued in a channel (or not), measured once.

The path (DESIGN §2): :meth:`Intake.enqueue` looks the raw key up in the access table (the
hot path: a dict lookup, no I/O); only on a miss is the key canonicalised and validated,
and its database measured off the caller's thread. The router prices it per channel; the
first channel in the operator's order that gives a priority > 0 queues it. The measurement
is kept with the key (:class:`Measurement`), so the re-check before its start costs a
``stat`` when the file has not changed since, instead of a second measurement.

Watcher events are debounced (:class:`~smoosh.daemon.watch.debounce.Debouncer`); a scan's reports
are examined at once. Examining a database whose ``-wal`` grew past half of ``wal_max_size`` also
examines its ``cleanup:`` key, which is how the cleanup channels are fed. Roots are checked here on the way in, and again wherever a database is
opened: the re-check before a start, and the compactor itself.

Ownership: the measurement table and the in-flight table belong to the intake, reached only
through its methods; ``_lock`` guards the in-flight table (examine threads and callers),
the measurement table is a dict whose single operations the GIL makes atomic.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from smoosh.clocks import Clocks
from smoosh.compactors.base import CompactorBase, Look, refused
from smoosh.config import Config
from smoosh.daemon.intake.admission import AdmissionGate
from smoosh.daemon.watch.debounce import Debouncer
from smoosh.daemon.intake.keys import MAX_KEY_BYTES, canonical_key, check_key
from smoosh.daemon.keypool import KeyPool
from smoosh.daemon.intake.measurement import Measurement, StatusSizer, signature
from smoosh.daemon.intake.router import CLEANUP_PREFIX, EXACT_DUE, Router, db_path
from smoosh.daemon.watch.staleness import AccessTable
from smoosh.daemon.intake.verdicts import (
    NOT_QUEUED, QUEUED, Verdict, Waiter, below_reason, look_at, not_measured_reason, stale_reason,
)
from smoosh.errors import InvalidKey
from smoosh.paths import inside, refused_at_use
from smoosh.priority import quantize

__all__ = ["Intake", "Measurement", "MAX_KEY_BYTES", "inside"]

log = logging.getLogger(__name__)

#: Threads computing priorities from cheap sizes (a header read each). One: the work is
#: Python under the GIL, and more threads only convoy on it.
EXAMINE_THREADS = 1
#: Threads taking exact ``dbstat`` measurements handed over by the examine thread. Several:
#: SQLite reads every page without the GIL, and at start-up those pages are rarely cached.
MEASURE_THREADS = 3


#: A busy key's ``-wal`` is looked at no more often than this on its events (seconds).
WAL_LOOK_INTERVAL_S = 1.0
#: Busy keys whose last look is remembered; past it the table starts again.
MAX_WAL_LOOKS = 100_000


@dataclass(slots=True)
class _InFlight:
    """A key waiting for or in its examination (one per key: a fleet has many).

    ``dirty`` asks for one more run after the one in progress; ``debounced`` reports the
    outcome to the debouncer (the key came from the watcher's events); ``force`` routes it
    past the thresholds (``enqueue --force``); ``look`` is the compactor's look at the file
    its admission took (HTTP, the CLI), for the examination to measure from instead of
    reading the file again (DESIGN §12: one look per new key); a run takes it once.
    """

    started: bool = False
    dirty: bool = False
    debounced: bool = False
    force: bool = False
    look: Look | None = None


class Intake:
    """Validates, examines and routes keys; see the module docstring.

    Parameters:
        config_of: the config in force (read anew for every decision: reloads apply at once).
        router: measures keys and prices them per channel.
        access: the staleness table (the hot path).
        offer: ``offer(key, channel_names, config, priority_of, sizes, force=False)``: hand the
            key to the first of the channels that takes it (with ``force``, to the first that
            considers it, whatever its priority); true when one took it (an
            :class:`~smoosh.daemon.intake.verdicts.Offered` says which, or why it does not wait there).
        own_paths: smoosh's own files (state_dir, the store), never keys.
        clocks: the daemon's clocks: the debounce counts on the monotonic one (the loop's,
            which ticks the intake), a verdict's words tell wall time.
    """

    def __init__(
        self,
        *,
        config_of: Callable[[], Config],
        router: Router,
        access: AccessTable,
        offer: Callable[..., Any],
        own_paths: tuple[str, ...],
        clocks: Clocks,
        counters: Any,
    ) -> None:
        self._config_of = config_of
        self.router = router
        self.access = access
        self._offer = offer
        self.own_paths = own_paths
        self._clock = clocks.monotonic
        self._wall = clocks.wall
        #: key -> when its WAL was last looked at on an event (see _watch_wal).
        self._wal_looked: dict[str, float] = {}
        self.counters = counters
        self._lock = threading.Lock()
        self._inflight: dict[str, _InFlight] = {}
        # Callers waiting for what becomes of a key (POST /enqueue?wait=1), under _lock; the
        # verdict of a key's latest examination is worked out only while someone waits.
        self._waiters: dict[str, list[Waiter]] = {}
        self._verdicts: dict[str, Verdict] = {}
        self.measurements: dict[str, Measurement] = {}
        self.debouncer = Debouncer(recheck_interval_s=config_of().recheck_interval_s)
        self._examiners: KeyPool[str] = KeyPool(self._examine_cheap, EXAMINE_THREADS, "smoosh-examine")
        self._measurers: KeyPool[str] = KeyPool(self._examine_exact, MEASURE_THREADS, "smoosh-measure")
        # Queued keys nobody measured in this process are sized for the status table; a key
        # being examined is left to its examination.
        self._sizer = StatusSizer(self.measurements, router.compactor_for, self._inflight.__contains__)
        # Keys an operator forced, until their run ends: the re-check before the start lets
        # them through whatever their priority. Under _lock.
        self._forced: set[str] = set()
        self._stopped = False
        #: Asks the owner's loop to tick the intake soon (its debounce has a new due time).
        self.wake: Callable[[], None] = lambda: None
        self._gate = AdmissionGate()

    def start(self) -> None:
        """Accept keys."""
        self._stopped = False
        self._examiners.start()
        self._measurers.start()
        self._sizer.start()

    def stop(self) -> None:
        """Stop examining: keys not yet taken by a thread are dropped."""
        self._stopped = True
        for pool in (self._examiners, self._measurers):
            with self._lock:
                for key in pool.stop():
                    self._inflight.pop(key, None)
        self._sizer.stop()
        with self._lock:
            waiting, self._waiters = self._waiters, {}
        for key, waiters in waiting.items():
            for waiter in waiters:
                waiter.resolve(Verdict(key, NOT_QUEUED, reason="the daemon is stopping"))

    def examining(self) -> int:
        """Keys waiting for or in their examination."""
        return len(self._inflight)

    # -- the way in --------------------------------------------------------------------------

    def enqueue(self, key: str, *, require_file: bool = False, waiter: Waiter | None = None,
                force: bool = False) -> None:
        """Consider ``key`` for compaction; returns at once (the examination runs elsewhere).

        Parameters:
            key: the key as the caller has it.
            require_file: a db key must name a database file (HTTP and the CLI): no such
                file, a directory or another kind of file is rejected. The watcher and the
                Python API leave that to the examination (priority 0, no error).
            waiter: filled with what becomes of the key once its examination ends.
            force: compact it now (``enqueue --force``): staleness, thresholds, a crash's
                backoff and the channel's start-up pause do not count; the roots, the file
                check, ``[smoosh.ignore]``, suspension, the window and ``max_jobs`` still do.

        Raises:
            InvalidKey: the key is not a usable key for this daemon (the reason says why).
        """
        access = self.access
        accepted_at = access.accepted.get(key)
        if accepted_at is not None and not force and access.clock() - accepted_at < access.staleness_s:
            # The hot path (a repeated event): a dict lookup, the clock and a counter, inline
            # (AccessTable.is_fresh's test: each call frame costs a sixth of the path).
            self.counters.enqueue_stale += 1
            if waiter is not None:
                self._stale(key, waiter)
            return
        canonical = self.canonical_key(key)
        if not force and canonical != key and self.access.is_fresh(canonical):
            self.counters.enqueue_stale += 1
            if waiter is not None:
                self._stale(canonical, waiter)
            return
        compactor = check_key(canonical, self.router, self._config_of().roots, self.own_paths)
        look = None
        if require_file and not canonical.startswith(CLEANUP_PREFIX):
            problem, look = look_at(canonical, compactor)
            if problem is not None:
                raise InvalidKey(canonical, problem)
        self._gate.admitted_one()
        self.submit(canonical, waiter=waiter, force=force, look=look)

    def _stale(self, key: str, waiter: Waiter) -> None:
        waiter.resolve(Verdict(waiter.key, NOT_QUEUED, reason=stale_reason(self.access.fresh_for_s(key), self._wall())))

    def on_event(self, path: str) -> None:
        """The watcher saw ``path`` change: into the debouncer, fresh or not (and a look at its WAL).

        A key a channel accepted recently is not examined, but it is debounced like any
        other: :meth:`tick` drops it as stale once its burst of events is over, and counts
        it once (``smoosh_enqueue_total{outcome="stale"}`` counts keys, not file events: a
        WAL database writes several per commit, and counting each made 16,305 of two writes).
        """
        now = self._clock()
        if self.debouncer.event(path, now):
            self.wake()
        self._watch_wal(path, now)

    def _watch_wal(self, key: str, now: float) -> None:
        """Look at ``key``'s ``-wal`` at most once per :data:`WAL_LOOK_INTERVAL_S` while events come.

        A database written without pause is examined at most every ``recheck_interval`` (its
        events never fall quiet, or no channel took it and it is held), and its WAL is the
        thing that grows then: behind a reader that never lets go it passes ``wal_max_size``
        long before that. One ``lstat`` a second per busy key (events' threads: the observer's,
        a scan's) makes its cleanup key a job within a second. The table of last looks is
        replaced whole when it grows, never changed by two threads at once in a way that matters
        (a lost entry only means one more look).
        """
        looked = self._wal_looked
        last = looked.get(key)
        if last is not None and now - last < WAL_LOOK_INTERVAL_S:
            return
        if len(looked) >= MAX_WAL_LOOKS:
            self._wal_looked = looked = {}
        looked[key] = now
        try:
            self.validate(key)
        except InvalidKey:
            return
        self._feed_cleanup(key)

    def on_scanned(self, path: str) -> None:
        """A scan found the database ``path``: examined at once (a scan never waits on the debounce).

        Unless it is being written right now: a file whose events are still settling is
        examined when they have (at the latest ``recheck_interval`` after the first one),
        not half-written.
        """
        if self.debouncer.is_busy(path):
            return
        if self.access.is_fresh(path):
            self.counters.enqueue_stale += 1
            return
        try:
            self.validate(path)
        except InvalidKey as e:
            log.debug("scanned file ignored: %s", e)
            return
        self.submit(path)

    def tick(self, now: float) -> float | None:
        """Examine the debounced keys that are due; returns when the next one is.

        A key a channel accepted recently is dropped as stale here, and counted once per
        debounce (per burst of its events), not once per event.
        """
        for key in self.debouncer.due(now):
            if self.access.is_fresh(key):
                self.counters.enqueue_stale += 1
                self.debouncer.result(key, True, now)
                continue
            try:
                self.validate(key)
            except InvalidKey as e:
                log.debug("watcher event ignored: %s", e)
                self.debouncer.result(key, False, now)
                continue
            self.submit(key, debounced=True)
        return self.debouncer.next_due()

    def canonical_key(self, key: object) -> str:
        """The key's identity (see :func:`smoosh.daemon.intake.keys.canonical_key`).

        Raises:
            InvalidKey: not a string, empty, too long, a NUL byte, or not an absolute path.
        """
        return canonical_key(key)

    def validate(self, key: str) -> None:
        """Check a canonical key: claimed by a compactor, inside ``roots``, not smoosh's own file.

        Raises:
            InvalidKey: naming the key and the reason.
        """
        check_key(key, self.router, self._config_of().roots, self.own_paths)

    def admits(self, key: str) -> bool:
        """Whether a key found in a checkpoint or the job store may stay: validated like a new one.

        A key that fails is logged once at WARNING, naming it and why.
        """
        try:
            if self.canonical_key(key) != key:
                raise InvalidKey(str(key), "it is not canonical (a symbolic link, or a relative part)")
            self.validate(key)
        except InvalidKey as e:
            log.warning("dropped %r restored from disk: %s", key, e.reason)
            return False
        return True

    # -- examination (pool threads) ------------------------------------------------------------

    def submit(
        self, key: str, debounced: bool = False, waiter: Waiter | None = None, force: bool = False, look: Look | None = None,
    ) -> None:
        """Examine ``key`` off this thread; a second request while it runs marks it dirty.

        ``waiter``, when given, hears what became of the key after its examination ends;
        ``force`` routes it past the thresholds (it sticks until the examination ends);
        ``look``, the compactor's look at its file just taken, is measured from instead of the
        file (a later request's look, or its absence, replaces it: the newest reading counts).
        """
        with self._lock:
            if waiter is not None:
                self._waiters.setdefault(key, []).append(waiter)
            state = self._inflight.get(key)
            if state is not None:
                # The examination running now may have read the file before this event's
                # change: run it once more afterwards so the file's final state is examined.
                # One still waiting for a thread will read the file anyway.
                state.dirty = state.started
                state.debounced = state.debounced or debounced
                state.force = state.force or force
                state.look = look
                return
            self._inflight[key] = _InFlight(debounced=debounced, force=force, look=look)
        if not self._examiners.submit(key):  # stopped: the daemon is stopping
            with self._lock:
                self._inflight.pop(key, None)
                waiters = self._waiters.pop(key, None)
            self._resolve(key, waiters)

    def admitting(self) -> contextlib.AbstractContextManager[None]:
        """Hold the examination back while a caller admits a batch of keys (a ``POST /enqueue``);
        see :mod:`smoosh.daemon.intake.admission`."""
        return self._gate.admitting()

    def _examine_cheap(self, key: str) -> None:
        self._gate.wait_turn()
        self._examine(key, defer_exact=True)

    def _examine_exact(self, key: str) -> None:
        self._examine(key, defer_exact=False)

    def _examine(self, key: str, defer_exact: bool) -> None:
        with self._lock:
            state = self._inflight.get(key)
            if state is None:
                return
            state.started = True
            look, state.look = state.look, None
        accepted = False
        while True:
            try:
                if defer_exact:
                    self.counters.enqueue_examined += 1
                outcome = self._route(key, defer_exact, force=state.force, look=look)
            except Exception as exc:
                log.exception("examining %r failed", key)
                self._verdicts[key] = Verdict(key, NOT_QUEUED, reason=f"examining it failed: {exc}")
                outcome = False
            if outcome is EXACT_DUE:
                if self._measurers.submit(key):
                    return  # still in flight: the measurer finishes its bookkeeping
                outcome = False
            accepted = bool(outcome)
            with self._lock:
                if state.dirty and not self._stopped:
                    state.dirty = False
                    look, state.look = state.look, None
                    continue
                self._inflight.pop(key, None)
                # Taken with the in-flight entry: a caller arriving after this waits for the
                # next examination, not this one's verdict.
                waiters = self._waiters.pop(key, None)
            break
        self._resolve(key, waiters)
        if state.debounced:
            try:
                if self.debouncer.result(key, accepted, self._clock()):
                    self.wake()
            except Exception:
                log.exception("debouncer result for %r failed", key)

    def _route(self, key: str, defer_exact: bool = False, force: bool = False, look: Look | None = None) -> object:
        """Offer ``key`` to its channels in configured order; True when one queued it.

        With ``defer_exact``: :data:`EXACT_DUE` when no channel took the cheap sizes and an
        exact measurement is due (the caller hands the key to a measurer thread). With
        ``force``: the first channel that considers the key takes it if none prices it above
        0. While a caller waits for the key, the verdict is kept in ``_verdicts`` for it.

        A database key's file is looked at once (the compactor's ``look``; ``look`` when its
        admission took one): its sizes, its ``-wal`` (for the cleanup key) and the signature
        the measurement is carried with all come from that look.
        """
        cfg = self._config_of()
        explain = key in self._waiters  # the words cost nothing on the fleet's path
        if self.router.is_ignored(key, cfg):
            log.debug("%r is ignored", key)
            if explain:
                self._verdicts[key] = Verdict(key, NOT_QUEUED, reason="ignored ([smoosh.ignore])")
            return False
        compactor = self.router.compactor_for(key)
        if look is None and compactor is not None and not key.startswith(CLEANUP_PREFIX):
            look = compactor.look(key, strict=False)
        if defer_exact and cfg.cleanup_channels:
            self._feed_cleanup(key, look, compactor)
        before = look.signature if look is not None else signature(db_path(key))
        verdict = None
        for offer in self.router.offers(key, cfg, defer_exact=defer_exact, force=force, look=look, compactor=compactor):
            if offer is EXACT_DUE:
                return EXACT_DUE
            names, sizes, priority_of, exact = offer
            if force:
                # Marked before any channel has it: its start may come before this returns.
                with self._lock:
                    self._forced.add(key)
            offered = self._offer(key, tuple(names), cfg, priority_of, sizes, force=force)
            if force and not offered:
                self.unforce(key)
            if offered:
                if sizes is not None:
                    self.measurements[key] = Measurement(sizes, before, exact)
                self.access.record(key)
                self.counters.enqueue_accepted += 1
                if explain:
                    reason = getattr(offered, "reason", None)
                    self._verdicts[key] = Verdict(key, NOT_QUEUED, reason=reason) if reason else Verdict(
                        key, QUEUED, channel=getattr(offered, "channel", None), priority=getattr(offered, "priority", None),
                        reason=getattr(offered, "note", None))
                return True
            if explain:
                reason = getattr(offered, "reason", None) or below_reason(
                    key, names, cfg, sizes, priority_of, self.router.compactor_for(key))
                verdict = Verdict(key, NOT_QUEUED, reason=reason)
        if explain:
            self._verdicts[key] = verdict or Verdict(key, NOT_QUEUED, reason=not_measured_reason(key))
        return False

    def _feed_cleanup(self, key: str, look: Look | None = None, compactor: CompactorBase | None = None) -> None:
        """Examine ``key``'s cleanup key too when its database asks for one (a ``-wal`` past half of ``wal_max_size``).

        Fed from the examination every event and scan leads to (one ``lstat``, on the thread
        already examining), so no loop polls WAL sizes. The cleanup key has the database's
        path, so the database key's validation holds for it; a cleanup key a channel took
        within ``staleness`` is left alone like any fresh key.
        """
        cleanup = self.router.cleanup_key(key, look, compactor)
        if cleanup is None or self.access.is_fresh(cleanup):
            return
        log.debug("%r has a WAL past half of wal_max_size; examining %r", key, cleanup)
        self.submit(cleanup)

    def _resolve(self, key: str, waiters: list[Waiter] | None) -> None:
        verdict = self._verdicts.pop(key, None)
        for waiter in waiters or ():
            found = verdict or Verdict(key, NOT_QUEUED, reason="the daemon is stopping" if self._stopped else
                                       "no channel takes it")
            waiter.resolve(Verdict(waiter.key, found.outcome, found.channel, found.priority, found.reason))

    # -- the re-check before a start (the scheduler's starter thread) ----------------------------

    def recheck(self, channel: str, key: str) -> float:
        """The key's priority in ``channel`` now, with the current config; 0 drops it.

        The key's roots are checked again (the config may have changed since it was queued;
        the compactor refuses a symlink where it opens the file). The measurement taken when
        the key was queued is reused while the file's signature is unchanged.
        """
        cfg = self._config_of()
        ch = cfg.channels.get(channel)
        if ch is None or self.router.is_ignored(key, cfg):
            return 0
        try:
            self.validate(key)
        except InvalidKey as e:
            log.warning("not starting %r: %s", key, e.reason)
            return 0
        reason = refused_at_use(db_path(key), cfg.roots)
        if reason is not None:
            refused(db_path(key), reason)  # logged: a path changed under smoosh
            return 0
        compactor = self.router.compactor_for(key)
        if compactor is None:
            return 0  # (validated: a compactor claims it; one gone with a reload has nothing to say)
        if self.is_forced(key):
            # Forced by an operator: thresholds do not count, but the file must still be one.
            return 0 if compactor.sizes(key) is None else math.inf
        if key.startswith(CLEANUP_PREFIX):
            return float(compactor.cleanup_priority(key))
        carried = self.measurements.get(key)
        if carried is not None and carried.signature is not None and carried.signature == signature(key):
            priority = self.router.priority(ch, key, carried.sizes, compactor)
            return quantize(priority) if priority else 0
        sizes = compactor.sizes(key)
        if sizes is None:
            return 0
        priority = self.router.priority(ch, key, sizes, compactor)
        if not priority:
            # Queued on exact sizes, perhaps: the work is about to start, so measure exactly.
            exact = compactor.sizes(key, exact=True)
            if exact is not None:
                priority = self.router.priority(ch, key, exact, compactor)
        return quantize(priority) if priority else 0

    def forget(self, key: str) -> None:
        """Drop what is known of ``key`` (it was compacted, or left every channel).

        A ``cleanup:`` key's staleness goes too: what calls for it is its log's size, looked at
        on the database's events at most once per :data:`WAL_LOOK_INTERVAL_S`, and a log that
        grows again within ``staleness`` of its last job must get the next one then, not
        minutes later (a key still in its backoff waits it out in its channel all the same).
        """
        self.measurements.pop(key, None)
        if key.startswith(CLEANUP_PREFIX):
            self.access.forget(key)

    def forget_flushed(self, key: str) -> None:
        """An operator flushed ``key`` out of its channel: its staleness goes with it (any thread).

        Otherwise the key, enqueued again within ``staleness``, would be answered "stale" and
        dropped while no channel holds it any more. A force goes too.
        """
        self.access.forget(key)
        self.unforce(key)

    def is_forced(self, key: str) -> bool:
        """Whether an operator forced ``key`` and its run has not ended yet (any thread)."""
        return key in self._forced

    def unforce(self, key: str) -> None:
        """``key``'s forced run ended (or never started): its thresholds count again (any thread)."""
        with self._lock:
            self._forced.discard(key)

    def reclaimable(self, keys: Mapping[str, Any] | set[str]) -> int:
        """Bytes the measured keys among ``keys`` would give back (file - active); the others
        are sized in the background (see :class:`~smoosh.daemon.intake.measurement.StatusSizer`)."""
        return self._sizer.reclaimable(keys)
