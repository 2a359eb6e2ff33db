"""The worker: accepts compaction jobs of one node's job type and runs them through the compactors.

One dispatcher thread accepts jobs while a slot is free. While jobs run, a heartbeat thread
(:mod:`smoosh.daemon.run.heartbeat`) sends each one's heartbeat (``jobs.update`` every
``job_timeout_s / 3``: one long VACUUM statement cannot call out, and a silent job is
re-enqueued by the activity monitor after the type timeout) and, for a worker in its own
process, reads the node's holds and rotation requests from the store; it ends when no job
runs. Each job runs on a thread of its own that ends with it, so an idle worker holds one
thread, asleep in ``accept`` until a job is added.

Two ways to hear about holds and rotation:

* In the daemon's process (``signals="direct"``) the server calls :meth:`Worker.set_hold` and
  :meth:`Worker.request_rotation` itself, and a :class:`RunListener` hears every start and end
  at once: no hand-off waits on a poll.
* In ``smoosh worker`` (``signals="store"``) they come through the store
  (:mod:`smoosh.daemon.control.control`), read every ``hold_poll_s`` while jobs run.

While held, an incremental compaction waits at its next chunk boundary holding no database
lock; a held full VACUUM is interrupted and finished as "interrupted". A job the layer halted
(removed, or re-enqueued after this worker went silent) is cancelled and never finished here:
it belongs to someone else now. A clean stop interrupts running compactions; the daemon's own
worker then finishes them as interrupted (``stopping``: the channel takes the key back), a
stand-alone worker puts them back to pending (``resubmit`` then ``finish``) for another one.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any, Callable, Literal, Mapping, Protocol, Sequence, TypeVar

from channels.ports import FAILED, INTERRUPTED, Outcome
from smoosh.compactors import Compactor, CompactorBase, adapt
from smoosh.daemon.control.store_health import log_failure
from smoosh.daemon.run.compaction import compact
from smoosh.daemon.run.finishes import DeferredFinishes
from smoosh.daemon.run.heartbeat import ERROR_PAUSE_S, LIVENESS_KEYS, Heartbeat
from smoosh.daemon.keypool import KeyPool
from smoosh.daemon.run.batch import BATCH_MAX_DATABASES, Carrier
from smoosh.daemon.run.job_context import STOPPING, JobContext, Running
from smoosh.io_budget import START, IoBudget
from smoosh.ioprio import apply_io_priority
from smoosh.jobs import AcceptInterrupt, Job, JobHalted, Jobs, NotFound
from smoosh.store import Store, Transaction

__all__ = ["Worker", "JobContext", "RunListener", "DEFAULT_JOB_TIMEOUT_S", "DEFAULT_HOLD_POLL_S", "STOP_TIMEOUT_S"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: A run claimed by this process's worker: its job (already accepted) and the data it was added with.
Claimed = tuple[Job, dict[str, Any]]
#: A batch's next run, claimed: its own job as :data:`Claimed`, or None for its job when it runs
#: under the batch's (:class:`~smoosh.daemon.run.batch.Carrier`).
Continued = tuple[Job | None, dict[str, Any]]

#: The job type's activity timeout (seconds); the heartbeat runs every third of it.
DEFAULT_JOB_TIMEOUT_S = 30.0
#: How often a stand-alone worker reads its running jobs' holds from the store (seconds).
DEFAULT_HOLD_POLL_S = 1.0
#: A clean stop finishes within this (seconds).
STOP_TIMEOUT_S = 10.0


class RunListener(Protocol):
    """Hears, in the worker's process, that a job started or ended (the daemon's scheduler)."""

    def run_started(self, key: str, data: dict[str, Any]) -> None:
        """The job of ``key`` was accepted and its compaction starts (``data``: its job data)."""

    def run_ended(self, key: str, data: dict[str, Any], outcome: Outcome) -> None:
        """The job of ``key`` ended with ``outcome`` (already recorded in the job layer)."""

    def run_continues(
        self, key: str, data: dict[str, Any], outcome: Outcome, taken: Callable[[str], None], carrier: Carrier,
    ) -> Callable[[], Continued | None] | None:
        """The job of ``key`` ended (as :meth:`run_ended`), and its thread, keeping its slot, can
        take its channel's next key (a batch: :mod:`smoosh.daemon.run.batch`): that run's claim,
        to call on this thread, or None (the batch ends; the end was told all the same). A key
        handed over is told to ``taken`` as it is handed, on whatever thread hands it: it is
        running from then, and its start is not told again. The claim runs the key under
        ``carrier`` (the batch's job: no job of its own, None in its place), or ends the carrier
        first and claims a job of the key's own (the carrier's own key, queued again)."""

    def catch_up(self) -> None:
        """Called on the compaction thread after a start or an end was told, holding no lock of the
        worker's: the listener may take its news there (the daemon's scheduler runs its loop's
        iteration, which may claim the next run)."""


class Worker:
    """Runs the compaction jobs of one job type.

    Parameters:
        jobs: the job layer.
        store: the store the node's holds live in (``signals="store"``; may be None otherwise).
        job_type: ``"smoosh:" + node``.
        compactors: in priority order (:func:`smoosh.compactors.load_compactors`).
        node: the node name (for the hold keys).
        job_timeout_s: the type timeout; heartbeats go out every third of it.
        concurrency: jobs run at once (one thread each).
        signals: ``"direct"`` (in the daemon) or ``"store"`` (a worker process); see the module.
        listener: hears starts and ends (``signals="direct"``).
        hold_poll_s: how often a stand-alone worker reads its holds.
        clock: wall-clock seconds, for ``started_at`` and the heartbeats' ``heartbeat_at``
            (read by other processes: wall time is the one they share).
        monotonic: monotonic seconds, for ``duration_s``.
        roots: the roots in force, read at every start (a reload applies); None: no roots
            restriction. A database outside them, or reached through a symbolic link, is
            refused (ends ``gone``) unopened.
        accept_timeout_s: kept for callers of the old worker; ignored (accept is interrupted on stop).
        io_budget: the process's I/O budget (``max_io_rate``): no job is accepted while it is
            in debt, and every chunk boundary of a running compaction waits for it. None: no pacing.
        io_priority: read at every start: ``"idle"`` puts the compaction thread in the idle
            I/O class for that compaction (:mod:`smoosh.ioprio`), ``"normal"`` leaves it.
        holder: the instance of the process it runs in, named in its jobs' heartbeats (and in
            the jobs the daemon claims for it): a restarting daemon follows the jobs of a live
            holder and takes back those of a dead one.
    """

    def __init__(
        self,
        jobs: Jobs,
        store: Store | None,
        job_type: str,
        compactors: Sequence[Compactor | CompactorBase],
        *,
        node: str,
        job_timeout_s: float = DEFAULT_JOB_TIMEOUT_S,
        concurrency: int = 1,
        signals: Literal["direct", "store"] = "store",
        listener: RunListener | None = None,
        hold_poll_s: float = DEFAULT_HOLD_POLL_S,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        roots: Callable[[], Sequence[str] | None] = lambda: None,
        accept_timeout_s: float | None = None,
        io_budget: IoBudget | None = None,
        io_priority: Callable[[], str] = lambda: "normal",
        holder: str | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, not {concurrency!r}")
        self.jobs = jobs
        self.store = store
        self.job_type = job_type
        self.compactors = [adapt(c) for c in compactors]
        self.node = node
        self.job_timeout_s = job_timeout_s
        self.concurrency = concurrency
        self.signals = signals
        self.listener = listener
        self.hold_poll_s = hold_poll_s
        self._clock = clock
        self._monotonic = monotonic
        self._roots = roots
        self.io_budget = io_budget
        self._io_priority = io_priority
        self.holder = holder
        lock = threading.RLock()
        self._cond = threading.Condition(lock)
        self._running: set[Running] = set()
        # Keys of the runs that ended and are being released (on_released): their slots are
        # free, and they still count as running. A list: one key may end twice at once. Under _cond.
        self._releasing: list[str] = []
        # Keys handed to a batch's thread, running from then while it claims them (under _cond).
        self._claiming: list[str] = []
        # The batches' jobs, by their keys, from their first database's end to the batch's
        # (smoosh.daemon.run.batch.Carrier): written under _cond, read with one dict lookup.
        self._carriers: dict[str, Carrier] = {}
        # Keys of the jobs running or being released now, for lock-free membership tests from
        # other threads.
        self._running_keys: frozenset[str] = frozenset()
        #: Told each key on its compaction thread just before it stops counting as running
        #: (:meth:`is_running`), its slot free already: the daemon's file watcher settles its
        #: last events then.
        self.on_released: Callable[[str], None] | None = None
        #: Asked, on its compaction thread, for the write that stores a claimed run's result
        #: (``on_finished(key, data, outcome)``: its durable history row, or None), made in the
        #: commit that finishes the run's job (``smoosh.daemon.results``).
        self.on_finished: Callable[[str, dict[str, Any], Outcome], Callable[[Transaction], None] | None] | None = None
        #: The write that gives back a claimed run's slot of the fleet-wide cap, from its job's data
        #: (None: no cap), made in the commit that finishes it (smoosh.daemon.control.cluster_cap).
        self.release_slot: Callable[[Mapping[str, object]], Callable[[Transaction], None] | None] | None = None
        # Compactions run on these threads; they stay while work keeps coming (a thread per
        # job would cost its start on every compaction of a fleet of small files).
        # A claimed run's finish waits for the next claim's commit (one commit per compaction);
        # an idle compaction thread commits it alone when no claim comes soon.
        self.finishes = DeferredFinishes(jobs)
        # After each run, its thread lets the listener take the news of its end (_catch_up):
        # the next run that news starts, the same thread claims, unwoken and holding nothing.
        self._pool: KeyPool[Running | Callable[[], Claimed | None]] = KeyPool(
            self._run_thread, concurrency, "smoosh-compact", on_idle=self.finishes.flush_if_due,
            after_item=self._catch_up)
        self._pool.start()
        self._held: set[str] = set()  # channels held now (direct signals)
        # Slots promised but not running yet: to claimed jobs on their way in, and one to the
        # dispatcher while it waits in accept (so a claim never takes the slot it accepts into).
        self._reserved = 0
        #: Of those, the slots reserve() promised to claims about to start (under _cond; read
        #: without it by compacting_any).
        self._claims_promised = 0
        # Runs whose thread waits for its channel's next key (a batch) at their end: their slots
        # count as free for a claim (reserve), which the next run takes when the batch ends there.
        self._offering = 0
        self._stopping = False
        self._interrupt = AcceptInterrupt()
        self._dispatcher: threading.Thread | None = None
        # Heartbeats and store signals of the running jobs, on a thread of its own that shares
        # this lock (smoosh.daemon.run.heartbeat); the timeout is read live (a reload changes it).
        self._heartbeat = Heartbeat(
            lock, runs=lambda: self._running, stopping=lambda: self._stopping, jobs=jobs, store=store,
            node=node, job_type=job_type, signals=signals, job_timeout_s=lambda: self.job_timeout_s,
            hold_poll_s=hold_poll_s, clock=clock, holder=holder, finishes=self.finishes,
            # A stand-alone worker paces its incremental chunks as the daemon's controller says.
            on_pace=io_budget.set_chunk_gap_factor if io_budget is not None and signals == "store" else None,
        )

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the dispatcher thread; jobs run until :meth:`stop`."""
        with self._cond:
            if self._dispatcher is not None:
                return
            self._stopping = False
            self._interrupt = AcceptInterrupt()
            self._pool.start()
            self._dispatcher = threading.Thread(target=self._dispatch, name="smoosh-worker", daemon=True)
        self._dispatcher.start()

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> bool:
        """Clean stop: interrupt running compactions and wait for them to end.

        Returns:
            True when every thread ended within ``timeout_s``.
        """
        with self._cond:
            self._stopping = True
            running = list(self._running)
            self._cond.notify_all()
            self._heartbeat.wake()
        self._interrupt.interrupt()
        if self.io_budget is not None:
            self.io_budget.wake()  # a dispatcher waiting for the budget sees the stop now
        for r in running:
            r.ctx.stop(STOPPING)
        deadline = time.monotonic() + timeout_s
        with self._cond:
            # Released too: a run's end is told to the listener after it leaves its slot.
            while (self._running or self._releasing) and time.monotonic() < deadline:
                self._cond.wait(max(0.0, deadline - time.monotonic()))
            left = len(self._running) + len(self._releasing)
            dispatcher, self._dispatcher = self._dispatcher, None
            heartbeat = self._heartbeat.thread
        self._pool.stop()
        self.finishes.flush()  # the runs that ended: their jobs finished before the stop returns
        for t in (heartbeat, dispatcher):
            if t is not None:
                t.join(max(0.0, deadline - time.monotonic()))
        alive = left + sum(1 for t in (heartbeat, dispatcher) if t is not None and t.is_alive())
        if alive:
            log.warning("%d worker thread(s) did not stop within %.1f s.", alive, timeout_s)
        return not alive

    def status(self) -> list[dict[str, Any]]:
        """The jobs running now: ``[{"key", "channel", "progress", "progress_at", "held", "stopping",
        "started_at", "started_mono", "run_id", "suspendable"}]`` (``progress_at``: when the progress
        last grew, on the monotonic clock; None while it has not)."""
        with self._cond:
            running = list(self._running)
        return [
            {
                "key": r.key,
                "channel": r.channel,
                "progress": r.ctx.fraction,
                "progress_at": r.ctx.progress_at,
                "held": r.ctx.held,
                "stopping": r.ctx.stop_reason is not None,
                "started_at": r.started_at,
                "started_mono": r.started_mono,
                "run_id": r.run_id,
                "suspendable": r.ctx.suspendable,
            }
            for r in running
        ]

    # ------------------------------------------------------------------ claimed jobs

    def reserve(self) -> bool:
        """Promise one free slot to a job the caller is about to claim; False when none is free."""
        with self._cond:
            busy = len(self._running) + self._reserved - self._offering
            if self._stopping or self._dispatcher is None or busy >= self.concurrency:
                return False
            self._reserved += 1
            self._claims_promised += 1
            return True

    def unreserve(self) -> None:
        """Give back a slot :meth:`reserve` promised (the claim failed)."""
        with self._cond:
            self._claims_promised = max(0, self._claims_promised - 1)
            self._give_back_locked()

    def _give_back_locked(self) -> None:
        """A promised slot is free again (under ``_cond``)."""
        self._reserved = max(0, self._reserved - 1)
        self._cond.notify_all()

    def claim_transact(self, key: str, body: Callable[[Transaction], T]) -> T:
        """Run a claim's ``body`` in the transaction that also finishes the runs that ended (see
        :class:`~smoosh.daemon.run.finishes.DeferredFinishes`); its result."""
        return self.finishes.transact(key, body)

    def release_carrier(self, key: str) -> bool:
        """Before a claim of ``key`` (any thread but a batch's own): when a batch's job is named
        ``key``, the batch ends after the database it compacts, and the job's finish is committed
        (waiting at most :data:`~smoosh.daemon.run.batch.CARRIER_WAIT_S`): the claim must find no
        job of the key running, or it would take the batch's for a run of its own to follow.

        Returns:
            False when the batch's job still runs after the wait (the claim must not go on).
        """
        carrier = self._carriers.get(key)
        if carrier is None:
            return True
        carrier.want()
        if not carrier.wait_ended():
            return False
        self.finishes.flush()
        return True

    def carriers(self) -> list[tuple[int, Mapping[str, object]]]:
        """The batches' jobs now, as ``(run token, the data they were claimed with)``: their first
        run may have ended, and they hold what it held (a slot of the cap) until the batch ends
        (any thread)."""
        with self._cond:
            carriers = list(self._carriers.values())
        return [(c.token, c.data) for c in carriers if c.token is not None]

    def run_claimed(self, claim: Callable[[], Claimed | None]) -> bool:
        """Claim and run a job in the slot :meth:`reserve` promised, all on a compaction thread.

        Parameters:
            claim: adds the job already accepted (``Jobs.add_claimed``) and returns
                ``(job, data)``, or None when there is nothing to run (the slot is given back).
                It runs on the thread that then compacts: the start costs no extra hand-off.
                It has checked the path at use (``refused_at_use``, the re-check): the
                compaction does not look again, the compactor's open aside.

        Returns:
            False when the pool refused it (the worker stops): the slot is given back and
            ``claim`` never runs, so the caller must end the run itself.
        """
        if not self._pool.submit(claim):
            self.unreserve()
            return False
        return True

    # ------------------------------------------------------------------ direct signals

    def set_concurrency(self, concurrency: int) -> None:
        """Run up to ``concurrency`` jobs at once from now on (config reload); running ones go on.

        Raises:
            ValueError: fewer than one.
        """
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, not {concurrency!r}")
        with self._cond:
            self.concurrency = concurrency
            self._pool.set_threads(concurrency)
            self._cond.notify_all()

    def is_running(self, key: str) -> bool:
        """Whether a job of ``key`` runs here now, or has ended and is being released (any thread;
        no lock: one attribute read)."""
        return key in self._running_keys

    def compacting_any(self) -> bool:
        """Whether any job runs here now, or :meth:`reserve` promised a slot to a claim about to
        start (any thread; no lock: two attribute reads).

        The promise counts: in a drain the next claim's slot is promised as the last run ends,
        so the daemon's inotify observer stays quiet from one compaction to the next instead of
        waking for the next one's first write (InotifyObserver.set_quiet). The slot the
        dispatcher holds while it waits in accept does not: that is no compaction coming.
        """
        return bool(self._running_keys) or self._claims_promised > 0

    def set_hold(self, channel: str, held: bool) -> None:
        """Hold (or release) the running and future jobs of ``channel`` (direct signals)."""
        with self._cond:
            if held:
                self._held.add(channel)
            else:
                self._held.discard(channel)
            running = [r for r in self._running if r.channel == channel]
        for r in running:
            r.ctx.set_held(held)

    def request_rotation(self, key: str) -> bool:
        """Ask the run of ``key`` to stop at its next chunk boundary; False if it cannot stop without loss."""
        with self._cond:
            running = [r for r in self._running if r.key == key]
        rotated = any(r.ctx.rotate() for r in running)
        if rotated:
            log.info("Job %r stops at its next chunk boundary: rotated out.", key)
        return rotated

    # ------------------------------------------------------------------ the dispatcher

    def _dispatch(self) -> None:
        while True:
            try:
                with self._cond:
                    if self._stopping:
                        return
                    if len(self._running) + self._reserved >= self.concurrency:
                        self._cond.wait()  # a run ends, a claim gives its slot back, or a stop
                        continue
                budget = self.io_budget
                if budget is not None and budget.in_debt():
                    # No job is taken while the I/O budget is in debt: a timed wait until it is
                    # paid (stop() wakes it), then look at the slots and the stop again.
                    budget.wait(lambda: self._stopping, kind=START)
                    continue
                with self._cond:
                    if self._stopping:
                        return
                    if len(self._running) + self._reserved >= self.concurrency:
                        continue
                    self._reserved += 1  # the slot it accepts into
                try:
                    # A stand-alone worker names itself in the job by the commit that accepts
                    # it: a restarting daemon then sees the job's worker alive from the start.
                    stamp = self._heartbeat.liveness if self.signals == "store" else None
                    job, data = self.jobs.accept(self.job_type, interrupt=self._interrupt, stamp=stamp)
                except BaseException:
                    with self._cond:
                        self._give_back_locked()
                    if isinstance(sys.exc_info()[1], NotFound):
                        continue
                    raise
                self._launch(job, data, reserved=True)
            except Exception as exc:
                # One bad job or a store hiccup never ends the worker.
                log_failure(log, exc, "Worker for %r: dispatching", self.job_type, health_says_it=self.signals == "direct")
                with self._cond:
                    self._cond.wait(ERROR_PAUSE_S)

    def _launch(self, job: Job, data: dict[str, Any], *, reserved: bool = False) -> None:
        self._pool.submit(self._admit(job, data, reserved=reserved, claimed=False))

    def _admit(self, job: Job, data: dict[str, Any], *, reserved: bool, claimed: bool) -> Running:
        """Register a job as running here (its slot, its heartbeats, its holds)."""
        ctx = JobContext(self.io_budget, clock=self._monotonic)
        running = Running(
            job=job, data=dict(data), ctx=ctx, claimed=claimed,
            started_at=self._clock(), started_mono=self._monotonic(),
            # No heartbeat at once: a short compaction (most of a fleet) needs none at all. A
            # stand-alone worker's accept wrote its heartbeat and its name in the job already
            # (Heartbeat.liveness), which is what tells a restarting daemon the worker is alive.
            next_update=time.monotonic() + self.job_timeout_s / 3.0,
        )
        with self._cond:
            if running.channel in self._held:
                ctx.set_held(True)
            if reserved:
                self._reserved = max(0, self._reserved - 1)  # the promised slot is taken now
                if claimed:
                    self._claims_promised = max(0, self._claims_promised - 1)
            self._running.add(running)
            self._refresh_keys_locked()
            self._heartbeat.run_added(running)  # under the lock: see Heartbeat.run_added
        return running

    def _run_thread(self, item: Running | Callable[[], Claimed | None]) -> None:
        if callable(item):
            claimed = _claim_logged(item)
            if claimed is None:
                self.unreserve()
                return
            running = self._admit(*claimed, reserved=True, claimed=True)
        else:
            # A pool kept busy by jobs this worker accepted (no claim to carry the waiting
            # finishes) still commits them once due.
            self.finishes.flush_if_due()
            running = item
        current = [running]  # the batch's run now: _run moves it on from one database to the next
        news: Callable[[], None] | None = None
        try:
            news = self._run(current)
        except Exception as exc:
            log.exception("Running the job of %r failed.", current[0].key)
            news = self._crashed(current[0], exc)
        finally:
            try:
                self._end_job(current[0])
            finally:
                self._release(current[0], news)

    def _crashed(self, running: Running, exc: Exception) -> Callable[[], None] | None:
        """The news of a run whose thread failed outside its compaction: it ended, failed.

        Its channel must hear an end whatever happened on the way (a claimed run has no other
        follower: without it, its channel would keep the run and its slots for good), and
        its job is finished as any failed run's is.
        """
        outcome = Outcome(FAILED, f"the compaction's thread failed: {type(exc).__name__}: {exc}")
        try:
            finished = self._finish(running, outcome)
        except Exception:
            log.exception("Finishing the job of %r failed.", running.key)
            finished = {**running.data, **outcome.to_data()}
        listener = self.listener
        if listener is None or finished is None:
            return None
        key = running.key
        return lambda: listener.run_ended(key, finished, outcome)

    def _catch_up(self) -> None:
        """Let the listener take the news just told, on this thread (see :class:`RunListener`)."""
        listener = self.listener
        if listener is not None:
            self._tell(listener.catch_up)

    def _release(self, running: Running, news: Callable[[], None] | None) -> None:
        """The run has ended: free its slot, tell the listener (``news``) and ``on_released``,
        then stop counting it as running.

        The slot is freed first: hearing the end, the loop starts the next run, whose claim
        must find a slot free (one that found every slot taken would wait for a worker instead,
        followed through the store). The release may take a while (the file watcher reads its
        queue there); the claim runs on this thread once it is done.
        """
        with self._cond:
            self._running.discard(running)
            self._releasing.append(running.key)
            self._cond.notify_all()
        keys = (*running.batched, running.key)  # a batch's files are settled together, at its end
        try:
            if news is not None:
                self._tell(news)
            on_released = self.on_released
            if on_released is not None:
                for key in keys:
                    try:
                        on_released(key)
                    except Exception:
                        log.exception("Releasing %r failed.", key)
        finally:
            with self._cond:
                for key in keys:
                    self._releasing.remove(key)
                self._refresh_keys_locked()
                self._cond.notify_all()  # a stop waits for the releases too

    def _refresh_keys_locked(self) -> None:
        """Rebuild :attr:`_running_keys` (under ``_cond``)."""
        self._running_keys = frozenset(r.key for r in self._running).union(self._releasing, self._claiming)

    # ------------------------------------------------------------------ one job

    def _run(self, current: list[Running]) -> Callable[[], None] | None:
        """Run the job of ``current[0]`` and record its end in the job layer; the news of its end
        for the listener (told once its slot is free: see :meth:`_release`), or None.

        A claimed run whose channel's next key is small goes on with it in the same slot (a
        batch, :mod:`smoosh.daemon.run.batch`): ``current[0]`` is then that run, and so on until
        the batch ends; each run's end is told as it ends.
        """
        running = current[0]
        with self._cond:
            stopping = self._stopping
        if stopping:
            running.ctx.stop(STOPPING)
        self._tell_started(running)
        outcome = self._compact(running, running.started_mono)
        while True:
            key = running.key
            if running.halted:
                log.info("Job %r was halted (removed or re-enqueued); not finishing it.", key)
                if running.carrier is not None:
                    running.carrier.drop()
                if running.claimed and self.listener is not None:
                    told: RunListener = self.listener
                    halted = Outcome(FAILED, "job halted: removed or re-enqueued while it ran")
                    return lambda: told.run_ended(key, dict(running.data), halted)
                return None
            if outcome.result == INTERRUPTED and running.ctx.stop_reason == STOPPING and self.signals == "store":
                self._requeue(running)
                return None
            finished = self._finish(running, outcome)
            if finished is None or self.listener is None:
                return None
            listener: RunListener = self.listener
            if not self._may_continue(running, outcome):
                return lambda: listener.run_ended(key, finished, outcome)
            handed: list[str] = []
            claim = self._ask_next(listener, running, finished, outcome, handed)
            if claim is None:
                # The end was told with the question. (A key handed over all the same, had the
                # listener failed after, stops counting as running: the run audit ends its run.)
                self._unclaim(handed)
                return None
            claimed = _claim_logged(claim)
            if claimed is None:
                self._unclaim(handed)
                return None
            if claimed[0] is not None and running.carrier is not None:
                running.carrier.end()  # (the claim ended it already: its key's own job follows)
            previous_key, running = running.key, self._continue_into(running, *claimed, handed)
            current[0] = running
            log.debug("Job %r runs in the slot of %r: a batch.", running.key, previous_key)
            outcome = self._compact(running, running.started_mono)

    def _tell_started(self, running: Running) -> None:
        """Tell the listener that ``running``'s compaction starts, and let it take the news here."""
        listener = self.listener
        if listener is not None:
            key, data = running.key, {**running.data, "run_id": running.run_id}
            self._tell(lambda: listener.run_started(key, data))
            self._catch_up()

    def _may_continue(self, running: Running, outcome: Outcome) -> bool:
        """Whether ``running``'s thread may ask for its channel's next key (a batch): a run this
        process claimed, that ended neither interrupted nor halted, on a worker that does not stop
        and a channel not held, short of :data:`BATCH_MAX_DATABASES`, and whose batch's job no
        claim of its key waits for."""
        if not running.claimed or outcome.result == INTERRUPTED or running.ctx.stop_reason is not None:
            return False
        if running.carrier is not None and running.carrier.wanted:
            return False
        if len(running.batched) + 1 >= BATCH_MAX_DATABASES:
            return False
        with self._cond:
            return not self._stopping and running.channel not in self._held

    def _ask_next(
        self, listener: RunListener, running: Running, finished: dict[str, Any], outcome: Outcome, handed: list[str],
    ) -> Callable[[], Continued | None] | None:
        """Tell ``running``'s end and ask for its channel's next key, its slot counted free for a
        claim meanwhile (the next run, if it is not this thread's, takes it). A key handed over
        counts as running from that moment (``handed`` gets it).

        The batch's job (its :class:`~smoosh.daemon.run.batch.Carrier`) is ``running``'s own
        when it is the batch's first database, registered before its end is told: a claim of
        its key from then on waits for the batch to end."""
        carrier = running.carrier
        if carrier is None:
            carrier = Carrier(running.key, dict(running.data), self._carrier_ended)
            carrier.running = running
            running.carrier = carrier
            with self._cond:
                self._carriers[carrier.key] = carrier

        def taken(key: str) -> None:
            with self._cond:
                self._offering -= 1  # the slot is this thread's again, for the key it takes
                handed.append(key)
                self._claiming.append(key)
                self._refresh_keys_locked()

        with self._cond:
            self._offering += 1
        # A run started meanwhile that is not this thread's waits for it, as after any run's end:
        # the thread that ended the last run claims the next, unwoken (see KeyPool.expect).
        self._pool.expect()
        try:
            return listener.run_continues(running.key, finished, outcome, taken, carrier)
        except Exception:
            log.exception("A run listener failed.")
            return None
        finally:
            self._pool.unexpect(returning=not handed)
            with self._cond:
                if not handed:
                    self._offering -= 1

    def _unclaim(self, handed: list[str]) -> None:
        """A key handed to this thread was not claimed (dropped): it stops counting as running."""
        with self._cond:
            for key in handed:
                self._claiming.remove(key)
            self._refresh_keys_locked()

    def _continue_into(self, previous: Running, job: Job | None, data: dict[str, Any], handed: list[str]) -> Running:
        """The batch's next run, in ``previous``'s slot: registered as running (its heartbeats, its
        holds), ``previous``'s key kept counting as running until the batch ends. ``job`` None:
        it runs under the batch's job (``previous``'s carrier); else under its own."""
        ctx = JobContext(self.io_budget, clock=self._monotonic)
        carrier = previous.carrier if job is None else None
        if job is None:
            if carrier is None:  # (a claim under the batch's job comes only after _ask_next made one)
                raise RuntimeError(f"{data.get('key')!r} was to run under its batch's job, and the batch has none")
            with previous.lock:
                job = previous.job  # the newest handle: its heartbeats went on with it
        # Under the batch's job, its heartbeats keep their schedule: restarted at every database, a
        # batch of databases each shorter than a heartbeat's interval would never send one, and its
        # job would be taken for a silent one (re-enqueued) after the type's timeout.
        next_update = previous.next_update if carrier is not None else time.monotonic() + self.job_timeout_s / 3.0
        running = Running(
            job=job, data=dict(data), ctx=ctx, claimed=True, started_at=self._clock(),
            started_mono=self._monotonic(), next_update=next_update,
            batched=(*previous.batched, previous.key), carrier=carrier,
            member_key=str(data["key"]) if carrier is not None else None,
        )
        if carrier is not None:
            carrier.running = running
        with self._cond:
            if running.channel in self._held:
                ctx.set_held(True)
            if self._stopping:
                ctx.stop(STOPPING)
            self._running.discard(previous)
            self._releasing.append(previous.key)
            for key in handed:
                self._claiming.remove(key)
            self._running.add(running)
            self._refresh_keys_locked()
            self._heartbeat.run_added(running)
        return running

    def _compact(self, running: Running, started: float) -> Outcome:
        # On the compaction thread itself: Linux keeps the I/O class per thread.
        restore_io_priority = apply_io_priority(self._io_priority())
        try:
            return compact(running.key, running.data, running.ctx, self.compactors, self._roots(), started,
                           self._monotonic, checked=running.claimed)
        finally:
            restore_io_priority()
            with running.lock:
                running.done = True

    def _finish(self, running: Running, outcome: Outcome) -> dict[str, Any] | None:
        data = {**running.data, **outcome.to_data(), "run_id": running.run_id}
        try:
            with running.lock:
                if running.claimed:
                    # Its channel is in this process and hears the end directly: the run's
                    # history row is written in the next claim's commit (smoosh.daemon.run.finishes),
                    # and its job finished and removed there too once no batch goes on under it
                    # (_end_job).
                    history = self._history_write(running, outcome)
                    if history is not None:
                        self.finishes.add(running.key, None, history)
                else:
                    self.jobs.finish(running.job, data)
        except JobHalted:
            log.info("Job %r was halted before it could be finished.", running.key)
            return None
        return data

    def _end_job(self, running: Running) -> None:
        """``running``'s thread lets go of it: a claimed run's job (its batch's, if it has one) is
        finished and removed in the next commit, with its slot of the cap; a halted one is not."""
        if not running.claimed or running.finish_queued:
            return
        running.finish_queued = True
        carrier = running.carrier
        if running.halted:
            if carrier is not None:
                carrier.drop()
        elif carrier is not None:
            carrier.end()
        else:
            self._queue_finish(running.key, running, running.data)

    def _carrier_ended(self, carrier: Carrier, finish: bool) -> None:
        """A batch's job is let go (:class:`~smoosh.daemon.run.batch.Carrier`): finished with
        ``finish``, by the handle of the run that compacted under it last."""
        running = carrier.running
        if finish and running is not None:
            self._queue_finish(carrier.key, running, carrier.data)
        with self._cond:
            if self._carriers.get(carrier.key) is carrier:
                del self._carriers[carrier.key]

    def _queue_finish(self, key: str, running: Running, data: Mapping[str, object]) -> None:
        """Queue the finish of job ``key`` by ``running``'s handle of it (the newest), with the
        give-back of the cap slot its claim ``data`` says it holds."""
        with running.lock:
            self.finishes.add(key, running.job, self._slot_release(data))

    def _slot_release(self, data: Mapping[str, object]) -> Callable[[Transaction], None] | None:
        """The write that gives back the cap slot a claimed job's ``data`` says it holds (None: none)."""
        release = self.release_slot
        return release(data) if release is not None else None

    def _history_write(self, running: Running, outcome: Outcome) -> Callable[[Transaction], None] | None:
        """The write of a claimed run's durable history row (None: no hook, or an interrupted run)."""
        on_finished = self.on_finished
        if on_finished is None or outcome.result == INTERRUPTED:
            return None
        try:
            return on_finished(running.key, running.data, outcome)
        except Exception:
            log.exception("Recording the result of %r failed.", running.key)
            return None

    def _requeue(self, running: Running) -> dict[str, Any] | None:
        # resubmit, then finish: a resubmitted job goes back to pending on finish, with the
        # data it started with, so the next worker starts it afresh (an incremental
        # compaction's progress is kept in the file itself).
        # Without what the accept wrote in it (Heartbeat.liveness): a pending job has no worker.
        data = {k: v for k, v in running.data.items() if k not in LIVENESS_KEYS}
        try:
            with running.lock:
                job = self.jobs.resubmit(running.job)
                self.jobs.finish(job, data)
            log.info("Job %r put back to pending (%s).", running.key, STOPPING)
        except JobHalted:
            log.info("Job %r was halted before it could be put back.", running.key)
        return None

    @staticmethod
    def _tell(fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:
            log.exception("A run listener failed.")


def _claim_logged(claim: Callable[[], T | None]) -> T | None:
    """Call ``claim`` (a claim the listener handed over, run on a compaction thread); None when
    it claimed nothing, or raised (logged; the caller gives the slot back)."""
    try:
        return claim()
    except Exception:
        log.exception("Claiming a job failed.")
        return None
