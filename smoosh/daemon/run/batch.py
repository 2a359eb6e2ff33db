"""Small databases in batches: a worker's run that takes its channel's next small key at its end.

A fleet of small databases spends more on each compaction's fixed cost (the run's start and end
through the channel, the scheduler and the worker, a thread hand-off, the watcher's read of the
run's own file events) than on the compaction itself. A *batch* amortises it: when a run this
process's worker claimed ends, its thread keeps its worker slot and asks its channel for the next
key (:meth:`~smoosh.daemon.run.scheduler.JobScheduler.run_continues`). The end goes to the
server's loop as any end does (its outcome recorded, its channel's slot freed), and the channel
starts its next work within that same event (:attr:`channels.ports.RunEvent.continues`), with
every check a start makes: its window, its holds, the global slots, its queue's order. When the
key it starts is small (:func:`small`), the scheduler hands it to the waiting thread (this
module's :class:`Offer`) instead of a new worker slot; the thread claims it (the priority
re-check, the job added already claimed, in the commit that finishes the run before it) and
compacts it. Any other key, or none, ends the batch: the thread lets its slot go.

So each database keeps everything that was per run: its own run token, its re-check, roots and
identity checked as it is opened, its outcome, history, backoff, progress and log line. What the
batch shares is its container: the worker's slot and its thread, the watcher's settling of the
batch's files (done once as the batch ends), and its job in the store (a :class:`Carrier`).

The first database is claimed as any run is (its job added already claimed, in a commit that
also finishes what ended before it, and takes its slot of the fleet-wide cap). The databases
after it are compacted under that same job: their claims re-check them and commit nothing, and
each one's history row waits, with the others', for the commit after the batch's last database,
which also finishes the batch's job and gives its cap slot back: one claim and one finish a
batch. While a batch runs, its job's heartbeats say which database it compacts (``compacting``),
and its run token stays one the cap's reconcile keeps. The rows wait no longer than
:data:`~smoosh.daemon.run.finishes.BATCH_ROW_WAIT_S`: a database that waits long for a quiet
moment does not keep the others' results from the store.

A ``kill -9`` mid-batch loses the rows not yet committed, never a database: the restart takes the
batch's job back and the channel's checkpoint gives back the keys it held in flight or waiting,
each re-checked before it runs, so one compacted already is dropped (nothing to reclaim), not
compacted again.

A batch ends between two databases, never inside one: when its channel would not start the next
key (suspended or held, out of its window: a strict window's hold interrupts the database being
compacted, as without batches), when the next key is not small, when another channel waits for
the global slot, when the worker stops, or after :data:`BATCH_MAX_DATABASES`.

Owner: an :class:`Offer` is made by a worker's compaction thread and answered once on the
server's loop (under its own lock): the one hand-off between the two.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable, Mapping

if TYPE_CHECKING:
    from smoosh.daemon.run.job_context import Running
    from smoosh.daemon.run.runs import Run

__all__ = ["Carrier", "Offer", "BATCH_MAX_DATABASES", "CARRIER_WAIT_S", "OFFER_WAIT_S", "small"]

#: A batch ends after this many databases, and its thread goes back to its pool (its settled
#: files are let go then: a bound on how long the watcher ignores a compacted file's events).
BATCH_MAX_DATABASES = 100
#: Longest a thread waits for the loop's answer (seconds): the loop answers within the iteration
#: that takes the run's end, so this bounds only a loop that is stuck or gone.
OFFER_WAIT_S = 10.0
#: Longest a claim of a batch job's own key waits for the batch to end (seconds): the batch ends
#: after the database it compacts, so this bounds only one that waits long for a quiet moment.
CARRIER_WAIT_S = 5.0


def small(file_bytes: int | None, limit_bytes: int) -> bool:
    """Whether a database of ``file_bytes`` is compacted in a batch under ``batch_max_size = limit_bytes``.

    Parameters:
        file_bytes: its size as last measured (None: never measured here, e.g. a forced key).
        limit_bytes: the limit (0: no batches).

    Returns:
        True for a measured database of at most ``limit_bytes``.
    """
    return file_bytes is not None and 0 < limit_bytes and file_bytes <= limit_bytes


class Offer:
    """A worker's thread waiting, at the end of its run, for its channel's next key.

    Made by the thread that ran the run, answered by the server's loop: :meth:`take` hands it a
    run (the key the channel started), :meth:`decline` says none comes. Whichever comes first of
    an answer and the waiter giving up (:meth:`close`) wins, under the offer's lock: a run is never
    handed to a thread that stopped waiting.

    Parameters:
        channel: the channel whose next key the thread can take.
        taken: told the key handed over, on the loop's thread as it is handed (the worker counts it
            as running from then: nothing sees the run started and not running).
        carrier: the key of the batch's job (:class:`Carrier`), if it has one yet.
    """

    def __init__(self, channel: str, taken: Callable[[str], None] = lambda key: None,
                 carrier: str | None = None) -> None:
        self.channel = channel
        self._taken = taken
        self._carrier = carrier
        self._lock = threading.Lock()
        self._answered = threading.Event()
        self._run: Run | None = None
        self._closed = False

    @property
    def open(self) -> bool:
        """Whether a run can still be handed to it."""
        with self._lock:
            return not self._closed and not self._answered.is_set()

    def take(self, run: Run) -> bool:
        """Hand ``run`` to the waiting thread (the loop); False when it was answered or closed already."""
        with self._lock:
            if self._closed or self._answered.is_set():
                return False
            self._taken(run.key)
            self._run = run
            self._answered.set()
            return True

    def runs_under_carrier(self, key: str) -> bool:
        """Whether ``key``, handed over, runs under the batch's job (no claim commit of its own to
        wait for): any key but the job's own."""
        return self._carrier is not None and key != self._carrier

    @property
    def handed(self) -> Run | None:
        """The run handed over, if any."""
        with self._lock:
            return self._run

    def decline(self) -> None:
        """No key for the waiting thread (the loop; a no-op once answered)."""
        with self._lock:
            self._answered.set()

    def wait(self, timeout_s: float = OFFER_WAIT_S) -> Run | None:
        """On the waiting thread: the run handed to it, or None (declined, or no answer in time).

        Parameters:
            timeout_s: the longest wait; a loop that does not answer within it is taken as a no.

        Returns:
            The run to claim, or None. After it returns nothing is handed any more.
        """
        self._answered.wait(timeout_s)
        return self.close()

    def close(self) -> Run | None:
        """Stop waiting; the run handed before that, if any (it must be claimed or ended)."""
        with self._lock:
            self._closed = True
            return self._run


