"""The channels' scheduler port over the job layer: one job per run, run events back to the loop.

A channel hands a key to :meth:`JobScheduler.submit` and gets a run token at once. The
*starter* thread then re-checks the key's priority (the database may be gone or compacted
since it was queued) and, in one transaction, adds the job (``type = "smoosh:" + node``,
``id = key``) unless another channel's job for the key is running (one key, one job). Every
step of the run comes back as a :class:`~channels.ports.RunEvent` posted to the server's
loop, from two sources that may both speak, so the channel ignores what it already heard:

* the daemon's own worker tells the scheduler directly (:class:`~smoosh.daemon.run.worker.RunListener`):
  a compaction starts within milliseconds of its job being added, and its end is heard at once;
* a callback subscription on the job tells it what a worker in another process does.

When a run has ended its job is removed (by the starter, in one transaction with whatever the
server must write beside it: the key's crash record). The removal waits, at most
:data:`REMOVAL_MERGE_WAIT_S`, for the addition of the run that takes the ended run's slot
(its channel starts it on the loop's next tick): that addition carries every removal waiting
in its own transaction, one commit where there were two. With no addition meanwhile, the
starter writes the removals alone once they are due; other store work of the starter and a
close write them first, in their order.
Store work runs on the starter, never on the server's loop; the starter is one thread
(started on demand, gone when idle), so a key's removal always precedes its next addition
(in an earlier transaction, or earlier in the same one).

Every run lives in the scheduler's :class:`~smoosh.daemon.run.runs.RunTable`, by its token,
from :meth:`JobScheduler.submit` (or :meth:`JobScheduler.adopt`) to :meth:`JobScheduler.end`,
the one way a run ends, whatever ends it: its worker's news, its job's events, a refusal, a
failed start, the run audit's repair (:mod:`smoosh.daemon.host.run_audit`). ``end`` delivers
the run's last event to its channel, which frees the run's slot in the channel and its global
``max_jobs`` slot, then takes the run out of the table and queues its job's removal. Each
thread that works on a run's start (the starter, a compaction thread's claim) ends in an event
for the loop whatever happens to it, an exception included: no run is left without one.

Ownership: the run table belongs to the server's loop thread; the starter and the workers reach
the loop only by posting events. The loop also keeps :attr:`JobScheduler.elsewhere`, the keys
of the runs started as jobs for any worker (another process's, most often), replaced whole, so
any thread may read it: the watcher takes their files' events as smoosh's own, as it does for
this process's runs.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
from typing import Any, Callable, Mapping, Protocol, TypeVar

from channels.ports import FAILED, Outcome, RunEvent
from smoosh.daemon.control.cluster_cap import SLOT_FIELD, NodeCap, Refusal
from smoosh.daemon.control.store_health import classify
from smoosh.daemon.history import NOTHING_TO_DO_REASON
from smoosh.daemon.keypool import KeyPool
from smoosh.daemon.run.batch import Carrier, Offer
from smoosh.daemon.run.runs import Run, RunTable
from smoosh.daemon.run.startup import DAEMON_WORKER, HOLDER
from smoosh.jobs import Job, Jobs, NotFound, Subscription
from smoosh.store.base import Transaction, Watch

__all__ = ["JobScheduler", "JOB_REMOVED_ERROR", "Run", "already_running"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: A run claimed by this process's worker: its job (already accepted) and the data it was added with.
Claimed = tuple[Job, dict[str, Any]]
#: A batch's next run claimed: as :data:`Claimed`, or with None for a job when it runs under the
#: batch's job (:class:`~smoosh.daemon.run.batch.Carrier`).
Continued = tuple[Job | None, dict[str, Any]]

#: The ``error`` of a run whose job disappeared from the job layer.
JOB_REMOVED_ERROR = "job removed"
#: Longest an ended run's removal waits for the next run's addition to carry it (seconds).
#: That addition comes within a loop iteration and a re-check when its channel has work.
REMOVAL_MERGE_WAIT_S = 0.005


def already_running(channel: str) -> str:
    """The reason a run is dropped when its key runs already, for ``channel``."""
    return f"it is already being compacted by channel {channel!r}"


class LocalWorker(Protocol):
    """What the scheduler asks of this process's worker (:class:`~smoosh.daemon.run.worker.Worker`):
    the one seam between the two, besides the worker's news (its ``RunListener``, this scheduler)."""

    #: The instance of the process the worker runs in, named in the jobs it claims (None: none).
    holder: str | None

    def reserve(self) -> bool:
        """Promise a free slot to a claim about to start; False when none is free."""

    def unreserve(self) -> None:
        """Give back a slot :meth:`reserve` promised."""

    def run_claimed(self, claim: Callable[[], Claimed | None]) -> bool:
        """Run ``claim`` and then its compaction in the promised slot; False when refused (stopping)."""

    def claim_transact(self, key: str, body: Callable[[Transaction], Any]) -> Any:
        """Run a claim's ``body`` in the commit that also finishes the runs that ended."""

    def release_carrier(self, key: str) -> bool:
        """Before a claim of ``key``: a batch's job named ``key`` ends first (see the worker's);
        False when it still runs after a bounded wait."""

    def carriers(self) -> list[tuple[int, Mapping[str, object]]]:
        """The batches' jobs now: ``(run token, the data they were claimed with)``."""


