"""The worker's heartbeat thread: keeps the worker's running jobs alive in the job layer.

One long VACUUM statement cannot call out, and a silent job is re-enqueued by the activity
monitor after the type timeout, so a thread beside the compactions sends each running job's
heartbeat (``jobs.update`` every ``job_timeout_s / 3``). For a worker in its own process
(``signals="store"``) the same thread reads the node's holds and rotation requests from the
store (:func:`smoosh.daemon.control.control.read_signals`, with the daemon's incremental pace) every ``hold_poll_s``. The thread starts
with a run, sleeps until the next heartbeat or poll is due, and ends a while after the last
run ends (at once on a stop).

Owner: the :class:`~smoosh.daemon.run.worker.Worker`, whose lock it shares.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Collection, Literal

from smoosh.daemon.control import control
from smoosh.daemon.control.store_health import log_failure
from smoosh.daemon.run.finishes import DeferredFinishes
from smoosh.daemon.run.job_context import HALTED, Running
from smoosh.daemon.keypool import DEFAULT_IDLE_EXIT_S
from smoosh.daemon.run.startup import DAEMON_WORKER, HOLDER
from smoosh.io_budget import DEFAULT_CHUNK_GAP_FACTOR
from smoosh.jobs import JobHalted, Jobs
from smoosh.store import Store

__all__ = ["Heartbeat", "ERROR_PAUSE_S"]

log = logging.getLogger("smoosh.daemon.run.worker")  # the worker's lines, one logger

#: The keys of a job's data that say who runs it and that it lives (:meth:`Heartbeat.liveness`).
LIVENESS_KEYS = frozenset({"heartbeat_at", "worker", HOLDER})

#: Pause after an unexpected error in the worker's dispatcher or heartbeat thread, so a broken
#: store is not hammered (seconds).
ERROR_PAUSE_S = 1.0
#: A heartbeat this late means the whole process was stopped (SIGSTOP, a cgroup freezer, a
#: debugger, a paused VM) or starved: said once when it runs again, naming the compactions that
#: were running (a VACUUM or a chunk among them held its database's write lock all along).
STALLED_S = 5.0


class Heartbeat:
    """The heartbeat thread of one worker, and when it next looks.

    Shared state, all under the worker's lock (``lock``): the worker's running set and stop
    flag (read here through ``runs`` and ``stopping``), and this object's thread and wake time.
    The one way in is :meth:`run_added`, which the worker calls with that lock held as it
    registers a run; its stop uses :meth:`wake` (under the lock) and :attr:`thread` (to join).
    The poll schedule (``_next_poll``) is written by the heartbeat thread alone.

    Parameters:
        lock: the worker's lock; the thread's own condition is on it.
        runs: the worker's running set itself (not a copy), read under ``lock``.
        stopping: whether the worker is stopping, read under ``lock``.
        jobs: the job layer (``jobs.update`` is the heartbeat).
        store: the store the node's holds live in (``signals="store"``).
        node: the node name (for the hold keys).
        job_type: the worker's job type (for its log lines).
        signals: ``"direct"`` (in the daemon: no store polls) or ``"store"``.
        job_timeout_s: the type timeout, read at every heartbeat (a config reload changes it).
        hold_poll_s: how often a stand-alone worker reads its holds (seconds).
        clock: wall-clock seconds, for ``heartbeat_at`` and to age the pace the daemon wrote.
        holder: the instance of the process the worker runs in, named in every heartbeat: a
            restarting daemon takes back the jobs of a holder it knows dead, and follows the others.
        on_pace: given the node's incremental pace as each store poll reads it (``signals="store"``:
            the daemon's backlog controller sets it; the worker's I/O budget takes it), or
            :data:`~smoosh.io_budget.DEFAULT_CHUNK_GAP_FACTOR` while the store holds no fresh one.
        finishes: the worker's finishes waiting for a commit: the thread commits them once they
            are :data:`~smoosh.daemon.run.finishes.BATCH_ROW_WAIT_S` old (a batch's thread is busy
            with its databases, and with one slot no other thread is idle to).
    """

    def __init__(
        self,
        lock: threading.RLock,
        *,
        runs: Callable[[], Collection[Running]],
        stopping: Callable[[], bool],
        jobs: Jobs,
        store: Store | None,
        node: str,
        job_type: str,
        signals: Literal["direct", "store"],
        job_timeout_s: Callable[[], float],
        hold_poll_s: float,
        clock: Callable[[], float],
        holder: str | None = None,
        on_pace: Callable[[float], None] | None = None,
        finishes: DeferredFinishes | None = None,
    ) -> None:
        # The heartbeat thread waits on a condition of its own (same lock), woken only when a
        # run needs it sooner than it planned to wake: not once per start and end of a run.
        self._cond = threading.Condition(lock)
        self._runs = runs
        self._stopping = stopping
        self._jobs = jobs
        self._store = store
        self._node = node
        self._job_type = job_type
        self._signals = signals
        self._job_timeout_s = job_timeout_s
        self._hold_poll_s = hold_poll_s
        self._clock = clock
        self._holder = holder
        self._on_pace = on_pace
        self._finishes = finishes
        #: When the heartbeat thread will next look (monotonic seconds); under the lock.
        self._beat_at = float("inf")
        self._thread: threading.Thread | None = None  # under the lock
        self._next_poll = 0.0

    @property
    def thread(self) -> threading.Thread | None:
        """The heartbeat thread alive now, or None (read it under the worker's lock)."""
        return self._thread

    def run_added(self, running: Running) -> None:
        """A run was registered: wake the thread if the run is due sooner, or start one.

        Called with the worker's lock held: the thread decides to end under that lock too, so
        a run added meanwhile is either seen by the thread or finds none and starts one.
        """
        due = running.next_update if self._signals == "direct" else min(running.next_update, self._next_poll)
        rows_due = self._finishes.rows_due_at() if self._finishes is not None else None
        if rows_due is not None:
            due = min(due, rows_due)  # a batch's next database: the rows of those before it
        if due < self._beat_at:
            self._cond.notify_all()  # this run's heartbeat (or signal poll) is due sooner
        if self._thread is None:
            self._thread = threading.Thread(target=self._beat, name="smoosh-heartbeat", daemon=True)
            self._thread.start()

    def wake(self) -> None:
        """Wake the thread now, to see a stop (called with the worker's lock held)."""
        self._cond.notify_all()

    def _beat(self) -> None:
        """The heartbeat thread: heartbeats (and store signals) while jobs run; it ends with the last."""
        while True:
            try:
                next_due = self._send_due(time.monotonic())
            except Exception:
                log.exception("Worker for %r: heartbeats failed; going on.", self._job_type)
                next_due = time.monotonic() + ERROR_PAUSE_S
            with self._cond:
                # Decided under the lock run_added starts this thread under: a run launched
                # meanwhile is either seen here or finds no thread and starts one. With no
                # job running it lingers a while first: a fleet's next job comes soon.
                if not self._runs() and not self._stopping():
                    self._beat_at = time.monotonic() + DEFAULT_IDLE_EXIT_S
                    self._cond.wait(DEFAULT_IDLE_EXIT_S)
                if self._stopping() or not self._runs():
                    self._thread = None
                    self._beat_at = float("inf")
                    return
                if next_due is not None:
                    self._beat_at = next_due
                    self._cond.wait(max(0.0, next_due - time.monotonic()))
                    self.woke(next_due, time.monotonic())

    def woke(self, planned: float, now: float) -> None:
        """The thread woke at ``now`` from a sleep planned to end at ``planned`` (monotonic seconds).

        Asleep, the thread does nothing that could make it late: a wake this late means the whole
        process was stopped (or starved), and the compactions running then kept any write lock
        they held that long. Said once, when smoosh runs again. Called with the lock held.
        """
        stalled_s = now - planned
        if stalled_s < STALLED_S:
            return
        keys = ", ".join(repr(r.key) for r in self._runs()) or "nothing"
        log.warning(
            "smoosh was stopped or starved for %.1f s (SIGSTOP, a freezer, a debugger or a paused VM?) while it "
            "compacted %s; a compaction holding a database's write lock kept the application's writers waiting "
            "that long (under systemd, WatchdogSec= ends such a stop).", stalled_s, keys,
        )

    def _send_due(self, now: float) -> float | None:
        """Heartbeats (and store signals) that are due; returns when the next one is."""
        with self._cond:
            running = list(self._runs())
        if not running:
            return None
        poll = self._signals == "store" and now >= self._next_poll
        if poll:
            self._next_poll = now + self._hold_poll_s
        for r in running:
            try:
                if poll:
                    self._poll_signals(r)
                # A run whose compaction is done sends none (its job is being finished), and keeps
                # its beat due: a batch's next database takes the schedule over and sends it.
                if now >= r.next_update and not r.done:
                    r.next_update = now + self._job_timeout_s() / 3.0
                    self._send_heartbeat(r)
            except Exception as exc:
                log_failure(log, exc, "Heartbeat of job %r", r.key, health_says_it=self._signals == "direct")
        # (A done run's beat, kept due for the run after it, is not waited for: it would spin.)
        dues = [r.next_update if not r.done else now + self._job_timeout_s() / 3.0 for r in running]
        if self._signals == "store":
            dues.append(self._next_poll)
        if self._finishes is not None:
            due_at = self._finishes.flush_rows_if_due()  # (a failed commit is logged there)
            if due_at is not None:
                dues.append(due_at)
        return min(dues)

    def _poll_signals(self, r: Running) -> None:
        if self._store is None:
            return  # (no store to read the signals from: a worker given none hears them directly)
        held, rotate_run, pace = control.read_signals(self._store, self._node, r.channel, r.key, now=self._clock())
        if self._on_pace is not None:
            # No pace (never written, too old, or cleared by a daemon that stopped): back to the
            # default, not the last one read, which a daemon gone no longer adjusts.
            self._on_pace(DEFAULT_CHUNK_GAP_FACTOR if pace is None else pace)
        if r.channel is not None:
            r.ctx.set_held(held)
        if rotate_run == r.run_id and r.ctx.stop_reason is None and r.ctx.rotate():
            log.info("Job %r stops at its next chunk boundary: rotated out.", r.key)

    def liveness(self) -> dict[str, object]:
        """What tells a restarting daemon who runs a job and that it lives (keys :data:`LIVENESS_KEYS`):
        written by every heartbeat, and by a stand-alone worker's accept (``Jobs.accept(stamp=)``)."""
        data: dict[str, object] = {"heartbeat_at": self._clock(),
                                "worker": DAEMON_WORKER if self._signals == "direct" else "process"}
        if self._holder is not None:
            data[HOLDER] = self._holder
        return data

    def _send_heartbeat(self, r: Running) -> None:
        # A batch's database runs under the batch's job: the job keeps its own data (its run, its
        # cap slot), and says which database it compacts now.
        base = r.data if r.carrier is None else {**r.carrier.data, "compacting": r.key}
        data = {
            **base,
            "progress": r.ctx.fraction,
            "run_id": r.run_id,
            "started_at": r.started_at,
            "suspendable": r.ctx.suspendable,
            **self.liveness(),
        }
        try:
            with r.lock:
                if r.done:
                    return  # the job is being finished: an update now could race the finish
                r.job = self._jobs.update(r.job, data)
        except JobHalted:
            r.halted = True
            r.ctx.stop(HALTED)
