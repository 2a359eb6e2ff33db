"""A claimed run's finish, carried by the next claim's commit: one durable commit per compaction.

A run of this process's worker is claimed in one commit (the job added already accepted)
and, when it ends, finished and removed in another. Both are ``synchronous=FULL`` commits, so
a fleet of small databases paid two fsyncs per compaction beside the VACUUM's own. When a
run ends, its channel hears the outcome at once and its finish waits here; the claim of the
next run, which its channel starts in the same loop iteration, writes it in its own commit.
When no claim comes within :data:`FINISH_MERGE_WAIT_S`, an idle compaction thread commits it
alone, and a stop commits whatever waits.

A batch's databases (``smoosh.daemon.run.batch``) leave only their history rows here (no job of
their own to finish) until the batch's last, whose finish carries the batch's job: those rows
wait for a commit up to :data:`BATCH_ROW_WAIT_S`, so a batch of a hundred small databases costs
one commit, and one that waits long for a quiet moment still gets its results to the store.

What a crash meanwhile leaves: the run's job still running in the store, as after a crash
during its compaction; the next start takes it back (``smoosh.daemon.run.startup``) and the key
is examined afresh. The finish never waits past a stop.

Owner: the worker; any compaction thread calls it, under one lock.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Optional, TypeVar

from smoosh.jobs import Job, JobHalted, Jobs
from smoosh.store import Transaction

__all__ = ["DeferredFinishes", "FINISH_MERGE_WAIT_S", "BATCH_ROW_WAIT_S"]

log = logging.getLogger("smoosh.daemon.run.worker")  # the worker's lines, one logger

T = TypeVar("T")

#: A write made in the commit that finishes a run (the run's durable history row), or None.
Also = Optional[Callable[[Transaction], None]]

#: A finish waiting for a commit: its key, its job (None: a batch's database, its history row
#: alone) and the write that goes with it.
Entry = tuple[str, Optional[Job], Also]

#: Longest a finished run's job waits for the next claim's commit before it is committed on
#: its own (seconds). The next claim comes within a loop iteration (well under a millisecond)
#: while its channel has work; when the channel has none, this is how late the store learns.
FINISH_MERGE_WAIT_S = 0.005
#: Longest a history row with no job to finish (a batch's database) waits for a commit to carry
#: it (seconds): the batch's own end carries it sooner, unless a database waits for a quiet moment.
BATCH_ROW_WAIT_S = 1.0
#: Seconds a claim waits, at most, for another commit carrying its key's last finish.
COMMIT_WAIT_S = 5.0


class DeferredFinishes:
    """Finishes of claimed runs waiting for a commit to carry them (see the module docstring).

    Parameters:
        jobs: the job layer the runs' jobs live in.
        clock: monotonic seconds.
    """

    def __init__(self, jobs: Jobs, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._jobs = jobs
        self._clock = clock
        self._cond = threading.Condition()
        self._waiting: list[Entry] = []  # (key, job or None, the write that goes with it)
        self._since = 0.0  # when the oldest waiting entry was added
        self._job_since: float | None = None  # when the oldest waiting entry with a job was added
        self._committing: dict[str, int] = {}  # key -> commits under way carrying its finish

    def add(self, key: str, job: Job | None, also: Also = None) -> None:
        """The run of ``key`` ended: its job is to be finished and removed (``job`` None: a batch's
        database, with only its history row to write).

        Its outcome is not written in the job: the channel heard it directly and keeps it, and
        the job is deleted in the same commit, so no reader could ever see it.

        Parameters:
            key: the run's key.
            job: its job.
            also: a write made in the same commit (the key's durable history row,
                ``smoosh.daemon.results``): durable history costs no extra commit.
        """
        with self._cond:
            now = self._clock()
            if not self._waiting:
                self._since = now
            if job is not None and self._job_since is None:
                self._job_since = now
            self._waiting.append((key, job, also))

    def waiting(self) -> int:
        """How many finishes wait for a commit."""
        with self._cond:
            return len(self._waiting)

    def flush_if_due(self) -> float | None:
        """Commit the waiting finishes once the oldest has waited :data:`FINISH_MERGE_WAIT_S`
        (:data:`BATCH_ROW_WAIT_S` while only a batch's history rows wait).

        The compaction pool calls it when a thread finds no work (and before each run).

        Returns:
            Seconds until they are due, when some wait and are not due yet; else None.
        """
        due = self._flush_if_past(jobs_too=True)
        return None if due is None else due[0] - due[1]

    def rows_due_at(self) -> float | None:
        """When what waits now must be committed at the latest (:data:`BATCH_ROW_WAIT_S` after the
        oldest entry, on this object's clock), or None when nothing waits."""
        with self._cond:
            return self._due_at_locked(jobs_too=False) if self._waiting else None

    def flush_rows_if_due(self) -> float | None:
        """Commit what waits once the oldest entry has waited :data:`BATCH_ROW_WAIT_S`.

        The worker's heartbeat thread calls it while jobs run: a batch's thread is busy with its
        databases, and with one slot no other thread is idle to commit their rows.

        Returns:
            When it is due next (this object's clock), when something waits that is not due yet.
        """
        due = self._flush_if_past(jobs_too=False)
        return None if due is None else due[0]

    def flush(self) -> None:
        """Commit every waiting finish now (a stop)."""
        with self._cond:
            taken = self._take_locked()
        if taken:
            self._commit(taken)

    def transact(self, key: str, body: Callable[[Transaction], T]) -> T:
        """Run ``body`` in one transaction that also finishes every waiting run (a claim's commit).

        A finish of ``key`` itself that another commit carries now is waited for first: the
        claim reads whether a job of the key runs, and must not find the one that ended.

        Raises:
            Whatever the transaction raises; the finishes it took wait again then.
        """
        with self._cond:
            deadline = self._clock() + COMMIT_WAIT_S
            while key in self._committing and self._clock() < deadline:
                self._cond.wait(max(0.0, deadline - self._clock()))
            taken = self._take_locked()
        try:
            return self._jobs.transact(lambda tr: self._carry(tr, taken, body))
        except BaseException:
            self._restore(taken)
            raise
        finally:
            self._done(taken)

    # -- under the lock, and the commits -----------------------------------------------------------

    def _due_at_locked(self, *, jobs_too: bool) -> float:
        """When what waits is due: :data:`BATCH_ROW_WAIT_S` after the oldest entry, and with
        ``jobs_too`` :data:`FINISH_MERGE_WAIT_S` after the oldest with a job, if sooner."""
        due_at = self._since + BATCH_ROW_WAIT_S
        if jobs_too and self._job_since is not None:
            due_at = min(due_at, self._job_since + FINISH_MERGE_WAIT_S)
        return due_at

    def _flush_if_past(self, *, jobs_too: bool) -> tuple[float, float] | None:
        """Commit what waits once it is due (:meth:`_due_at_locked`); while it is not, ``(when it
        is due, now)``; None when nothing waits or it was committed."""
        with self._cond:
            if not self._waiting:
                return None
            due_at, now = self._due_at_locked(jobs_too=jobs_too), self._clock()
            if due_at > now:
                return due_at, now
            taken = self._take_locked()
        self._commit(taken)
        return None

    def _take_locked(self) -> list[Entry]:
        taken, self._waiting = self._waiting, []
        self._job_since = None
        for key, _, _ in taken:
            self._committing[key] = self._committing.get(key, 0) + 1
        return taken

    def _done(self, taken: list[Entry]) -> None:
        if not taken:
            return
        with self._cond:
            for key, _, _ in taken:
                left = self._committing.get(key, 0) - 1
                if left > 0:
                    self._committing[key] = left
                else:
                    self._committing.pop(key, None)
            self._cond.notify_all()

    def _restore(self, taken: list[Entry]) -> None:
        if not taken:
            return
        with self._cond:
            now = self._clock()
            if not self._waiting:
                self._since = now
            if self._job_since is None and any(job is not None for _, job, _ in taken):
                self._job_since = now
            self._waiting = taken + self._waiting

    def _carry(self, tr: Transaction, taken: list[Entry], body: Callable[[Transaction], T]) -> T:
        self._apply(tr, taken)
        return body(tr)

    def _apply(self, tr: Transaction, taken: list[Entry]) -> None:
        for key, job, also in taken:
            if job is None:
                if also is not None:
                    also(tr)  # a batch's database: its history row alone
                continue
            try:
                # Finished and removed in one step (smoosh never resubmits a job while it
                # runs; one that was would be left pending, not removed).
                self._jobs.finish_and_remove(job, tx=tr)
            except JobHalted:
                # Removed (its crash record was written with the removal) or re-enqueued
                # since it ran: nothing of this run to finish. finish() reads before it writes.
                log.debug("Job %r was halted before it could be finished.", key)
            if also is not None:
                also(tr)  # its compaction ended all the same: its history row is written

    def _commit(self, taken: list[Entry]) -> None:
        try:
            self._jobs.transact(lambda tr: self._apply(tr, taken))
        except Exception:
            # The jobs stay running in the store; their activity timeout re-enqueues them.
            log.exception("Finishing the jobs of %s failed.", ", ".join(repr(k) for k, _, _ in taken))
        finally:
            self._done(taken)
