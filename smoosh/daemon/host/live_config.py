"""Live reload: a new config applied to the running server, or rejected whole.

A mixin of :class:`~smoosh.daemon.server.Server`, kept apart because it touches every part
the server wires (slots, history, staleness, compactors, the worker, the channels, the
chores) and nothing else does. Owner: the server's loop thread: :meth:`LiveConfig.apply_config`
hands the work to it, and a rejected file only records its error.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any

from smoosh import logs
from smoosh.config import Config
from smoosh.errors import ConfigError
from smoosh.identity import Roots
from smoosh.loop import quietly

if TYPE_CHECKING:
    from smoosh.clocks import Clocks
    from smoosh.daemon.control.budget_gate import BudgetGate
    from smoosh.daemon.history import HistoryTable
    from smoosh.daemon.results import ResultLog
    from smoosh.daemon.host.housekeeping import Housekeeping
    from smoosh.daemon.intake.intake import Intake
    from smoosh.daemon.host.registry import ChannelRegistry
    from smoosh.daemon.run.scheduler import JobScheduler
    from smoosh.daemon.control.slots import SlotGate
    from smoosh.daemon.watch.staleness import AccessTable
    from smoosh.daemon.control.backlog import BacklogController
    from smoosh.daemon.control.pressure import DiskPressure
    from smoosh.disk_room import DiskRoom
    from smoosh.io_budget import IoBudget
    from smoosh.jobs import Jobs
    from smoosh.loop import Loop

__all__ = ["LiveConfig", "CALL_TIMEOUT_S"]

log = logging.getLogger("smoosh.daemon.server")  # the server's own lines

#: Seconds an operator call (suspend, apply_config...) waits for the server's loop.
CALL_TIMEOUT_S = 30.0


class LiveConfig:
    """The server's config in force, and how a new one is applied (see the module docstring)."""

    # The server's parts this touches (set by Server.__init__ and Server.start).
    _config: Config
    #: The config the daemon started with: what the keys that cannot apply live still run with.
    _started_config: Config
    _config_error: str | None
    _restart_required: list[str]
    _slots: SlotGate
    io_budget: IoBudget
    disk_room: DiskRoom
    controller: BacklogController
    pressure: DiskPressure
    _budget_gate: BudgetGate
    _history: HistoryTable
    _results: ResultLog
    _access: AccessTable
    _compactors: list[Any]
    _worker: Any
    _workers_from_config: bool
    _state_dir_ok: bool
    intake: Intake
    _registry: ChannelRegistry
    _housekeeping: Housekeeping | None
    _jobs: Jobs | None
    _scheduler: JobScheduler | None
    job_type: str
    _loop: Loop
    _clocks: Clocks

    def on_hold(self, channel: str, held: bool) -> None:
        """Running work of ``channel`` holds or goes on (the server's)."""
        raise NotImplementedError

    def wake(self, channel: str) -> None:
        """Tick ``channel`` soon (the server's)."""
        raise NotImplementedError

    def apply_config(self, new: Config) -> None:
        """Apply a valid new config live: channels created, closed (with checkpoint) or retuned."""
        self._loop.call(lambda: self._apply_config(new), CALL_TIMEOUT_S)

    def _apply_config(self, new: Config) -> None:
        old = self._config
        # Against the config the daemon started with, not the one in force: that one already
        # holds an earlier edit of these keys, which never took effect, so an edit put back
        # would still have differed from it and stayed "required" until a restart.
        required = self._started_config.restart_keys_changed(new)
        if required and required != self._restart_required:
            log.warning("config keys changed that need a restart: %s", ", ".join(required))
        elif self._restart_required and not required:
            log.info("config keys that needed a restart are back to what the daemon runs with: %s",
                     ", ".join(self._restart_required))
        self._restart_required = required
        self._config = new
        self._config_error = None
        if old.token and not new.token:
            # A security downgrade an operator must see in `journalctl -p warning`, not an INFO line.
            log.warning("token removed by a live edit: POST requests on loopback no longer need a bearer token "
                        "(any local process may enqueue, suspend, resume and flush)")
        elif new.token != old.token:
            log.info("token %s by a live edit: POST requests need the new one", "set" if not old.token else "changed")
        if new.log_format != old.log_format:
            # Only the handler `smoosh run` installed changes; an embedding application's stays.
            logs.set_format(new.log_format)
        # The controller's bounds change with the config; its last decision stands within them.
        self.controller.configure(min_jobs=new.min_jobs, max_jobs=new.max_jobs,
                                  backlog_full_bytes=new.backlog_full_bytes)
        self._slots.limit = new.max_jobs
        if new.max_io_rate_bytes_per_s != old.max_io_rate_bytes_per_s:
            # Bytes still owed are re-priced at the new rate; paused chunks and waiting starts look again.
            self.io_budget.set_rate(new.max_io_rate_bytes_per_s)
            self._budget_gate.rate_changed()
        self.disk_room.set_min_free(new.min_free_space)
        self.pressure.set_threshold(new.disk_pressure)
        self._history.configure(
            max_history=new.max_history,
            health_threshold_s=new.health_threshold_s,
            backoff_base_s=new.backoff_base_s,
            busy_retries=new.busy_retries,
        )
        self._results.configure(max_per_key=new.max_history)
        self._access.set_staleness(new.staleness_s)
        targets = {k: (getattr(old.sqlite, k), getattr(new.sqlite, k)) for k in ("page_size", "auto_vacuum")}
        changed = {k: v for k, (was, v) in targets.items() if was != v}
        if changed:
            # Every database must be looked at again, and the full rescan below reports each
            # one, but a key accepted within `staleness` would be dropped as stale: forgotten,
            # each is examined (a database compacted lately still goes to the upgrade channels).
            forgotten = self._access.forget_all()
            log.info("upgrade targets changed (%s): every database is examined again (%d recently accepted "
                     "key(s) forgotten)", ", ".join(f"{k} {v}" for k, v in changed.items()), forgotten)
        self._access.set_max_size(new.access_max_size)
        if (new.roots, new.allow_hard_links, new.allow_mounts) != (old.roots, old.allow_hard_links, old.allow_mounts):
            self._set_compactor_roots(new)
        for compactor in self._compactors:
            quietly(functools.partial(compactor.configure, new.sqlite, wal_max_size_bytes=new.wal_max_size_bytes,
                                      exact_size_interval_s=new.exact_size_interval_s),
                    "applying a change to a part of the server", log)
        if new.job_timeout_s != old.job_timeout_s:
            self._set_job_timeout(new.job_timeout_s)
        if self._worker is not None and self._workers_from_config:
            self._worker.set_concurrency(new.max_jobs)
        persist_dir = new.state_dir if (new.persist and self._state_dir_ok) else None
        self.intake.debouncer.set_recheck_interval(new.recheck_interval_s)
        now = self._clocks.monotonic()  # the channels' clock (the loop's)
        registry = self._registry
        for name in list(registry.current):
            if name not in new.channels:
                log.info("channel %s removed from the config; closing it", name)
                registry.close(name)
                # Its running jobs finish; a hold left on them would pause them forever.
                quietly(lambda: self.on_hold(name, False), "applying a change to a part of the server", log)
        for name, ch_cfg in new.channels.items():
            channel = registry.current.get(name)
            if channel is None:
                log.info("channel %s added by the config", name)
                registry.open(name, ch_cfg, now)
            else:
                channel.update_settings(ch_cfg, now)
                channel.set_checkpoint_interval(new.checkpoint_interval_s, now)
                if new.persist != old.persist:
                    channel.set_state_dir(persist_dir)
                self.wake(name)
        if self._housekeeping is not None:
            self._housekeeping.config_changed(old, new)
        log.info("config reloaded: %d channel(s)", len(registry.current))

    def _set_job_timeout(self, job_timeout_s: float) -> None:
        """The job type's activity timeout (in the store) and the heartbeat period follow a reload."""
        if self._worker is not None:
            self._worker.job_timeout_s = job_timeout_s
        jobs, scheduler = self._jobs, self._scheduler
        if jobs is not None and scheduler is not None:
            scheduler.background(lambda: jobs.set_type_timeout(self.job_type, job_timeout_s))

    def reload_config(self) -> None:
        """Re-read the config file now (SIGHUP); an invalid file is rejected whole."""
        from smoosh.config import load_config

        if self._config.path is None:
            return
        try:
            result: Config | ConfigError = load_config(self._config.path)
        except ConfigError as e:
            result = e
        self._on_config_change(result)

    def _on_config_change(self, result: Config | ConfigError) -> None:
        if isinstance(result, ConfigError):
            self._config_error = str(result)
            log.error("config edit rejected, the previous config stays in force: %s", result)
            return
        try:
            self.apply_config(result)
        except Exception as e:
            self._config_error = f"could not apply config: {e}"
            log.exception("could not apply the new config")

    def _set_compactor_roots(self, config: Config) -> None:
        """Every compactor that checks roots where it opens a file gets the roots in force.

        As a :class:`~smoosh.identity.Roots`: a tuple of the roots to any compactor, and the
        identity checks' opt-ins to those that make them.
        """
        roots = Roots(config.roots, allow_hard_links=config.allow_hard_links, allow_mounts=config.allow_mounts)
        for compactor in self._compactors:
            compactor.set_roots(roots)
