"""Offering a key to the channels: the first that prices it above 0 queues it (an intake thread).

The intake measures and prices a key (:class:`~smoosh.daemon.intake.router.Router`); this walks the
channels in the operator's order and hands the key to the first that wants it, keeping one
key, one job (a key that runs already is not queued again), a crash's backoff (the key waits
it out in the channel) and a force (at the top of its channel, out of any backoff). It also
says in words what holds a channel back (``holds``), for ``?wait=1`` verdicts and
``smoosh explain``.

Owner: none of its own; it reads the registry's current channels (a whole map, replaced,
never changed in place) and writes only through a channel's ``enqueue``/``force``/``defer``
(the channel's lock) and the history table (its lock), so any thread may call it.
"""

from __future__ import annotations

import logging
import math
from datetime import datetime, timezone
from typing import Any, Callable, Mapping

from channels import Channel
from smoosh.clocks import Clocks
from smoosh.config import ChannelConfig, Config
from smoosh.daemon.history import ADDED, HistoryTable
from smoosh.daemon.control.slots import SlotGate
from smoosh.daemon.intake.verdicts import Offered, forced_note, hold_reasons
from smoosh.paths import CLEANUP_PREFIX
from smoosh.priority import quantize

__all__ = ["Offers"]

log = logging.getLogger("smoosh.daemon.server")  # the queueing lines keep the server's logger


