"""Accepting jobs: the transaction that takes a pending job, and the wait for one to be pending.

An accept picks at random among the first pending keys of its type (the type's
:class:`~smoosh.jobs.pending.PickWindow`, widened when acceptors conflict), skips stray
pending keys, and starts the job's run in the same transaction. When nothing is eligible,
that transaction's watch on the type's pending counter is armed at its commit and the
accept sleeps on it (or until the earliest scheduled job is due), then looks again. Another
thread ends such a wait through an :class:`AcceptInterrupt`, and closing the job layer ends
them all. The API call is :meth:`smoosh.jobs.layer.Jobs.accept`.
"""

from __future__ import annotations

import collections
import logging
import math
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from smoosh.store.base import Transaction, Watch
from smoosh.store.errors import NOT_COMMITTED, StoreError
from smoosh.jobs import model, pending, transitions
from smoosh.jobs.codec import enc_bytes
from smoosh.jobs.encoding import JobType, check_sched_time, decode_data, encode_data
from smoosh.jobs.errors import NotFound
from smoosh.jobs.model import PENDING_STATE, Job, Keys
from smoosh.jobs.txids import TxIds

# The job layer's log lines keep the logger name operators know, whichever module writes them.
log = logging.getLogger("smoosh.jobs.layer")

#: Shortest time-based wait (seconds) of a blocked ``accept`` (couch_jobs' MIN_ACCEPT_WAIT_MSEC).
MIN_ACCEPT_WAIT_S = 0.1
#: Pending keys without a matching pending row that one accept transaction may skip.
MAX_STRAY_PENDING = 16
#: Keys recently taken by this layer's accepts that the others avoid picking.
RECENTLY_TAKEN = 64
#: Looks again after seeing only such keys before an accept picks among them anyway (a key
#: taken earlier may be pending again: a job re-added under the same time and id).
MAX_ONLY_TAKEN_LOOKS = 4


