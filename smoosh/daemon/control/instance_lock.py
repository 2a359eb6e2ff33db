"""One daemon per ``state_dir``: an exclusive lock on ``<state_dir>/smoosh.lock`` (DESIGN §10).

Two daemons on one ``state_dir`` would write the same checkpoints and take each other's jobs.
The lock is an ``flock`` on an open descriptor, so the kernel releases it when the process
dies however it dies (kill -9 included): a stale lock file never blocks a restart. The file
holds the PID of the holder, for the message a second daemon prints.

The lock fails closed: a daemon that cannot take it (the file cannot be created on a full
or read-only ``state_dir``), or cannot verify that the file it locked is the one the path
names (it was removed or replaced meanwhile, so a second daemon would lock another), does
not start (:class:`LockFailed`). Only the PID is best effort: on a disk too full to write
it the lock still holds, and a second daemon names no PID.
"""

from __future__ import annotations

import fcntl
import logging
import os

from smoosh.errors import SmooshError

__all__ = ["InstanceLock", "InstanceLocked", "LockFailed", "LOCK_FILE", "prepare_state_dir"]

log = logging.getLogger(__name__)

#: The lock file's name inside ``state_dir``.
LOCK_FILE = "smoosh.lock"


class InstanceLocked(SmooshError):
    """Raised when another daemon holds the lock of a ``state_dir``."""

    def __init__(self, path: str, pid: int | None) -> None:
        holder = f"pid {pid}" if pid else "another process"
        super().__init__(f"another smoosh is running on this state_dir: {path} is locked by {holder}")
        self.path = path
        self.pid = pid


class LockFailed(SmooshError):
    """Raised when the lock of a ``state_dir`` cannot be taken or verified (the daemon does not start)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"cannot lock {path}: {reason}; refusing to start without it "
                         "(it keeps a second daemon off this state_dir)")
        self.path = path
        self.reason = reason


class InstanceLock:
    """The exclusive lock of one ``state_dir``; :meth:`acquire` then :meth:`release`.

    Parameters:
        state_dir: the directory (created if missing, as the daemon's first use of it).
    """

    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, LOCK_FILE)
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, verify it, and write this process's PID into the file.

        Raises:
            InstanceLocked: another process holds it (the message names the file and its PID).
            LockFailed: the file cannot be opened or locked, or the path names another file
                than the one locked (removed or replaced meanwhile).
        """
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise LockFailed(self.path, e.strerror or str(e)) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise InstanceLocked(self.path, pid) from None
        except OSError as e:
            os.close(fd)
            raise LockFailed(self.path, e.strerror or str(e)) from None
        # The lock is on the file this descriptor opened: if the path names another one now
        # (removed, renamed over), a second daemon would lock that one undisturbed.
        try:
            locked, named = os.fstat(fd), os.stat(self.path)
        except OSError as e:
            reason: str | None = e.strerror or str(e)
        else:
            same = (locked.st_dev, locked.st_ino) == (named.st_dev, named.st_ino)
            reason = None if same else "the file was replaced while it was being locked"
        if reason is not None:
            os.close(fd)
            raise LockFailed(self.path, reason)
        self._fd = fd
        _write_pid(fd, self.path)

    def release(self) -> None:
        """Give the lock up (idempotent). The file stays: removing it could race a new holder."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor releases the flock


def prepare_state_dir(state_dir: str) -> bool:
    """Create ``state_dir`` and check that checkpoints can be written there; False (logged) if not.

    A daemon whose state_dir cannot keep checkpoints (a full disk) still compacts once it holds
    the directory's lock: its queues are only not checkpointed.
    """
    from persist import check_setup

    try:
        os.makedirs(state_dir, exist_ok=True)
        check_setup(state_dir)
        return True
    except Exception as e:
        log.error("queues will not be checkpointed: %s", e)
        return False


def _write_pid(fd: int, path: str) -> None:
    """Write this process's PID into the locked file, best effort (the lock holds without it).

    Written over the old content before the file is cut to length: on a full disk an
    existing file's block is rewritten in place, where truncating first would need a new one.
    """
    text = f"{os.getpid()}\n".encode()
    try:
        os.pwrite(fd, text, 0)
        os.ftruncate(fd, len(text))
    except OSError as e:
        log.warning("locked %s, but could not write this process's PID into it (%s): "
                    "a second daemon on this state_dir will not name it", path, e.strerror or e)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        return int(text) if text.isdigit() else None
    except OSError:
        return None
