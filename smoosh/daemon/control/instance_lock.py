"""One daemon per ``state_dir``: an exclusive lock on ``<state_dir>/smoosh.lock`` (DESIGN §10).

Two daemons on one ``state_dir`` would write the same checkpoints and take each other's jobs.
The lock is an ``flock`` on an open descriptor, so the kernel releases it when the process
dies however it dies (kill -9 included): a stale lock file never blocks a restart. The file
holds the PID of the holder, for the message a second daemon prints.
"""

from __future__ import annotations

import fcntl
import logging
import os

from smoosh.errors import SmooshError

__all__ = ["InstanceLock", "InstanceLocked", "LOCK_FILE", "prepare_state_dir"]

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


class InstanceLock:
    """The exclusive lock of one ``state_dir``; :meth:`acquire` then :meth:`release`.

    Parameters:
        state_dir: the directory (it must exist).
    """

    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, LOCK_FILE)
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock and write this process's PID into the file.

        Raises:
            InstanceLocked: another process holds it (the message names the file and its PID).
            OSError: the file cannot be opened.
        """
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise InstanceLocked(self.path, pid) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def take(self) -> None:
        """:meth:`acquire`, for a daemon that runs on regardless of an unusable ``state_dir``.

        Raises:
            InstanceLocked: another daemon runs on it.
        """
        try:
            self.acquire()
        except OSError as e:
            # An unusable state_dir was reported already; the daemon runs without checkpoints.
            log.error("cannot lock %s: %s; nothing stops a second daemon on it", self.path, e)

    def release(self) -> None:
        """Give the lock up (idempotent). The file stays: removing it could race a new holder."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor releases the flock


def prepare_state_dir(state_dir: str) -> bool:
    """Create ``state_dir`` and check that checkpoints can be written there; False (logged) if not.

    A daemon whose state_dir is unusable still compacts: its queues are only not checkpointed.
    """
    from persist import check_setup

    try:
        os.makedirs(state_dir, exist_ok=True)
        check_setup(state_dir)
        return True
    except Exception as e:
        log.error("queues will not be checkpointed: %s", e)
        return False


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        return int(text) if text.isdigit() else None
    except OSError:
        return None
