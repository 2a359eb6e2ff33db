"""A channel's shared state: what its parts share, the status snapshot, and the readers of any thread.

:class:`ChannelState` is the base of :class:`~channels.channel.Channel` and of its other
parts (:class:`~channels.channel_runs.ChannelRuns`,
:class:`~channels.channel_checkpoints.ChannelCheckpoints`). It declares the state those parts
share, which the channel's constructor sets up, and owns everything that reads it from
outside the owner's loop thread: :meth:`~ChannelState.status`, :meth:`~ChannelState.keys`,
:meth:`~ChannelState.waiting` and :meth:`~ChannelState.try_snapshot`.

``_lock`` guards only what those readers (and :meth:`Channel.enqueue
<channels.channel.Channel.enqueue>`, from the intake's threads) share with the owner: the
waiting keys and the run tables. It is held for dictionary work and never across a call to
the host or the scheduler. :meth:`~ChannelState.status` takes no lock at all: it returns an
immutable snapshot, rebuilt under the lock on every change (:meth:`_publish_locked`) and
swapped in with one attribute store.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Mapping, Protocol

from channels.checkpointer import Checkpointer
from channels.ports import Host, Scheduler
from channels.priority_queue import PriorityQueue
from channels.waiting import Waiting
from channels.window import Window

__all__ = ["ChannelSettings", "ChannelState", "Run"]


class ChannelSettings(Protocol):
    """What a channel reads from its settings (smoosh's ``ChannelConfig`` fits)."""

    @property
    def capacity(self) -> int: ...
    @property
    def concurrency(self) -> int: ...
    @property
    def window(self) -> Window | None: ...
    @property
    def strict_window(self) -> bool: ...


@dataclass(eq=False)
class Run:
    """One key the channel handed to its scheduler (starting or active)."""

    key: str
    priority: float
    token: int = -1
    slot: bool = True  # holds one of the host's global slots, given back when the run ends


class ChannelState:
    """The state a channel's parts share, set up by :class:`~channels.channel.Channel`; the readers.

    The suffix ``_locked`` marks a method its caller must call holding ``_lock``.
    """

    name: str
    _log: logging.Logger
    _settings: ChannelSettings
    _scheduler: Scheduler
    _host: Host
    _checkpointer: Checkpointer | None
    _lock: threading.Lock
    _paused: bool
    _suspended: bool
    _held: Mapping[str, Any] | None  # an outside hold (smoosh: a cluster hold), as its status shows it
    _in_window: bool
    _waiting: Waiting
    _queue: PriorityQueue  # the waiting keys' queue (``_waiting.queue``)
    _starting: dict[str, Run]
    _active: dict[str, Run]
    _forced: dict[str, None]
    _unpause_at: float
    _changes: int  # bumped whenever the checkpoint's content changes
    _closed: bool
    _status: dict[str, Any]

    # -- readers (any thread) --------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The published status snapshot; never waits on the channel.

        Returns:
            ``{"active", "starting", "waiting": {"size", "min", "max"}, "deferred", "paused",
            "suspended", "held", "in_window", "holding", "evicted", "concurrency",
            "checkpoint_errors"}`` (a copy). ``suspended`` is the channel's own suspension,
            ``held`` the outside hold (None, or what :meth:`Channel.set_held` was given),
            ``waiting`` the keys that could start (queued, or set aside by rotation),
            ``deferred`` the keys waiting out a not-before time (not in ``waiting``),
            ``holding`` whether running work must hold (either of those, or a strict window
            that is closed).
        """
        snapshot = self._status  # one attribute load: the snapshot is never mutated
        return {**snapshot, "waiting": dict(snapshot["waiting"])}

    def keys(self) -> set[str]:
        """Every key waiting, deferred, starting or active in this channel."""
        with self._lock:
            return self._keys_locked()

    def try_snapshot(self, timeout_s: float = 0.05) -> tuple[set[str], list[tuple[str, float]]] | None:
        """``(keys(), waiting())`` taken together, or None if the channel stays busy past ``timeout_s``.

        For readers that must never wait on a slow or stuck channel (the status table).
        """
        if not self._lock.acquire(timeout=timeout_s):
            return None
        try:
            return self._keys_locked(), self._waiting_locked()
        finally:
            self._lock.release()

    def head(self, offset: int, limit: int, timeout_s: float = 0.5) -> tuple[list[dict[str, Any]], int] | None:
        """One page of the waiting keys in the order they would start, or None if the channel stays
        busy past ``timeout_s`` (any thread; a reader never waits on a stuck channel).

        The forced keys first (they start before the rest, oldest first), then the queue, highest
        first, then the keys set aside by rotation, then the deferred ones, earliest first (see
        :meth:`channels.waiting.Waiting.page`). Bounded by the page, whatever the queue's length.

        Returns:
            ``(rows, total)``: per key ``{"key", "priority", "place", "position"}`` (``position``:
            1 for the next to start; ``forced`` true for a forced key; a deferred key's
            ``not_before`` on the owner's clock), and how many keys wait in all.
        """
        if not self._lock.acquire(timeout=timeout_s):
            return None
        try:
            forced = [key for key in self._forced if key in self._queue]
            rows = self._waiting.page(offset, limit, forced)
            total = len(self._waiting)
        finally:
            self._lock.release()
        forced_set = set(forced)
        for i, row in enumerate(rows):
            row["position"] = offset + i + 1
            if row["key"] in forced_set:
                row["forced"] = True
        return rows, total

    def locate(self, key: str) -> dict[str, Any] | None:
        """Where ``key`` is in this channel, or None when it is not here (any thread).

        Returns:
            ``{"place": "starting" | "active", "priority"}`` for a run;
            ``{"place": "queue", "priority", "position"}`` (1: it starts next),
            ``{"place": "benched", "priority"}`` (set aside by rotation) or
            ``{"place": "deferred", "priority", "not_before"}`` (waiting out a backoff)
            for a waiting key; with ``"forced": True`` for a key an operator forced.
        """
        with self._lock:
            for place, runs in (("starting", self._starting), ("active", self._active)):
                run = runs.get(key)
                if run is not None:
                    return {"place": place, "priority": run.priority}
            found = self._waiting.where(key)
            if found is not None and key in self._forced:
                found["forced"] = True
                # Forced keys start before the rest of the queue, oldest first.
                found["position"] = list(self._forced).index(key) + 1
            return found

    @property
    def paused_until(self) -> float | None:
        """When the start-up pause ends (the owner's clock), or None when the channel is not paused (any thread)."""
        return self._unpause_at if self._paused else None

    def waiting(self) -> list[tuple[str, float]]:
        """The waiting ``(key, priority)`` pairs, highest first (oldest among equals).

        Keys set aside after a rotation come after the queue, deferred keys last.
        """
        with self._lock:
            return self._waiting_locked()

    def __repr__(self) -> str:
        s = self._status
        return f"<Channel {self.name} active={s.get('active')} starting={s.get('starting')} waiting={s.get('waiting')}>"

    def _wall_time(self, now: float) -> float:
        """Unix seconds now: the host's wall clock, or ``now`` when the host ticks in wall time."""
        wall = self._host.wall_time()
        return now if wall is None else float(wall)

    # -- under the lock ----------------------------------------------------------------------------

    def _keys_locked(self) -> set[str]:
        keys = self._waiting.keys()
        keys.update(self._starting, self._active)
        return keys

    def _waiting_locked(self) -> list[tuple[str, float]]:
        return self._waiting.items()

    def _stopped_locked(self) -> bool:
        """Whether an operator stopped the channel: its own suspension or an outside hold."""
        return self._suspended or self._held is not None

    def _held_locked(self) -> bool:
        """Whether running work must hold: the channel is stopped, or outside its strict window."""
        return self._stopped_locked() or (bool(self._settings.strict_window) and not self._in_window)

    def _changed_locked(self) -> None:
        """The checkpoint's content changed: note it and republish the status."""
        self._changes += 1
        self._publish_locked()

    def _concurrency_locked(self) -> int:
        """The runs this channel may have at once: its ``concurrency``, or more while the host
        raises it (``concurrency_raised``: smoosh under disk pressure); 0 stays 0."""
        configured = self._settings.concurrency
        if configured <= 0:
            return configured
        try:
            return max(configured, int(self._host.concurrency_raised(self.name)))
        except Exception:
            self._log.exception("Channel %s: concurrency_raised failed; keeping its own concurrency.", self.name)
            return configured

    def _publish_locked(self) -> None:
        self._status = {
            "active": len(self._active),
            "starting": len(self._starting),
            "waiting": self._waiting.info(),
            "deferred": self._waiting.deferred,
            "paused": self._paused,
            "suspended": self._suspended,
            "held": None if self._held is None else dict(self._held),
            "in_window": self._in_window,
            "holding": self._held_locked(),
            "evicted": self._queue.evicted,
            "concurrency": self._concurrency_locked(),
            "checkpoint_errors": 0 if self._checkpointer is None else self._checkpointer.errors,
        }

    def _snapshot_locked(self) -> tuple[list[str], list[tuple[str, float]]]:
        """The checkpoint's content as cheap copies; the mapping is built outside the lock."""
        return [*self._starting, *self._active], self._waiting_locked()
