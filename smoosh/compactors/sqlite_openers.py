"""Whether another process has a WAL database open, read from the locks the kernel lists (Linux).

Every connection to a WAL database holds a shared POSIX lock on one byte of its ``-shm`` file
for as long as it is open (SQLite's "dead man switch", byte 128 of the unix VFS's lock
area). ``/proc/locks`` lists each such lock with its holder's pid, so smoosh can tell,
without touching the file, whether a process other than itself has the database open: an
application that may start a write transaction at any moment.

It never opens the ``-shm`` file itself: closing any descriptor of a file drops every POSIX
lock the process holds on it, which would silently take the locks of smoosh's own SQLite
connection away (SQLite's "How To Corrupt", 2.2). In rollback-journal mode an idle connection
holds no lock at all, so nothing can be told; neither can it off Linux: the answer is then
None (unknown).
"""

from __future__ import annotations

import os

__all__ = ["others_have_open", "DMS_LOCK_BYTE", "PROC_LOCKS"]

#: The ``-shm`` byte every open connection of a WAL database holds a shared lock on
#: (``UNIX_SHM_DMS`` in SQLite's os_unix.c: ``(22 + 8) * 4 + 8``).
DMS_LOCK_BYTE = 128
#: The kernel's list of file locks.
PROC_LOCKS = "/proc/locks"


def others_have_open(path: str, *, proc_locks: str = PROC_LOCKS) -> bool | None:
    """Whether a process other than this one holds the WAL database ``path`` open.

    Parameters:
        path: the database file (its ``-shm`` is looked up, never opened).
        proc_locks: the lock list to read (tests give their own).

    Returns:
        True or False for a WAL database on Linux; None when it cannot be told (no ``-shm``:
        not in WAL mode or not open by anyone with WAL; no ``/proc/locks``).
    """
    try:
        st = os.stat(path + "-shm")
    except OSError:
        return None
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    me = str(os.getpid())
    try:
        with open(proc_locks, encoding="ascii", errors="replace") as f:
            for line in f:
                # "12: POSIX  ADVISORY  READ 4711 fd:01:123456 128 128" (a "->" marks a waiter)
                fields = line.split()
                if len(fields) < 8 or fields[1] != "POSIX" or fields[5] != inode:
                    continue
                pid, start, end = fields[4], fields[6], fields[7]
                if pid != me and _covers(start, end, DMS_LOCK_BYTE):
                    return True
    except OSError:
        return None
    return False


def _covers(start: str, end: str, byte: int) -> bool:
    try:
        return int(start) <= byte and (end == "EOF" or int(end) >= byte)
    except ValueError:
        return False
