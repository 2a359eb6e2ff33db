"""The channels' host: the daemon as every channel sees it, and the holds put on channels from outside.

A :class:`~channels.Channel` asks its :class:`~channels.ports.Host` for a global slot, tells it
when its running work must hold, hands it every outcome and asks it to validate a restored
key; the run events of its runs reach it through :meth:`ChannelHost.deliver`. The other way
round, what stops or frees a channel from outside goes through here too: the operator's
suspension (``suspend``/``resume``, and ``flush`` of its queue) and the cluster holds read
from the store.

Owner: the server's :class:`~smoosh.loop.Loop` thread. Channels call the port from their
ticks there, the scheduler delivers run events there, and the server runs the operator
calls and the housekeeping hands the cluster holds there; only :meth:`ChannelHost.wake`
may be called from any thread. The channels themselves are made by the server (its
``_make_channel``), which hands them this host.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any, Callable

from channels.ports import Outcome, RunEvent
from smoosh.daemon.control import control
from smoosh.daemon.control.cluster_holds import Hold, covering

if TYPE_CHECKING:
    from smoosh.config import Config
    from smoosh.daemon.control.budget_gate import BudgetGate
    from smoosh.daemon.control.cluster_cap import CapGate
    from smoosh.daemon.control.pressure import DiskPressure
    from smoosh.daemon.control.store_health import StoreHealth
    from smoosh.daemon.intake.intake import Intake
    from smoosh.daemon.record.outcomes import Outcomes
    from smoosh.daemon.host.registry import ChannelRegistry
    from smoosh.daemon.run.scheduler import JobScheduler
    from smoosh.daemon.control.slots import SlotGate
    from smoosh.daemon.control.suspension import Suspension
    from smoosh.store import Store

__all__ = ["ChannelHost"]

log = logging.getLogger("smoosh.daemon.server")  # an operator's action is the server's line


class ChannelHost:
    """What every channel asks of the daemon (:class:`~channels.ports.Host`), answered on the server's loop.

    Parameters:
        node: this daemon's node name (its holds in the store are written under it).
        registry: the server's channel registry.
        slots: the global ``max_jobs`` gate.
        budget_gate: the starts waiting for the I/O budget.
        intake: validates restored keys, and ends a key's force with its run.
        outcomes: records how runs ended and delivers their events to the channels.
        suspension: the operator's suspensions, saved in ``state_dir``.
        worker_of: this process's worker once the server runs (None before, or with none).
        scheduler_of: the job scheduler once the server runs (None before).
        store_of: the job store once the server runs (None before and after).
        acted: publishes the status at once: an operator would notice the change just made.
        wall_time: the wall clock: channels are ticked on the loop's monotonic clock and read
            their windows in wall time (:meth:`wall_time`).
        config_of: the config in force (a channel's ``under_pressure``).
        pressure: the file systems under disk pressure (:meth:`window_waived`).
        store_health: the job store's health: no start while the store is full or unreachable.
        cap_gate: the starts waiting for a slot of the fleet-wide cap (``cluster_max_jobs``).

    Attributes:
        stopping: set once by the server's ``stop`` (on its caller's thread; a plain flag,
            read here on the loop): from then on no channel gets a slot for a new start,
            so a key its stopping worker gives back stays in its channel.
        cluster_holds: the cluster holds in the store as last read (owner: the loop; the
            server sets the first at start, :meth:`apply_cluster_holds` every later one).
    """

    def __init__(
        self, *, node: str, registry: ChannelRegistry, slots: SlotGate, budget_gate: BudgetGate,
        intake: Intake, outcomes: Outcomes, suspension: Suspension, worker_of: Callable[[], Any],
        scheduler_of: Callable[[], JobScheduler | None], store_of: Callable[[], Store | None],
        acted: Callable[[], None], wall_time: Callable[[], float] = time.time,
        config_of: Callable[[], Config] | None = None, pressure: DiskPressure | None = None,
        store_health: StoreHealth | None = None, cap_gate: CapGate | None = None,
    ) -> None:
        self.node = node
        self._registry = registry
        self._slots = slots
        self._budget_gate = budget_gate
        self._intake = intake
        self._outcomes = outcomes
        self._suspension = suspension
        self._worker_of = worker_of
        self._scheduler_of = scheduler_of
        self._store_of = store_of
        self._acted = acted
        self._wall_time = wall_time
        self._config_of = config_of
        self._pressure = pressure
        self._store_health = store_health
        self._cap_gate = cap_gate
        self._cores = os.cpu_count() or 1
        self.stopping = False
        self.cluster_holds: list[Hold] = []

    # ------------------------------------------------------------------ the port (loop thread)

    def acquire_slot(self, channel: str, *, force: bool = False, forced: bool = False) -> bool:
        """A global slot for ``channel`` (see :class:`~channels.ports.Host`); none once the server stops.

        None either while the I/O budget is in debt: the channel is woken when it is paid
        (:class:`~smoosh.daemon.control.budget_gate.BudgetGate`); nor while the job store is full
        or unreachable: the channel is woken when it is back
        (:class:`~smoosh.daemon.control.store_health.StoreHealth`); nor while the fleet-wide cap
        refused this node's last claim: the channel is woken when a slot is given back
        (:class:`~smoosh.daemon.control.cluster_cap.CapGate`). ``force`` (a run that runs
        already) skips them all; ``forced`` (an operator's forced key is next) passes the backlog
        controller's limit, not ``max_jobs``.
        """
        if self.stopping and not force:
            return False
        if not force and not self._budget_gate.admits(channel):
            return False
        if not force and self._store_health is not None and not self._store_health.admits(channel):
            return False
        if not force and self._cap_gate is not None and not self._cap_gate.admits(channel):
            return False
        return self._slots.acquire(channel, force=force, forced=forced)

    def release_slot(self, channel: str) -> None:
        """Give a slot back; the channels in line for one are woken."""
        self._slots.release(channel)
        for name in self._slots.waiting():
            self.wake(name)

    def withdraw(self, channel: str) -> None:
        """``channel`` waits for no slot now."""
        self._slots.withdraw(channel)

    def wake(self, channel: str) -> None:
        """Tick ``channel`` soon (any thread)."""
        self._registry.wake(channel)

    def wall_time(self) -> float:
        """Unix seconds now: a channel's window is defined in wall time, its ticks are monotonic."""
        return self._wall_time()

    def window_waived(self, channel: str) -> bool:
        """Whether ``channel`` runs outside its window now: a file system under the roots is under
        disk pressure, and the channel has ``under_pressure = ignore_window`` (any thread)."""
        if self._pressure is None or self._config_of is None or not self._pressure.any:
            return False
        settings = self._config_of().channels.get(channel)
        return settings is not None and settings.under_pressure == "ignore_window"

    def concurrency_raised(self, channel: str) -> int:
        """Runs ``channel`` may have at once whatever its own concurrency: while a file system under
        the roots is under disk pressure, as many as the backlog controller lets run (``max_jobs``
        at most) up to one per core; 0 otherwise (any thread). Reclaiming the space is then the
        day's work; more compactions than cores only take turns on them (and a VACUUM's rewrite
        is CPU as much as disk), and the controller still halves its slots at the first harm to
        the application."""
        if self._pressure is None or not self._pressure.any:
            return 0
        return min(self._slots.in_force, self._cores)

    def look_at_windows(self, now: float) -> None:
        """Every channel looks at its window at once (the loop's thread): the wall clock stepped, or
        a disk pressure that waives some windows and raises concurrencies started or ended."""
        for channel in self._registry.current.values():
            channel.check_window(now)

    def set_slots(self, slots: int) -> None:
        """The backlog controller set the node's slots (the loop's thread): more slots wake the
        channels waiting for one (every channel, under disk pressure)."""
        grew = slots > self._slots.soft_limit
        self._slots.soft_limit = slots
        if not grew:
            return
        # Under disk pressure the slots are the channels' concurrency too: every channel may
        # start more (concurrency_raised), not only those in line for a slot.
        pressured = self._pressure is not None and self._pressure.any
        for name in list(self._registry.current) if pressured else self._slots.waiting():
            self.wake(name)

    def admits(self, key: str) -> bool:
        """A key restored from a checkpoint is validated like a new one."""
        return self._intake.admits(key)

    def on_hold(self, channel: str, held: bool) -> None:
        """Running work of ``channel`` holds (or goes on): this process's worker at once, others through the store."""
        worker = self._worker_of()
        if worker is not None:
            worker.set_hold(channel, held)
        store, scheduler = self._store_of(), self._scheduler_of()
        if store is not None and scheduler is not None:
            scheduler.background(lambda: control.set_hold(store, self.node, channel, held))

    def on_outcome(self, channel: str, key: str, outcome: Outcome, now: float) -> float | None:
        """Record how a run ended (see :meth:`Outcomes.on_outcome`); a force ends with its run."""
        self._intake.unforce(key)
        return self._outcomes.on_outcome(channel, key, outcome, now)

    def deliver(self, channel: str, event: RunEvent) -> Any:
        """A run event reaches its channel (see :meth:`Outcomes.deliver`); a dropped run ends a force."""
        if event.kind == "dropped":
            self._intake.unforce(event.key)
        return self._outcomes.deliver(channel, event)

    # ------------------------------------------------------------------ holds from outside (loop thread)

    def cluster_hold_of(self, name: str) -> dict[str, Any] | None:
        """The cluster hold that covers channel ``name`` on this node, as a channel shows it; None if none does."""
        hold = covering(self.cluster_holds, self.node, name)
        return None if hold is None else hold.to_json()

    def apply_cluster_holds(self, holds: list[Hold]) -> None:
        """Hold (or release) every channel as the cluster holds now say (loop thread)."""
        self.cluster_holds = holds
        changed = []
        for name, channel in self._registry.current.items():
            if channel.set_held(self.cluster_hold_of(name)):
                changed.append(name)
        if changed:
            held = [name for name, channel in self._registry.current.items() if channel.status().get("held")]
            # One line for the operator's `smoosh suspend|resume --store`, not one per channel.
            log.info("cluster holds changed for %s: %s", ", ".join(changed),
                     f"now held: {', '.join(held)}" if held else "no channel of this node is held")
            self._acted()  # the node's record in the store shows it now

    def suspend(self, channel: str | None) -> None:
        """Suspend one channel or all, and save it (the server's ``suspend``, run on the loop).

        Raises:
            UnknownChannel: ``channel`` is not configured.
        """
        targets = self._registry.targets(channel)
        self._suspension.suspend(channel)
        for ch in targets:
            ch.suspend()
        # One line per operator action, whatever the number of channels (each channel says
        # its own change at DEBUG): suspending 4 channels wrote 8 lines.
        log.info("suspended %s: nothing starts and running compactions hold until it is resumed",
                 _channels_named(channel, targets))
        self._acted()

    def resume(self, channel: str | None) -> None:
        """Resume one channel or all, and save it (the server's ``resume``, run on the loop).

        Raises:
            UnknownChannel: ``channel`` is not configured.
        """
        targets = self._registry.targets(channel)
        self._suspension.resume(channel, list(self._registry.current))
        for ch in targets:
            ch.resume()
        log.info("resumed %s", _channels_named(channel, targets))
        self._acted()

    def flush(self, channel: str | None) -> int:
        """Empty the waiting queue of one channel or all (the server's ``flush``, run on the loop).

        Returns:
            How many waiting keys were dropped (their staleness forgotten with them).

        Raises:
            UnknownChannel: ``channel`` is not configured.
        """
        dropped = 0
        targets = self._registry.targets(channel)
        for ch in targets:
            for key in ch.flush():
                self._intake.forget_flushed(key)
                dropped += 1
        log.info("flushed %s: %d waiting key(s) dropped", _channels_named(channel, targets), dropped)
        self._acted()
        return dropped


def _channels_named(channel: str | None, targets: list[Any]) -> str:
    """``channel ratio_dbs``, or ``every channel (upgrade_dbs, ratio_dbs)`` for an action on all of them."""
    if channel is not None:
        return f"channel {channel}"
    return f"every channel ({', '.join(ch.name for ch in targets)})" if targets else "every channel (none configured)"
