"""The channel registry: every channel by name, and the loop task that ticks each one.

Owner: the server's :class:`~smoosh.loop.Loop` thread. Channels are opened, closed and
restarted only there; other threads read :attr:`ChannelRegistry.current`, a dict that is
replaced whole (never changed in place), so a reader always sees a complete registry and a
restarted channel's name is never missing from it.
"""

from __future__ import annotations

import logging
from typing import Callable

from channels import Channel
from smoosh.config import ChannelConfig
from smoosh.errors import UnknownChannel
from smoosh.loop import Loop, quietly

__all__ = ["ChannelRegistry"]

log = logging.getLogger(__name__)


class _ChannelTask:
    """Ticks one channel on the loop; a channel whose tick escapes with an error is restarted."""

    def __init__(self, registry: ChannelRegistry, name: str) -> None:
        self.registry = registry
        self.name = name

    def tick(self, now: float) -> float | None:
        channel = self.registry.current.get(self.name)
        if channel is None:
            return None
        try:
            return channel.tick(now)
        except (Exception, SystemExit):
            log.exception("channel %s crashed; restarting it from its checkpoint", self.name)
            self.registry.restart(self.name)
            return now


class ChannelRegistry:
    """The channels by name (see the module docstring for who may call what).

    Parameters:
        loop: the server's loop; each channel is a task on it.
        make: builds a channel from its name, its settings and the time now.
        settings_of: a channel's settings in the config in force, or None once it is removed.
        clock: the loop's clock (monotonic): a channel restarted after a crash opens at its now.
    """

    def __init__(
        self,
        loop: Loop,
        *,
        make: Callable[[str, ChannelConfig, float], Channel],
        settings_of: Callable[[str], ChannelConfig | None],
        clock: Callable[[], float],
    ) -> None:
        self._loop = loop
        self._make = make
        self._settings_of = settings_of
        self._clock = clock
        self.current: dict[str, Channel] = {}
        self._tasks: dict[str, _ChannelTask] = {}

    def open(self, name: str, settings: ChannelConfig, now: float) -> None:
        """Open (or reopen) channel ``name``: restored from its checkpoint, ticked by its task."""
        channel = self._make(name, settings, now)
        self.current = {**self.current, name: channel}
        task = self._tasks.get(name)
        if task is None:
            task = self._tasks[name] = _ChannelTask(self, name)
            self._loop.add(task, f"channel {name}")
        else:
            self._loop.wake(task)  # a restarted channel: the same task ticks the new one

    def close(self, name: str, *, checkpoint: bool = True) -> None:
        """Take channel ``name`` out and close it (its queue checkpointed unless told not to)."""
        channel = self.current.get(name)
        if channel is None:
            return
        self.current = {n: c for n, c in self.current.items() if n != name}
        task = self._tasks.pop(name, None)
        if task is not None:
            self._loop.remove(task)
        quietly(lambda: channel.close(checkpoint=checkpoint), "closing a channel", log)

    def restart(self, name: str) -> None:
        """Replace a crashed channel by one restored from its checkpoint, with no gap in the registry.

        The old channel checkpoints while it is still registered; the new one takes its place
        in one assignment, so a reader on another thread never finds the name missing. A
        channel the config no longer has is closed instead.
        """
        settings = self._settings_of(name)
        old = self.current.get(name)
        if settings is None or old is None:
            self.close(name)
            return
        quietly(lambda: old.close(checkpoint=True), "closing a channel", log)
        self.open(name, settings, self._clock())

    def close_all(self) -> None:
        """Close every channel, each checkpointed."""
        for name in list(self.current):
            self.close(name)

    def wake(self, name: str) -> None:
        """Tick channel ``name`` soon (any thread)."""
        task = self._tasks.get(name)
        if task is not None:
            self._loop.wake(task)

    def targets(self, name: str | None) -> list[Channel]:
        """Channel ``name``, or every channel when None.

        Raises:
            UnknownChannel: ``name`` is not configured.
        """
        if name is None:
            return list(self.current.values())
        channel = self.current.get(name)
        if channel is None:
            raise UnknownChannel(name)
        return [channel]
