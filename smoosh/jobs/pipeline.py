"""Claims overlapped: one worker keeps several of its transactions in flight (issue 50).

On the embedded store a claim costs a commit on this machine. On a FoundationDB cluster it costs
round trips to other machines: a read version, the reads, the commit; a worker that accepts a
job, runs it, finishes it, then accepts the next spends nearly all of a small job's time
waiting on the network, and one worker's job rate is a few round trips' worth whatever the
cluster could take. A :class:`ClaimPipeline` keeps up to ``depth`` claims in flight for its one
consumer: while the consumer runs a job, the next ones are being accepted, and the finishes of
the last ones commit behind it, together: the finishes handed over while an earlier one commits
wait for the next commit and share it (up to :data:`MAX_FINISH_BATCH`), so a busy consumer's
finishes cost a round trip or two per batch, not per job. The transactions are the job layer's
own (``accept``, ``finish``), with the same conflicts and the same "may have committed"
answers, only they no longer wait for each other.

At most ``depth`` jobs are held at once (accepted and not yet finished or given back), so a
slow consumer never takes more jobs from other workers than it will run soon; each held job
is running in the store, monitored by its type's activity timeout like any accepted job. A
consumer that stops (:meth:`ClaimPipeline.close`) gives the jobs it was handed none of back
(pending again, for any worker).

Owner: the consumer's thread calls :meth:`~ClaimPipeline.take`, :meth:`~ClaimPipeline.finish`,
:meth:`~ClaimPipeline.flush` and :meth:`~ClaimPipeline.close`; the pipeline's own threads (its
acceptors and finishers) only meet it through its queue, its credits and its lock.
"""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable, Mapping

from smoosh.jobs.accept import AcceptInterrupt
from smoosh.jobs.errors import JobHalted, NotFound
from smoosh.jobs.layer import Jobs
from smoosh.jobs.model import Job
from smoosh.jobs.threads import THREAD_NAME_PREFIX

__all__ = ["ClaimPipeline", "DEFAULT_DEPTH"]

log = logging.getLogger(__name__)

#: Claims in flight by default: enough to cover a cluster's round trips with small jobs.
DEFAULT_DEPTH = 8
#: Seconds an acceptor pauses after an error of the store before it tries again.
ERROR_PAUSE_S = 1.0
#: Finishes committed in one transaction at most (each a row read and a few writes: far under
#: FoundationDB's 10 MB and 5 s).
MAX_FINISH_BATCH = 64
#: Threads committing finishes: two batches in flight, one filling while the other commits.
FINISHERS = 2

_Finish = tuple[Job, "dict[str, Any] | None", "Future[None]"]


