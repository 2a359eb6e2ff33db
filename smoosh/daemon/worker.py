"""The worker: accepts compaction jobs of one node's job type and runs them through the compactors.

Each job runs on one of ``concurrency`` threads; beside it a heartbeat thread calls
``jobs.update`` every ``job_timeout_s / 3`` (one long VACUUM statement cannot call out, and a
silent job is re-enqueued by the activity monitor after the type timeout) and polls the
channel's hold (:mod:`smoosh.daemon.control`) every ``hold_poll_s``. While held, an incremental
compaction waits at its next chunk boundary holding no database lock; a full VACUUM is
interrupted and finished as "interrupted". A job the layer halted (removed, or re-enqueued
after this worker went silent) is cancelled and never finished here: it belongs to someone
else now. A clean stop interrupts running compactions and puts their jobs back to pending
(``resubmit`` then ``finish``). A rotation request (:func:`smoosh.daemon.control.request_rotation`)
naming this run stops a suspendable compaction at its next chunk boundary; the job is
finished as "interrupted" with ``rotated: True`` and its channel queues it again.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Callable, Sequence

from smoosh.daemon import control
from smoosh.compactors import Busy, Compactor, Gone, Interrupted, compactor_for
from smoosh.jobs import JobHalted, NotFound

__all__ = ["Worker", "JobContext", "run_worker_process", "DEFAULT_JOB_TIMEOUT_S", "DEFAULT_HOLD_POLL_S"]

log = logging.getLogger(__name__)

#: The job type's activity timeout (seconds); the heartbeat runs every third of it.
DEFAULT_JOB_TIMEOUT_S = 30.0
#: How often a running job's channel hold is read from the store (seconds).
DEFAULT_HOLD_POLL_S = 1.0
#: How long one ``accept`` waits for a pending job before the loop checks for a stop (seconds).
ACCEPT_TIMEOUT_S = 1.0
#: Pause after an unexpected error in the accept loop, so a broken store is not hammered (seconds).
ERROR_PAUSE_S = 1.0
#: A clean stop of ``smoosh worker`` finishes within this (seconds).
STOP_TIMEOUT_S = 10.0
#: Longest single wait inside a held checkpoint, so a stop is noticed promptly (seconds).
HOLD_WAIT_SLICE_S = 0.5
#: The stop reason of a run that rotation stopped.
ROTATED = "rotated"


class JobContext:
    """The :class:`~smoosh.compactors.base.CompactionContext` a worker hands a compaction.

    Three outside events reach a running compaction through it: a hold (``set_held``: the
    next ``checkpoint`` waits; cancel callbacks run, so a full VACUUM stops), a stop or halt
    (``stop``: callbacks run and every later ``checkpoint`` raises ``Interrupted``).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._fraction = 0.0
        self._cancel_fns: list[Callable[[], None]] = []
        self._held = False
        self._checkpointed = False
        self.stop_reason: str | None = None

    # -- the compaction's side
    def progress(self, fraction: float) -> None:
        """Record progress; kept monotone and clamped to [0, 1]."""
        fraction = min(1.0, max(0.0, float(fraction)))
        with self._cond:
            if fraction > self._fraction:
                self._fraction = fraction

    def checkpoint(self) -> None:
        """Wait while held; raise :class:`Interrupted` once stopped."""
        with self._cond:
            self._checkpointed = True
            while self._held and self.stop_reason is None:
                self._cond.wait(HOLD_WAIT_SLICE_S)
            if self.stop_reason is not None:
                raise Interrupted(self.stop_reason)

    def on_cancel(self, fn: Callable[[], None]) -> None:
        """Register ``fn`` to run when the job must stop now; runs at once if it already must."""
        with self._cond:
            self._cancel_fns.append(fn)
            now = self._held or self.stop_reason is not None
        if now:
            self._call(fn)

    # -- the worker's side
    @property
    def fraction(self) -> float:
        """The latest progress, in [0, 1]."""
        with self._cond:
            return self._fraction

    @property
    def held(self) -> bool:
        """Is the job's channel held now?"""
        with self._cond:
            return self._held

    @property
    def suspendable(self) -> bool:
        """Can the run stop at a chunk boundary without losing work?

        True once the compaction has passed a chunk boundary and has no cancel callback: a
        chunked compaction keeps its progress in the file; one that registered a cancel
        callback (a full VACUUM) would throw its work away.
        """
        with self._cond:
            return self._checkpointed and not self._cancel_fns

    def rotate(self) -> bool:
        """Stop at the next chunk boundary for rotation, only if :attr:`suspendable`.

        Decided under the same lock ``on_cancel`` takes, so a compaction that registers a
        cancel callback a moment later finds the stop already set and never starts its
        VACUUM. Returns True when the run is (now or already) stopping for rotation.
        """
        with self._cond:
            if self.stop_reason is not None:
                return self.stop_reason == ROTATED
            if self._cancel_fns or not self._checkpointed:
                return False
            self.stop_reason = ROTATED
            self._cond.notify_all()
        return True

    def set_held(self, held: bool) -> None:
        """Hold or release; holding runs the cancel callbacks (a full VACUUM cannot pause)."""
        with self._cond:
            if held == self._held:
                return
            self._held = held
            fns = list(self._cancel_fns) if held else []
            self._cond.notify_all()
        for fn in fns:
            self._call(fn)

    def stop(self, reason: str) -> None:
        """Stop the compaction: callbacks run now, the next checkpoint raises ``Interrupted``."""
        with self._cond:
            if self.stop_reason is not None:
                return
            self.stop_reason = reason
            fns = list(self._cancel_fns)
            self._cond.notify_all()
        for fn in fns:
            self._call(fn)

    @staticmethod
    def _call(fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:
            log.exception("A compaction's cancel callback failed.")


@dataclass(eq=False)  # identity hashing: kept in a set of running jobs
class _Running:
    """One job in flight: the heartbeat thread and the compaction share it."""

    job: Any
    data: dict[str, Any]
    ctx: JobContext
    done: threading.Event = field(default_factory=threading.Event)
    halted: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Published in the job's data so rotation can name this run (and no later one).
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    started_at: float = 0.0


class Worker:
    """Runs the compaction jobs of one job type.

    Parameters:
        jobs: the job layer (:class:`smoosh.jobs.Jobs` or anything with accept/update/finish/resubmit).
        store: the store the node's holds live in (:mod:`smoosh.daemon.control`).
        job_type: ``"smoosh:" + node``.
        compactors: in priority order (:func:`smoosh.compactors.load_compactors`).
        node: the node name (for the hold keys).
        job_timeout_s: the type timeout; heartbeats go out every third of it.
        concurrency: jobs run at once (one thread each).
        hold_poll_s: how often a running job's hold is read.
        clock: wall-clock seconds, for ``duration_s``.
        accept_timeout_s: how long one ``accept`` waits; a stop waits up to this for idle threads.
    """

    def __init__(
        self,
        jobs: Any,
        store: Any,
        job_type: str,
        compactors: Sequence[Compactor],
        *,
        node: str,
        job_timeout_s: float = DEFAULT_JOB_TIMEOUT_S,
        concurrency: int = 1,
        hold_poll_s: float = DEFAULT_HOLD_POLL_S,
        clock: Callable[[], float] = time.time,
        accept_timeout_s: float = ACCEPT_TIMEOUT_S,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, not {concurrency!r}")
        self.jobs = jobs
        self.store = store
        self.job_type = job_type
        self.compactors = list(compactors)
        self.node = node
        self.job_timeout_s = job_timeout_s
        self.concurrency = concurrency
        self.hold_poll_s = hold_poll_s
        self._clock = clock
        self.accept_timeout_s = accept_timeout_s
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._running: set[_Running] = set()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start ``concurrency`` threads, each accepting and running jobs until :meth:`stop`."""
        self._stopping.clear()
        for i in range(self.concurrency):
            t = threading.Thread(target=self._loop, name=f"smoosh-worker-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> bool:
        """Clean stop: interrupt running compactions and put their jobs back to pending.

        Parameters:
            timeout_s: how long to wait for the threads.

        Returns:
            True when every thread ended within ``timeout_s``.
        """
        self._stopping.set()
        with self._lock:
            running = list(self._running)
        for r in running:
            r.ctx.stop("worker stopping")
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        alive = [t for t in self._threads if t.is_alive()]
        self._threads = alive
        if alive:
            log.warning("%d worker thread(s) did not stop within %.1f s.", len(alive), timeout_s)
        return not alive

    def status(self) -> list[dict[str, Any]]:
        """The jobs running now: ``[{"key", "channel", "progress", "held", "stopping"}]``."""
        with self._lock:
            running = list(self._running)
        return [
            {
                "key": r.job.id,
                "channel": r.data.get("channel"),
                "progress": r.ctx.fraction,
                "held": r.ctx.held,
                "stopping": r.ctx.stop_reason is not None,
            }
            for r in running
        ]

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                try:
                    job, data = self.jobs.accept(self.job_type, timeout=self.accept_timeout_s)
                except NotFound:
                    continue
                self.run_job(job, data)
            except Exception:
                # One bad job or a store hiccup never ends the worker.
                log.exception("Worker loop iteration for %r failed; going on.", self.job_type)
                self._stopping.wait(ERROR_PAUSE_S)

    # ------------------------------------------------------------------ one job

    def run_job(self, job: Any, data: dict[str, Any]) -> dict[str, Any] | None:
        """Run one accepted job to its end and finish it.

        Parameters:
            job: the accepted :class:`smoosh.jobs.Job` (its id is the key).
            data: its data (``channel``, ``key``, ``priority``, ``progress``).

        Returns:
            The data the job was finished with, or None when it was not finished here
            (halted: it belongs to someone else; or put back to pending by a clean stop).
        """
        key = job.id
        data = dict(data)
        started = self._clock()
        running = _Running(job=job, data=data, ctx=JobContext(), started_at=started)
        if self._stopping.is_set():
            return self._requeue(running, "worker stopping")
        compactor = compactor_for(key, self.compactors)
        if compactor is None:
            return self._finish(running, self._outcome("failed", f"no compactor claims {key}", started))
        try:
            sizes = compactor.sizes(key)
        except Exception as exc:
            log.exception("Reading the sizes of %r failed.", key)
            return self._finish(running, self._outcome("failed", f"{type(exc).__name__}: {exc}", started))
        if sizes is None:
            return self._finish(running, self._outcome("gone", f"{key} is missing or not a database", started))

        with self._lock:
            self._running.add(running)
        heartbeat = threading.Thread(target=self._heartbeat, args=(running,), name=f"smoosh-heartbeat-{key}", daemon=True)
        heartbeat.start()
        size_bytes = sizes.file_bytes
        try:
            log.info("Compacting %r (channel %r).", key, data.get("channel"))
            result = compactor.compact(key, running.ctx)
            outcome = self._outcome("ok", None, started, result.size_before_bytes, result.size_after_bytes)
        except Busy as exc:
            outcome = self._outcome("busy", str(exc), started, size_bytes, size_bytes)
        except Interrupted as exc:
            outcome = self._outcome("interrupted", str(exc), started, size_bytes, size_bytes)
        except Gone as exc:
            outcome = self._outcome("gone", str(exc), started)
        except Exception as exc:
            log.exception("Compaction of %r failed.", key)
            outcome = self._outcome("failed", f"{type(exc).__name__}: {exc}", started, size_bytes, size_bytes)
        finally:
            running.done.set()
            heartbeat.join()
            with self._lock:
                self._running.discard(running)
        outcome["progress"] = 1.0 if outcome["result"] == "ok" else running.ctx.fraction
        if outcome["result"] == "interrupted" and running.ctx.stop_reason == ROTATED:
            outcome["rotated"] = True
        if running.halted:
            log.info("Job %r was halted (removed or re-enqueued); not finishing it.", key)
            return None
        if outcome["result"] == "interrupted" and running.ctx.stop_reason == "worker stopping":
            return self._requeue(running, "worker stopping")
        log.info("Compaction of %r ended: %s (%s).", key, outcome["result"], outcome["error"] or "no error")
        return self._finish(running, outcome)

    def _outcome(
        self, result: str, error: str | None, started: float, before: int = 0, after: int | None = None
    ) -> dict[str, Any]:
        after = before if after is None else after
        return {
            "result": result,
            "error": error,
            "size_before_bytes": int(before),
            "size_after_bytes": int(after),
            "reclaimed_bytes": max(0, int(before) - int(after)),
            "duration_s": max(0.0, float(self._clock() - started)),
        }

    def _finish(self, running: _Running, outcome: dict[str, Any]) -> dict[str, Any] | None:
        data = {**running.data, **outcome}
        data.setdefault("progress", running.data.get("progress", 0.0))
        try:
            with running.lock:
                self.jobs.finish(running.job, data)
        except JobHalted:
            log.info("Job %r was halted before it could be finished.", running.job.id)
            return None
        return data

    def _requeue(self, running: _Running, reason: str) -> None:
        # resubmit, then finish: a resubmitted job goes back to pending on finish, with the
        # data it started with, so the next worker starts it afresh (an incremental
        # compaction's progress is kept in the file itself).
        try:
            with running.lock:
                job = self.jobs.resubmit(running.job)
                self.jobs.finish(job, running.data)
            log.info("Job %r put back to pending (%s).", running.job.id, reason)
        except JobHalted:
            log.info("Job %r was halted before it could be put back.", running.job.id)
        return None

    # ------------------------------------------------------------------ heartbeat

    def _heartbeat(self, running: _Running) -> None:
        update_every_s = self.job_timeout_s / 3.0
        channel = running.data.get("channel")
        next_update = time.monotonic() + update_every_s
        next_poll = time.monotonic()
        while not running.done.is_set():
            try:
                now = time.monotonic()
                if now >= next_poll:
                    next_poll = now + self.hold_poll_s
                    self._poll_signals(running, channel)
                if now >= next_update:
                    next_update = now + update_every_s
                    self._send_heartbeat(running)
                    if running.halted:
                        return
            except Exception:
                log.exception("Heartbeat of job %r failed; going on.", running.job.id)
            running.done.wait(max(0.0, min(next_update, next_poll) - time.monotonic()))

    def _poll_signals(self, running: _Running, channel: str | None) -> None:
        held, rotate_run = control.read_signals(self.store, self.node, channel, running.job.id)
        if channel is not None:
            running.ctx.set_held(held)
        if rotate_run == running.run_id and running.ctx.stop_reason is None:
            if running.ctx.rotate():
                log.info("Job %r stops at its next chunk boundary: rotated out.", running.job.id)

    def _send_heartbeat(self, running: _Running) -> None:
        data = {
            **running.data,
            "progress": running.ctx.fraction,
            "run_id": running.run_id,
            "started_at": running.started_at,
            "suspendable": running.ctx.suspendable,
        }
        try:
            with running.lock:
                if running.done.is_set():
                    return  # the job is being finished: an update now could race the finish
                running.job = self.jobs.update(running.job, data)
        except JobHalted:
            running.halted = True
            running.ctx.stop("job halted")


def run_worker_process(config: Any, store_url: str | None = None, concurrency: int | None = None) -> int:
    """``smoosh worker``: run jobs of the config's node until SIGTERM/SIGINT, then stop cleanly.

    Parameters:
        config: smoosh's ``Config`` (``node``, ``job_timeout_s``, ``sqlite``, ``store``,
            ``wal_max_size_bytes``, ``exact_size_interval_s``).
        store_url: the store (default: the config's ``store``).
        concurrency: jobs at once (default 1).

    Returns:
        The exit code: 0 after a clean stop.
    """
    from smoosh.compactors import load_compactors
    from smoosh.jobs import Jobs
    from smoosh.store import open_store

    node = config.node
    job_timeout_s = float(getattr(config, "job_timeout_s", DEFAULT_JOB_TIMEOUT_S))
    store = open_store(store_url or config.store)
    jobs = Jobs(store)
    stop = threading.Event()
    previous: dict[int, Any] = {}
    try:
        job_type = "smoosh:" + node
        jobs.set_type_timeout(job_type, job_timeout_s)
        kw = {}
        for name in ("wal_max_size_bytes", "exact_size_interval_s"):
            if getattr(config, name, None) is not None:
                kw[name] = getattr(config, name)
        compactors = load_compactors(getattr(config, "sqlite", None), **kw)
        worker = Worker(jobs, store, job_type, compactors, node=node, job_timeout_s=job_timeout_s,
                        concurrency=concurrency or 1)

        def on_signal(signum: int, frame: FrameType | None) -> None:
            stop.set()

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, on_signal)
        worker.start()
        log.info("Worker for %r running %d job(s) at once.", job_type, worker.concurrency)
        while not stop.wait(1.0):
            pass
        log.info("Stopping the worker for %r.", job_type)
        worker.stop(STOP_TIMEOUT_S - 1.0)
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        jobs.close()
        store.close()