class AcceptInterrupt:
    """Lets another thread end an ``accept`` that waits for a pending job: it raises NotFound.

    Thread-safe. Once interrupted it stays so: a worker makes one per run of its accept loop.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._interrupted = False
        self._watches: set[Watch] = set()

    @property
    def interrupted(self) -> bool:
        """Whether :meth:`interrupt` was called."""
        return self._interrupted

    def interrupt(self) -> None:
        """End the waits of every accept given this token, now and later."""
        with self._lock:
            self._interrupted = True
            watches, self._watches = self._watches, set()
        for watch in watches:
            watch.cancel()

    def _arm(self, watch: Watch) -> bool:
        with self._lock:
            if not self._interrupted:
                self._watches.add(watch)
                return True
        return False

    def _disarm(self, watch: Watch) -> None:
        with self._lock:
            self._watches.discard(watch)


@dataclass(frozen=True)
class _NoJob:
    watch: Watch | None
    earliest_scheduled_time: int | None


#: An accept whose committed attempt took nothing: try again at once.
_LOOK_AGAIN = _NoJob(None, None)
#: An accept that saw only keys other accepts of this layer are taking or just took: its
#: snapshot is older than their commits, or they are about to commit. Look again, after
#: letting the other threads run.
_ONLY_TAKEN = _NoJob(None, None)


def _remember(result: tuple[Job, bytes] | _NoJob) -> Any:
    # Remembered: the job taken, so a replay returns that same job. A _NoJob that wrote (it
    # only cleared stray keys) replays as "look again".
    return None if isinstance(result, _NoJob) else result


def _recall(value: Any) -> tuple[Job, bytes] | _NoJob:
    return _LOOK_AGAIN if value is None else (value[0], value[1])


class Acceptor:
    """The accepts of one job layer: their pick windows, and the waits that closing must end.

    Parameters:
        keys: the layer's keys.
        txids: the layer's transaction ids (an accept's replay returns the job it took).
        clock: wall-clock seconds ("now" for scheduled times).
        rng: randomness for picking jobs and their run locks.
    """

    def __init__(self, keys: Keys, txids: TxIds, clock: Callable[[], float], rng: random.Random) -> None:
        self._keys = keys
        self._txids = txids
        self._clock = clock
        self._rng = rng
        self._closed = False
        self._watches: set[Watch] = set()
        self._lock = threading.Lock()
        self._windows: dict[JobType, pending.PickWindow] = {}
        #: Pending keys this layer's accepts are taking now (picked, not yet committed or
        #: failed), and the last few they took: an accept whose snapshot is older than
        #: another's commit still sees the key that one took. Only a hint between threads
        #: (the conflict key still decides): workers of one process that each add and
        #: accept, with a key or two pending, otherwise pick the same key often, and each
        #: such pick costs a transaction and a backoff sleep. A thread preempted (the GIL)
        #: between its snapshot and its commit is the usual loser.
        self._taking: set[bytes] = set()
        self._taken: set[bytes] = set()
        self._taken_order: collections.deque[bytes] = collections.deque()

    def accept(
        self,
        job_type: JobType,
        *,
        max_sched_time: float | None,
        no_schedule: bool,
        timeout: float | None,
        interrupt: AcceptInterrupt | None,
        stamp: Callable[[], Mapping[str, object]] | None = None,
    ) -> tuple[Job, bytes]:
        """Take a pending job and mark it running; ``(job, encoded data)``. See :meth:`Jobs.accept`.

        Raises:
            NotFound: nothing became pending within ``timeout`` (or the layer was closed, or
                ``interrupt`` was used).
            ValueError: ``no_schedule`` with a ``max_sched_time`` other than None or 0, or a
                negative ``timeout``.
        """
        if no_schedule and max_sched_time not in (None, 0):
            raise ValueError("no_schedule requires max_sched_time None or 0")
        fixed_max = None if max_sched_time is None else check_sched_time(max_sched_time)
        if timeout is not None and timeout < 0:
            raise ValueError(f"timeout {timeout!r} must not be negative")
        deadline = None if timeout is None else time.monotonic() + timeout
        window = self.pick_window(job_type)
        conflicts = 0

        def on_retry(error: StoreError) -> None:
            nonlocal conflicts
            if error.code == NOT_COMMITTED:
                # Another acceptor committed first, most likely on the same key: spread wider.
                conflicts += 1
                window.widen()

        picked: set[bytes] = set()  # what this call's current attempt is taking

        def body(tr: Transaction) -> tuple[Job, bytes] | _NoJob:
            # A new attempt: the last one's picks were not taken (it failed) or are gone.
            if picked:
                self._taking.difference_update(picked)
                picked.clear()
            avoiding = looks < MAX_ONLY_TAKEN_LOOKS
            return self._accept_tx(tr, job_type, max_s, no_schedule, window.size, picked if avoiding else None, stamp)

        looks = 0
        while True:
            max_s = 0 if no_schedule else (math.floor(self._clock()) if fixed_max is None else fixed_max)
            conflicts = 0
            try:
                store = self._txids.store
                if not store.commit_outcome_may_be_unknown:  # what TxIds.run does for such a store, one call sooner
                    result = store.transact(body, on_retry=on_retry)
                else:
                    result = self._txids.run(body, on_retry=on_retry, remember=_remember, recall=_recall)
            finally:
                keys_taken = list(picked)
                if picked:
                    self._taking.difference_update(picked)
                    picked.clear()
            if not isinstance(result, _NoJob):
                if not conflicts:
                    window.narrow()
                self._remember_taken(keys_taken)
                return result
            if result is _ONLY_TAKEN:
                looks += 1
                time.sleep(0)  # let the accepts that hold those keys commit
                continue
            if result.watch is not None:
                self._wait_pending(job_type, result, fixed_max is None and not no_schedule, deadline, interrupt)

    def _remember_taken(self, keys: list[bytes]) -> None:
        """Keep the keys an accept took among those others avoid, for a while (a bounded few)."""
        taken, order = self._taken, self._taken_order
        for key in keys:
            if key not in taken:
                taken.add(key)
                order.append(key)
        while len(order) > RECENTLY_TAKEN:
            try:
                taken.discard(order.popleft())
            except IndexError:  # another thread emptied it meanwhile
                break

    def pick_window(self, job_type: JobType) -> pending.PickWindow:
        """The type's accept window (how many pending keys an accept picks among)."""
        window = self._windows.get(job_type)
        if window is None:
            window = self._windows.setdefault(job_type, pending.PickWindow())
        return window

    def close(self) -> None:
        """From now on an accept that would wait, or wakes from its wait, raises NotFound."""
        self._closed = True

    def cancel_waits(self) -> None:
        """Wake every accept waiting now (after :meth:`close`, each raises NotFound)."""
        with self._lock:
            watches = list(self._watches)
        for watch in watches:
            watch.cancel()

    def _accept_tx(
        self,
        tr: Transaction,
        job_type: JobType,
        max_s: int,
        no_schedule: bool,
        window: int = pending.PICK_RANGE_LIMIT,
        picked: set[bytes] | None = None,
        stamp: Callable[[], Mapping[str, object]] | None = None,
    ) -> tuple[Job, bytes] | _NoJob:
        """One attempt: take a pending job, or say why not (a :class:`_NoJob`).

        ``picked`` (None: pick among every key read) collects the keys this attempt takes;
        keys other accepts of this layer take or just took are not picked then. ``stamp``'s
        keys are merged into the job's data in this transaction.
        """
        keys = self._keys
        taking = self._taking
        for _ in range(MAX_STRAY_PENDING):
            dequeued: tuple[str, int] | None | bool
            if no_schedule:
                dequeued = pending.dequeue_no_schedule(tr, keys, job_type, self._rng)
            else:
                if picked is None:
                    dequeued = pending.dequeue(tr, keys, job_type, max_s, self._rng, window)
                else:
                    dequeued = pending.dequeue(
                        tr, keys, job_type, max_s, self._rng, window, avoid=(taking, self._taken), picked=(taking, picked)
                    )
                if dequeued is False:
                    return _ONLY_TAKEN
            if dequeued is None or isinstance(dequeued, bool):
                break
            job_id, stime = dequeued
            row = model.get_row(tr, keys, job_type, job_id)
            if row is None or row.state != PENDING_STATE or row.scheduled_time != stime:
                # A pending key without its pending row should not exist; dequeue cleared
                # it, so it cannot wedge the queue. Pick again.
                log.warning("dropped stray pending key of job %r of type %r", job_id, job_type)
                continue
            if stamp is None:
                return transitions.start_run(tr, keys, job_type, job_id, stime, row.data_enc, self._rng), row.data
            data = encode_data({**decode_data(row.data), **stamp()})
            return transitions.start_run(tr, keys, job_type, job_id, stime, enc_bytes(data), self._rng), data
        # Nothing eligible: this transaction's watch on the pending counter fires on the
        # next enqueue; it is armed when the (read-only) transaction commits.
        return _NoJob(pending.watch_pending(tr, keys, job_type), pending.earliest_scheduled_time(tr, keys, job_type))

    def _wait_pending(
        self, job_type: JobType, nojob: _NoJob, by_time: bool, deadline: float | None, interrupt: AcceptInterrupt | None
    ) -> None:
        watch = nojob.watch
        assert watch is not None
        if interrupt is not None and not interrupt._arm(watch):
            watch.cancel()
            raise NotFound(f"no pending job of type {job_type!r}: the wait was interrupted", type=job_type)
        wait_s = math.inf
        if by_time and nojob.earliest_scheduled_time is not None:
            # A job scheduled in the future becomes eligible when its time comes.
            wait_s = max(MIN_ACCEPT_WAIT_S, nojob.earliest_scheduled_time - self._clock())
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._closed:
                watch.cancel()
                raise NotFound(f"no pending job of type {job_type!r}", type=job_type)
            wait_s = min(wait_s, remaining)
        if self._closed:
            watch.cancel()
            raise NotFound(f"no pending job of type {job_type!r}: the job layer is closed", type=job_type)
        with self._lock:
            self._watches.add(watch)
        try:
            watch.wait(None if wait_s == math.inf else wait_s)
        except StoreError as e:
            if self._closed:
                raise NotFound(f"no pending job of type {job_type!r}: the job layer is closed", type=job_type) from e
            # Spurious watch errors (couch_jobs saw 1009) just mean "look again".
            log.debug("pending watch of type %r failed (%s); trying again", job_type, e)
        finally:
            with self._lock:
                self._watches.discard(watch)
            if interrupt is not None:
                interrupt._disarm(watch)
            watch.cancel()
        if interrupt is not None and interrupt.interrupted:
            raise NotFound(f"no pending job of type {job_type!r}: the wait was interrupted", type=job_type)