class ClaimPipeline:
    """One consumer's claims of ``job_type``, up to ``depth`` in flight at once (see the module docstring).

    Parameters:
        jobs: the job layer.
        job_type: the type whose jobs are claimed.
        depth: claims in flight, and jobs held, at most (at least 1).
        stamp: merged into each job's data by the transaction that accepts it (``Jobs.accept``).
    """

    def __init__(self, jobs: Jobs, job_type: Any, *, depth: int = DEFAULT_DEPTH,
                 stamp: Callable[[], Mapping[str, Any]] | None = None) -> None:
        if depth < 1:
            raise ValueError(f"a pipeline's depth must be at least 1, not {depth!r}")
        self._jobs = jobs
        self._type = job_type
        self._stamp = stamp
        self.depth = depth
        self._credits = threading.Semaphore(depth)  # one per job held or being accepted
        self._ready: queue.SimpleQueue[tuple[Job, dict[str, Any]] | None] = queue.SimpleQueue()
        self._interrupt = AcceptInterrupt()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._finishing: set[Future[None]] = set()
        self._errors: list[BaseException] = []
        self._to_finish: queue.SimpleQueue[_Finish | None] = queue.SimpleQueue()
        self._finishers = [threading.Thread(target=self._finish_loop, name=f"{THREAD_NAME_PREFIX}-finish-{i}",
                                            daemon=True) for i in range(FINISHERS)]
        self._acceptors = [threading.Thread(target=self._accept_loop, name=f"{THREAD_NAME_PREFIX}-claim-{i}",
                                            daemon=True) for i in range(depth)]
        for thread in (*self._finishers, *self._acceptors):
            thread.start()

    # -- the consumer -----------------------------------------------------------------------------

    def take(self, timeout: float | None = None) -> tuple[Job, dict[str, Any]] | None:
        """The next claimed job and its data; None after ``timeout`` seconds with none, or once closed."""
        if self._closed.is_set():
            return None
        try:
            item = self._ready.get(timeout=timeout)
        except queue.Empty:
            return None
        if item is None:  # close() woke this wait
            self._ready.put(None)
            return None
        return item

    def finish(self, job: Job, data: dict[str, Any] | None = None) -> Future[None]:
        """Finish ``job`` (``Jobs.finish``) behind the consumer: it returns at once.

        Returns:
            The finish's future (its error, such as ``JobHalted``, is also raised by :meth:`flush`).
        """
        future: Future[None] = Future()
        with self._lock:
            self._finishing.add(future)
        future.add_done_callback(self._finished)
        self._to_finish.put((job, data, future))
        return future

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every finish handed over so far has committed.

        Raises:
            JobsError or StoreError: the first finish that failed since the last flush.
            TimeoutError: they did not all commit within ``timeout`` seconds.
        """
        with self._lock:
            waiting = list(self._finishing)
        for future in waiting:
            future.exception(timeout=timeout)  # waits; the error is kept by _finished
        with self._lock:
            errors, self._errors = self._errors, []
        if errors:
            raise errors[0]

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop claiming; give back the jobs claimed but never taken; let the finishes commit.

        Idempotent. The acceptors' waits end at once; a claim committing meanwhile is given back.
        """
        if self._closed.is_set():
            return
        self._closed.set()
        self._interrupt.interrupt()
        for _ in self._acceptors:
            self._credits.release()  # an acceptor waiting for a credit looks at the close
        for thread in self._acceptors:
            thread.join(timeout_s)
        self._ready.put(None)
        while True:
            item = self._ready.get()
            if item is None:
                break
            self._give_back(*item)
        self._ready.put(None)  # a take() after the close ends at once too
        for _ in self._finishers:
            self._to_finish.put(None)  # after every finish handed over: each is committed first
        for thread in self._finishers:
            thread.join(timeout_s)

    def __enter__(self) -> ClaimPipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the pipeline's threads -------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            self._credits.acquire()
            if self._closed.is_set():
                return
            try:
                job, data = self._jobs.accept(self._type, interrupt=self._interrupt, stamp=self._stamp)
            except NotFound:
                self._credits.release()  # interrupted (a close), or the layer closed
                continue
            except Exception:
                self._credits.release()
                log.warning("claiming a job of %r failed; trying again in %.0f s", self._type, ERROR_PAUSE_S,
                            exc_info=log.isEnabledFor(logging.DEBUG))
                self._closed.wait(ERROR_PAUSE_S)
                continue
            if self._closed.is_set():
                self._give_back(job, data)
                return
            self._ready.put((job, data))

    def _finish_loop(self) -> None:
        while True:
            first = self._to_finish.get()
            if first is None:
                return
            batch = [first]
            stop = False
            while len(batch) < MAX_FINISH_BATCH:
                try:
                    item = self._to_finish.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            self._commit_finishes(batch)
            if stop:
                return

    def _commit_finishes(self, batch: list[_Finish]) -> None:
        """Finish the jobs of ``batch`` in one transaction; each future hears its own job's end."""
        jobs = self._jobs

        def body(tr: Any) -> list[str | None]:
            halted: list[str | None] = []
            for job, data, _future in batch:
                try:
                    jobs.finish(job, data, tx=tr)
                    halted.append(None)
                except JobHalted as e:
                    # Read before any write: nothing of this job was written; the others go on.
                    halted.append(str(e))
            return halted  # plain data: a "may have committed" retry replays it

        try:
            outcomes = jobs.transact(body)
        except BaseException as e:
            outcomes = None
            error: BaseException | None = e
        else:
            error = None
        for i, (job, _data, future) in enumerate(batch):
            self._credits.release()
            if error is not None:
                future.set_exception(error)
            elif outcomes is not None and outcomes[i] is not None:
                future.set_exception(JobHalted(str(outcomes[i]), type=job.type, job_id=job.id))
            else:
                future.set_result(None)

    def _finished(self, future: Future[None]) -> None:
        with self._lock:
            self._finishing.discard(future)
            error = future.exception()
            if error is not None:
                self._errors.append(error)

    def _give_back(self, job: Job, data: dict[str, Any]) -> None:
        """A job claimed and never run: pending again, with its data, for any worker."""
        jobs = self._jobs
        try:
            # One transaction: resubmitted while it runs, the finish puts it back to pending.
            jobs.transact(lambda tr: jobs.finish(jobs.resubmit(job, tx=tr), data, tx=tr))
        except (JobHalted, NotFound):
            pass  # removed or re-enqueued meanwhile: nothing of it is this pipeline's
        except Exception:
            log.warning("giving back job %r of %r failed; its activity timeout puts it back", job.id, self._type,
                        exc_info=log.isEnabledFor(logging.DEBUG))
        finally:
            self._credits.release()
