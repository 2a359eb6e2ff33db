"""Who else has a WAL database open, and who pins its log, read from the locks the kernel lists (Linux).

Every connection to a WAL database holds a shared POSIX lock on one byte of its ``-shm`` file
for as long as it is open (SQLite's "dead man switch", byte 128 of the unix VFS's lock
area). ``/proc/locks`` lists each such lock with its holder's pid, so smoosh can tell,
without touching the file, whether a process other than itself has the database open: an
application that may start a write transaction at any moment.

A connection inside a read transaction also holds a shared lock on one of the log's read
marks (bytes 123-127; mark 0 reads the database file alone, marks 1-4 a snapshot that includes
WAL frames). Either way its snapshot keeps the checkpoint from copying back the frames written
after it began (the database file must not change under it): :func:`wal_readers` names the
processes holding a read mark, the readers that keep a checkpoint from emptying the log. A
writer holds a read mark too, for as long as its transaction, and the log's write lock (byte
120) with it: its mark goes with its commit, a moment later, so it is no reader to wait for
(an application committing every few milliseconds would otherwise be "a reader" at most looks).
Locks are the process's, not the connection's: a process with a long read transaction on one
connection and writes on another holds the write lock now and then beside a read mark that
pins the log. Across the looks of one job (:class:`PinningReaders`), a process seen once with
a read mark and no write lock is a reader from then on.

It never opens the ``-shm`` file itself: closing any descriptor of a file drops every POSIX
lock the process holds on it, which would silently take the locks of smoosh's own SQLite
connection away (SQLite's "How To Corrupt", 2.2). In rollback-journal mode an idle connection
holds no lock at all, so nothing can be told; neither can it off Linux: the answer is then
None (unknown).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator

__all__ = ["others_have_open", "wal_readers", "PinningReaders", "Reader", "DMS_LOCK_BYTE", "READ_MARK_BYTES", "PROC_LOCKS"]

#: The ``-shm`` byte every open connection of a WAL database holds a shared lock on
#: (``UNIX_SHM_DMS`` in SQLite's os_unix.c: ``(22 + 8) * 4 + 8``).
DMS_LOCK_BYTE = 128
#: The ``-shm`` bytes of the read marks (``WAL_READ_LOCK(0..4)``: 120 + 3 + mark).
READ_MARK_BYTES = range(123, 128)
#: The ``-shm`` byte of the log's write lock (``WAL_WRITE_LOCK``: 120 + 0), held by a writer
#: from its ``BEGIN IMMEDIATE`` (or first write) to its commit.
WRITE_LOCK_BYTE = 120
#: The kernel's list of file locks.
PROC_LOCKS = "/proc/locks"
#: Longest command line quoted for a reader.
MAX_CMDLINE_CHARS = 120


@dataclass(frozen=True)
class Reader:
    """A process inside a read transaction on a WAL database (its snapshot pins the frames written since).

    Attributes:
        pid: its process id.
        command: its command line (as ``/proc/PID/cmdline`` gives it; empty when unreadable).
    """

    pid: int
    command: str

    def __str__(self) -> str:
        return f"pid {self.pid} ({self.command})" if self.command else f"pid {self.pid}"


def others_have_open(path: str, *, proc_locks: str = PROC_LOCKS) -> bool | None:
    """Whether a process other than this one holds the WAL database ``path`` open.

    Parameters:
        path: the database file (its ``-shm`` is looked up, never opened).
        proc_locks: the lock list to read (tests give their own).

    Returns:
        True or False for a WAL database on Linux; None when it cannot be told (no ``-shm``:
        not in WAL mode or not open by anyone with WAL; no ``/proc/locks``).
    """
    locks = _shm_locks(path, proc_locks)
    return None if locks is None else _open_in(locks)


def _open_in(locks: list[tuple[str, str, str, str]]) -> bool:
    """Whether a process in ``locks`` (:func:`_shm_locks`) holds the database open."""
    return any(_covers(start, end, DMS_LOCK_BYTE) for _pid, _kind, start, end in locks)


def wal_readers(path: str, *, proc_locks: str = PROC_LOCKS, proc: str = "/proc") -> list[Reader] | None:
    """The other processes inside a read transaction on the WAL database ``path`` (they pin its log).

    One look (see :class:`PinningReaders` for a job's looks): a process that also holds the
    log's write lock is in a write transaction, which its commit ends in a moment, and is not
    counted (see the module docstring).

    Parameters:
        path: the database file (its ``-shm`` is looked up, never opened).
        proc_locks: the lock list to read (tests give their own).
        proc: where process directories are (for command lines).

    Returns:
        The readers, by pid (each once); ``[]`` when none; None when it cannot be told (no
        ``-shm``, no ``/proc/locks``).
    """
    return PinningReaders(path, proc_locks=proc_locks, proc=proc).look()


class PinningReaders:
    """The readers of one WAL database over the looks of one job (:func:`wal_readers`, remembered).

    A process seen at any look holding a read mark without the log's write lock is a reader
    from then on, whenever it holds a read mark; one only ever seen holding both is a writer in
    its transactions. Owner: the job's thread.

    Attributes:
        others_open: :func:`others_have_open` as the last look's lock list answered it (None
            before a look, or when it could not be told): the same read of ``/proc/locks``
            serves both questions.
    """

    def __init__(self, path: str, *, proc_locks: str = PROC_LOCKS, proc: str = "/proc") -> None:
        self._path = path
        self._proc_locks = proc_locks
        self._proc = proc
        self._reading: set[str] = set()
        self.others_open: bool | None = None

    def look(self) -> list[Reader] | None:
        """The readers now, by pid; ``[]`` when none; None when it cannot be told."""
        locks = _shm_locks(self._path, self._proc_locks)
        if locks is None:
            self.others_open = None
            return None
        self.others_open = _open_in(locks)
        writing = {pid for pid, _kind, start, end in locks if _covers(start, end, WRITE_LOCK_BYTE)}
        # Shared locks only: a checkpoint takes the marks exclusively for a moment to move them.
        marked = {pid for pid, kind, start, end in locks
                  if kind == "READ" and pid.isdigit() and any(_covers(start, end, byte) for byte in READ_MARK_BYTES)}
        self._reading |= marked - writing
        pids = sorted(int(pid) for pid in marked if pid not in writing or pid in self._reading)
        return [Reader(pid, _command(pid, self._proc)) for pid in pids]


def _shm_locks(path: str, proc_locks: str) -> list[tuple[str, str, str, str]] | None:
    """(pid, ``READ`` or ``WRITE``, start, end) of every POSIX lock another process holds on ``path``'s ``-shm``; None: unknown."""
    try:
        st = os.stat(path + "-shm")
    except OSError:
        return None
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    me = str(os.getpid())
    try:
        with open(proc_locks, encoding="ascii", errors="replace") as f:
            return list(_held(f, inode, me))
    except OSError:
        return None


def _held(lines: Iterator[str], inode: str, me: str) -> Iterator[tuple[str, str, str, str]]:
    for line in lines:
        # "12: POSIX  ADVISORY  READ 4711 fd:01:123456 128 128" (a "->" marks a waiter, which
        # holds nothing yet: its fields are shifted by one and it is skipped)
        fields = line.split()
        if len(fields) < 8 or fields[1] != "POSIX" or fields[5] != inode:
            continue
        if fields[4] != me:
            yield fields[4], fields[3], fields[6], fields[7]


def _command(pid: int, proc: str) -> str:
    try:
        with open(f"{proc}/{pid}/cmdline", "rb") as f:
            raw = f.read(4096)
    except OSError:
        return ""
    text = " ".join(raw.replace(b"\0", b" ").decode("utf-8", "replace").split())
    return text if len(text) <= MAX_CMDLINE_CHARS else text[:MAX_CMDLINE_CHARS - 3] + "..."


def _covers(start: str, end: str, byte: int) -> bool:
    try:
        return int(start) <= byte and (end == "EOF" or int(end) >= byte)
    except ValueError:
        return False
