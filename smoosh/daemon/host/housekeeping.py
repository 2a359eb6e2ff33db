"""The server loop's timed chores: file watching, config reloads, rotation, status records, staleness.

One :class:`Housekeeping` task on the server's loop does what used to take a thread each: it
ticks the file watcher (root checks, rescans: a scan runs on a short-lived thread of its own),
the config watcher (a settled edit is reloaded on the loop itself), the access table's
cleaner, rotation (DESIGN §5.6) and the node's status record in the store (every ~5 s,
written by the scheduler's starter thread: store I/O never runs on the loop). The daemon
keeps one watchdog observer, shared by the file watcher and the config watcher.

The status record is also the job store's heartbeat: written every ~5 s whatever else
happens, it proves (or disproves) that the store takes writes, and every tick looks for a
transaction that has had no answer for too long
(:class:`~smoosh.daemon.control.store_health.StoreHealth`). It names this daemon's process,
and the same transaction reads the record it replaces: a record another live daemon wrote
(two daemons given one ``node``) is logged once, as an ERROR.

The fleet view rides on it too: every :data:`FLEET_VIEW_INTERVAL_S` the same transaction reads
every node's record (a snapshot read, no conflict) and counts the nodes live, stale and
stopped (``/status``'s ``fleet``, ``smoosh_fleet_nodes``), so an alert can name a node gone
stale from any daemon of the fleet that still runs.

The cluster holds (:mod:`smoosh.daemon.control.cluster_holds`) ride on the status record: the
transaction that writes it also reads the holds and, when none is armed, watches them.
The watch firing has them read again at once, in a read-only transaction of their own (which
arms the next watch), so a hold set by ``smoosh suspend --store`` is obeyed as soon as the store
delivers the watch, and within one status interval even if a watch is lost; nothing polls for
it. Not with a status record: where the store's writes take turns (fifty daemons on one SQLite
file), their records queue behind each other and the last daemon would obey seconds after the
first; reads do not wait for them. The record shows the hold right after (a hold applied is an
operator's act: the record is written at once).

Every chore is due on the loop's monotonic clock; the status record carries wall time (a
person reads ``updated_at``). Each tick also looks whether the wall clock stepped
(:class:`~smoosh.clocks.WallSteps`): a step is logged once and handed to the server, which
has every channel look at its window again. While a channel has a window the chores are due
at least every :data:`STEP_CHECK_INTERVAL_S`, so a step into or out of it is seen within a
second; without windows a step only needs its line, and the next chore's tick says it.

Owner: the server's loop thread (every method but :meth:`stop`, which runs after the loop's
last tick, and the watchdog callbacks, which only post or wake).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from smoosh.clocks import Clocks, WallSteps
from smoosh.config import Config
from smoosh.daemon.control import control
from smoosh.daemon.run import rotation
from smoosh.daemon.control.cluster_holds import ClusterHolds, Hold
from smoosh.daemon.control.store_health import FULL, classify
from smoosh.daemon.record.status import (
    STALE_AFTER_S, STATUS_INTERVAL_S, fleet_counts, other_live_daemon, put_node_status, read_node_record, read_records,
    status_key,
)
from smoosh.errors import ConfigError, SmooshError

if TYPE_CHECKING:
    import subprocess

    from channels import Channel
    from smoosh.daemon.control.backlog import BacklogController, Decision
    from smoosh.daemon.control.cluster_cap import NodeCap
    from smoosh.daemon.control.pressure import DiskPressure
    from smoosh.daemon.control.node_claim import Identity
    from smoosh.daemon.control.store_health import StoreHealth
    from smoosh.daemon.intake.intake import Intake
    from smoosh.daemon.record.outcomes import Counters
    from smoosh.daemon.run.scheduler import JobScheduler
    from smoosh.daemon.control.slots import SlotGate
    from smoosh.daemon.watch.staleness import AccessTable
    from smoosh.daemon.run.worker import Worker
    from smoosh.store import Store, Transaction, Watch

__all__ = ["Housekeeping", "Parts", "STEP_CHECK_INTERVAL_S"]

log = logging.getLogger(__name__)

#: Seconds between two looks at the wall clock while a channel has a window (DESIGN §10:
#: windows are re-evaluated within a second of a step).
STEP_CHECK_INTERVAL_S = 1.0
#: Seconds between two reads of every node's record for the fleet view: as often as a node can
#: go stale, and no more (each read is every node's record, for every node of the fleet).
FLEET_VIEW_INTERVAL_S = STALE_AFTER_S


@dataclass(frozen=True)
class Parts:
    """What the chores work on: the server's parts, handed over whole when it starts."""

    node: str
    #: The loop's clock (monotonic): every chore is due on it.
    clock: Callable[[], float]
    config_of: Callable[[], Config]
    #: A reloaded config file (or the error that rejects it) goes to the server.
    on_config_change: Callable[[Config | ConfigError], None]
    #: Wakes a task of the server's loop (the housekeeping task itself).
    wake: Callable[[Any], None]
    intake: Intake
    access: AccessTable
    slots: SlotGate
    channels: Callable[[], dict[str, Channel]]
    status: Callable[[], dict[str, Any]]
    store: Store
    scheduler: JobScheduler
    worker: Worker | None
    counters: Counters
    #: Whether this process's worker compacts that path now (its events are its own).
    compacting: Callable[[str], bool]
    #: The cluster holds of the store, read with every status record.
    cluster: ClusterHolds
    #: The holds just read go to the server (called on the loop).
    on_holds: Callable[[list[Hold]], None]
    #: Hands a callable to the server's loop (:meth:`smoosh.loop.Loop.post`).
    post: Callable[[Callable[[], None]], None]
    #: The daemon's clocks: the status record's ``updated_at`` is wall time; steps are watched.
    clocks: Clocks
    #: The wall clock stepped (called on the loop with its ``now``): the channels look at
    #: their windows again.
    on_clock_step: Callable[[float], None]
    #: The file systems under the roots, checked for disk pressure with every status record.
    pressure: DiskPressure
    #: Disk pressure started or ended (called on the loop with its ``now``).
    on_pressure_change: Callable[[float], None]
    #: The backlog controller, stepped with every status record; its decision (the slots and
    #: the incremental pace) goes to ``on_decision``.
    controller: BacklogController
    on_decision: Callable[[Decision], None]
    #: Lock waits compactions noted since start (the I/O budget's count): harm, with busy results.
    lock_waits: Callable[[], int]
    #: Bytes the running compactions have still to give back: part of the backlog.
    running_reclaimable: Callable[[], int]
    #: This daemon's process, named in its status record (None: the record names none).
    process: Identity | None = None
    #: The job store's health, checked for stalled transactions at every tick.
    store_health: StoreHealth | None = None
    #: Whether this process's worker compacts anything now, or is about to (any thread, never
    #: blocks): the observer then lets events wait for a compaction's end (InotifyObserver.set_quiet).
    compacting_any: Callable[[], bool] = lambda: False
    #: A scan helper process the server started ahead for the start-up scan (None: the scan
    #: starts its own); the housekeeping owns it, then the watcher it hands it to.
    scan_helper: subprocess.Popen[bytes] | None = None
    #: This node's side of the fleet-wide cap: the status record renews its lease and gives
    #: back the slots no run of the node holds any more (None: none).
    cap: NodeCap | None = None
    #: The tokens of the runs the scheduler follows now (any thread).
    live_runs: Callable[[], list[int]] = lambda: []


