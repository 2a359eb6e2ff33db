"""What the application is doing with a database, read from the locks the kernel lists (Linux): who has
a WAL database open, who pins its log, and whether any transaction is open on it now (:func:`app_look`).

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

In rollback-journal mode the locks are on the database file itself (SQLite's lock bytes at
1 GiB: a read transaction holds the shared range, a write transaction the reserved byte too, a
commit the pending byte and then the shared range for writing), so :func:`app_look` tells a
quiet moment there as well: no other process inside a transaction. An idle connection holds
nothing, so whether one is open cannot be told in that mode.

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

__all__ = ["others_have_open", "open_elsewhere", "wal_readers", "PinningReaders", "Reader", "AppLook", "app_look", "DMS_LOCK_BYTE",
           "READ_MARK_BYTES", "PROC_LOCKS", "PENDING_BYTE"]

#: The ``-shm`` byte every open connection of a WAL database holds a shared lock on
#: (``UNIX_SHM_DMS`` in SQLite's os_unix.c: ``(22 + 8) * 4 + 8``).
DMS_LOCK_BYTE = 128
#: The ``-shm`` bytes of the read marks (``WAL_READ_LOCK(0..4)``: 120 + 3 + mark).
READ_MARK_BYTES = range(123, 128)
#: The ``-shm`` byte of the log's write lock (``WAL_WRITE_LOCK``: 120 + 0), held by a writer
#: from its ``BEGIN IMMEDIATE`` (or first write) to its commit.
WRITE_LOCK_BYTE = 120
#: SQLite's lock bytes in a rollback-journal database file (os.h): the pending byte at 1 GiB,
#: the reserved byte after it, then the 510 bytes of the shared range.
PENDING_BYTE = 0x40000000
RESERVED_BYTE = PENDING_BYTE + 1
SHARED_FIRST = PENDING_BYTE + 2
SHARED_LAST = SHARED_FIRST + 510 - 1
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


def open_elsewhere(path: str, *, proc: str = "/proc") -> bool | None:
    """Whether another process has the file ``path`` open: its descriptors, from ``/proc/PID/fd``.

    For a rollback-journal database, where an idle connection holds no lock: the one way to
    know whether an application could be waiting behind a long hold. It reads the name of
    every descriptor of every process (a few milliseconds on a busy host), so it is asked once
    per compaction, never per look.

    Parameters:
        path: the file's canonical path.
        proc: where process directories are (tests give their own).

    Returns:
        True or False; None when it cannot be told (no ``/proc``, or a process whose
        descriptors this user may not read).
    """
    try:
        entries = list(os.scandir(proc))
    except OSError:
        return None
    me, unknown = str(os.getpid()), False
    for entry in entries:
        if not entry.name.isdigit() or entry.name == me:
            continue
        fd_dir = f"{entry.path}/fd"
        try:
            fds = list(os.scandir(fd_dir))
        except PermissionError:
            unknown = True
            continue
        except OSError:
            continue  # the process ended meanwhile
        for fd in fds:
            try:
                if os.readlink(fd.path) == path:
                    return True
            except OSError:
                continue
    return None if unknown else False


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


@dataclass(frozen=True)
class AppLook:
    """What other processes are doing with a database at one moment, from ``/proc/locks`` (no lock taken).

    The one look the compactor (when to take its locks), the backlog controller (harm) and
    ``explain`` (why a compaction waits) share: :func:`app_look`.

    Attributes:
        known: whether it could be told (False: no ``/proc/locks``; a WAL database with no
            ``-shm`` is known idle: nobody has it open).
        wal: the database is in WAL mode (as the caller said).
        open: another process has the database open (WAL: its ``-shm`` liveness lock); None
            where that cannot be told (rollback mode: an idle connection holds no lock).
        readers: processes inside a read transaction (rollback: the shared range; WAL: a read
            mark), by pid.
        writers: processes inside a write transaction or a commit (rollback: the reserved or
            pending byte, the shared range for writing; WAL: the log's write lock), by pid.
    """

    known: bool
    wal: bool
    open: bool | None = None
    readers: tuple[int, ...] = ()
    writers: tuple[int, ...] = ()

    @property
    def quiet(self) -> bool:
        """No other process is inside a transaction: a lock taken now catches nobody between a read and a write."""
        return self.known and not self.readers and not self.writers

    def describe(self, proc: str = "/proc") -> str:
        """The look in an operator's words (for ``explain`` and a busy result's reason)."""
        if not self.known:
            return "the application's locks cannot be read here (no /proc/locks)"
        parts = [f"{Reader(pid, _command(str(pid), proc))} writing" for pid in self.writers]
        parts += [f"{Reader(pid, _command(str(pid), proc))} in a read transaction"
                  for pid in self.readers if pid not in self.writers]
        return "; ".join(parts) if parts else "quiet: no other process inside a transaction"


def app_look(path: str, wal: bool, *, proc_locks: str = PROC_LOCKS) -> AppLook:
    """One look at what other processes hold on the database ``path`` now (one read of ``/proc/locks``).

    Parameters:
        path: the database file.
        wal: whether it is in WAL mode (its header says): the locks are then on its ``-shm``,
            otherwise on the file itself.
        proc_locks: the lock list to read (tests give their own).

    Returns:
        The :class:`AppLook`.
    """
    if wal:
        try:
            locks = _shm_locks(path, proc_locks)
        except OSError:
            locks = None
        if locks is None:
            # No -shm: nobody has the database open in WAL mode (its first opener makes one).
            known = os.path.exists(proc_locks) and not os.path.exists(path + "-shm")
            return AppLook(known=known, wal=True, open=False if known else None)
        # A checkpointer is no writer here: it rewrites the database file from the log, which
        # changes nothing an open transaction sees (and a write of smoosh's beside it fails none).
        writers = {int(pid) for pid, _k, start, end in locks if pid.isdigit() and _covers(start, end, WRITE_LOCK_BYTE)}
        readers = {int(pid) for pid, kind, start, end in locks if kind == "READ" and pid.isdigit() and any(
            _covers(start, end, byte) for byte in READ_MARK_BYTES)}
        return AppLook(True, True, _open_in(locks), tuple(sorted(readers)), tuple(sorted(writers)))
    locks = _file_locks(path, proc_locks)
    if locks is None:
        return AppLook(known=False, wal=False)
    readers, writers = set(), set()
    for pid, kind, start, end in locks:
        if not pid.isdigit() or not _overlaps(start, end, PENDING_BYTE, SHARED_LAST):
            continue
        if kind == "WRITE" or _covers(start, end, RESERVED_BYTE):
            writers.add(int(pid))
        else:
            readers.add(int(pid))
    return AppLook(True, False, None, tuple(sorted(readers)), tuple(sorted(writers)))


def _shm_locks(path: str, proc_locks: str) -> list[tuple[str, str, str, str]] | None:
    """(pid, ``READ`` or ``WRITE``, start, end) of every POSIX lock another process holds on ``path``'s ``-shm``; None: unknown."""
    return _file_locks(path + "-shm", proc_locks)


