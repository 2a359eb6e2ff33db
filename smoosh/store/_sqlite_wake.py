"""What the SQLite store's watch poller sleeps on, and the doorbell that wakes it across processes.

Another process's commit moves ``PRAGMA data_version``, which the poller reads every
``poll_interval_s`` (longer after a quiet spell). So a job crossing processes was heard of a
poll late: a ``smoosh worker`` learnt of each job its daemon added a poll after the add, and
the daemon of each finish a poll after the finish.

So every process rings a doorbell after each commit: a one-byte write of the file
``PATH-wake`` beside the store. While other processes commit, the poller listens for it
(inotify on the bell's file), and another process's commit wakes it at once;
the poll stays, as the safety net. The bell, not the ``-wal``: SQLite writes a commit's frames
to the ``-wal`` first, then waits for their ``fsync``, and only then makes the commit visible
(in the ``-shm``, which is mapped and so makes no event), so a poller woken by the ``-wal``
would mostly read the version before it; and each frame's write would wake it again.

Listening is kept for while other processes commit. A process that alone writes its store
(a daemon running its own compactions) would otherwise be woken by its own bell, for
nothing: the poller turns listening on when a poll finds another process's commit, and off
after :data:`LISTEN_QUIET_S` without one (``SqliteStore._poll_loop``).

Where inotify is missing (not Linux, ``inotify_simple`` not installed, the watches used up)
or the bell cannot be written, the poller polls, as before.

Owners: the store's poller thread waits on its :class:`PollWake` and listens; the store's
close closes it once that thread has ended; any thread may :meth:`PollWake.set`. The store's
committer rings its :class:`Doorbell` (one commit group at a time); the store closes it after
the committer.
"""

from __future__ import annotations

import logging
import math
import os
import select
import threading
import time
from typing import Any, Callable

log = logging.getLogger("smoosh.store.sqlite")

__all__ = ["BELL_SUFFIX", "Doorbell", "LISTEN_QUIET_S", "PollWake"]

#: Seconds without another process's commit after which the poller stops listening for them.
LISTEN_QUIET_S = 60.0
#: The doorbell's file is the store's path with this after it.
BELL_SUFFIX = "-wake"

# inotify's event bits (<sys/inotify.h>): a write of the file; its watch is gone (the file was
# removed, or its file system unmounted).
_IN_MODIFY = 0x002
_IN_IGNORED = 0x8000


class Doorbell:
    """Rung by the committer after each commit: one byte written to ``PATH-wake``.

    Parameters:
        path: the store's file.
    """

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path) + BELL_SUFFIX
        self._fd: int | None = None
        self._failed = False

    def ring(self) -> None:
        """Write the bell (no sync: only the write's event matters); never raises."""
        fd = self._fd
        if fd is None:
            if self._failed:
                return
            try:
                # Made like SQLite makes the -wal: readable and writable as the umask allows.
                fd = self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
            except OSError as e:
                self._failed = True  # listeners poll: the commit is still seen, a poll later
                log.info("SQLite store: cannot write its doorbell %r (%s); other processes poll for its commits.",
                         self.path, e)
                return
        try:
            os.pwrite(fd, b"\0", 0)
        except OSError:
            pass

    def close(self) -> None:
        """Close the bell's file (after the last commit)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class PollWake:
    """An event the poller waits on, set by this process or, while listening, by a doorbell.

    Parameters:
        path: the store's file; a ring of its :class:`Doorbell` wakes a listening poller.
        clock: monotonic seconds (the waits' deadlines).
    """

    def __init__(self, path: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._bell_path = os.path.abspath(path) + BELL_SUFFIX
        self._clock = clock
        self._lock = threading.Lock()  # the flag, and the pipe against close()
        self._is_set = False
        self._closed = False
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)
        self._poll = select.poll()
        self._poll.register(self._read_fd, select.POLLIN)
        self._inotify: Any = None  # an inotify_simple.INotify while listening
        self._warned = False

    @property
    def listening(self) -> bool:
        """Whether a ring of the store's doorbell wakes :meth:`wait`."""
        return self._inotify is not None

    def set(self) -> None:
        """Wake the waiter (now, or at its next wait). Any thread; a no-op after close."""
        with self._lock:
            if self._is_set or self._closed:
                return
            self._is_set = True
            os.write(self._write_fd, b"\0")

    def wait(self, timeout_s: float | None) -> bool:
        """Sleep until set, the doorbell rings (while listening), or ``timeout_s`` passes.

        Returns:
            True when woken by :meth:`set` or the doorbell; False at the timeout. The
            flag is cleared either way, as ``threading.Event.wait`` then ``clear`` would.
        """
        deadline = None if timeout_s is None else self._clock() + timeout_s
        while True:
            if deadline is None:
                timeout_ms = None
            else:
                timeout_ms = max(0, math.ceil((deadline - self._clock()) * 1000))
            ready = self._poll.poll(timeout_ms)
            woken = self._take()
            if self._inotify is not None and ready and self._bell_rung():
                woken = True
            if woken:
                return True
            if not ready or (deadline is not None and self._clock() >= deadline):
                return False

    def listen(self, on: bool) -> None:
        """Start or stop listening for the doorbell (the poller thread only)."""
        if on == self.listening:
            return
        if not on:
            self._poll.unregister(self._inotify.fileno())
            self._inotify.close()
            self._inotify = None
            return
        try:
            from inotify_simple import INotify

            inotify = INotify(nonblocking=True)
        except (ImportError, OSError) as e:
            self._cannot_listen(e)
            return
        try:
            # The bell is made here if no process has rung it yet: a watch needs the file.
            os.close(os.open(self._bell_path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o666))
            inotify.add_watch(self._bell_path, _IN_MODIFY)
        except OSError as e:
            inotify.close()
            self._cannot_listen(e)
            return
        self._inotify = inotify
        self._poll.register(inotify.fileno(), select.POLLIN)

    def close(self) -> None:
        """Release the pipe and the inotify descriptor (the store's close, once no thread waits)."""
        self.listen(False)
        with self._lock:
            if self._closed:
                return
            self._closed = True
            os.close(self._read_fd)
            os.close(self._write_fd)

    def _take(self) -> bool:
        """Clear the flag; whether it was set."""
        with self._lock:
            if not self._is_set:
                return False
            self._is_set = False
            try:
                os.read(self._read_fd, 64)
            except BlockingIOError:
                pass
            return True

    def _bell_rung(self) -> bool:
        """Read the queued inotify events; whether the doorbell rang."""
        try:
            events = self._inotify.read(timeout=0)
        except BlockingIOError:
            return False
        if any(ev.mask & _IN_IGNORED for ev in events):
            # The bell's file was removed: stop listening until another commit is polled.
            self.listen(False)
            return True
        return bool(events)

    def _cannot_listen(self, error: BaseException) -> None:
        # Said once: the poll still hears every commit, a poll later.
        if not self._warned:
            self._warned = True
            log.info("SQLite store: cannot listen on its doorbell %r for other processes' commits (%s); "
                     "polling for them.", self._bell_path, error)
