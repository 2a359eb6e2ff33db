"""A channel's side of its checkpoint: when it is written, and which restored keys it takes.

The file itself (sequence numbers, the writer thread, newest wins, a damaged file moved aside)
is :class:`~channels.checkpointer.Checkpointer`'s. :class:`ChannelCheckpoints`, a part of
:class:`~channels.channel.Channel`, decides the rest:

* when: a periodic checkpoint every ``checkpoint_interval_s`` (a phase of the tick), skipped
  while the previous write still runs and when the content has not changed since the file
  was written (``_changes``); the snapshot is cheap copies taken under the channel's lock,
  written on the checkpointer's thread;
* what a restore takes, at construction: the file's keys, highest first, each one admitted by
  the host like a new key, as many as the capacity holds; the file is rewritten unless it
  holds exactly the restored queue;
* live changes: checkpointing switched on or off, and its interval.
"""

from __future__ import annotations

import os

from channels.channel_state import ChannelState
from channels.checkpointer import Checkpointer

__all__ = ["ChannelCheckpoints"]


class ChannelCheckpoints(ChannelState):
    """The checkpoint side of a channel: the periodic write, the restore, and their live settings."""

    _checkpoint_interval_s: float
    _next_checkpoint_at: float

    def set_state_dir(self, state_dir: str | os.PathLike[str] | None) -> None:
        """Turn checkpointing on (into ``state_dir``) or off (None), live; the file is not read now.

        Turned on, the channel's state is written at the next checkpoint; turned off, the
        last file stays where it is (a restart with persistence on restores it).
        """
        with self._lock:
            if state_dir is None:
                self._checkpointer = None
            elif self._checkpointer is None:
                self._checkpointer = Checkpointer(state_dir, self.name, self._log, self._on_checkpoint_error)
            self._changes += 1
            self._publish_locked()

    def set_checkpoint_interval(self, interval_s: float, now: float) -> None:
        """Change the checkpoint interval live; the next checkpoint is due at most one interval from now."""
        self._checkpoint_interval_s = float(interval_s)
        self._next_checkpoint_at = min(self._next_checkpoint_at, now + self._checkpoint_interval_s)

    def join_checkpoint(self, timeout: float | None = None) -> bool:
        """Wait for a background checkpoint write to end; True if none is running now."""
        return self._checkpointer is None or self._checkpointer.join(timeout)

    def _on_checkpoint_error(self) -> None:
        with self._lock:
            self._publish_locked()

    def _maybe_checkpoint(self, now: float) -> None:
        checkpointer = self._checkpointer
        if checkpointer is None or now < self._next_checkpoint_at:
            return
        self._next_checkpoint_at = now + self._checkpoint_interval_s
        if checkpointer.busy():
            self._log.debug("Channel %s: previous checkpoint still running; skipped.", self.name)
            return
        with self._lock:
            if checkpointer.is_current(self._changes):
                return  # the file already holds exactly this state
            seq, changes = checkpointer.next_seq(), self._changes
            in_flight, waiting = self._snapshot_locked()
        checkpointer.write_async(seq, in_flight, waiting, changes)

    def _restore(self, now: float) -> None:
        checkpointer = self._checkpointer
        if checkpointer is None:
            return
        mapping = checkpointer.restore(self._wall_time(now))  # a damaged file is set aside under a date
        # Stable sort: equal priorities keep the file's (oldest-first) order.
        entries = sorted(mapping.items(), key=lambda item: item[1], reverse=True)
        refused = [key for key, _ in entries if not self._host.admits(key)]
        if refused:
            # Restored keys are validated like new ones: a checkpoint is a file anyone with
            # access to state_dir could have written. The host says why each one is refused.
            entries = [(key, priority) for key, priority in entries if key not in set(refused)]
            self._changes += 1  # the file no longer matches the queue: rewrite it
        capacity = self._queue.capacity
        for key, priority in entries[:capacity]:
            self._queue.push(key, priority)
        dropped = max(0, len(entries) - capacity)
        if not dropped and not refused:
            checkpointer.restored(self._changes)  # the file holds exactly this state
        if entries:
            self._log.info(
                "Channel %s: restored %d key(s) from %r (%d dropped over capacity).",
                self.name, min(len(entries), capacity), checkpointer.path, dropped,
            )
