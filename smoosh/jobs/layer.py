"""The job layer's API: couch_jobs in Python, over any store with FoundationDB's semantics.

Every state change is one transaction; each call that changes state takes ``tx=`` so a
caller's own writes and the job change commit together (or not at all). Without ``tx`` the
call runs its own transaction through the store's retry loop, and is idempotent under
"may have committed" errors (1021, 1031, 1039): each write transaction carries a
transaction id that remembers its result (:mod:`smoosh.jobs.txids`), so a retry after such
an error returns what the committed attempt returned. With ``tx=``, the caller's own
:meth:`Jobs.transact` carries the id for the whole transaction.

This module owns the API: checking and encoding arguments, running each call's transaction,
the layer's life cycle and its reads of many jobs. What each state change reads and writes
is :mod:`smoosh.jobs.transitions`; taking a pending job and waiting for one is
:mod:`smoosh.jobs.accept`; the background roles are :mod:`smoosh.jobs.supervisor`.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, TypeVar

from smoosh.store import tuples
from smoosh.store.base import Store, Transaction
from smoosh.jobs import model, pending, transitions
from smoosh.jobs.accept import AcceptInterrupt, Acceptor
from smoosh.jobs.batching import BatchPolicy
from smoosh.jobs.encoding import JobData, JobDataIn, JobType, check_id, check_sched_time, check_type, decode_data, encode_data
from smoosh.jobs.errors import NotFound
from smoosh.jobs.model import FINISHED_STATE, Job, JobRow, Keys
from smoosh.jobs.monitor import MAX_JITTER_S
from smoosh.jobs.subscription import Event, Hub, Subscription
from smoosh.jobs.supervisor import Supervisor
from smoosh.jobs.txids import TxIds

T = TypeVar("T")
A = TypeVar("A")

#: Default prefix of every job-layer key.
DEFAULT_PREFIX = tuples.pack(("jobs",))
#: Default cap of ``pending_count``.
PENDING_COUNT_LIMIT = 1024
#: Rows read per transaction by ``fold_jobs`` / ``list_jobs`` (keeps each under the 5 s limit).
FOLD_BATCH_ROWS = 1000


@dataclass(frozen=True)
class JobInfo:
    """Everything stored about one job (for listings and debugging)."""

    type: JobType
    id: str
    state: str
    scheduled_time: int
    resubmit: bool
    data: JobData


class Jobs:
    """The job layer over one store.

    Parameters:
        store: any :class:`~smoosh.store.base.Store`; the caller keeps ownership (``close``
            does not close it).
        prefix: the key prefix under which every job-layer key lives.
        clock: wall-clock seconds ("now" for scheduled times and transaction ids; the monitors' timers
            run on the monotonic clock).
        monitors: run activity monitors (and the type scanner) in this process. A short-lived
            reader such as the CLI passes False; subscriptions work either way.
        rng: randomness for picking jobs and jittering timers (tests pass a seeded one).
        batch: AIMD sizing of the monitors' and notifiers' batches.
        max_jitter_s: ceiling of the activity monitors' timer jitter.
    """

    def __init__(
        self,
        store: Store,
        *,
        prefix: bytes = DEFAULT_PREFIX,
        clock: Callable[[], float] = time.time,
        monitors: bool = True,
        rng: random.Random | None = None,
        batch: BatchPolicy | None = None,
        max_jitter_s: float = MAX_JITTER_S,
    ) -> None:
        self.store = store
        self.keys = Keys(prefix)
        self.clock = clock
        self.rng = rng or random.Random()
        self._hub = Hub()
        self._txids = TxIds(store, self.keys, clock=clock)
        self._acceptor = Acceptor(self.keys, self._txids, clock, self.rng)
        self._supervisor = Supervisor(
            store, self.keys, self._hub, clock=clock, rng=self.rng, batch=batch or BatchPolicy(),
            monitors=monitors, max_jitter_s=max_jitter_s,
        )
        self._supervisor.start()

    # -- plumbing ------------------------------------------------------------------------------

    def transact(self, fn: Callable[[Transaction], T]) -> T:
        """Run ``fn(tx)`` in one transaction with retries; pass ``tx=tx`` to the calls inside.

        The body may run more than once (after a conflict), so it must be safe to repeat.
        It never runs again after an attempt that committed: when that attempt reported
        "may have committed", the result it returned is returned from the transaction's
        id, provided it is made of None, bools, numbers, strings, bytes, Jobs, lists,
        tuples and dicts (for any other result such a replay raises StoreError 1021).
        """
        return self._txids.run(fn)

    def _run(self, fn: Callable[[Transaction], T], tx: Transaction | None) -> T:
        if tx is not None:
            return fn(tx)
        if not self.store.commit_outcome_may_be_unknown:
            return self.store.transact(fn)  # what TxIds.run does for such a store, one call sooner
        return self._txids.run(fn)

    def close(self) -> None:
        """Stop every background thread of this layer and wake blocked ``accept``/``wait`` calls.

        Blocked ``accept`` calls raise NotFound; subscription waits return None.
        """
        self._acceptor.close()
        self._supervisor.close()
        self._hub.close()
        self._txids.close()
        self._acceptor.cancel_waits()

    def __enter__(self) -> Jobs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- type timeouts -------------------------------------------------------------------------

    def set_type_timeout(self, job_type: JobType, timeout_s: float, *, tx: Transaction | None = None) -> None:
        """Set a type's activity timeout (registering the type); starts or re-times its monitor here.

        Raises:
            ValueError: ``timeout_s`` is not a positive finite number.
            EncodingError: a malformed type.
        """
        check_type(job_type)
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not (0 < timeout_s < math.inf):
            raise ValueError(f"type timeout {timeout_s!r} must be a positive number of seconds")
        key = self.keys.activity_timeout(job_type)
        self._run(lambda tr: tr.set(key, tuples.pack((timeout_s,))), tx)
        self._supervisor.ensure_monitor(job_type, retime=True)

    def get_type_timeout(self, job_type: JobType, *, tx: Transaction | None = None) -> float | None:
        """The type's activity timeout in seconds, or None when unset."""
        check_type(job_type)
        return self._run(lambda tr: model.read_type_timeout(tr, self.keys, job_type), tx)

    def clear_type_timeout(self, job_type: JobType, *, tx: Transaction | None = None) -> None:
        """Remove a type's timeout (the type is then unknown); stops its threads in this process."""
        check_type(job_type)
        key = self.keys.activity_timeout(job_type)
        self._run(lambda tr: tr.clear(key), tx)
        self._supervisor.stop_type(job_type)

    def drop_type(self, job_type: JobType, *, tx: Transaction | None = None) -> None:
        """Clear every key of a type: its jobs' rows and pending and activity entries, its timeout (the
        type is then unknown) and its watch keys; stops its threads in this process.

        For a type nobody will use again (``smoosh forget`` of a decommissioned node): a worker
        still running one of its jobs gets ``JobHalted`` at its next update, as after ``remove``,
        but subscribers hear nothing; remove the jobs first where that matters.
        """
        check_type(job_type)
        prefix = self.keys.prefix

        def body(tr: Transaction) -> None:
            for section in range(model.DATA, model.ACTIVITY + 1):
                tr.clear(tuples.pack((section, job_type), prefix))
                tr.clear_range(*tuples.range((section, job_type), prefix))

        self._run(body, tx)
        self._supervisor.stop_type(job_type)

    def get_types(self, *, tx: Transaction | None = None) -> list[JobType]:
        """Every type with a timeout."""
        begin, end = self.keys.activity_timeout_range()
        kvs = self._run(lambda tr: tr.get_range(begin, end), tx)
        return [self.keys.type_of(k) for k, _ in kvs]

    # -- creating jobs -------------------------------------------------------------------------

    def add(
        self, job_type: JobType, job_id: str, data: JobDataIn, scheduled_time: float = 0, *, tx: Transaction | None = None
    ) -> None:
        """Add a job, or re-add an existing one.

        Re-adding: a pending job takes the new time and data; a running job is flagged to
        run again (at the new time, with its data kept) once its worker finishes; a finished
        job becomes pending with the new data and time.

        Raises:
            NoTypeTimeout: the type has no timeout.
            EncodingError: bad data, type or id (raised before anything is written).
            ValueError: a bad scheduled time.
        """
        check_type(job_type)
        check_id(job_id)
        encoded = encode_data(data)
        stime = check_sched_time(scheduled_time)
        self._run(lambda tr: transitions.add(tr, self.keys, job_type, job_id, stime, encoded), tx)

    def add_claimed(
        self, job_type: JobType, job_id: str, data: JobDataIn, *, tx: Transaction | None = None
    ) -> Job:
        """Add a job already accepted by its adder: one transaction where ``add`` + ``accept`` take two.

        For a caller that runs the job itself (the daemon's own worker, which has a free
        slot): the job is durable and running at once, monitored like any accepted job, and
        never visible as pending, so no other acceptor is woken for it. An existing pending
        or finished job of that id is taken over (its pending key removed).

        Returns:
            The running job's handle (``update``, ``finish`` and ``resubmit`` take it).

        Raises:
            NoTypeTimeout: the type has no timeout.
            EncodingError: bad data, type or id (raised before anything is written).
            JobHalted: the job is running already (someone else's run).
        """
        check_type(job_type)
        check_id(job_id)
        encoded = encode_data(data)
        return self._run(lambda tr: transitions.add_claimed(tr, self.keys, job_type, job_id, encoded, self.rng), tx)

    def remove(self, job_type: JobType, job_id: str, *, tx: Transaction | None = None) -> None:
        """Delete a job; its subscribers hear "not_found" and a running worker gets JobHalted.

        Raises:
            NotFound: no such job.
        """
        check_type(job_type)
        check_id(job_id)
        self._run(lambda tr: transitions.remove(tr, self.keys, job_type, job_id), tx)

    def get_job(self, job_type: JobType, job_id: str, *, tx: Transaction | None = None) -> JobInfo:
        """Everything stored about a job.

        Raises:
            NotFound: no such job.
        """
        check_type(job_type)
        check_id(job_id)
        row = self._run(lambda tr: model.get_row(tr, self.keys, job_type, job_id), tx)
        if row is None:
            raise NotFound(f"job {job_type} {job_id} not found", type=job_type, job_id=job_id)
        return JobInfo(job_type, job_id, row.state, row.scheduled_time, row.resubmit, decode_data(row.data))

    def get_job_data(self, job_type: JobType, job_id: str, *, tx: Transaction | None = None) -> JobData:
        """A job's data. Raises NotFound."""
        return self.get_job(job_type, job_id, tx=tx).data

    def get_job_state(self, job_type: JobType, job_id: str, *, tx: Transaction | None = None) -> str:
        """"pending", "running" or "finished". Raises NotFound."""
        return self.get_job(job_type, job_id, tx=tx).state

    # -- processing jobs -----------------------------------------------------------------------

    def accept(
        self,
        job_type: JobType,
        *,
        max_sched_time: float | None = None,
        no_schedule: bool = False,
        timeout: float | None = None,
        interrupt: AcceptInterrupt | None = None,
        stamp: Callable[[], JobDataIn] | None = None,
    ) -> tuple[Job, JobData]:
        """Take a pending job and mark it running; block until one is pending.

        Parameters:
            job_type: the type.
            max_sched_time: only jobs scheduled at or before this time (floored to int);
                None means now, re-read on every try.
            no_schedule: take only scheduled-time-0 jobs, picked next to a random id (for
                types with random ids: no range read).
            timeout: seconds to wait for a pending job (0: do not wait; None: forever). It
                bounds the wait, not conflict retries.
            interrupt: a token another thread may use to end the wait early.
            stamp: called in the accept's transaction; its keys are merged into the job's
                data there (a worker naming itself in the job as it takes it: no update of
                its own needed). Beyond couch_jobs.

        Returns:
            ``(job, data)``, the data with the stamp's keys.

        Raises:
            NotFound: nothing became pending within ``timeout`` (or the layer was closed, or
                ``interrupt`` was used).
            ValueError: ``no_schedule`` with a ``max_sched_time`` other than None or 0.
        """
        check_type(job_type)
        job, raw = self._acceptor.accept(
            job_type, max_sched_time=max_sched_time, no_schedule=no_schedule, timeout=timeout, interrupt=interrupt,
            stamp=stamp,
        )
        return job, decode_data(raw)

    def pick_window(self, job_type: JobType) -> pending.PickWindow:
        """The type's accept window in this layer (how many pending keys an accept picks among)."""
        return self._acceptor.pick_window(job_type)

    def update(self, job: Job, data: JobDataIn | None = None, *, tx: Transaction | None = None) -> Job:
        """Heartbeat (and optionally replace the data of) a running job.

        Returns:
            A new Job whose ``resubmitted`` is current.

        Raises:
            JobHalted: the job was removed or re-enqueued since it was accepted.
            EncodingError: bad data (raised before anything is written).
        """
        encoded = None if data is None else encode_data(data)
        return self._run(lambda tr: transitions.update(tr, self.keys, job, encoded), tx)

    def finish(self, job: Job, data: JobDataIn | None = None, *, tx: Transaction | None = None) -> None:
        """Mark a running job finished (or pending again, if it was resubmitted while running).

        Raises:
            JobHalted: the job was removed or re-enqueued since it was accepted.
            EncodingError: bad data (raised before anything is written).
        """
        encoded = None if data is None else encode_data(data)
        self._run(lambda tr: transitions.finish(tr, self.keys, job, encoded), tx)

    def finish_and_remove(self, job: Job, *, tx: Transaction | None = None) -> bool:
        """End a run and delete its job at once: for a caller that keeps the outcome itself.

        The same as ``finish`` then ``remove`` in one transaction (its subscribers hear
        "not_found"), without writing the finished row first; a job resubmitted while it ran
        is not deleted but pending again with its data, as ``finish`` leaves it.

        Returns:
            True when the job was deleted, False when it is pending again.

        Raises:
            JobHalted: the job was removed or re-enqueued since it was accepted.
        """
        return self._run(lambda tr: transitions.finish_and_remove(tr, self.keys, job), tx)

    def resubmit(self, job: Job, scheduled_time: float | None = None, *, tx: Transaction | None = None) -> Job:
        """Run a job again: as ``add`` on an existing job, but its data is always kept.

        ``scheduled_time`` None keeps the job's current time.

        Raises:
            NotFound: the job no longer exists.
        """
        stime = None if scheduled_time is None else check_sched_time(scheduled_time)
        return self._run(lambda tr: transitions.resubmit(tr, self.keys, job, stime), tx)

    # -- subscriptions ---------------------------------------------------------------------------

    def subscribe(
        self, job_type: JobType, job_id: str, *, on_event: Callable[[Event], None] | None = None
    ) -> Subscription:
        """Follow a job's state changes (and, while it runs, each update).

        Parameters:
            job_type, job_id: the job.
            on_event: called with each event instead of queueing it for ``wait`` (on the
                notifier's thread, which it must not block: hand the event on and return).

        Returns:
            A Subscription; one for a finished job has already ended.

        Raises:
            NotFound: no such job, or its type has no timeout.
        """
        check_type(job_type)
        check_id(job_id)

        def body(tr: Transaction) -> tuple[object, JobRow | None]:
            return model.read_type_timeout(tr, self.keys, job_type), model.get_row(tr, self.keys, job_type, job_id)

        timeout_s, row = self.store.transact(body)
        if timeout_s is None or row is None:
            raise NotFound(f"job {job_type} {job_id} not found", type=job_type, job_id=job_id)
        data = decode_data(row.data)
        state = row.state
        if state == FINISHED_STATE:
            return Subscription(self._hub, None, job_type, job_id, state, data, on_event)
        notifier = self._supervisor.notifier(job_type)
        sub = Subscription(self._hub, notifier, job_type, job_id, state, data, on_event)
        if notifier is None:  # closed layer: a subscription that never hears anything
            sub.close()
            return sub
        notifier.register(sub, state, row.seq)
        return sub

    def wait_any(self, subscriptions: list[Subscription], state: str | None = None, timeout: float | None = None) -> Event | None:
        """The first event of any of ``subscriptions`` (of ``state``, if given), or None on timeout."""
        return self._hub.wait_any(subscriptions, state, timeout)

    # -- reading many jobs -----------------------------------------------------------------------

    def iter_jobs(self, job_type: JobType | None = None) -> Iterator[JobInfo]:
        """Every job (of one type, or of all), read in batches of :data:`FOLD_BATCH_ROWS` per transaction."""
        if job_type is None:
            begin, end = self.keys.data_all_range()
        else:
            check_type(job_type)
            begin, end = self.keys.data_type_range(job_type)
        while True:
            start = begin
            kvs = self.store.transact(lambda tr: tr.snapshot.get_range(start, end, limit=FOLD_BATCH_ROWS))
            for key, value in kvs:
                row_type, row_id = self.keys.data_key_parts(key)
                row = model.decode_row(value)
                yield JobInfo(row_type, row_id, row.state, row.scheduled_time, row.resubmit, decode_data(row.data))
            if len(kvs) < FOLD_BATCH_ROWS:
                return
            begin = kvs[-1][0] + b"\x00"

    def list_jobs(self, job_type: JobType | None = None) -> list[tuple[JobType, str, str, JobData]]:
        """``[(type, id, state, data)]`` of every job (of one type, or of all)."""
        return [(j.type, j.id, j.state, j.data) for j in self.iter_jobs(job_type)]

    def fold_jobs(self, job_type: JobType, fn: Callable[[str, str, JobData, A], A], acc: A) -> A:
        """Fold ``fn(id, state, data, acc) -> acc`` over every job of a type.

        Rows are read in batches, one transaction each, so a huge type never trips the 5 s
        transaction limit; ``fn`` runs outside any transaction (it may be slow, and is never
        repeated by a retry). Jobs changed during the fold may be seen in either state.
        """
        for info in self.iter_jobs(job_type):
            acc = fn(info.id, info.state, info.data, acc)
        return acc

    def get_active_job_ids(self, job_type: JobType, *, tx: Transaction | None = None) -> list[str]:
        """Ids of the type's running jobs (from its ACTIVITY entries)."""
        check_type(job_type)
        begin, end = self.keys.activity_range(job_type)
        kvs = self._run(lambda tr: tr.snapshot.get_range(begin, end), tx)
        return [tuples.unpack(value)[0] for _, value in kvs]

    def pending_count(
        self, job_type: JobType, max_sched_time: float | None = None, limit: int = PENDING_COUNT_LIMIT, *, tx: Transaction | None = None
    ) -> int:
        """Pending jobs eligible at ``max_sched_time`` (None: now), counted up to ``limit``."""
        check_type(job_type)
        max_s = math.floor(self.clock()) if max_sched_time is None else check_sched_time(max_sched_time)
        return self._run(lambda tr: pending.count(tr, self.keys, job_type, max_s, limit), tx)

    # -- introspection (tests, status) --------------------------------------------------------------

    @property
    def supervisor(self) -> Supervisor:
        """The owner of this layer's background threads."""
        return self._supervisor

    @property
    def txids(self) -> TxIds:
        """This layer's transaction ids (replays answered, ids awaiting their clear)."""
        return self._txids