class Carrier:
    """A batch's job in the store: its first database's, under which the databases after it run.

    Made by the worker's compaction thread as its first database ends and it asks for the next
    key; ended once (:meth:`end`), as the batch ends, which queues the job's finish and its cap
    slot's give-back for the next commit (or :meth:`drop`, when the job was halted meanwhile).

    Its key is taken by the job until then, so a new run of that key (a new event, queued
    again while the batch goes on) must not be claimed under it: a claim asks for the batch to
    end (:meth:`want`), which it does after the database it compacts, and waits for that.

    Owner: the batch's compaction thread; :meth:`want` and :meth:`wait_ended` from any thread.

    Parameters:
        key: the job's id (the batch's first database).
        data: the data the job was claimed with (its run token, its cap slot).
        end: ``end(carrier, finish)``, called once (by :meth:`end` or :meth:`drop`): the worker lets
            the carrier go, and with ``finish`` queues its job's finish.
    """

    def __init__(self, key: str, data: Mapping[str, object], end: Callable[[Carrier, bool], None]) -> None:
        self.key = key
        self.data = data
        self._end = end
        self._lock = threading.Lock()
        self._wanted = threading.Event()
        self._ended = threading.Event()
        #: The run compacting under the job now (its handle of the job is the newest).
        self.running: Running | None = None

    @property
    def token(self) -> int | None:
        """The run token the job was claimed with (its cap slot's)."""
        token = self.data.get("run")
        return token if isinstance(token, int) else None

    @property
    def wanted(self) -> bool:
        """Whether a claim of the job's key waits for the batch to end."""
        return self._wanted.is_set()

    def want(self) -> None:
        """A claim of the job's key waits: the batch ends after the database it compacts."""
        self._wanted.set()

    def wait_ended(self, timeout_s: float | None = None) -> bool:
        """Wait for :meth:`end` (or :meth:`drop`); whether it came within ``timeout_s`` (None:
        :data:`CARRIER_WAIT_S`)."""
        return self._ended.wait(CARRIER_WAIT_S if timeout_s is None else timeout_s)

    def end(self) -> None:
        """The batch ends: the job's finish is queued for the next commit (once)."""
        self._close(True)

    def drop(self) -> None:
        """The job was halted (removed, re-enqueued): nothing to finish; the batch ends."""
        self._close(False)

    def _close(self, finish: bool) -> None:
        with self._lock:
            if self._ended.is_set():
                return
            try:
                self._end(self, finish)
            finally:
                self._ended.set()
