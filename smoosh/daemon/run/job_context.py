"""A running job in a worker: the context its compaction sees (progress, chunk boundaries, holds,
stops, rotation) and the record its heartbeat and compaction threads share."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from smoosh.compactors import Interrupted
from smoosh.io_budget import IoBudget
from smoosh.jobs import Job

if TYPE_CHECKING:
    from smoosh.daemon.run.batch import Carrier

__all__ = ["JobContext", "Running", "ROTATED", "STOPPING", "HALTED"]

log = logging.getLogger(__name__)

#: The stop reason of a run that rotation stopped.
ROTATED = "rotated"
#: The stop reason of a run whose worker stops.
STOPPING = "worker stopping"
#: The stop reason of a run whose job the layer halted (removed, or re-enqueued elsewhere).
HALTED = "job halted"


class JobContext:
    """The :class:`~smoosh.compactors.base.CompactionContext` a worker hands a compaction.

    Three outside events reach a running compaction through it: a hold (``set_held``: the
    next ``checkpoint`` waits; cancel callbacks run, so a full VACUUM stops), a stop or halt
    (``stop``: callbacks run and every later ``checkpoint`` raises ``Interrupted``).

    Parameters:
        io_budget: the process's I/O budget: a chunk boundary also waits while it is in debt
            (``max_io_rate`` paces the chunks); a stop ends that wait at once. None: no pacing.
        clock: monotonic seconds: when the progress last grew (:attr:`progress_at`), which
            ``/status`` shows as a run's time since progress.
    """

    def __init__(self, io_budget: IoBudget | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._io_budget = io_budget
        self._clock = clock
        self._cond = threading.Condition()
        self._fraction = 0.0
        self._progress_at: float | None = None
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
                self._progress_at = self._clock()

    def checkpoint(self) -> None:
        """Wait while held or while the I/O budget is in debt; raise :class:`Interrupted` once stopped."""
        budget = self._io_budget
        while True:
            with self._cond:
                self._checkpointed = True
                while self._held and self.stop_reason is None:
                    self._cond.wait()  # set_held(False) and stop() both notify
                if self.stop_reason is not None:
                    raise Interrupted(self.stop_reason)
            if budget is None or not budget.in_debt():
                return
            # Outside our lock: stop() sets the reason under it, then wakes the budget, so
            # the waiter either sees the reason before it sleeps or is woken after.
            budget.wait(lambda: self.stop_reason is not None)
            # Paid (or stopped): look at the hold and the stop again before the next chunk.

    def pause(self, seconds: float) -> None:
        """Wait up to ``seconds`` between two chunks (holding no lock); a stop or a hold ends it at once.

        The next :meth:`checkpoint` then raises or waits as it would have.
        """
        deadline = time.monotonic() + seconds
        with self._cond:
            while not self._held and self.stop_reason is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._cond.wait(left)  # stop(), set_held() and rotate() notify

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
    def progress_at(self) -> float | None:
        """When the progress last grew (the clock's seconds), None while it has not."""
        with self._cond:
            return self._progress_at

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
        self._wake_budget()
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
        self._wake_budget()
        for fn in fns:
            self._call(fn)

    def _wake_budget(self) -> None:
        """A stop must not wait out the I/O budget's debt: the waiter re-reads the stop now."""
        if self._io_budget is not None:
            self._io_budget.wake()

    @staticmethod
    def _call(fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:
            log.exception("A compaction's cancel callback failed.")


@dataclass(eq=False)  # identity hashing: kept in a set of running jobs
class Running:
    """One job in flight in a worker: its heartbeat thread and its compaction thread share it."""

    job: Job
    data: dict[str, Any]
    ctx: JobContext
    next_update: float
    halted: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)  # job handle updates vs. finish
    done: bool = False
    # Published in the job's data so rotation can name this run (and no later one).
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    started_at: float = 0.0  # wall time: shown, and sent with heartbeats
    started_mono: float = 0.0  # the same moment on the monotonic clock: the duration counts from it
    # Claimed by this process's scheduler (add_claimed): its job is removed as it finishes,
    # in the same transaction, and a halted run is reported (nobody else follows it).
    claimed: bool = False
    # The keys its batch compacted before it, in order (smoosh.daemon.run.batch): they still
    # count as running until the batch ends, which settles their files' last events at once.
    batched: tuple[str, ...] = ()
    # The batch's job this run compacts under, once its batch has one (smoosh.daemon.run.batch):
    # ``job`` is then that job's handle (heartbeats keep it alive), not one of its own.
    carrier: Carrier | None = None
    # The key, when ``job`` is a batch's job named after another database.
    member_key: str | None = None
    # Its job's finish (or its batch's end) is queued: once per run, whatever way its thread ends.
    finish_queued: bool = False

    @property
    def key(self) -> str:
        return self.member_key if self.member_key is not None else str(self.job.id)

    @property
    def channel(self) -> str | None:
        channel = self.data.get("channel")
        return channel if isinstance(channel, str) else None