class Offers:
    """Hands priced keys to channels (see the module docstring).

    Parameters:
        channels: the registry's current channels, by name.
        config_of: the config in force.
        scheduler_of: the job scheduler once the server runs (None before): asked which keys run.
        history: records a key's addition, and holds its backoff.
        slots: the global ``max_jobs`` gate, for the words of ``holds``.
        clocks: the daemon's clocks: wall time for the history and the window, monotonic time
            for a backoff (the channels' clock).
        dry_run: the daemon only reports what it would do.
        pressure: whether a key's file system is under disk pressure
            (:meth:`~smoosh.daemon.control.pressure.DiskPressure.on`): such a key is queued at the
            bytes it would reclaim when that is above its channel's priority (worst first).
    """

    def __init__(
        self, *, channels: Callable[[], Mapping[str, Channel]], config_of: Callable[[], Config],
        scheduler_of: Callable[[], Any], history: HistoryTable, slots: SlotGate, clocks: Clocks,
        dry_run: bool, pressure: Callable[[str], bool] = lambda key: False,
    ) -> None:
        self._channels = channels
        self._config_of = config_of
        self._scheduler_of = scheduler_of
        self._history = history
        self._slots = slots
        self._clocks = clocks
        self.dry_run = dry_run
        self._pressure = pressure

    def offer(self, key: str, names: tuple[str, ...], cfg: Config, priority_of: Callable[[ChannelConfig], float],
               sizes: Any, *, force: bool = False) -> Offered:
        """Hand ``key`` to the first of ``names`` that prices it above 0 (an intake thread); true when queued.

        With ``force`` a key no channel prices above 0 goes to the first channel that
        considers it (its ``match``), preferring one that is not an upgrade channel (an
        upgrade channel's priority says whether the database needs one, not how urgently).
        """
        channels = self._channels()
        considered: list[str] = []
        for name in names:
            ch_cfg = cfg.channels.get(name)
            channel = channels.get(name)
            if ch_cfg is None or channel is None or not ch_cfg.matches(key):
                continue
            considered.append(name)
            priority = priority_of(ch_cfg)
            if priority:
                return self._take(key, name, channel, quantize(self.worst_first(key, priority, sizes)), force=force)
        if force and considered:
            name = next((n for n in considered if cfg.channels[n].priority != "upgrade"), considered[0])
            channel = channels.get(name)
            if channel is not None:
                return self._take(key, name, channel, 0.0, force=True)
        return Offered()

    def worst_first(self, key: str, priority: float, sizes: Any) -> float:
        """``priority`` (a channel's, above 0) raised to the bytes ``key`` would reclaim while its
        file system is under disk pressure; unchanged otherwise (any thread).

        Under pressure the largest reclaim goes first, whatever the channel's method: space
        back soonest is what a filling disk needs, not the best ratio.
        """
        if priority and sizes is not None and self._pressure(key):
            return max(priority, float(sizes.reclaimable_bytes))
        return priority

    def reprice(self, sizes_of: Callable[[str], Any], price: Callable[[ChannelConfig, str, Any], float]) -> int:
        """Move every waiting key of every channel to its priority as things are now (the loop thread).

        Called as disk pressure starts or ends: a backlog queued on a normal day by ratio
        would otherwise keep that order on a filling disk until each key's next event (and
        keep its pressure order after the pressure ends). Only the order within a channel
        changes; no key changes channel. Left alone: forced and taken-back keys (priority
        infinity, at the top whatever their sizes), cleanup keys (priced by their own rule),
        keys with no measurement in this process, and keys the channel no longer prices above
        0 (their start's re-check drops them).

        Parameters:
            sizes_of: a key's last measurement (its sizes), or None.
            price: ``(channel config, key, sizes) -> priority``, the channel's own (unquantized).

        Returns:
            How many keys moved.
        """
        cfg = self._config_of()
        moved = 0
        for name, channel in self._channels().items():
            ch_cfg = cfg.channels.get(name)
            if ch_cfg is None:
                continue
            for key, current in channel.waiting():
                if math.isinf(current) or key.startswith(CLEANUP_PREFIX):
                    continue
                sizes = sizes_of(key)
                if sizes is None:
                    continue
                base = price(ch_cfg, key, sizes)
                if not base:
                    continue
                new = quantize(self.worst_first(key, base, sizes))
                if new != current and channel.enqueue(key, new):
                    moved += 1
        return moved

    def _take(self, key: str, name: str, channel: Channel, quantized: float, *, force: bool) -> Offered:
        """Queue ``key`` in ``channel`` (forced: at its top, out of any backoff), unless it runs already."""
        scheduler = self._scheduler_of()
        run = scheduler.run_of(key) if scheduler is not None else None
        if run is not None:  # one key, one job: it runs (or is starting) already
            return Offered(reason=f"already running in channel {run.channel}")
        taken = channel.force(key) if force else channel.enqueue(key, quantized)
        if not taken:
            # Taken all the same (the key is not offered elsewhere), but it does not wait here.
            return Offered(name, quantized, f"already running in channel {name}" if key in channel.in_flight()
                           else f"channel {name} is full and its priority {quantized!r} is the lowest")
        now = self._clocks.wall()
        if force:
            self._history.record(key, ADDED, now, channel=name, reason="forced")
            log.info("%r forced into %s", key, name)
            return Offered(name, math.inf, note=forced_note(self.holds(name, forced=True)))
        rec = self._history.get(key)
        retry_mono = rec.retry_mono if rec is not None else None
        if retry_mono is not None and retry_mono > self._clocks.monotonic():
            # Crashing (or busy) still: it waits out its backoff in the channel, on the
            # monotonic clock (a wall clock set back would keep it there for the step).
            channel.defer(key, quantized, retry_mono)
        else:
            self._history.record(key, ADDED, now, channel=name)
        log.debug("%r queued in %s at priority %r", key, name, quantized)
        return Offered(name, quantized)

    def holds(self, name: str, *, forced: bool = False) -> list[str]:
        """What keeps channel ``name`` from starting its next key now, in words (any thread).

        ``forced``: for a forced key, which the start-up pause does not hold back.
        """
        channel = self._channels().get(name)
        if channel is None:
            return [f"channel {name} is closed"]
        ch_cfg = self._config_of().channels.get(name)
        window = getattr(ch_cfg, "window", None)
        status = channel.status()
        next_open = None
        if window is not None and not status.get("in_window", True):
            now = self._clocks.wall()
            next_open = window.next_open(datetime.fromtimestamp(now, timezone.utc)).timestamp()
        paused_until = None if forced else channel.paused_until
        return hold_reasons(
            name, status, window=window, next_open=next_open,
            paused_until=None if paused_until is None else self._clocks.wall_at(paused_until),
            slots_busy=self._slots.busy, max_jobs=self._slots.limit if forced else self._slots.in_force,
            dry_run=self.dry_run,
        )
