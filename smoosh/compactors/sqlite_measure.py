"""What the SQLite compactor measures beyond a database's header, and remembers per key.

:meth:`~smoosh.compactors.sqlite.SqliteCompactor.sizes` reads a database's header
(:mod:`~smoosh.compactors.sqlite_file`); two of its answers need more than that one read:

* the exact live payload, from ``dbstat`` (:func:`exact_active_bytes`): it reads every page,
  so it is taken at most every ``exact_size_interval_s`` per key and remembered meanwhile;
* ``changes``, counted from a file change counter remembered when a compaction ends.

``changes`` (what a channel's ``min_changes`` compares) is the number of write transactions
since smoosh last compacted the database, from SQLite's file change counter (header bytes
24-27, bumped by every write transaction that changes a rollback-journal database): the
counter is remembered when a compaction ends, and ``changes`` is the current one minus it,
modulo 2**32 (the counter wraps). It is None, unknown, when there is nothing to count from:
a database this compactor has not compacted since it was created (the memory is in the
process, like CouchDB's "never compacted"), a WAL database (SQLite does not maintain the
counter in WAL mode), or a file renamed over the one compacted (another inode).

Both memories are a compactor's :class:`KeyMemory`.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

import apsw

from smoosh.compactors.sqlite_file import LOOKS, DbState, open_for_read, read_quietly
from smoosh.compactors.sqlite_open import close_quietly, run

__all__ = ["KeyMemory", "exact_active_bytes", "DBSTAT_QUERY", "EXACT_MEMORY_MAX_KEYS", "CHANGE_COUNTER_MODULUS"]

log = logging.getLogger("smoosh.compactors.sqlite")  # the compactor's lines, one logger

#: The exact live payload of a database: bytes in use on its b-tree pages.
DBSTAT_QUERY = "SELECT SUM(pgsize - unused) FROM dbstat"
#: Exact sizes remembered at most for this many keys (oldest forgotten first), bounding memory.
EXACT_MEMORY_MAX_KEYS = 100_000
#: The file change counter is a 32-bit big-endian integer that wraps: differences are modulo this.
CHANGE_COUNTER_MODULUS = 1 << 32


def exact_active_bytes(
    path: str, estimate: int, busy_timeout_s: float, roots: tuple[str, ...] | None, *, wal: bool = True
) -> int | None:
    """The exact live bytes (``dbstat``), ``estimate`` when SQLite cannot tell, or None for "not now".

    Read through an ``immutable=1`` connection when nobody is writing the database
    (:func:`~smoosh.compactors.sqlite_file.read_quietly`: no lock). Otherwise a WAL database is
    read through :func:`~smoosh.compactors.sqlite_file.open_for_read` (a WAL reader holds no
    writer back), and a rollback-journal database is not read at all: a read lock held for a
    whole ``dbstat`` pass would hold the application's commits back, and every transaction of
    it caught between its read and its write meanwhile would fail.

    Parameters:
        path: the database file (canonical).
        estimate: what to answer when SQLite cannot tell (``dbstat`` missing, an open failing).
        busy_timeout_s: busy timeout of the normal connection.
        roots: canonical roots the path must lie in, or None for no roots restriction.
        wal: whether the database is in WAL mode (its header says).

    Returns:
        Bytes in use on the database's b-tree pages, or ``estimate``; None when a
        rollback-journal database is being written (the caller keeps its estimate and asks
        again later).

    Raises:
        Refused: through a symlink (logged at WARNING).
    """
    row = read_quietly(path, DBSTAT_QUERY, roots=roots)
    if row is not None:
        LOOKS.lockless()
        return int(row[0] or 0)
    if not wal:
        return None
    try:
        conn = open_for_read(path, busy_timeout_s, roots=roots)
    except apsw.Error:
        return estimate
    LOOKS.locked()
    try:
        rows = run(conn, DBSTAT_QUERY)
        return int(rows[0][0] or 0) if rows else estimate
    except apsw.Error:
        log.debug("dbstat of %r unavailable; using the page estimate.", path, exc_info=True)
        return estimate
    finally:
        close_quietly(conn)


class KeyMemory:
    """Per key: the last exact payload taken, and the change counter when the last compaction ended.

    Owned by one :class:`~smoosh.compactors.sqlite.SqliteCompactor` and shared by the threads
    that call it: priority re-checks (``sizes``, ``exact_size_due``) run while compactions
    (``compact``) end. The one way in is these methods; each holds the one lock for its dict
    operations only, never across a file read. Each memory keeps at most
    :data:`EXACT_MEMORY_MAX_KEYS` keys, the oldest forgotten first.

    Parameters:
        clock: monotonic seconds: when an exact payload was taken, and how old it is.
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        # key -> (taken_at, file_bytes, active_bytes); insertion order = age, for the bound.
        self._exact: dict[str, tuple[float, int, int]] = {}
        # key -> (inode, file change counter) when this compactor's last compaction of it ended;
        # insertion order = age, for the bound. Under _lock, like _exact.
        self._counters: dict[str, tuple[int, int]] = {}

    # ------------------------------------------------------------------ exact payloads

    def remember_exact(self, key: str, file_bytes: int, active_bytes: int) -> None:
        """Remember the exact payload of ``key`` just taken, with the file size it was taken at."""
        with self._lock:
            self._exact.pop(key, None)
            self._exact[key] = (self._clock(), file_bytes, active_bytes)
            while len(self._exact) > EXACT_MEMORY_MAX_KEYS:
                self._exact.pop(next(iter(self._exact)))

    def fresh_exact(self, key: str, file_bytes: int, interval_s: float) -> int | None:
        """The remembered exact payload of ``key`` while it holds, else None.

        It holds while the file is still ``file_bytes`` long and was measured less than
        ``interval_s`` ago.
        """
        with self._lock:
            remembered = self._exact.get(key)
        if remembered is not None:
            taken_at, taken_file_bytes, active = remembered
            if taken_file_bytes == file_bytes and self._clock() - taken_at < interval_s:
                return active
        return None

    def exact_due(self, key: str, interval_s: float) -> bool:
        """True when the exact payload of ``key`` was not taken within ``interval_s``."""
        with self._lock:
            remembered = self._exact.get(key)
        return remembered is None or self._clock() - remembered[0] >= interval_s

    def forget_exact(self, key: str) -> None:
        """Forget the exact payload of ``key``: a compaction has just changed it."""
        with self._lock:
            self._exact.pop(key, None)

    # ------------------------------------------------------------------ change counters

    def changes(self, key: str, state: DbState) -> int | None:
        """Write transactions since this compactor last compacted ``key``; None when unknown (module docstring)."""
        if state.change_counter is None:
            return None
        with self._lock:
            remembered = self._counters.get(key)
        if remembered is None or remembered[0] != state.inode:
            return None
        return (state.change_counter - remembered[1]) % CHANGE_COUNTER_MODULUS

    def remember_counter(self, key: str, state: DbState | None) -> None:
        """Remember the change counter of ``key`` as ``state`` read it after a compaction ended.

        A ``state`` without one (None: missing or refused; a WAL database; no inode) forgets
        the key's counter, so its ``changes`` are unknown again.
        """
        with self._lock:
            self._counters.pop(key, None)
            if state is not None and state.change_counter is not None and state.inode:
                self._counters[key] = (state.inode, state.change_counter)
                while len(self._counters) > EXACT_MEMORY_MAX_KEYS:
                    self._counters.pop(next(iter(self._counters)))
