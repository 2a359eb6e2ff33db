"""The activity monitor: re-enqueues running jobs whose worker went silent.

One per type and process. Every type timeout (plus jitter) it compares the type's ACTIVITY
entries with the baseline it took on its previous check: an entry at or below the baseline
belongs to a job that has not called ``update`` for at least one timeout, so its worker is
presumed dead, and the job goes back to pending under a fresh state (its old lock is gone,
so the old worker's next ``update``/``finish`` raises JobHalted). The first check after a
start, or after the timeout changes, only takes the baseline.

Steppable: ``tick(now)`` does whatever is due at ``now`` and returns when it is next due.
:meth:`ActivityMonitor.step` ticks it on the monotonic clock: a check due "one timeout from
now" must not come a day late when the wall clock is set back a day, nor at once when it is
set forward (a check that comes early takes jobs whose worker is alive, but has not updated
since the baseline, for dead).
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any, Callable

from fdb.tuple import Versionstamp

from smoosh.store import tuples
from smoosh.store.base import Store, Transaction
from smoosh.store.errors import StoreError
from smoosh.jobs import model
from smoosh.jobs.batching import BATCH_RETRY_LIMIT, MAX_CONSECUTIVE_FAILURES, BatchPolicy, is_batch_error
from smoosh.jobs.model import Keys
from smoosh.jobs.txids import TxIds, sweep_expired
from smoosh.jobs.encoding import JobType

log = logging.getLogger(__name__)

#: Maximum random delay (seconds) added to each check, so monitors in many processes spread out.
MAX_JITTER_S = 10.0
#: Re-check interval (seconds) while the type has no timeout.
MISSING_TIMEOUT_CHECK_S = 5.0
#: The user version that makes a baseline stamp cover every stamped write of its commit.
ALL_USER_VERSIONS = 0xFFFF

_NO_BASELINE = object()


class ActivityMonitor:
    """Re-enqueues a type's inactive running jobs; drive it with :meth:`tick` or :meth:`step`.

    Parameters:
        store: the store.
        keys: the layer's key builders.
        job_type: the type watched.
        clock: wall-clock seconds (transaction ids' issue times, shared with other processes).
        monotonic: the clock :meth:`step` ticks on (the checks' schedule).
        rng: randomness for the jitter.
        max_jitter_s: ceiling of the jitter (couch_jobs' ``activity_monitor_max_jitter_msec``).
        batch: AIMD batch sizing of the re-enqueue transactions.
    """

    def __init__(
        self,
        store: Store,
        keys: Keys,
        job_type: JobType,
        *,
        clock: Callable[[], float],
        monotonic: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        max_jitter_s: float = MAX_JITTER_S,
        batch: BatchPolicy | None = None,
    ) -> None:
        self.store = store
        self.keys = keys
        self.job_type = job_type
        self.clock = clock
        self.monotonic = monotonic
        self.rng = rng or random.Random()
        self.max_jitter_s = max_jitter_s
        self.batch = batch or BatchPolicy()
        self.batch_size = self.batch.initial
        #: Jobs re-enqueued so far (for tests and status).
        self.reenqueued = 0
        self.txids = TxIds(store, keys, clock=clock)
        self._retime_requested = False
        self.reset()

    def reset(self) -> None:
        """Forget the baseline and the schedule (a fresh start)."""
        self.timeout_s: float | None = None
        self.baseline: Any = _NO_BASELINE
        self.next_check_at: float | None = None

    def wake(self) -> None:
        """Nothing blocks inside a step; the runner's own wait is interrupted by its kick."""

    def request_retime(self) -> None:
        """Have the next :meth:`step` re-read the timeout and reschedule (thread-safe)."""
        self._retime_requested = True

    def step(self) -> float:
        """One round for the runner: tick at the monotonic clock's now; return seconds until the next."""
        if self._retime_requested:
            self._retime_requested = False
            self.next_check_at = None
        next_at = self.tick(self.monotonic())
        return max(0.0, next_at - self.monotonic())

    def tick(self, now: float) -> float:
        """Do what is due at ``now``: schedule on the first call, check when the timer is up.

        Returns:
            The clock time at which the next check is due.
        """
        if self.next_check_at is None:
            self._schedule(now)
        elif now >= self.next_check_at:
            self.check_activity()
            self._schedule(now)
        assert self.next_check_at is not None
        return self.next_check_at

    def retime(self, now: float) -> float:
        """Re-read the timeout now (after ``set_type_timeout``) and reschedule from ``now``."""
        self.next_check_at = None
        return self.tick(now)

    def _schedule(self, now: float) -> None:
        timeout_s = self.store.transact(lambda tr: model.read_type_timeout(tr.snapshot, self.keys, self.job_type))
        if timeout_s is None:
            self.timeout_s = None
            self.baseline = _NO_BASELINE
            self.next_check_at = now + MISSING_TIMEOUT_CHECK_S
            return
        if timeout_s != self.timeout_s:
            # A new timeout invalidates the baseline: it was taken for a different period.
            self.timeout_s = timeout_s
            self.baseline = _NO_BASELINE
        max_jitter_s = min(timeout_s / 2, self.max_jitter_s)
        self.next_check_at = now + timeout_s + self.rng.uniform(0, max_jitter_s)

    def check_activity(self) -> int:
        """Re-enqueue every running job whose activity is at or below the baseline; take a new baseline.

        Returns:
            How many jobs went back to pending.
        """
        count = 0
        if self.baseline is not _NO_BASELINE and self.baseline is not None:
            count = self._reenqueue_all(self.baseline)
        self.baseline = self.store.transact(lambda tr: model.read_activity_stamp(tr, self.keys, self.job_type))
        # Transaction ids of calls whose process died before clearing them (see txids).
        sweep_expired(self.store, self.keys, self.clock())
        self.txids.flush()
        return count

    def _reenqueue_all(self, baseline: Versionstamp) -> int:
        total = 0
        failures = 0
        while True:
            limit = self.batch_size
            try:
                count = self.txids.run(lambda tr: self._reenqueue_batch(tr, baseline, limit), retry_limit=BATCH_RETRY_LIMIT)
            except StoreError as e:
                if not is_batch_error(e):
                    raise
                failures += 1
                self.batch_size = self.batch.shrink(limit)
                log.debug("re-enqueue batch of %d for type %r failed (%s); batch size now %d",
                          limit, self.job_type, e, self.batch_size)
                if failures >= MAX_CONSECUTIVE_FAILURES:
                    raise
                continue
            failures = 0
            total += count
            self.batch_size = self.batch.grow(limit)
            if count < limit:
                break
        if total:
            self.reenqueued += total
            log.info("re-enqueued %d inactive job(s) of type %r", total, self.job_type)
        return total

    def _reenqueue_batch(self, tr: Transaction, baseline: Versionstamp, limit: int) -> int:
        """One batch: up to ``limit`` activity entries at or below the baseline go back to pending.

        The reads here are conflicting reads on purpose: a worker's ``update`` that lands
        while this runs rewrites the entry and the row, so one of the two commits fails and
        a live job is never re-enqueued under its worker.
        """
        begin, _ = self.keys.activity_range(self.job_type)
        # Every stamp of the baseline's own commit counts as old, whatever its user version.
        last_old = self.keys.activity(self.job_type, Versionstamp(baseline.tr_version, ALL_USER_VERSIONS))
        kvs = tr.get_range(begin, last_old + b"\x00", limit=limit)
        for key, value in kvs:
            tr.clear(key)
            stamp = self.keys.unpack(key)[2]
            job_id, _data = tuples.unpack(value)
            row = model.get_row(tr, self.keys, self.job_type, job_id)
            if row is None or row.lock is None or row.seq != stamp:
                continue  # a stray entry (its job moved on): clearing it is all there is to do
            model.write_pending(tr, self.keys, self.job_type, job_id, row.scheduled_time, row.data_enc)
        if kvs:
            model.bump_activity_watch(tr, self.keys, self.job_type)
        return len(kvs)