class JobScheduler:
    """Starts runs as jobs and follows them.

    Parameters:
        jobs: the job layer.
        job_type: this node's job type.
        recheck: ``recheck(channel, key) -> priority`` before a start (I/O: runs on the starter).
        post: hands a callable to the server's loop (:meth:`smoosh.loop.Loop.post`).
        deliver: ``deliver(channel, event)`` on the loop: the server routes it to the channel;
            for an ``ended`` event it may return a write to make with the job's removal.
        clock: monotonic seconds (the loop's clock): when a run began running, which rotation
            measures against the loop's ``now``.
        rng: makes run tokens (random, so a token never repeats across restarts).
        requeue: ``requeue(channel, key, priority)`` on the loop, for a key whose job the store
            failed to add (full, unreachable): it waits in its channel again instead of being
            dropped (None: dropped, as any other failed start).
        post_helped: hands the loop news of this process's worker, whose thread then offers to
            run the loop's iteration (:meth:`smoosh.loop.Loop.post` with ``helped``); None: ``post``.
        help: runs the loop's iteration on the caller's thread while the loop sleeps
            (:meth:`smoosh.loop.Loop.help`); the worker calls it through :meth:`catch_up`.
        batchable: whether a key may join a batch (:mod:`smoosh.daemon.run.batch`: a small
            database); loop thread. By default none does.
    """

    def __init__(
        self,
        jobs: Jobs,
        job_type: str,
        *,
        recheck: Callable[[str, str], float],
        post: Callable[[Callable[[], None]], None],
        deliver: Callable[[str, RunEvent], Callable[[Transaction], None] | None],
        clock: Callable[[], float],
        rng: random.Random | None = None,
        requeue: Callable[[str, str, float], None] | None = None,
        post_helped: Callable[[Callable[[], None]], None] | None = None,
        help: Callable[[], None] | None = None,
        batchable: Callable[[str], bool] = lambda key: False,
    ) -> None:
        self.jobs = jobs
        self._batchable = batchable
        # The worker's thread waiting for its channel's next key while that run's end is
        # delivered (see smoosh.daemon.run.batch): set by end() around its delivery (loop thread).
        self._offer: Offer | None = None
        self._post_helped = post_helped or post
        self._help = help
        self.job_type = job_type
        self._recheck = recheck
        self._post = post
        self._deliver = deliver
        self._clock = clock
        self._rng = rng or random.Random()
        self._requeue = requeue
        #: Every run followed now, by token, with each key's live run (loop thread).
        self.table = RunTable()
        #: Told (loop thread) when a run is started or adopted: the run audit looks while runs exist.
        self.on_opened: Callable[[], None] | None = None
        #: Keys of the runs started as a job for any worker, from their submit to their end:
        #: a worker in another process compacts them (or this one's, when it accepted the
        #: job). From the submit, not from the "running" news, which comes a few milliseconds
        #: after the worker's first writes; a write of the application meanwhile is missed as
        #: one during the compaction is, and the compaction measures the file anyway. The loop
        #: thread replaces it whole; any thread may read it.
        self.elsewhere: frozenset[str] = frozenset()
        #: Told the key of such a run as it ends, before it leaves :attr:`elsewhere` (the
        #: server's settle: the watcher still takes the run's last events as smoosh's own).
        self.on_released: Callable[[str], None] | None = None
        #: This process's worker, which runs claimed jobs (None: every job waits for a worker).
        self.local: LocalWorker | None = None
        #: The fleet-wide cap (``cluster_max_jobs``): every claim takes a slot of it in its own
        #: transaction (None: no cap; see :mod:`smoosh.daemon.control.cluster_cap`).
        self.cap: NodeCap | None = None
        #: Told on the loop that the cap refused a claim, with the watch that ends the wait (the
        #: server's cap gate holds the starts); told with None as a claim takes a slot.
        self.on_cap: Callable[[bool, Watch | None], None] | None = None
        #: Removals of ended runs' jobs not yet written (see the module docstring), and when
        #: the oldest came (monotonic): the loop thread adds, the starter takes; under their lock.
        self._removals: list[tuple[Run, Callable[[Transaction], None] | None]] = []
        self._removals_since = 0.0
        self._removals_lock = threading.Lock()
        self._starter: KeyPool[Callable[[], None]] = KeyPool(
            lambda fn: fn(), 1, "smoosh-starter", on_idle=self._flush_when_due)
        self._starter.start()

    # -- the channels' port (loop thread) ------------------------------------------------------

    def submit(self, channel: str, key: str, priority: float) -> int:
        """Start work on ``key`` for ``channel``; the run's token (see :class:`channels.ports.Scheduler`).

        When this process's worker has a free slot, the start (re-check, job added already
        claimed) runs on the thread that then compacts: one hand-off from the decision to the
        compaction. Otherwise the starter adds a job for any worker.

        A run the worker's slot took is running from that moment for the status table (the
        channel asks :meth:`running_at_once`): ``starting`` means a job waiting for a worker,
        and this one waits for none. Its own record (``/jobs``, rotation) hears the worker's
        ``running`` event as before, once the job is claimed and the compaction begins.
        """
        run = Run(channel, key, self._token(), priority, opened_at=self._clock())
        holder = self._open(run)
        if holder is not None:
            # One key, one run: a key another channel holds too (a routing change, two backoffs
            # ending together) is dropped here; the run that holds it goes on, and keeps its own.
            self._emit(run, "dropped", reason=already_running(holder.channel))
            return run.token
        offer = self._offer
        if offer is not None and offer.channel == channel and self._batchable(key) and offer.take(run):
            # The worker's thread whose run of this channel just ended takes it, in its slot:
            # the run is claimed there at once (see smoosh.daemon.run.batch). Under the batch's
            # job it waits for no commit: claimed from here (only its re-check comes first).
            run.reserved = True
            run.claimed = offer.runs_under_carrier(key)
            self.table.publish()
            return run.token
        local = self.local
        if local is not None and local.reserve():
            run.reserved = True  # the channel counts it active at once (running_at_once)
            self.table.publish()
            if not local.run_claimed(lambda: self._claim_or_drop(run)):
                run.reserved = False
                self._emit(run, "dropped", reason="the daemon is stopping")
        elif self._starter.submit(lambda: self._start_or_drop(run)):
            self.elsewhere = self.elsewhere | {key}
        else:
            self._emit(run, "dropped", reason="the daemon is stopping")
        return run.token

    def running_at_once(self, key: str, token: int) -> bool:
        """Whether run ``token`` of ``key`` is running from its submit: this process's worker took it.

        The channel asks right after :meth:`submit` (loop thread), so it counts the run active
        at once instead of when the posted ``running`` event is processed, which a busy loop
        may take a while to get to.
        """
        run = self.table.get(token)
        return run is not None and run.key == key and run.reserved

    def adopt(self, channel: str, key: str) -> int | None:
        """Follow the run of ``key``: the one this scheduler follows already (a channel reopened:
        a restart after its crash, a live edit that removed and added it), or its existing job
        (found running at start-up); its token, or None (none, or another channel's)."""
        live = self.table.live(key)
        if live is not None:
            if live.channel != channel:
                return None
            if live.running_since is not None:
                self._emit(live, "running")  # the new channel counts it active, as the old one did
            return live.token
        try:
            data = self.jobs.get_job_data(self.job_type, key)
        except NotFound:
            return None
        run_token = data.get("run")
        token = run_token if isinstance(run_token, int) else self._token()
        # (A store read on the caller's thread: adopt runs at start-up, before the loop does.)
        stored = data.get("priority")
        priority = float(stored) if isinstance(stored, (int, float)) and not isinstance(stored, bool) else 0.0
        run = Run(channel, key, token, priority or 1.0, opened_at=self._clock())
        run.cap_slot = data.get(SLOT_FIELD) is True  # it held a slot of the cap: it keeps it
        if self._open(run) is not None:
            self.table.close(run)
            return None
        self.elsewhere = self.elsewhere | {key}
        self._starter.submit(lambda: self._follow_or_end(run))
        return token

    # -- what the server asks (loop thread) -------------------------------------------------------

    def observe(self, event: RunEvent, data: dict[str, Any] | None = None) -> Run | None:
        """Note an event of a run before its channel hears it; the run, or None for an old run."""
        run = self.table.get(event.run)
        if run is None or run.key != event.key or run.ended:
            return None
        if event.kind == "running":
            if run.running_since is None:
                run.running_since = self._clock()
            if data:
                if isinstance(data.get("run_id"), str):
                    run.run_id = data["run_id"]
                run.suspendable = data.get("suspendable") is True
                progress = data.get("progress")
                if isinstance(progress, (int, float)) and not isinstance(progress, bool):
                    if float(progress) > run.progress:
                        run.progress_at = self._clock()
                    run.progress = float(progress)
            self.table.publish()
        elif event.kind == "pending":
            run.running_since = None
            self.table.publish()
        return run

    def _released(self, key: str) -> None:
        """The run of ``key`` started as a job for any worker has ended, or was dropped."""
        if key not in self.elsewhere:
            return
        on_released = self.on_released
        if on_released is not None:
            try:
                on_released(key)
            except Exception:
                log.exception("Releasing %r failed.", key)
        self.elsewhere = self.elsewhere - {key}

    def end(self, run: Run, event: RunEvent, offer: Offer | None = None) -> None:
        """The one way a run ends (loop thread): its last event (``ended`` or ``dropped``) reaches
        its channel, then the run leaves the table and, for an ``ended`` run, its job is removed.

        The channel, hearing it, frees the run's place and its global slot (whatever ended
        it: a finish, a crash, a refusal, a failed start, the run audit's repair). The run
        leaves the table even when the delivery fails: a channel that kept the run all the
        same holds a slot nothing is behind, which the run audit finds and frees. Idempotent:
        a second end of the same run does nothing.

        ``offer``: the run's worker thread waits for its channel's next key (a batch, see
        :mod:`smoosh.daemon.run.batch`): the key the channel starts within this delivery goes to
        it when it is small; it is told no otherwise, before this returns.
        """
        if run.ended:
            if offer is not None:
                offer.decline()
            return
        also: Callable[[Transaction], None] | None = None
        self._offer = offer
        try:
            also = self._deliver(run.channel, event)
        finally:
            self._offer = None
            if offer is not None:
                offer.decline()  # a no-op when the channel's next key was handed to it
            # A dropped run was never added, or the job that runs is another's: nothing to remove.
            self._close(run, also, remove=event.kind == "ended")
        handed = offer.handed if offer is not None else None
        if handed is not None:
            # Running from the hand-over: its thread runs it now, and says so no more (the claim
            # it makes first is part of its run, as a claimed run's start is).
            self._route(handed.key, RunEvent(handed.key, handed.token, "running", priority=handed.priority), None,
                        local=True)

    def retire(self, key: str, token: int, also: Callable[[Transaction], None] | None = None) -> None:
        """Stop following an ended run, with no event to its channel, and remove its job.

        ``also`` writes in the same transaction as the removal (the key's crash record).
        """
        run = self.table.get(token)
        if run is not None and run.key == key and not run.ended:
            self._close(run, also)

    def _close(self, run: Run, also: Callable[[Transaction], None] | None, *, remove: bool = True) -> None:
        """Take ``run`` out of the table and, with ``remove``, queue its job's removal (with ``also``)."""
        run.ended = True
        if self.table.close(run):
            self._released(run.key)
        if run.sub is not None:
            run.sub.close()
        if not remove or (run.claimed and also is None):
            # Claimed: its worker removed the job in the commit that finished it, and nothing
            # is to be written beside it.
            return
        with self._removals_lock:
            if not self._removals:
                self._removals_since = time.monotonic()
            self._removals.append((run, also))
        # Wakes (or starts) the starter: idle, it writes the removals once due.
        self._starter.submit(self._nudge)

    def runs(self) -> list[Run]:
        """Every run followed now (loop thread)."""
        return list(self.table)

    def live_tokens(self) -> list[int]:
        """The run tokens whose cap slots are held now: every run followed, and the batches' jobs,
        which keep their first run's slot until the batch ends (:mod:`smoosh.daemon.run.batch`)."""
        tokens = [run.token for run in self.table]
        return tokens + [token for token, _ in self._carriers()]

    def cap_slots_held(self) -> int:
        """How many slots of the fleet-wide cap this node's runs hold now (a batch's job counts
        while its batch runs, after its first run ended)."""
        tokens = {run.token for run in self.table if run.cap_slot}
        tokens.update(token for token, data in self._carriers() if data.get(SLOT_FIELD) is True)
        return len(tokens)

    def _carriers(self) -> list[tuple[int, Mapping[str, object]]]:
        local = self.local
        return local.carriers() if local is not None else []

    def claiming(self) -> dict[str, int]:
        """Per channel, the runs this process's worker took at their submit whose claim has not
        committed yet (any thread: a copy of the table, and flags their threads set).

        Nothing compacts them until that commit: the status table counts them ``starting``
        (:func:`smoosh.daemon.record.status.truthful_counts`), whatever their channel counted.
        """
        out: dict[str, int] = {}
        for run in self.table:
            # (A batch's next database is told running as its thread takes it, before its claim.)
            if run.reserved and not run.claimed and not run.ended and not run.refused:
                out[run.channel] = out.get(run.channel, 0) + 1
        return out

    def run_of(self, key: str) -> Run | None:
        """The live run of ``key`` (the one that holds it), if any (loop thread; the intake's
        threads read it too, as one dict lookup)."""
        return self.table.live(key)

    def background(self, fn: Callable[[], None]) -> None:
        """Run store work ``fn`` on the starter thread, in order with the runs' own.

        A store that is full or unreachable fails it quietly: the store's health says that
        once (:mod:`smoosh.daemon.control.store_health`); any other failure is logged.
        """
        def work() -> None:
            self._flush_removals()
            _store_work(fn)

        self._starter.submit(work)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop following every run (their jobs stay where they are); store work queued so far finishes."""
        for run in self.table.clear():
            if run.sub is not None:
                run.sub.close()
        self.elsewhere = frozenset()
        self._starter.submit(self._flush_removals)  # no merge wait past a close
        if not self._starter.drain(timeout_s):
            log.warning("store work of the scheduler did not finish within %.0f s", timeout_s)

    # -- events from this process's worker (worker threads) ----------------------------------------

    def run_started(self, key: str, data: dict[str, Any]) -> None:
        """The daemon's worker accepted the job of ``key`` (its data names the run)."""
        token = data.get("run")
        priority = data.get("priority")
        priority = float(priority) if isinstance(priority, (int, float)) and not isinstance(priority, bool) else None
        if not isinstance(token, int):
            return
        event = RunEvent(key, token, "running", priority=priority)
        self._post_helped(lambda: self._route(key, event, data, local=True))

    def run_ended(self, key: str, data: dict[str, Any], outcome: Outcome) -> None:
        """The daemon's worker finished the job of ``key``."""
        token = data.get("run")
        if isinstance(token, int):
            self._post_helped(lambda: self._route(key, RunEvent(key, token, "ended", outcome=outcome), data))

    def run_continues(
        self, key: str, data: dict[str, Any], outcome: Outcome, taken: Callable[[str], None], carrier: Carrier,
    ) -> Callable[[], Continued | None] | None:
        """The daemon's worker finished the job of ``key`` and its thread can take the next key of
        the run's channel in the same slot (a batch: :mod:`smoosh.daemon.run.batch`).

        The end is told as :meth:`run_ended` tells it, and the loop's iteration that takes it runs
        here while the loop sleeps (:meth:`catch_up`); the channel starts its next work within it.
        A key handed to this thread is running from then (``taken(key)`` is told it on the loop's
        thread as it is handed: the worker counts it as running).

        Returns:
            The next run's claim, to call on this thread (:meth:`_claim_carried`: ``(None, data)``
            for a key compacted under ``carrier``, the batch's job; ``(job, data)`` for one
            claimed in a job of its own; None when the run was dropped instead); None when the
            channel's next key is not this thread's (none, not small, or another channel's turn).
        """
        token = data.get("run")
        channel = data.get("channel")
        if not isinstance(token, int) or not isinstance(channel, str):
            self.run_ended(key, data, outcome)
            return None
        offer = Offer(channel, taken, carrier.key)
        event = RunEvent(key, token, "ended", outcome=outcome, continues=True)
        self._post_helped(lambda: self._route(key, event, data, offer=offer))
        self.catch_up()
        run = offer.wait()
        if run is None:
            return None
        return lambda: self._continue_or_drop(run, carrier)

    def catch_up(self) -> None:
        """The worker's thread, holding nothing, after it told a start or an end: it runs the
        loop's iteration that takes the news while the loop sleeps (:meth:`smoosh.loop.Loop.help`).
        After an end, that iteration's channel starts the next run, whose claim this same thread
        then takes: from one compaction to the next, no other thread wakes."""
        if self._help is not None:
            self._help()

    # -- the starter thread -------------------------------------------------------------------------

    def _claim_or_drop(self, run: Run) -> Claimed | None:
        """:meth:`_claim`, ending in an event for the loop whatever happens: an exception drops the run."""
        return self._or_drop(run, self._claim)

    def _continue_or_drop(self, run: Run, carrier: Carrier) -> Continued | None:
        """:meth:`_claim_carried` for a batch's next run, ending in an event for the loop whatever happens."""
        return self._or_drop(run, lambda r: self._claim_carried(r, carrier))

    def _or_drop(self, run: Run, claim: Callable[[Run], T | None]) -> T | None:
        try:
            return claim(run)
        except Exception as exc:
            log.exception("Starting the run of %r failed; dropped.", run.key)
            self._emit(run, "dropped", reason=f"it could not start: {type(exc).__name__}: {exc}")
            return None

    def _start_or_drop(self, run: Run) -> None:
        """:meth:`_start`, ending in an event for the loop whatever happens: an exception drops the run.

        (Its job may have been added before the exception: a job nobody follows is one the
        next start takes back, as after a crash.)
        """
        try:
            self._start(run)
        except Exception as exc:
            log.exception("Starting the run of %r failed; dropped.", run.key)
            self._emit(run, "dropped", reason=f"it could not start: {type(exc).__name__}: {exc}")

    def _follow_or_end(self, run: Run) -> None:
        """:meth:`_follow`, ending the run (failed) if its job cannot be followed."""
        try:
            self._follow(run)
        except Exception as exc:
            log.exception("Following the job of %r failed.", run.key)
            error = f"its job could not be followed: {type(exc).__name__}: {exc}"
            self._emit(run, "ended", outcome=Outcome(FAILED, error))

    def _recheck_or_drop(self, run: Run) -> dict[str, Any] | None:
        """Re-check the key's priority; the job data to start it with, or None (dropped, reported)."""
        try:
            priority = self._recheck(run.channel, run.key)
        except Exception:
            log.warning("Re-checking the priority of %r failed; counted as 0.", run.key, exc_info=True)
            priority = 0
        if not priority:
            self._emit(run, "dropped", reason=NOTHING_TO_DO_REASON, priority=0)
            return None
        run.priority = priority
        return {"channel": run.channel, "key": run.key, "priority": float(priority), "progress": 0.0, "run": run.token}

    def _claim_carried(self, run: Run, carrier: Carrier) -> Continued | None:
        """On a batch's compaction thread: ``run``, its channel's next key, re-checked and compacted
        under ``carrier``, the batch's job, with no commit (:mod:`smoosh.daemon.run.batch`).

        One key, one job holds without a look at the store: a job of this node's type that runs
        is a run of this scheduler's table (started here, or adopted at start-up), which opens
        one run a key, and a batch's job is its carrier's key's (whose own new run waits for the
        batch to end: :meth:`Worker.release_carrier`). The carrier's own key, handed to it again,
        ends the batch's job first and is claimed in a job of its own (:meth:`_claim`).
        """
        if run.key == carrier.key:
            carrier.end()  # its finish goes first in the claim's commit, which adds the key's new job
            return self._claim(run)
        data = self._recheck_or_drop(run)
        if data is None:
            return None
        # (Claimed and told running as its thread took it: no loop iteration of its own here.)
        return None, self._held(data)

    def _held(self, data: dict[str, Any]) -> dict[str, Any]:
        """``data`` naming this process as the run's holder (when it has one)."""
        holder = self.local.holder if self.local is not None else None
        if holder is None:
            return data
        # Claimed by this process from its first commit: a restart after a kill -9 knows whose
        # it was before any heartbeat says so.
        return {**data, "worker": DAEMON_WORKER, HOLDER: holder}

    def _carrier_released(self, run: Run) -> bool:
        """Before a claim or start of ``run``: a batch's job named after its key ends first (see
        :meth:`Worker.release_carrier`). When the batch is still at it after the wait (its
        database waits long for a quiet moment), the run goes back to its channel instead, as a
        cap's refusal does: claimed now, it would find the batch's job running and follow it."""
        local = self.local
        if local is None or local.release_carrier(run.key):
            return True
        log.info("%r: a batch still runs under the job of its name; queued again.", run.key)
        self._queue_again(run, f"a batch of channel {run.channel!r} still runs under the job of its name")
        return False

    def _claim(self, run: Run) -> Claimed | None:
        """On the compaction thread: the job added already claimed by this process's worker."""
        data = self._recheck_or_drop(run)
        if data is None:
            return None
        if not self._carrier_released(run):
            return None
        claim = _Claim(self._held(data))
        local = self.local
        if local is None:  # (a claim runs in a slot this process's worker promised: never here)
            raise RuntimeError("no worker in this process to claim for")
        try:
            # The commit that claims this run also finishes the runs that just ended (their
            # slots of the cap given back first, in the same commit).
            claimed = local.claim_transact(run.key, lambda tr: self._add_claimed(tr, run, claim))
        except Exception as exc:
            self._add_failed(run, exc)
            return None
        if isinstance(claimed, str):
            self._owned_elsewhere(run, claimed)
            return None
        refusal = Refusal.from_data(claimed)
        if refusal is not None:
            self._cap_refused(run, refusal, claim.watch)
            return None
        run.claimed = True
        if run.running_since is not None:
            # A batch's next database, told running as its thread took it: the status shows it
            # running from this commit (the table's views are rebuilt on the loop, in an
            # iteration this thread runs while the loop sleeps: no wake-up of its own).
            self._post_helped(self.table.publish)
            self.catch_up()
        self._cap_taken(run, claim)
        return claimed, claim.data

    def _owned_elsewhere(self, run: Run, owner: str) -> None:
        """A job of the key runs already: another channel's (dropped) or this channel's (followed)."""
        if owner != run.channel:
            self._emit(run, "dropped", reason=already_running(owner))
            return
        log.info("%r is already running for channel %s; following its job.", run.key, run.channel)
        self._follow_or_end(run)

    def _start(self, run: Run) -> None:
        """On the starter: re-check, then add the job for any worker (or follow the one that runs)."""
        data = self._recheck_or_drop(run)
        if data is None:
            return
        if not self._carrier_released(run):
            return
        removals = self._take_removals()
        claim = _Claim(data)

        def with_removals(tr: Transaction) -> Any:
            for ended, also in removals:
                self._remove_in(tr, ended, also)
            return self._add(tr, run, claim)

        try:
            try:
                owner = self.jobs.transact(with_removals if removals else lambda tr: self._add(tr, run, claim))
            except Exception:
                if not removals:
                    raise
                # A removal's write (a crash record) failed, or the store: the removals are
                # written on their own, and the addition is tried alone, as without them.
                self._put_back(removals)
                owner = self.jobs.transact(lambda tr: self._add(tr, run, claim))
        except Exception as exc:
            self._add_failed(run, exc)
            return
        refusal = Refusal.from_data(owner)
        if refusal is not None:
            self._cap_refused(run, refusal, claim.watch)
            return
        if owner is not None:
            self._owned_elsewhere(run, owner)
            return
        self._cap_taken(run, claim)
        self._follow_or_end(run)

    def _take_slot(self, tr: Transaction, run: Run, claim: _Claim) -> dict[str, Any] | None:
        """In a claim's transaction: a slot of the fleet-wide cap for ``run``; the refusal as data, or None.

        With a slot taken (or no cap set), ``claim.data`` is what the job is added with: it
        says whether the run holds a slot, so whatever ends the job gives it back.
        """
        cap = self.cap
        claim.data = claim.base
        claim.watch = None
        if cap is None:
            return None
        taken, refusal = cap.take(tr, run.token)
        if refusal is not None:
            claim.watch = cap.cap.watch_freed(tr)
            return refusal.to_data()
        if taken:
            claim.data = {**claim.base, SLOT_FIELD: True}
        return None

    def _cap_refused(self, run: Run, refusal: Refusal, watch: Watch | None) -> None:
        """The cap refused ``run``'s claim: the node's starts wait for a slot, the key in its channel.

        The gate closes first (posted before the run's end frees its channel's slot, so the
        channel does not start its next key into the same refusal), then the key goes back.
        """
        log.debug("The cluster's cap refused %r: %s.", run.key, refusal.reason())
        on_cap = self.on_cap
        if on_cap is not None:
            self._post(lambda: on_cap(False, watch))
        elif watch is not None:
            watch.cancel()
        self._queue_again(run, refusal.reason())

    def _queue_again(self, run: Run, why: str) -> None:
        """``run`` is dropped for ``why`` and its key goes back to its channel at its priority
        (dropped only, with no ``requeue`` to give it back to)."""
        self._emit(run, "dropped", reason=f"{why}; queued again")
        requeue = self._requeue
        if requeue is not None:
            channel, key, priority = run.channel, run.key, run.priority
            self._post(lambda: requeue(channel, key, priority))

    def _cap_taken(self, run: Run, claim: _Claim) -> None:
        """``run``'s claim committed: it holds a slot of the cap when its data says so."""
        if claim.data.get(SLOT_FIELD) is True:
            run.cap_slot = True
            on_cap = self.on_cap
            if on_cap is not None:
                self._post(lambda: on_cap(True, None))

    def _add_failed(self, run: Run, exc: Exception) -> None:
        """The job of ``run`` could not be added: dropped, or queued again when the store is to blame."""
        if self._requeue is not None and classify(exc) is not None:
            # The store's health says it once (smoosh.daemon.control.store_health), and holds
            # the channels' starts until the store is back: the key waits in its channel.
            log.debug("Could not add the job of %r: %s; it waits in its channel for the store.", run.key, exc)
            self._queue_again(run, f"the job store failed ({exc})")
            return
        log.warning("Could not add the job of %r: %s", run.key, exc, exc_info=log.isEnabledFor(logging.DEBUG))
        self._emit(run, "dropped", reason=f"its job could not be added: {exc}")

    def _running_owner(self, tr: Transaction, run: Run) -> str | None:
        """The channel of a job that runs for the key already (one key, one job), or None."""
        try:
            info = self.jobs.get_job(self.job_type, run.key, tx=tr)
        except NotFound:
            return None
        if info.state != "running":
            return None
        owner = info.data.get("channel")
        owner = owner if isinstance(owner, str) else run.channel
        job_run = info.data.get("run")
        if owner == run.channel and isinstance(job_run, int):
            run.job_run = job_run
        return owner

    def _add(self, tr: Transaction, run: Run, claim: _Claim) -> Any:
        """Add the job unless one for the key runs, or the cap refuses it; the running job's
        channel, the refusal (as data), or None when added."""
        owner = self._running_owner(tr, run)
        if owner is not None:
            return owner
        refused = self._take_slot(tr, run, claim)
        if refused is not None:
            return refused
        self.jobs.add(self.job_type, run.key, claim.data, tx=tr)
        return None

    def _add_claimed(self, tr: Transaction, run: Run, claim: _Claim) -> Any:
        """Add the job claimed by this process's worker; the running job's channel instead, if one
        runs, or the cap's refusal (as data)."""
        owner = self._running_owner(tr, run)
        if owner is not None:
            return owner
        refused = self._take_slot(tr, run, claim)
        if refused is not None:
            return refused
        return self.jobs.add_claimed(self.job_type, run.key, claim.data, tx=tr)

    def _follow(self, run: Run) -> None:
        """Subscribe to the run's job; a state already reached is reported at once."""
        try:
            sub = self.jobs.subscribe(self.job_type, run.key, on_event=lambda ev: self._on_job_event(run, ev))
        except NotFound:
            self._emit(run, "ended", outcome=Outcome(FAILED, JOB_REMOVED_ERROR))
            return
        self._post(lambda: self._attach(run, sub))
        if sub.state in ("running", "finished"):
            self._on_job_event(run, (self.job_type, run.key, sub.state, sub.data))

    def _attach(self, run: Run, sub: Subscription) -> None:
        if run.ended or self.table.get(run.token) is not run:
            sub.close()  # ended before the subscription arrived
        else:
            run.sub = sub

    def _on_job_event(self, run: Run, event: tuple[Any, str, str, Any]) -> None:
        """A job event from the store (notifier thread): hand it to the loop."""
        _type, key, state, data = event
        if state == "running":
            self._emit(run, "running", data=data)
        elif state == "pending":
            self._emit(run, "pending")
        elif state == "finished":
            self._emit(run, "ended", outcome=Outcome.from_data(data))
        elif state == "not_found":
            self._emit(run, "ended", outcome=Outcome(FAILED, JOB_REMOVED_ERROR))

    def _take_removals(self) -> list[tuple[Run, Callable[[Transaction], None] | None]]:
        with self._removals_lock:
            removals, self._removals = self._removals, []
        return removals

    def _put_back(self, removals: list[tuple[Run, Callable[[Transaction], None] | None]]) -> None:
        """Removals taken by an addition that failed: written on their own, first."""
        with self._removals_lock:
            self._removals[:0] = removals
        self._starter.submit(self._flush_removals)

    def _nudge(self) -> None:
        """On the starter: nothing; the idle call after it writes the removals once due."""

    def _flush_when_due(self) -> float | None:
        """On the starter, as it finds nothing to do: write the removals once they are due.

        Returns:
            Seconds until they are due, or None when none wait.
        """
        with self._removals_lock:
            if not self._removals:
                return None
            wait_s = self._removals_since + REMOVAL_MERGE_WAIT_S - time.monotonic()
        if wait_s > 0:
            return wait_s
        self._flush_removals()
        return None

    def _flush_removals(self) -> None:
        """On the starter: write the removals no addition has carried, in one transaction."""
        removals = self._take_removals()
        if not removals:
            return

        def body(tr: Transaction) -> None:
            for run, also in removals:
                self._remove_in(tr, run, also)

        try:
            self.jobs.transact(body)
        except Exception:
            if len(removals) == 1:
                log.warning("Could not remove the finished job of %r.", removals[0][0].key, exc_info=True)
                return
            # One bad write (a crash record) must not cost the others their removal.
            for run, also in removals:
                try:
                    self.jobs.transact(functools.partial(self._remove_in, run=run, also=also))
                except Exception:
                    log.warning("Could not remove the finished job of %r.", run.key, exc_info=True)

    def _remove_in(self, tr: Transaction, run: Run, also: Callable[[Transaction], None] | None) -> None:
        """Remove the job of ended ``run`` in ``tr``, and make the write that goes with it."""
        try:
            info = self.jobs.get_job(self.job_type, run.key, tx=tr)
        except NotFound:
            info = None
        # Only this run's job: a job someone else added for the key since stays.
        if info is not None and info.state != "running" and info.data.get("run") in (run.token, run.job_run, None):
            self.jobs.remove(self.job_type, run.key, tx=tr)
            release = self.cap.release_write(info.data) if self.cap is not None else None
            if release is not None:
                release(tr)  # its slot of the cap, given back with the job
        if also is not None:
            also(tr)

    # -- plumbing -----------------------------------------------------------------------------------

    def _emit(self, run: Run, kind: Any, *, data: Any = None, **fields: Any) -> None:
        event = RunEvent(run.key, run.token, kind, **fields)
        self._post(lambda: self._route(run.key, event, data if isinstance(data, dict) else None))

    def _route(
        self, key: str, event: RunEvent, data: dict[str, Any] | None, *, local: bool = False, offer: Offer | None = None,
    ) -> None:
        """A run's event on the loop: noted, then delivered to its channel; a last one ends the run
        (``offer``: its worker's thread waits for the channel's next key, see :meth:`end`)."""
        run = self.observe(event, data)
        if run is None:
            if offer is not None:
                offer.decline()
            return
        if local and event.kind == "running":
            run.local = True
        if event.kind in ("ended", "dropped"):
            self.end(run, event, offer)
        else:
            self._deliver(run.channel, event)

    def _open(self, run: Run) -> Run | None:
        """Enter ``run`` in the table (see :meth:`RunTable.open`); the run that refuses it, or None."""
        holder = self.table.open(run)
        on_opened = self.on_opened
        if on_opened is not None:
            on_opened()
        return holder

    def _token(self) -> int:
        return self._rng.getrandbits(62)


class _Claim:
    """What a claim's transaction adds its job with: the data, with the cap's slot when it took one,
    and the watch its refusal armed. Set by the attempt that runs last (a retry sets them again;
    a replayed result leaves the committed attempt's)."""

    __slots__ = ("base", "data", "watch")

    def __init__(self, data: dict[str, Any]) -> None:
        self.base = data
        self.data = data
        self.watch: Watch | None = None


def _store_work(fn: Callable[[], None]) -> None:
    """Run ``fn``; a failure that is the store's health is logged at DEBUG only.

    Raises:
        Exception: any other failure of ``fn`` (the starter logs it with its traceback).
    """
    try:
        fn()
    except Exception as exc:
        if classify(exc) is None:
            raise
        log.debug("store work %r failed: %s", fn, exc)
