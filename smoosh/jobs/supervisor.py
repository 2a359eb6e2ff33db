"""Starts, stops and restarts the job layer's background roles, all on one thread.

Per type: an activity monitor (for every type with a timeout, when monitors are enabled),
and a type monitor + notifier pair (started by the first ``subscribe`` of the type). One
type scanner finds types added or cleared by other processes (every 10 s plus up to 5 s of
jitter, so within 15 s) and restarts the roles' thread if it died. Every role is stepped on
the supervisor's one :class:`~smoosh.jobs.threads.Roles` loop.
"""

from __future__ import annotations

import logging
import random
import threading
from typing import Any, Callable

from smoosh.store import tuples
from smoosh.store.base import Store
from smoosh.jobs.batching import BatchPolicy
from smoosh.jobs.model import Keys
from smoosh.jobs.monitor import MAX_JITTER_S, ActivityMonitor
from smoosh.jobs.notifier import Notifier, TypeMonitor
from smoosh.jobs.subscription import Hub
from smoosh.jobs.threads import Roles, Runner
from smoosh.jobs.encoding import JobType

log = logging.getLogger(__name__)

#: Base period (seconds) of the type scan.
TYPE_SCAN_PERIOD_S = 10.0
#: Maximum jitter (seconds) added to each type scan period (period + jitter <= 15 s).
TYPE_SCAN_MAX_JITTER_S = 5.0


def list_types(store: Store, keys: Keys) -> list[JobType]:
    """Every type with an activity timeout (the registry of types)."""
    begin, end = keys.activity_timeout_range()
    kvs = store.transact(lambda tr: tr.snapshot.get_range(begin, end))
    return [keys.type_of(k) for k, _ in kvs]


class _TypeScanner:
    """The scanner role: reconcile per-type threads with the store's type registry."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor
        self.first = True

    def step(self) -> float:
        if self.first:
            # start() scanned just before starting this thread: begin with a full wait.
            self.first = False
        else:
            self.supervisor.scan()
        return TYPE_SCAN_PERIOD_S + self.supervisor.rng.uniform(0, TYPE_SCAN_MAX_JITTER_S)

    def reset(self) -> None:
        pass

    def wake(self) -> None:
        pass


class Supervisor:
    """Owns every background thread of one :class:`~smoosh.jobs.Jobs`."""

    def __init__(
        self,
        store: Store,
        keys: Keys,
        hub: Hub,
        *,
        clock: Callable[[], float],
        rng: random.Random,
        batch: BatchPolicy,
        monitors: bool,
        max_jitter_s: float = MAX_JITTER_S,
    ) -> None:
        self.store = store
        self.keys = keys
        self.hub = hub
        self.clock = clock
        self.rng = rng
        self.batch = batch
        self.monitors_enabled = monitors
        self.max_jitter_s = max_jitter_s
        self._lock = threading.RLock()
        self._closed = False
        self.monitors: dict[JobType, Runner] = {}
        self.notifiers: dict[JobType, tuple[Runner, Runner]] = {}
        self.scanner: Runner | None = None
        #: The one thread every role of this layer is stepped on.
        self.roles = Roles()

    def start(self) -> None:
        """Start monitors for the types that exist now, and the type scanner."""
        if not self.monitors_enabled:
            return
        self.scan()
        with self._lock:
            if self._closed:
                return
            self.scanner = Runner(_TypeScanner(self), "type-scan", self.roles)
            self.scanner.start()

    # -- activity monitors ------------------------------------------------------------------

    def ensure_monitor(self, job_type: JobType, *, retime: bool = False) -> None:
        """Start the type's activity monitor, or (``retime``) make it re-read its timeout now."""
        if not self.monitors_enabled:
            return
        with self._lock:
            if self._closed:
                return
            runner = self.monitors.get(job_type)
            if runner is None:
                monitor = ActivityMonitor(
                    self.store, self.keys, job_type, clock=self.clock, rng=self.rng,
                    max_jitter_s=self.max_jitter_s, batch=self.batch,
                )
                runner = Runner(monitor, f"activity-{_name(job_type)}", self.roles)
                self.monitors[job_type] = runner
                runner.start()
                return
        if retime:
            role = runner.role
            assert isinstance(role, ActivityMonitor)
            # The runner's next step (now) re-reads the timeout and reschedules from now.
            role.request_retime()
            runner.kick()

    # -- notifiers ---------------------------------------------------------------------------

    def notifier(self, job_type: JobType) -> Notifier | None:
        """The type's notifier, started on first use; None once the layer is closed."""
        with self._lock:
            if self._closed:
                return None
            pair = self.notifiers.get(job_type)
            if pair is None:
                notifier = Notifier(self.store, self.keys, job_type, self.hub, batch=self.batch)
                notifier_runner = Runner(notifier, f"notifier-{_name(job_type)}", self.roles)
                notifier.kick = notifier_runner.kick
                type_monitor = TypeMonitor(self.store, self.keys, job_type, notifier_runner.kick,
                                           pass_cost_s=lambda: notifier.last_pass_s)
                monitor_runner = Runner(type_monitor, f"type-monitor-{_name(job_type)}", self.roles)
                type_monitor.kick = monitor_runner.kick
                pair = (monitor_runner, notifier_runner)
                self.notifiers[job_type] = pair
                notifier_runner.start()
                monitor_runner.start()
            role = pair[1].role
            assert isinstance(role, Notifier)
            return role

    # -- lifecycle ---------------------------------------------------------------------------

    def stop_type(self, job_type: JobType) -> None:
        """Stop every thread of ``job_type`` (its timeout was cleared)."""
        with self._lock:
            runners = []
            if job_type in self.monitors:
                runners.append(self.monitors.pop(job_type))
            if job_type in self.notifiers:
                runners.extend(self.notifiers.pop(job_type))
        _stop_all(runners)

    def scan(self) -> None:
        """Start monitors for new types, stop threads of cleared types, restart dead runners."""
        with self._lock:
            # Taken before reading the store: a type this process registers while the scan
            # runs is not in this set, so a scan that read the registry too early cannot
            # stop its brand-new monitor.
            known = set(self.monitors) | set(self.notifiers)
        types = set(list_types(self.store, self.keys))
        with self._lock:
            if self._closed:
                return
            gone = known - types
            new = types - set(self.monitors)
            for runner in self.runners():
                if not runner.is_alive() and not runner.stopping:
                    log.error("background thread %s died; restarting it", runner.name)
                    runner.start()
        for job_type in gone:
            log.info("job type %r has no timeout any more; stopping its monitors", job_type)
            self.stop_type(job_type)
        for job_type in new:
            self.ensure_monitor(job_type)

    def runners(self) -> list[Runner]:
        """Every per-type runner (not the scanner)."""
        with self._lock:
            found = list(self.monitors.values())
            for pair in self.notifiers.values():
                found.extend(pair)
            return found

    def close(self) -> None:
        """Stop and join every thread."""
        with self._lock:
            self._closed = True
            runners = self.runners()
            if self.scanner is not None:
                runners.append(self.scanner)
            self.monitors.clear()
            self.notifiers.clear()
            self.scanner = None
        _stop_all(runners)
        self.roles.close()


def _stop_all(runners: list[Runner]) -> None:
    # Ask all first, then join: the threads wind down in parallel.
    for runner in runners:
        runner.stop()
    for runner in runners:
        runner.join()


def _name(job_type: JobType) -> str:
    return str(job_type)[:40]
