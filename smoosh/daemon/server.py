"""The smoosh server: the daemon's parts wired together, and the one loop that owns them.

The path of one key (ARCHITECTURE.md walks it through these modules): the
:class:`~smoosh.daemon.intake.intake.Intake` turns an event into a measured, priced key and hands
it to a :class:`~channels.Channel`; the channel picks what to start and hands it to the
:class:`~smoosh.daemon.run.scheduler.JobScheduler`, which makes it a job; the
:class:`~smoosh.daemon.run.worker.Worker` runs it; its end comes back to the channel as a run
event, and to this server as an outcome (history, backoff, counters) through the channels'
:class:`~smoosh.daemon.host.channel_host.ChannelHost`, which answers all they ask of the daemon.

Ownership (one owner per fact): the server's :class:`~smoosh.loop.Loop` thread owns the
channel registry, every channel's scheduling, the slot gate, the scheduler's runs and the
operator's suspensions. Other threads reach them only through messages on that loop:
``suspend``/``resume``/``flush``/``apply_config`` are calls run there, the worker and the
job layer post run events there (and the cluster holds the housekeeping reads from the
store), and the registry is replaced (never changed in place) so
readers on other threads see a whole one. What other threads may touch directly says so in
its own docstring: the intake (its pools), the history table (its lock), a channel's
``enqueue`` and ``status`` (its lock, its snapshot).
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from typing import Any, Callable, Sequence

from channels import Channel
from channels.ports import Outcome
from smoosh import __version__
from smoosh.clocks import Clocks
from smoosh.compactors import Compactor, CompactorBase, adapt, load_compactors
from smoosh.config import ChannelConfig, Config
from smoosh.daemon.control.budget_gate import BudgetGate
from smoosh.daemon.host.channel_host import ChannelHost
from smoosh.daemon.control.cluster_cap import CapGate, ClusterCap, NodeCap
from smoosh.daemon.control.cluster_holds import ClusterHolds
from smoosh.config.digest import config_digest
from smoosh.daemon.intake.explain import Sources, explain as explain_key
from smoosh.daemon.history import ADDED, HistoryTable
from smoosh.daemon.host.housekeeping import Housekeeping, Parts
from smoosh.daemon.control.instance_lock import InstanceLock, prepare_state_dir
from smoosh.daemon.control.node_claim import Identity, running_here
from smoosh.daemon.control.store_health import StoreHealth
from smoosh.daemon.control.watched_store import WatchedStore
from smoosh.daemon.intake.intake import Intake
from smoosh.daemon.intake.measurement import own_paths
from smoosh.daemon.intake.offers import Offers
from smoosh.daemon.host.live_config import CALL_TIMEOUT_S, LiveConfig
from smoosh.daemon.intake.admission import RequestDeadline
from smoosh.daemon.intake.verdicts import WAIT_S, Verdict, enqueue_and_wait
from smoosh.daemon.record.outcomes import Counters, Outcomes
from smoosh.daemon.results import Result, ResultLog
from smoosh.daemon.host.registry import ChannelRegistry
from smoosh.daemon.host.run_audit import RunAudit
from smoosh.daemon.intake.router import Router
from smoosh.daemon.run.batch import small
from smoosh.daemon.run.scheduler import JobScheduler
from smoosh.daemon.control.slots import SlotGate
from smoosh.daemon.watch.scan_helper import discard_helper, spawn_helper
from smoosh.daemon.watch.staleness import AccessTable
from smoosh.daemon.run.startup import take_over_jobs
from smoosh.daemon.record.status import build_status, claim_node, jobs_table, mark_stopped
from smoosh.daemon.control.suspension import Suspension
from smoosh.errors import UnknownChannel
from smoosh.daemon.control.backlog import BacklogController, Decision
from smoosh.daemon.control.pressure import DiskPressure
from smoosh.disk_room import DiskRoom
from smoosh.io_budget import IoBudget
from smoosh.jobs import Jobs
from smoosh.paths import CLEANUP_PREFIX
from smoosh.loop import Loop, quietly
from smoosh.daemon.control.store_reset import open_job_store
from smoosh.store import Store, Transaction

__all__ = ["Server", "UnknownChannel", "Counters"]

log = logging.getLogger(__name__)

#: Seconds a clean stop may take before the daemon gives up waiting (DESIGN §5.1).
STOP_TIMEOUT_S = 10.0
#: Longest a clean stop waits to mark the node's status record stopped (a store that does not
#: answer must not eat the stop's budget).
MARK_STOPPED_TIMEOUT_S = 2.0


class Server(LiveConfig):
    """The compaction daemon, embeddable: ``Server(load_config(path)).start()``.

    Parameters:
        config: the loaded configuration.
        store: a store to use instead of opening ``config.store`` (the caller closes it).
        workers: in-process worker slots; None means ``config.max_jobs``, 0 none.
        dry_run: route, prioritise and queue as usual, but start no compaction.
        clock: the clocks (DESIGN §12): ``time.time`` (the default) for the real wall and
            monotonic clocks; an object with ``wall()`` and ``monotonic()`` (a
            :class:`smoosh.clocks.Clocks`, or a test's pair whose wall clock it steps alone);
            or one callable for both (a test's clock that moves only when told). Whatever
            waits (the loop's timers, backoffs, pacing, the debounce, rotation) counts on the
            monotonic clock; what a person reads, a window and a stored retry time are wall
            time.
        watch_config: reload the config file live when it changes.
        compactors: compactors to use instead of the built-in SQLite one and the plugins.
        reset_store: at start, move a corrupt SQLite store aside and start with an empty one
            (``smoosh run --reset-store``; see :mod:`smoosh.daemon.control.store_reset`).
    """

    def __init__(
        self,
        config: Config,
        *,
        store: Store | None = None,
        workers: int | None = None,
        dry_run: bool = False,
        clock: Callable[[], float] | Clocks = time.time,
        watch_config: bool = True,
        compactors: Sequence[Compactor | CompactorBase] | None = None,
        reset_store: bool = False,
    ) -> None:
        self._config = config
        self._started_config = config  # what http, store, node and state_dir stay until a restart
        self._reset_store = reset_store
        self._clocks = clocks = Clocks.of(clock)
        monotonic = clocks.monotonic
        self.dry_run = dry_run
        self._owns_store = store is None
        # The store the caller handed over, or None: wrapped at start so every transaction of
        # the daemon reports to the store's health (smoosh.daemon.control.store_health).
        self._given_store = store
        self._store: Store | None = None
        self._store_health = StoreHealth(store.url if store is not None else config.store, clock=clocks.wall,
                                         monotonic=clocks.monotonic,
                                         wake_channel=lambda name: self._registry.wake(name))
        self._workers_n = config.max_jobs if workers is None else workers
        self._workers_from_config = workers is None  # then max_jobs sets them, live
        self._watch_config = watch_config and config.path is not None
        self.node = config.node
        self.job_type = f"smoosh:{config.node}"
        self.counters = Counters()
        self._loop = Loop("smoosh-server", clock=monotonic)
        self._registry = ChannelRegistry(
            self._loop, make=self._make_channel, clock=monotonic,
            settings_of=lambda name: self._config.channels.get(name) if self._started else None,
        )
        self._slots = SlotGate(config.max_jobs)
        # The slots follow the backlog between min_jobs and max_jobs, and back off on harm.
        self.controller = BacklogController(min_jobs=config.min_jobs, max_jobs=config.max_jobs,
                                            backlog_full_bytes=config.backlog_full_bytes)
        # One I/O budget for the process (max_io_rate): compactions charge it, starts wait for it.
        self.io_budget = IoBudget(config.max_io_rate_bytes_per_s, clock=monotonic)
        self.io_budget.set_chunk_gap_factor(self.controller.last.chunk_gap_factor)
        self._budget_gate = BudgetGate(self.io_budget, wake_channel=self.wake,
                                       rearm=lambda: self._loop.wake(self._budget_gate))
        # The fleet-wide cap (cluster_max_jobs): its slots in the store, taken by each claim, and
        # the gate that holds this node's starts while the cap refuses them.
        self._cap = NodeCap(ClusterCap(), config.node, limit_of=lambda: self._config.cluster_max_jobs,
                            wall=clocks.wall)
        self._cap_gate = CapGate(wake_channel=self.wake, rearm=lambda: self._loop.wake(self._cap_gate),
                                 clock=monotonic, wall=clocks.wall)
        self._config_digest: tuple[Config, str] | None = None
        self._history = HistoryTable(
            max_history=config.max_history,
            health_threshold_s=config.health_threshold_s,
            backoff_base_s=config.backoff_base_s,
            busy_retries=config.busy_retries,
        )
        self._access = AccessTable(config.staleness_s, max_size=config.access_max_size, clock=time.monotonic)
        self._compactors = [adapt(c) for c in compactors] if compactors is not None else load_compactors(
            config.sqlite,
            roots=config.roots,
            wal_max_size_bytes=config.wal_max_size_bytes,
            exact_size_interval_s=config.exact_size_interval_s,
        )
        self._set_compactor_roots(config)
        # One set of disk reservations for the process (min_free_space): every compaction's room.
        self.disk_room = DiskRoom(config.min_free_space)
        # Which file systems under the roots are fuller than disk_pressure (checked by the housekeeping).
        self.pressure = DiskPressure(config.disk_pressure, clock=clocks.wall)
        for compactor in self._compactors:
            compactor.set_io_budget(self.io_budget)
            compactor.set_disk_room(self.disk_room)
        self._router = Router(self._compactors, clock=monotonic)
        self._suspension = Suspension(config.state_dir)
        self._lock = InstanceLock(config.state_dir)
        self._state_dir_claimed = False
        #: This daemon's process in the node's status record; drawn as it claims the node.
        self._process: Identity | None = None
        #: The previous daemon of this node, found dead by the claim: its jobs are taken back.
        self._dead_holders: frozenset[str] = frozenset()
        self._config_error: str | None = None
        self._restart_required: list[str] = []
        self._state_dir_ok = False
        # channel -> (reclaimable bytes, would-run list) last computed: shown while it is busy.
        self._last_estimates: dict[str, tuple[int, list[list[Any]]]] = {}
        self._estimated_at: dict[str, float] = {}  # channel -> when its estimate was last taken (monotonic)
        self._offers = Offers(
            channels=lambda: self._registry.current, config_of=lambda: self._config,
            scheduler_of=lambda: self._scheduler, history=self._history, slots=self._slots,
            clocks=clocks, dry_run=dry_run, pressure=self.pressure.on,
        )
        self.intake = Intake(
            config_of=lambda: self._config, router=self._router, access=self._access,
            offer=self._offers.offer, own_paths=(), clocks=clocks, counters=self.counters,
        )
        # The enqueue hot path (a repeated event, dropped as fresh: DESIGN §9 asks >= 1M/s)
        # goes straight to the intake: the method below is the API's signature and docs, and
        # a call frame of its own cost a third of the path's time.
        self.enqueue = self.intake.enqueue  # type: ignore[method-assign]
        self._jobs: Jobs | None = None
        self._scheduler: JobScheduler | None = None
        # The finished compactions' durable history, written with the commits that end their jobs.
        self._results = ResultLog(self.node, max_per_key=config.max_history)
        self._outcomes = Outcomes(
            node=self.node, history=self._history, counters=self.counters, router=self._router,
            forget=self.intake.forget, channel_of=lambda name: self._registry.current.get(name), clocks=clocks,
            log_level=lambda: getattr(logging, self._config.compaction_log_level.upper(), logging.INFO),
            claimed_run=self._claimed_run, results=self._results, live_token=self._live_token,
        )
        self._worker: Any = None
        # What the channels ask of the daemon, and the holds put on them from outside.
        self._host = ChannelHost(
            node=self.node, registry=self._registry, slots=self._slots, budget_gate=self._budget_gate,
            intake=self.intake, outcomes=self._outcomes, suspension=self._suspension,
            worker_of=lambda: self._worker, scheduler_of=lambda: self._scheduler, store_of=lambda: self._store,
            acted=self._operator_acted, wall_time=clocks.wall, config_of=lambda: self._config, pressure=self.pressure,
            store_health=self._store_health, cap_gate=self._cap_gate,
        )
        self._housekeeping: Housekeeping | None = None
        # Every slot held has a live run behind it, or it is said once and freed.
        self._audit = RunAudit(
            channels=lambda: self._registry.current, slots=self._slots, scheduler_of=lambda: self._scheduler,
            worker_of=lambda: self._worker, deliver=self._host.deliver, wake=self.wake,
        )
        self._started = False

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Open the store, take over this node's jobs, restore every channel, then start the rest.

        Raises:
            CorruptStore: the SQLite store is damaged (the message names ``--reset-store``).
            SmooshError: the store cannot be opened.
        """
        if self._started:
            return
        scan_helper = self._spawn_scan_helper()
        try:
            self._start(scan_helper)
        except BaseException:
            if scan_helper is not None:
                discard_helper(scan_helper)  # idempotent: whoever held it last may have too
            raise

    def _spawn_scan_helper(self) -> subprocess.Popen[bytes] | None:
        """The start-up scan's helper process, started before anything else of the start.

        Its interpreter then starts beside this start (the store opened, the jobs taken over)
        rather than after it, and the first databases are found that much sooner. None when
        nothing is watched, or when it cannot be started (the scan tries again itself).
        """
        if not self._config.watch:
            return None
        try:
            return spawn_helper()
        except OSError:
            log.debug("could not start the scan helper ahead; the scan starts its own", exc_info=True)
            return None

    def _start(self, scan_helper: subprocess.Popen[bytes] | None) -> None:
        cfg = self._config
        self.claim_node()
        log.info(
            "starting smoosh on node %r: store %s, %d channel(s), %d worker(s)%s",
            self.node, cfg.store, len(cfg.channels), self._workers_n, ", dry run" if self.dry_run else "",
        )
        assert self._store is not None and self._process is not None
        self.intake.own_paths = own_paths(cfg)
        self._jobs = Jobs(self._store)
        self._jobs.set_type_timeout(self.job_type, cfg.job_timeout_s)
        self._scheduler = JobScheduler(
            self._jobs, self.job_type, recheck=self.intake.recheck, post=self._loop.post,
            deliver=self._host.deliver, clock=self._clocks.monotonic, requeue=self._requeue,
            post_helped=lambda fn: self._loop.post(fn, helped=True), help=self._loop.help,
            batchable=self._batchable,
        )
        self._scheduler.on_released = self._settle
        self._scheduler.on_opened = self._run_opened
        self._scheduler.cap = self._cap
        self._scheduler.on_cap = self._on_cap
        self._suspension.load()
        # Before any channel opens: a channel the cluster holds never starts a run first.
        cluster = ClusterHolds(self._store)
        self._host.cluster_holds = cluster.current()
        # Before any worker of ours runs: every job of this node is taken back into its
        # channel, or followed when a live worker elsewhere runs it (one owner per key).
        found = take_over_jobs(
            self._jobs, self.job_type, self._history, self._clocks.wall(),
            node=self.node, job_timeout_s=cfg.job_timeout_s, admits=self.intake.admits,
            mono=self._clocks.monotonic(),
            dead_holders=self._dead_holders,
        )
        self._outcomes.crash_records = set(found.recorded)
        self._results.restore(found.results)
        # How full the disks are, before any channel opens or any key is offered: a daemon
        # started on a filling disk queues its start-up scan worst first from the first key,
        # and a window the pressure waives is waived at the channel's first look (otherwise
        # the housekeeping's first look, racing the scan, decides).
        self.pressure.check(cfg.roots)
        now = self._clocks.monotonic()  # the channels' clock (the loop's)
        for name, ch_cfg in cfg.channels.items():
            self._registry.open(name, ch_cfg, now)
        found.apply(self._registry.current, now)
        self._reconcile_cap_slots()
        self.intake.start()
        if self._workers_n > 0 and not self.dry_run:
            from smoosh.daemon.run.worker import Worker

            self._worker = Worker(
                self._jobs, self._store, self.job_type, self._compactors, node=self.node,
                job_timeout_s=cfg.job_timeout_s, concurrency=self._workers_n, signals="direct",
                listener=self._scheduler, clock=self._clocks.wall, monotonic=self._clocks.monotonic,
                roots=lambda: self._config.roots,
                io_budget=self.io_budget, io_priority=lambda: self._config.io_priority,
                holder=self._process.holder,  # host, PID and start time: see node_claim
            )
            self._worker.on_released = self._settle
            self._worker.on_finished = self._history_row
            self._worker.release_slot = self._cap.release_write
            self._worker.start()
            self._scheduler.local = self._worker
        self._housekeeping = Housekeeping(Parts(
            node=self.node, clock=self._clocks.monotonic, config_of=lambda: self._config,
            on_config_change=self._on_config_change, wake=self._loop.wake, intake=self.intake,
            access=self._access, slots=self._slots, channels=self.channels, status=self.status,
            store=self._store, scheduler=self._scheduler, worker=self._worker, counters=self.counters,
            compacting=self._compacting, cluster=cluster, on_holds=self._host.apply_cluster_holds,
            post=self._loop.post, clocks=self._clocks, on_clock_step=self._clock_stepped,
            pressure=self.pressure, on_pressure_change=self._pressure_changed, controller=self.controller,
            on_decision=self._apply_decision, lock_waits=lambda: self.io_budget.lock_waits,
            running_reclaimable=self._running_reclaimable,
            process=self._process, store_health=self._store_health, compacting_any=self._compacting_any,
            scan_helper=scan_helper, cap=self._cap,
            live_runs=lambda: self._scheduler.live_tokens() if self._scheduler is not None else [],
        ), watch_config=self._watch_config)
        self.intake.wake = lambda: self._loop.wake(self.intake)
        self._loop.add(self.intake, "the intake")
        self._loop.add(self._housekeeping, "housekeeping")
        self._loop.add(self._budget_gate, "the I/O budget gate", due=None)
        self._loop.add(self._cap_gate, "the cluster cap's gate", due=None)
        self._loop.add(self._audit, "the run audit")
        self._housekeeping.start()
        self._loop.start()
        self._started = True
        log.info("smoosh is running")

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop cleanly: interrupt running compactions, take their keys back, checkpoint, close."""
        if not self._started:
            return
        deadline = time.monotonic() + timeout_s
        self._started = False
        # From here no channel starts anything: a key its stopping worker gives back must stay
        # in its channel (at the top), not go to the job store for some other worker.
        self._host.stopping = True
        if self._housekeeping is not None:
            quietly(self._housekeeping.stop, "stopping", log)
        self._cap_gate.close()
        self.intake.stop()
        if self._worker is not None:
            # Its runs end as "interrupted (stopping)": their events reach the loop, which
            # queues the keys again at the top; the starter removes their jobs.
            quietly(lambda: self._worker.stop(timeout_s=max(0.5, deadline - time.monotonic() - 1.0)), "stopping", log)
        quietly(lambda: self._loop.call(self._registry.close_all, max(0.5, deadline - time.monotonic())),
                "stopping", log)
        self._loop.stop(max(0.5, deadline - time.monotonic()))
        scheduler = self._scheduler
        if scheduler is not None:
            quietly(lambda: scheduler.close(max(0.5, deadline - time.monotonic())), "stopping", log)
        self._release_node(deadline)
        if self._jobs is not None:
            quietly(self._jobs.close, "stopping", log)
        self._close_store()
        self._lock.release()
        self._state_dir_claimed = False
        log.info("smoosh stopped")

    def claim_state_dir(self) -> None:
        """Take ``state_dir`` and its instance lock (idempotent); :meth:`start` does it first.

        Called on its own by a caller that has more to set up before starting (the CLI binds
        the admin socket): a second daemon on this state_dir says so, and nothing else.

        Raises:
            InstanceLocked: another daemon runs on this state_dir.
            LockFailed: the lock cannot be taken or verified (the daemon must not start).
        """
        if self._state_dir_claimed:
            return
        # The lock first: a daemon that cannot take it says that, and only that.
        self._lock.acquire()
        self._state_dir_ok = prepare_state_dir(self._config.state_dir)
        self._state_dir_claimed = True

    def claim_node(self) -> None:
        """Take ``state_dir``, open the store and claim this node's name in it (idempotent); :meth:`start` does it first.

        Before anything is logged: a second live daemon of this node on this store says so,
        and nothing else (DESIGN §10). On any failure the store is closed again and the
        state_dir released.

        Raises:
            InstanceLocked: another daemon runs on this state_dir.
            LockFailed: the state_dir's lock cannot be taken or verified.
            NodeInUse: a live daemon of another process serves this node on this store.
            CorruptStore: the SQLite store is damaged (the message names ``--reset-store``).
            SmooshError: the store cannot be opened, or fails.
        """
        if self._process is not None:
            return
        self.claim_state_dir()
        process = Identity.of_this_process(self._config.state_dir)
        try:
            if self._store is None:
                inner = self._given_store or open_job_store(self._config.store, reset=self._reset_store)
                self._store = WatchedStore(inner, self._store_health, owns_inner=self._owns_store)
            running_here.add(process.instance)
            facts = {"version": self.version, "config_digest": self.config_digest,
                     "cluster": {"max_jobs": self._config.cluster_max_jobs}}
            self._dead_holders = claim_node(self._store, self.node, process, self._clocks.wall(), facts=facts)
        except BaseException:
            running_here.discard(process.instance)
            self._close_store()
            self._lock.release()
            self._state_dir_claimed = False
            raise
        self._process = process
        self._store_health.quiet_store_logs()

    def _release_node(self, deadline: float) -> None:
        """Say in the node's record that this daemon stopped (a restart anywhere need not wait for it to go stale)."""
        process, self._process = self._process, None
        if process is None:
            return
        store = self._store
        if store is not None:
            timeout_s = min(MARK_STOPPED_TIMEOUT_S, max(0.1, deadline - time.monotonic()))
            quietly(lambda: mark_stopped(store, self.node, process, timeout_s), "stopping", log)
        running_here.discard(process.instance)

    def _close_store(self) -> None:
        """Close the store when this server opened it; from now on nothing is reported of it."""
        store, self._store = self._store, None
        self._store_health.closing()
        self._store_health.unquiet_store_logs()
        if store is not None and self._owns_store:
            quietly(store.close, "stopping", log)

    def _reconcile_cap_slots(self) -> None:
        """At start, after the take-over: the node's slots of the fleet-wide cap are its followed runs'.

        Those its previous life left (a kill -9, a finish that never committed) are given back;
        a run adopted from a ``smoosh worker`` that held one keeps it. Before any claim of
        this daemon: nothing it starts is given back here.
        """
        scheduler, store = self._scheduler, self._store
        if scheduler is None or store is None:
            return
        runs = scheduler.runs()
        cap, node, now = self._cap.cap, self.node, self._clocks.wall()

        def body(tr: Transaction) -> None:
            for run in runs:
                if run.cap_slot:
                    cap.adopt(tr, node, run.token, now)
            cap.reconcile(tr, node, [run.token for run in runs])

        try:
            store.transact(body)
        except Exception as e:
            # The status record's reconcile gives them back a few seconds later.
            log.warning("could not give back the cluster cap's slots this node left: %s", e)

    def _on_cap(self, taken: bool, watch: Any) -> None:
        """A claim took a slot of the fleet-wide cap, or was refused one (loop thread)."""
        if taken:
            self._cap_gate.admitted()
        else:
            self._cap_gate.refused(watch, self._loop.post)

    def cluster_status(self) -> dict[str, Any]:
        """The fleet-wide cap as this node sees it (``/status``'s ``cluster``; any thread).

        Returns:
            ``{"max_jobs"``: this node's ``cluster_max_jobs`` (None: no cap), ``"slots"``: the
            slots its runs hold, ``"waiting_since"``: since when its starts wait for a slot
            (None: they do not), ``"refusals"``: claims the cap refused since the start,
            ``"waiting_channels"``: the channels waiting for a slot now``}``.
        """
        scheduler = self._scheduler
        slots = scheduler.cap_slots_held() if scheduler is not None else 0
        gate = self._cap_gate
        return {"max_jobs": self._config.cluster_max_jobs, "slots": slots, "waiting_since": gate.waiting_since,
                "refusals": gate.refusals, "waiting_channels": gate.waiting()}

    #: The version of smoosh this daemon runs (its status record says it, for a fleet's mixed versions).
    version = __version__

    @property
    def config_digest(self) -> str:
        """The digest of the config in force (:func:`smoosh.config.digest.config_digest`; any thread)."""
        cached = self._config_digest
        config = self._config
        if cached is None or cached[0] is not config:
            cached = self._config_digest = (config, config_digest(config))
        return cached[1]

    def _requeue(self, channel: str, key: str, priority: float) -> None:
        """The store failed to add the job of ``key`` (loop thread): it waits in its channel again.

        The channel's starts wait for the store to be back (its health holds them), so the key
        is compacted then, instead of being dropped until its next event.
        """
        target = self._registry.current.get(channel)
        if target is not None and target.enqueue(key, priority):
            self._history.record(key, ADDED, self._clocks.wall(), channel=channel,
                                 reason="queued again: the job store failed")

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def config(self) -> Config:
        """The configuration in force (an invalid edit leaves the previous one)."""
        return self._config

    @property
    def jobs(self) -> Jobs:
        """The job layer this server schedules through."""
        assert self._jobs is not None, "server not started"
        return self._jobs

    @property
    def store_health(self) -> StoreHealth:
        """The job store's health (``/status``'s ``store``, ``/metrics``'s ``smoosh_store_state``)."""
        return self._store_health

    @property
    def store(self) -> Store:
        """The store of the job layer."""
        assert self._store is not None, "server not started"
        return self._store

    def tick(self, now: float | None = None) -> None:
        """Run one iteration of the server's loop at ``now`` (monotonic; tests step it with their clock)."""
        self._loop.run_once(now)

    def _running_reclaimable(self) -> int:
        """What this process's running compactions have still to give back, by their measurements and progress.

        A large database being compacted is backlog too: without it, one 5 GB compaction with
        nothing else waiting would run at the pace of an empty backlog.
        """
        if self._worker is None:
            return 0
        measurements = self.intake.measurements
        total = 0.0
        for run in self._worker.status():
            m = measurements.get(run["key"])
            if m is not None:
                total += m.sizes.reclaimable_bytes * (1.0 - run["progress"])
        return int(total)

    def _apply_decision(self, decision: Decision) -> None:
        """The backlog controller looked (the loop's thread): its slots go to the gate, its pace to the I/O budget."""
        self._host.set_slots(decision.slots)
        self.io_budget.set_chunk_gap_factor(decision.chunk_gap_factor)

    def _clock_stepped(self, now: float) -> None:
        """The wall clock stepped (the loop's thread; ``now`` is monotonic).

        Nothing that waits moves (it all counts on the monotonic clock); what is defined or
        shown in wall time is looked at again: every channel's window at once, rather than at
        its next routine check a minute away, and the retry times ``/jobs`` shows.
        """
        self._history.wall_stepped(self._clocks.wall(), self._clocks.monotonic())
        self._host.look_at_windows(now)

    def _pressure_changed(self, now: float) -> None:
        """Disk pressure started or ended on a file system under the roots (the loop's thread).

        The windows a pressure waives are looked at again, and the keys already waiting are
        queued again at their priority now: worst first by reclaimable bytes as the pressure
        starts (not only the keys examined after it), each channel's own order as it ends.
        """
        self._host.look_at_windows(now)
        router = self._router

        def sizes_of(key: str) -> Any:
            measured = self.intake.measurements.get(key)
            return measured.sizes if measured is not None else None

        def price(ch: Any, key: str, sizes: Any) -> float:
            compactor = router.compactor_for(key)
            return router.priority(ch, key, sizes, compactor) if compactor is not None else 0.0

        moved = self._offers.reprice(sizes_of, price)
        if moved:
            log.info("%d waiting key(s) moved to their priority under the disk's new state (%s).", moved,
                     "worst first by reclaimable bytes" if self.pressure.any else "each channel's own order")

    # ------------------------------------------------------------------ the way in

    def enqueue(self, key: str, *, require_file: bool = False, force: bool = False) -> None:
        """Ask smoosh to consider ``key`` for compaction; returns at once.

        ``require_file`` (HTTP and the CLI) rejects a db key that names no database file.
        ``force`` compacts it now (``smoosh enqueue --force``): staleness, the channels'
        thresholds, a crash's backoff and the channel's start-up pause do not count; the
        roots, ``[smoosh.ignore]``, operator suspension, the window, the channel's
        concurrency and ``max_jobs`` still do (the key then waits at the top of its channel).

        Raises:
            InvalidKey: the key is not a usable key for this daemon (the reason says why).
        """
        self.intake.enqueue(key, require_file=require_file, force=force)

    def enqueue_and_wait(self, keys: list[str], timeout_s: float = WAIT_S, *, force: bool = False,
                         deadline: RequestDeadline | None = None) -> list[Verdict]:
        """Enqueue ``keys`` as HTTP does and say what became of each (``POST /enqueue?wait=1``).

        ``force``: as :meth:`enqueue`; a forced key's ``queued`` result has the reason
        ``forced``, followed by what holds it back, if anything does. ``deadline``: the
        request's admission deadline; keys left when it passes are ``not_queued``, not examined.

        Returns:
            One :class:`~smoosh.daemon.intake.verdicts.Verdict` per key, in order, within ``timeout_s``.
        """
        return enqueue_and_wait(
            lambda key, waiter: self.intake.enqueue(key, require_file=True, waiter=waiter, force=force),
            keys, timeout_s, deadline=deadline)

    def canonical_key(self, key: object) -> str:
        """The key's identity (see :meth:`Intake.canonical_key`)."""
        return self.intake.canonical_key(key)

    def validate(self, key: str) -> None:
        """Check a canonical key (see :meth:`Intake.validate`)."""
        self.intake.validate(key)

    def holds(self, name: str, *, forced: bool = False) -> list[str]:
        """What keeps channel ``name`` from starting its next key now, in words (see :meth:`Offers.holds`)."""
        return self._offers.holds(name, forced=forced)

    # ------------------------------------------------------------------ the channels' host (ChannelHost)

    def wake(self, channel: str) -> None:
        """Tick ``channel`` soon (any thread)."""
        self._registry.wake(channel)

    def on_hold(self, channel: str, held: bool) -> None:
        """Running work of ``channel`` holds (or goes on): this process's worker at once, others through the store."""
        self._host.on_hold(channel, held)

    def _history_row(self, key: str, data: dict[str, Any], outcome: Outcome) -> Callable[[Transaction], None]:
        """The write of a claimed run's durable history row (the worker's compaction thread)."""
        channel = data.get("channel")
        result = Result.of(outcome, channel if isinstance(channel, str) else None, self._clocks.wall())
        return self._results.write_for(key, result)

    def _batchable(self, key: str) -> bool:
        """Whether ``key`` may join a batch (loop thread): a database measured at most
        ``batch_max_size`` when it was queued (:mod:`smoosh.daemon.run.batch`)."""
        measured = self.intake.measurements.get(key)
        return small(None if measured is None else measured.sizes.file_bytes, self._config.batch_max_size_bytes)

    def _live_token(self, key: str) -> int | None:
        """The token of the run that holds ``key`` now, if any (loop thread)."""
        run = self._scheduler.run_of(key) if self._scheduler is not None else None
        return None if run is None else run.token

    def _run_opened(self) -> None:
        """A run started or was adopted (loop thread): the run audit looks while runs exist."""
        if self._audit.asleep:
            self._audit.asleep = False
            self._loop.wake(self._audit)

    def _claimed_run(self, key: str) -> bool:
        """Whether ``key``'s run is this process's worker's, claimed by it (no store request to clear)."""
        run = self._scheduler.run_of(key) if self._scheduler is not None else None
        return run is not None and run.claimed

    # ------------------------------------------------------------------ the registry (loop thread)

    def _make_channel(self, name: str, ch_cfg: ChannelConfig, now: float) -> Channel:
        """Channel ``name`` restored from its checkpoint, suspended if the operator left it so."""
        cfg = self._config
        assert self._scheduler is not None
        channel = Channel(
            name, ch_cfg, scheduler=self._scheduler, host=self._host, now=now,
            state_dir=cfg.state_dir if (cfg.persist and self._state_dir_ok) else None,
            checkpoint_interval_s=cfg.checkpoint_interval_s, wait_s=cfg.wait_s, dry_run=self.dry_run,
        )
        if self._suspension.is_suspended(name):
            channel.suspend()
        channel.set_held(self._host.cluster_hold_of(name))
        # A channel reopened (restarted after a crash, or removed and added again by a live
        # edit) follows the runs its predecessor started: they count against its concurrency
        # and hold their slots again, and their ends reach it.
        for run in self._scheduler.runs():
            if run.channel == name and self._scheduler.run_of(run.key) is run:
                channel.adopt(run.key)
        return channel

    def _compacting(self, path: str) -> bool:
        """Whether a worker is compacting ``path`` now: this process's, or one whose job this
        daemon follows (any thread)."""
        worker = self._worker
        if worker is not None and worker.is_running(path):
            return True
        scheduler = self._scheduler
        return scheduler is not None and path in scheduler.elsewhere

    def _compacting_any(self) -> bool:
        """Whether any worker compacts for this daemon now, or this process's is about to (any
        thread; no lock)."""
        worker = self._worker
        if worker is not None and worker.compacting_any():
            return True
        scheduler = self._scheduler
        return scheduler is not None and bool(scheduler.elsewhere)

    def _settle(self, key: str) -> None:
        """The compaction of ``key`` ends (its thread, or the loop for a run of another process's
        worker): the watcher ignores its last events.

        Only what :meth:`_compacting` covers: a ``cleanup:`` key is never the path of an event.
        """
        if key.startswith(CLEANUP_PREFIX):
            return
        housekeeping = self._housekeeping
        watcher = housekeeping.watcher if housekeeping is not None else None
        if watcher is not None:
            watcher.settle(key)

    def channels(self) -> dict[str, Channel]:
        """The channels now (a whole registry: safe to read from any thread)."""
        return self._registry.current

    # ------------------------------------------------------------------ operator controls

    def suspend(self, channel: str | None = None) -> None:
        """Suspend one channel or all (sticky until resume; survives restarts).

        Raises:
            UnknownChannel: ``channel`` is not configured.
        """
        self._loop.call(lambda: self._host.suspend(channel), CALL_TIMEOUT_S)

    def resume(self, channel: str | None = None) -> None:
        """Resume one channel or all; queued work starts at once.

        Raises:
            UnknownChannel: ``channel`` is not configured.
        """
        self._loop.call(lambda: self._host.resume(channel), CALL_TIMEOUT_S)

    def flush(self, channel: str | None = None) -> int:
        """Empty the waiting queue of one channel or all (running jobs go on).

        The dropped keys' staleness is forgotten with them: enqueued again, a key is examined
        afresh (kept, it would be dropped as stale by a queue that no longer holds it).
        Their crash backoff stays: a crashing key enqueued again still waits it out.

        Returns:
            How many waiting keys were dropped.

        Raises:
            UnknownChannel: ``channel`` is not configured.
        """
        return self._loop.call(lambda: self._host.flush(channel), CALL_TIMEOUT_S)

    def _operator_acted(self) -> None:
        if self._housekeeping is not None:
            self._housekeeping.operator_acted()

    # ------------------------------------------------------------------ status

    def compactors(self) -> list[CompactorBase]:
        """The compactors in use (the metrics read what they remember, such as pinned logs)."""
        return list(self._compactors)

    def application(self) -> dict[str, float | int]:
        """What the compactions saw of the applications beside their databases, summed over the
        compactors (``/status``'s ``application``, ``smoosh_application_*``; any thread).

        Returns:
            ``{"waits", "wait_seconds", "gave_up", "looks_locked", "looks_lockless"}``: waits for
            a moment with no application transaction open, their seconds, waits that ended
            without one (the compaction ended ``busy``), and the looks at a database that took a
            SQLite lock or read the file without one.
        """
        out: dict[str, float | int] = {"waits": 0, "wait_seconds": 0.0, "gave_up": 0, "looks_locked": 0,
                                       "looks_lockless": 0}
        looks_seen = False
        for compactor in self._compactors:
            seen = compactor.application()
            for name in ("waits", "wait_seconds", "gave_up"):
                out[name] += seen.get(name, 0)
            if not looks_seen and "looks_locked" in seen:
                # The looks are the process's (one count for every compactor of its kind).
                out["looks_locked"], out["looks_lockless"] = seen["looks_locked"], seen["looks_lockless"]
                looks_seen = True
        out["wait_seconds"] = round(float(out["wait_seconds"]), 3)
        return out

    def pinned_wals(self) -> list[tuple[str, int, float]]:
        """``(path, WAL bytes now, pinned since: monotonic seconds)`` of each database whose log a
        reader kept pinned at its last run, oldest first (``smoosh_wal_pinned_*``; any thread).

        What the compactors saw in this process, and what the history remembers across a restart
        (its blocks' ``pinned_since`` are stored with the key's crash record): the earlier
        moment counts, so the age does not start again at 0 when the daemon does.
        """
        since: dict[str, float] = {}
        sizes: dict[str, int] = {}
        for compactor in self._compactors:
            for path, size, at in compactor.pinned_wals():
                since[path] = min(at, since.get(path, at))
                sizes[path] = size
        for key, at in self._history.pinned().items():
            path = key[len(CLEANUP_PREFIX):] if key.startswith(CLEANUP_PREFIX) else key
            since[path] = min(at, since.get(path, at))
            if path not in sizes:
                try:
                    sizes[path] = os.stat(path + "-wal").st_size
                except OSError:
                    sizes[path] = 0
        return sorted(((p, sizes[p], at) for p, at in since.items()), key=lambda t: t[2])

    def status(self) -> dict[str, Any]:
        """The status table: CouchDB's ``_smoosh/status`` shape plus smoosh's fields. Never blocks on a channel."""
        return build_status(self)

    def explain(self, key: object) -> dict[str, Any]:
        """Why ``key`` is or is not queued, per channel (``smoosh explain``, ``GET /explain``).

        Changes nothing: no enqueue, no exact measurement. See :mod:`smoosh.daemon.intake.explain`
        for the answer's shape.
        """
        return explain_key(Sources(
            intake=self.intake, history=self._history, channels=self._registry.current, config=self._config,
            holds=lambda name, forced: self.holds(name, forced=forced),
            slots=(self._slots.busy, self._slots.limit), clocks=self._clocks, pressure=self.pressure.on,
        ), key)

    def jobs_table(self) -> list[dict[str, Any]]:
        """Per-key state, progress, error count, last error and history (``GET /jobs``), most recent first."""
        return jobs_table(self._history, self._worker, held=self._store_health.holding())[0]

    def jobs_page(
        self, *, states: frozenset[str] | None = None, limit: int | None = None, offset: int = 0,
    ) -> tuple[list[dict[str, Any]], int]:
        """A page of :meth:`jobs_table`: only ``states``, ``limit`` rows after ``offset``; with the matching total."""
        return jobs_table(self._history, self._worker, states=states, limit=limit, offset=offset,
                          held=self._store_health.holding())

    def queue_page(self, channel: str, *, offset: int = 0, limit: int = 50) -> tuple[list[dict[str, Any]], int] | None:
        """A page of ``channel``'s waiting keys in the order they would start (``GET /queue``); any thread.

        Returns:
            ``(rows, total)`` (see :meth:`channels.Channel.head`; a deferred key's ``not_before``
            in wall time), or None when the channel stayed busy past a moment.

        Raises:
            UnknownChannel: ``channel`` is not configured.
        """
        found = self._registry.current.get(channel)
        if found is None:
            raise UnknownChannel(channel)
        page = found.head(offset, limit)
        if page is None:
            return None
        rows, total = page
        for row in rows:
            if "not_before" in row:
                row["not_before"] = round(self._clocks.wall_at(row["not_before"]), 3)
        return rows, total

    def history_page(
        self, *, results: frozenset[str] | None = None, channel: str | None = None, offset: int = 0, limit: int = 50,
    ) -> tuple[list[dict[str, Any]], int]:
        """A page of the finished compactions held, newest first (``GET /history``); any thread.

        Each row is a result (:meth:`smoosh.daemon.results.Result.to_json`) with its ``key``, its
        ``reclaimed_bytes`` and, for a key's newest result when the key now waits for a retry (a
        crash's backoff, a busy database), ``retry_at`` (Unix seconds; else None).
        """
        page, total = self._results.recent(results=results, channel=channel, offset=offset, limit=limit)
        rows = []
        for key, result, latest in page:
            row: dict[str, Any] = {"key": key, **result.to_json()}
            row["reclaimed_bytes"] = max(0, result.size_before_bytes - result.size_after_bytes) if result.result == "ok" else 0
            record = self._history.get(key) if latest else None
            row["retry_at"] = record.retry_at if record is not None else None
            rows.append(row)
        return rows, total

    def series(self) -> dict[str, Any]:
        """The last hour per minute for the operators' page (``GET /series``; :mod:`smoosh.daemon.record.series`)."""
        return self.counters.series.read(self._clocks.wall())

    def crashing_jobs(self) -> dict[str, int]:
        """Keys in crash backoff now, per channel (``smoosh_crashing_jobs``); any thread."""
        return self._history.crashing(self._clocks.monotonic())