def _file_locks(path: str, proc_locks: str) -> list[tuple[str, str, str, str]] | None:
    """(pid, ``READ`` or ``WRITE``, start, end) of every POSIX lock another process holds on ``path``; None: unknown."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    me = str(os.getpid())
    try:
        # Bytes, decoded here: a text file would look its codec up at first use, which a
        # compaction that dropped its privileges (tests/compactor/test_blocked.py) cannot import.
        with open(proc_locks, "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # The host's whole lock table is read at every look (a database host holds thousands of
    # locks): only the lines naming this file's inode are split, found by a search in C.
    needle = f" {inode} ".encode("ascii")
    if needle not in raw:
        return []
    lines = (line.decode("ascii", "replace") for line in raw.split(b"\n") if needle in line)
    return list(_held(lines, inode, me))


def _held(lines: Iterator[str], inode: str, me: str) -> Iterator[tuple[str, str, str, str]]:
    for line in lines:
        # "12: POSIX  ADVISORY  READ 4711 fd:01:123456 128 128" (a "->" marks a waiter, which
        # holds nothing yet: its fields are shifted by one and it is skipped)
        fields = line.split()
        if len(fields) < 8 or fields[1] != "POSIX" or fields[5] != inode:
            continue
        if fields[4] != me:
            yield fields[4], fields[3], fields[6], fields[7]


def _command(pid: int | str, proc: str) -> str:
    try:
        with open(f"{proc}/{pid}/cmdline", "rb") as f:
            raw = f.read(4096)
    except OSError:
        return ""
    text = " ".join(raw.replace(b"\0", b" ").decode("utf-8", "replace").split())
    return text if len(text) <= MAX_CMDLINE_CHARS else text[:MAX_CMDLINE_CHARS - 3] + "..."


def _overlaps(start: str, end: str, first: int, last: int) -> bool:
    try:
        return int(start) <= last and (end == "EOF" or int(end) >= first)
    except ValueError:
        return False


def _covers(start: str, end: str, byte: int) -> bool:
    try:
        return int(start) <= byte and (end == "EOF" or int(end) >= byte)
    except ValueError:
        return False