class Housekeeping:
    """The server's timed chores, ticked on its loop."""

    def __init__(self, parts: Parts, *, watch_config: bool) -> None:
        self.parts = parts
        self._watch_config = watch_config
        self._scan_helper = parts.scan_helper
        self._observer: Any = None
        self.watcher: Any = None
        self.config_watcher: Any = None
        now = parts.clock()
        self._next_status_write = now
        self._next_rotation = now + parts.config_of().interval_s
        self._steps = WallSteps(parts.clocks)
        #: The armed watch on the cluster holds (None: the next status write arms one).
        self._holds_watch: Watch | None = None
        #: The instance of another live daemon last found writing this node's record (the
        #: starter thread's alone: the status write runs there).
        self._other_daemon: str | None = None
        #: The fleet view last read (see :meth:`fleet`): replaced whole by the starter thread.
        self._fleet: dict[str, Any] | None = None
        #: When the fleet view is read next (the loop's monotonic clock; the loop's alone).
        self._next_fleet_read = now

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start watching the data directories and the config file (one observer for both)."""
        parts = self.parts
        cfg = parts.config_of()
        if cfg.watch or self._watch_config:
            self._ensure_observer()
        if cfg.watch:
            self._start_watcher(cfg)
        else:
            self._discard_scan_helper()
        if self._watch_config and cfg.path is not None:
            from smoosh.config.watch import ConfigWatcher

            self.config_watcher = ConfigWatcher(
                cfg.path, parts.on_config_change, on_edit=self._wake
            )
            self.config_watcher.start(ticker=False, observer=self._observer)

    def _ensure_observer(self) -> None:
        """Start the one observer the file and config watchers share, unless it runs already."""
        if self._observer is None:
            from smoosh.daemon.watch.inotify import new_observer

            self._observer = new_observer()
            set_quiet = getattr(self._observer, "set_quiet", None)  # watchdog's has none
            if set_quiet is not None:
                set_quiet(self.parts.compacting_any)
            self._observer.start()

    def _start_watcher(self, cfg: Config) -> None:
        from smoosh.daemon.watch.watcher import Watcher

        intake = self.parts.intake
        self.watcher = Watcher(
            list(cfg.watch), intake.on_event, on_scanned=intake.on_scanned, on_settling=intake.on_event,
            rescan_interval_s=cfg.rescan_interval_s, exclude=self._is_own_path, observer=self._observer,
            busy=self.parts.compacting, scan_helper=self._take_scan_helper(),
        )
        self.watcher.start(thread=False)

    def _take_scan_helper(self) -> subprocess.Popen[bytes] | None:
        """The helper started ahead for the start-up scan, once (a later watcher starts its own)."""
        helper, self._scan_helper = self._scan_helper, None
        return helper

    def _discard_scan_helper(self) -> None:
        helper = self._take_scan_helper()
        if helper is not None:  # no watcher to hand it to (no watch, or stopped before one started)
            from smoosh.daemon.watch.scan_helper import discard_helper

            discard_helper(helper)

    def stop(self) -> None:
        """Stop the watchers and the observer."""
        self._discard_scan_helper()
        for part in (self.config_watcher, self.watcher):
            if part is not None:
                try:
                    part.stop()
                except Exception:
                    log.exception("error while stopping %r", part)
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(5)
            self._observer = None
        watch, self._holds_watch = self._holds_watch, None
        if watch is not None:
            watch.cancel()

    def _wake(self) -> None:
        self.parts.wake(self)

    def _is_own_path(self, path: str) -> bool:
        return any(path == own or path.startswith(own + "/") for own in self.parts.intake.own_paths)

    def operator_acted(self) -> None:
        """An operator suspended, resumed or flushed: the node's record in the store shows it now."""
        self._next_status_write = self.parts.clock()
        self._wake()

    def config_changed(self, old: Config, new: Config) -> None:
        """Apply what a live reload changed of the chores."""
        if new.watch != old.watch:
            # A new list of directories: a new watcher (its start-up scan reports them all).
            if self.watcher is not None:
                self.watcher.stop()
                self.watcher = None
            if new.watch:
                self._ensure_observer()
                self._start_watcher(new)
        elif self.watcher is not None and new.rescan_interval_s != old.rescan_interval_s:
            self.watcher.set_rescan_interval(new.rescan_interval_s)
        if self.watcher is not None:
            # Periodic rescans report only changed files; the new config may price an
            # unchanged one differently (a new channel, an upgrade target), so look at all.
            self.watcher.request_full_scan()
        if new.interval_s != old.interval_s:
            self._next_rotation = min(self._next_rotation, self.parts.clock() + new.interval_s)
        self._wake()

    # -- the loop ------------------------------------------------------------------------------

    def tick(self, now: float) -> float | None:
        """Do the chores that are due at ``now``; return when the next one is."""
        parts = self.parts
        self._look_at_the_wall_clock(now)
        mono = time.monotonic()
        dues: list[float] = []
        for part in (self.watcher, self.config_watcher):
            if part is None:
                continue
            if part is self.config_watcher:
                part.tick(mono)
                due = part.next_due()
            else:
                due = part.tick(mono)
            if due is not None:
                dues.append(now + max(0.0, due - mono))
        cleaned = parts.access.tick(mono)
        if cleaned:
            log.debug("access table cleaner dropped %d expired keys", cleaned)
        clean_at = parts.access.next_due()
        if clean_at is not None and len(parts.access):
            dues.append(now + max(0.0, clean_at - mono))
        if now >= self._next_rotation:
            self._next_rotation = now + parts.config_of().interval_s
            self._rotate(now)
        dues.append(self._next_rotation)
        if now >= self._next_status_write:
            self._next_status_write = now + STATUS_INTERVAL_S
            if parts.pressure.check(parts.config_of().roots):
                parts.on_pressure_change(now)
            status = parts.status()
            wall = parts.clocks.wall()
            # The page's chart of the fleet's reclaimable bytes: this sum, made here anyway.
            parts.counters.series.note_reclaimable(int(status.get("reclaimable_bytes") or 0), wall)
            busy = sum(n for (_channel, result), n in parts.counters.compactions.items() if result == "busy")
            backlog = int(status.get("reclaimable_bytes") or 0) + parts.running_reclaimable()
            parts.on_decision(parts.controller.step(backlog, busy, parts.lock_waits()))
            read_fleet = now >= self._next_fleet_read
            if read_fleet:
                self._next_fleet_read = now + FLEET_VIEW_INTERVAL_S
            self._write_status(wall, status, read_fleet=read_fleet)
        dues.append(self._next_status_write)
        if any(ch.window is not None for ch in parts.config_of().channels.values()):
            dues.append(now + STEP_CHECK_INTERVAL_S)
        if parts.store_health is not None:
            parts.store_health.check()
        return min(dues)

    def _look_at_the_wall_clock(self, now: float) -> None:
        """Say a step of the wall clock once, and hand it to the server (``now``: the loop's)."""
        step_s = self._steps.check()
        if step_s is None:
            return
        log.warning(
            "the wall clock stepped %s by %.1f s; waits, backoffs and pacing run on the monotonic clock and keep "
            "their time, and every channel looks at its window again now",
            "back" if step_s < 0 else "forward", abs(step_s),
        )
        if self.watcher is not None:
            self.watcher.wall_stepped(step_s)  # rescans compare file times, which are wall time
        self.parts.on_clock_step(now)

    def _write_status(self, now: float, status: dict[str, Any] | None = None, *, read_fleet: bool = False) -> None:
        """Write the node's record (``now``: wall time) and read the cluster holds, in one transaction on the starter.

        ``status``: the status table just built for this interval (None: build it);
        ``read_fleet``: read every node's record too, for the fleet view.
        """
        parts = self.parts
        store, scheduler, node, cluster = parts.store, parts.scheduler, parts.node, parts.cluster
        if status is None:
            status = parts.status()
        arm = self._holds_watch is None

        process = parts.process
        cap = parts.cap
        own_key = status_key(node)
        # The controller's newest decision (the status table was built before it looked)
        pace = parts.controller.last.chunk_gap_factor

        def body(tr: Transaction) -> tuple[list[Hold], Watch | None, dict[str, Any] | None, list[Any] | None]:
            previous = read_node_record(tr.snapshot, node) if process is not None else None
            # Before this node's own write: the fleet as the others left it, this node's
            # previous record included (its new one is live by definition).
            fleet = read_records(tr) if read_fleet else None
            put_node_status(tr, node, status, now, process=process)
            if cap is not None:
                if cap.limit is not None:
                    cap.cap.renew(tr, node, now)  # this node's slots count while it lives
                cap.cap.reconcile(tr, node, parts.live_runs())
            # For this node's `smoosh worker` processes (their heartbeat reads it): stamped with
            # the record's time, so a pace this daemon stops writing ages out of use.
            control.put_pace(tr, node, pace, now)
            # Snapshot reads: the write stays conflict-free. The watch is armed at this
            # commit against what this read saw, so no change can slip between the two.
            return cluster.read(tr), (cluster.watch(tr) if arm else None), previous, fleet

        def write() -> None:
            try:
                # No longer than the interval: this write is how the store's health is known,
                # and a store that does not answer must not hold the starter for a minute.
                holds, watch, previous, fleet = store.transact(body, timeout_s=2 * STATUS_INTERVAL_S,
                                                               on_retry=_give_up_if_full)
            except SmooshError as e:
                # The store's health says it once per change (and the state is in /status).
                log.debug("could not write this node's status record: %s", e)
                return
            if fleet is not None:
                counts = fleet_counts([(k, v) for k, v in fleet if k != own_key], now)
                counts["live"] += 1  # this node: its record was just written
                self._fleet = {**counts, "read_at": now}
            if process is not None:
                self._check_other_daemon(previous, process, now)
            parts.post(lambda: self._holds_read(holds, watch))

        scheduler.background(write)

    def _check_other_daemon(self, previous: dict[str, Any] | None, ours: Identity, now: float) -> None:
        """The record this write replaced came from another live daemon: say so, once per such daemon.

        A second daemon of this node refuses to start (the node's claim); this catches the one
        that started while this daemon's record was stale (its store unreachable meanwhile).
        Runs on the starter thread, after the write.
        """
        other = other_live_daemon(previous, ours, now)
        if other is None or other.instance == self._other_daemon:
            return
        self._other_daemon = other.instance
        log.error("another smoosh (host %s, pid %d) also runs as node %r on this store: the two take each "
                  "other's jobs; stop one, or give each its own node name ([smoosh] node)",
                  other.host, other.pid, self.parts.node)

    def _holds_read(self, holds: list[Hold], watch: Watch | None) -> None:
        """The holds as the last status write read them (loop thread); follow the new watch."""
        self.parts.on_holds(holds)
        if watch is None:
            return
        if self._holds_watch is not None:
            watch.cancel()  # two writes raced to arm one: keep the first
            return
        self._holds_watch = watch
        post = self.parts.post
        watch.on_settled(lambda: post(lambda: self._holds_changed(watch)))

    def _holds_changed(self, watch: Watch) -> None:
        """The watch on the holds settled (loop thread): read them again now, or at the next write."""
        if watch is not self._holds_watch:
            return  # cancelled by stop() or replaced
        self._holds_watch = None
        try:
            watch.wait(0)
        except SmooshError as e:
            # A failed watch (the store closing, a transient error): the next regular
            # status write arms a new one; re-reading at once could spin on a broken store.
            log.debug("the watch on the cluster holds failed (%s); re-armed at the next status write", e)
            return
        self._read_holds()

    def _read_holds(self) -> None:
        """Read the cluster holds and watch them anew, in one read-only transaction on the starter (see the
        module docstring); a failure leaves it to the next status write, which arms a watch again."""
        parts = self.parts
        store, cluster = parts.store, parts.cluster

        def read() -> None:
            try:
                holds, watch = store.transact(lambda tr: (cluster.read(tr), cluster.watch(tr)),
                                              timeout_s=2 * STATUS_INTERVAL_S)
            except SmooshError as e:
                log.debug("could not read the cluster holds: %s; read again at the next status write", e)
                return
            parts.post(lambda: self._holds_read(holds, watch))

        parts.scheduler.background(read)

    def _rotate(self, now: float) -> None:
        """Rotation (DESIGN §5.6): make way for work waiting on ``max_jobs``."""
        parts = self.parts
        cfg = parts.config_of()
        scheduler, worker, store, node = parts.scheduler, parts.worker, parts.store, parts.node
        waiting = parts.slots.waiting()
        channels = parts.channels()
        waiting_keys = sum(int(channels[n].status()["waiting"]["size"]) for n in waiting if n in channels)
        local = {r["key"] for r in worker.status()} if worker is not None else set()
        runs = [
            rotation.Candidate(run.key, run.running_since, None if run.key in local else run.suspendable, run.run_id)
            for run in scheduler.runs()
            if run.running_since is not None
        ]
        chosen = rotation.choose(
            now, runs, interval_s=cfg.interval_s, max_churn=cfg.max_churn,
            busy_slots=parts.slots.busy, max_jobs=parts.slots.in_force, waiting_keys=waiting_keys,
        )
        for run in chosen:
            if run.key in local and worker is not None:
                if not worker.request_rotation(run.key):
                    continue
            elif run.run_id is not None:
                key, run_id = run.key, run.run_id
                scheduler.background(lambda: control.request_rotation(store, node, key, run_id))
            else:
                continue
            parts.counters.rotations += 1
            log.info("rotating %r out after %.0f s: channel(s) %s wait for a slot",
                     run.key, now - run.running_since, ", ".join(waiting))

    # -- status --------------------------------------------------------------------------------

    def fleet(self) -> dict[str, Any] | None:
        """The fleet view as last read from the store (any thread): how many nodes are ``live``,
        ``stale`` and ``stopped``, and ``read_at`` (Unix seconds); None until the first read."""
        return self._fleet

    def scan_status(self) -> dict[str, Any]:
        """Progress of finding and examining the fleet (start-up of a large fleet takes a while)."""
        watcher = self.watcher
        intake = self.parts.intake
        completed, (found, took_s), (last_found, last_s) = 0, (0, 0.0), (0, 0.0)
        if watcher is not None:
            completed = int(watcher.scans_completed)
            found, took_s = watcher.startup_scan
            last_found, last_s = watcher.last_scan
        return {
            "scans_completed": completed,
            "databases_found": found,
            "duration_s": round(took_s, 3),
            "last_scan_databases": last_found,
            "last_scan_s": round(last_s, 3),
            "debouncing": intake.debouncer.counts()["pending"],
            "examining": intake.examining(),
        }


def _give_up_if_full(error: SmooshError) -> None:
    """The status write's retries end at an attempt that found the store full (it is tried again next interval).

    Retrying cannot help until space is freed, and every failed commit is a line in the
    store's log: one attempt per status interval tells when the store has room again.

    Raises:
        SmooshError: ``error``, when it says the store is full.
    """
    if classify(error) == FULL:
        raise error
