"""A channel's checkpoint: restored at start, written off the channel's loop, newest wins.

The channel takes snapshots under its own lock (cheap list copies) and hands them here;
the O(n) work (building the mapping, packing, fsync) happens on a writer thread or in the
caller, never under the channel's lock.

Each snapshot gets a sequence number when it is taken. Writes are serialised by one lock
and a write older than the newest one written is skipped, so a slow periodic write can
never bring back a queue that ``flush`` or ``close`` has replaced since. A periodic write
is never started while the previous one still runs. Failures are logged and counted; they
never reach the channel's loop. A failure of the file system (a full disk, a checkpoint path
that is a directory, a permission) is one line naming the file and the error: a traceback
would say nothing more, and it repeats at every interval while the cause lasts.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import threading
from typing import Callable

from persist import (
    CorruptCheckpoint,
    quarantine,
    read_checkpoint,
    remove_stale_temp_files,
    write_checkpoint,
)

__all__ = ["Checkpointer", "checkpoint_mapping"]

#: File name suffix of a channel's checkpoint in ``state_dir``.
CHECKPOINT_SUFFIX = ".smooshq"


def checkpoint_mapping(in_flight: list[str], waiting: list[tuple[str, float]]) -> dict[str, float]:
    """Build the mapping a checkpoint stores.

    Keys in flight come first at infinity, so a successor follows them before anything else
    (and drops them if its priority re-check says they are done); waiting keys follow,
    highest first and oldest first among equals: the order a restore re-creates.

    Parameters
    ----------
    in_flight:
        Keys starting or active.
    waiting:
        ``(key, priority)`` pairs, highest first.

    Returns
    -------
    ``{key: priority}`` in that order.
    """
    mapping: dict[str, float] = dict.fromkeys(in_flight, math.inf)
    for key, priority in waiting:
        mapping.setdefault(key, priority)
    return mapping


class Checkpointer:
    """Reads and writes one channel's ``<state_dir>/<name>.smooshq``.

    Parameters
    ----------
    state_dir:
        The directory of the checkpoint file.
    name:
        The channel's name.
    log:
        The channel's logger.
    on_error:
        Called (from the failing thread) after a failure has been counted in ``errors``.
    """

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        name: str,
        log: logging.Logger,
        on_error: Callable[[], None] = lambda: None,
    ) -> None:
        self.path = os.path.join(os.fspath(state_dir), name + CHECKPOINT_SUFFIX)
        self.name = name
        #: Failed reads, moves and writes since construction.
        self.errors = 0
        self._log = log
        self._on_error = on_error
        self._sequence = itertools.count(1)
        self._write_lock = threading.Lock()
        self._written_seq = 0
        # The channel's change counter as of the last good write: equal -> nothing to write.
        self._written_changes: int | None = None
        self._writer: threading.Thread | None = None

    def restore(self, now_s: float) -> dict[str, float]:
        """Read the checkpoint; a damaged one is moved aside and an empty queue returned.

        Parameters
        ----------
        now_s:
            The current time (names the quarantined file ``.corrupt-<unix seconds>``).

        Returns
        -------
        ``{key: priority}`` as written (``{}`` when missing, damaged or unreadable).
        """
        try:
            # Safe here: no write of this file can be running before the channel exists.
            remove_stale_temp_files(self.path)
        except OSError:
            self._log.debug("Channel %s: could not clean stale temp files.", self.name, exc_info=True)
        try:
            return read_checkpoint(self.path)
        except CorruptCheckpoint as exc:
            try:
                moved = quarantine(self.path, now_s)
            except OSError as move_exc:
                self._log.error("Channel %s: corrupt checkpoint %r could not be moved aside (%s).",
                                self.name, self.path, _os_error_text(move_exc))
                self.errors += 1
                moved = self.path
            self._log.error(
                "Channel %s: checkpoint %r is corrupt (%s); moved it to %r and starting empty.",
                self.name, self.path, exc.reason, moved,
            )
        except OSError as exc:
            self._log.error("Channel %s: could not read checkpoint %r (%s); starting empty.",
                            self.name, self.path, _os_error_text(exc))
            self.errors += 1
        return {}

    def restored(self, changes: int) -> None:
        """Note that the file holds exactly the channel's state at change count ``changes``."""
        self._written_changes = changes

    def next_seq(self) -> int:
        """A sequence number for a snapshot; take it under the same lock as the snapshot."""
        return next(self._sequence)

    def is_current(self, changes: int) -> bool:
        """Whether the file already holds the state at change count ``changes``."""
        return self._written_changes == changes

    def busy(self) -> bool:
        """Whether a background write is still running."""
        writer = self._writer
        return writer is not None and writer.is_alive()

    def write_async(self, seq: int, in_flight: list[str], waiting: list[tuple[str, float]], changes: int) -> None:
        """Write a snapshot on a new daemon thread (call only when not :meth:`busy`)."""
        writer = threading.Thread(
            target=lambda: self.write(seq, checkpoint_mapping(in_flight, waiting), changes),
            name=f"smoosh-checkpoint-{self.name}",
            daemon=True,
        )
        self._writer = writer
        writer.start()

    def write(self, seq: int, mapping: dict[str, float], changes: int) -> bool:
        """Write snapshot ``seq`` now, unless a newer one was written already.

        Returns
        -------
        False when the write failed (logged and counted), True otherwise.
        """
        with self._write_lock:
            if seq <= self._written_seq:
                return True
            try:
                write_checkpoint(self.path, mapping)
            except Exception as exc:
                if isinstance(exc, OSError):
                    self._log.warning("Channel %s: could not write checkpoint %r (%s).",
                                      self.name, self.path, _os_error_text(exc))
                else:  # a key or priority it cannot store: a bug, worth its traceback
                    self._log.warning("Channel %s: could not write checkpoint %r.", self.name, self.path, exc_info=True)
                self.errors += 1
                failed = True
            else:
                self._written_seq = seq
                self._written_changes = changes
                failed = False
        if failed:
            self._on_error()  # outside the write lock: it takes the channel's lock
            return False
        self._log.debug("Channel %s: checkpointed %d key(s).", self.name, len(mapping))
        return True

    def join(self, timeout: float | None = None) -> bool:
        """Wait for a background write to end; True if none is running now."""
        writer = self._writer
        if writer is not None:
            writer.join(timeout)
            return not writer.is_alive()
        return True


def _os_error_text(exc: OSError) -> str:
    """An ``OSError`` in one line: the system's words, without the path the message names already."""
    return exc.strerror or str(exc)
