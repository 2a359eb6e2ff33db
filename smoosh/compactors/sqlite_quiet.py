"""Taking a database's locks the way its application does not notice: at a quiet moment, and whole.

An application at its defaults (Django, SQLAlchemy: deferred ``BEGIN``, a busy timeout of a few
seconds) waits in its busy handler when it meets another connection's lock at the *start* of a
transaction, but fails at once with ``database is locked`` when it meets one between its read and
its write: SQLite will not let a transaction that holds a read lock wait for a writer (a
deadlock could follow). So what an application notices is not how long smoosh holds a lock, but
whether a transaction of its own is caught in the middle by one.

In rollback-journal mode that is decided by the lock smoosh takes:

* a write lock taken the ordinary way (``BEGIN IMMEDIATE``: the reserved lock) lets the
  application's transactions start reading meanwhile, and every one of them that then wants to
  write fails; so does one that was already reading when the lock was taken. A VACUUM holds that
  lock while it builds its copy: the issue's Django fleet failed 40-100% more often beside it;
* an *exclusive* lock, taken when no other process is inside a transaction (a quiet moment,
  read from the kernel's lock table: :func:`~smoosh.compactors.sqlite_openers.app_look`), stops
  new transactions at their first read, where they wait in their busy handler, and catches none
  in the middle. Held from a quiet moment to the end of the compaction (SQLite's exclusive
  locking mode keeps it across the VACUUM), the application waits at most that long.

So in rollback mode every lock smoosh takes on a database it compacts is exclusive and taken at
a quiet moment (:func:`hold_exclusive`), with no busy wait of its own: a lock that cannot be had
at once is let go and tried again at the next quiet moment, so smoosh is never the one an
application waits behind while it waits itself. Its reads happen inside that hold, and the
looks between compactions read no lock at all (the header, ``immutable=1``).

In WAL mode readers never wait for a writer, so no lock can stop a transaction at its start: a
write of smoosh's catches every application transaction that reads during it and writes after.
What is left is to write only from a quiet moment (:func:`wait_for_quiet`) and briefly.

Waits, give-ups and the processes waited for are counted (:class:`QuietStats`): what smoosh
can see of its effect on the application.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import apsw

from smoosh.compactors.base import Busy
from smoosh.compactors.sqlite_open import rollback_quietly, run
from smoosh.compactors.sqlite_openers import AppLook, app_look

__all__ = ["QuietStats", "wait_for_quiet", "hold_exclusive", "release_exclusive", "QUIET_POLL_S"]

#: Seconds between two looks at the kernel's lock table while a compaction waits for a quiet
#: moment (one read of ``/proc/locks``): an application transaction lasts a few milliseconds.
QUIET_POLL_S = 0.002


@dataclass
class QuietStats:
    """What a compactor saw of the applications beside it, for ``/status`` and ``/metrics``.

    Owned by one compactor; every compaction thread adds to it under its lock (the only way in
    is :meth:`waited` and :meth:`gave_up`); readers take :meth:`snapshot`.

    Attributes:
        waits: compactions (or chunks) that found the application inside a transaction and
            waited for a quiet moment.
        wait_s: seconds spent so.
        gave_up: waits that ended without a quiet moment (the compaction ended ``busy``).
        waited_for: distinct processes waited for (pids, the last 64).
    """

    waits: int = 0
    wait_s: float = 0.0
    gave_up: int = 0
    waited_for: list[int] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def waited(self, seconds: float, look: AppLook) -> None:
        """Count one wait of ``seconds`` for the processes ``look`` names."""
        with self._lock:
            self.waits += 1
            self.wait_s += seconds
            for pid in (*look.writers, *look.readers):
                if pid not in self.waited_for:
                    self.waited_for.append(pid)
            del self.waited_for[:-64]

    def gave_up_waiting(self) -> None:
        """Count one wait that found no quiet moment."""
        with self._lock:
            self.gave_up += 1

    def snapshot(self) -> dict[str, float | int]:
        """``{"waits", "wait_seconds", "gave_up"}``, consistent with each other."""
        with self._lock:
            return {"waits": self.waits, "wait_seconds": round(self.wait_s, 3), "gave_up": self.gave_up}


def wait_for_quiet(
    path: str, wal: bool, wait_s: float, *, pause: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic, look: Callable[[], AppLook] | None = None,
    stats: QuietStats | None = None,
) -> AppLook:
    """Return at a moment when no other process is inside a transaction on ``path``; or raise.

    Parameters:
        path: the database file.
        wal: whether it is in WAL mode.
        wait_s: the longest wait.
        pause: the wait between two looks (a compaction passes its context's, which a stop ends).
        clock: monotonic seconds, for the bound.
        look: the look to take (tests give their own); :func:`app_look` by default.
        stats: where the wait is counted.

    Returns:
        The quiet look (or one that cannot tell, where the lock table cannot be read: the
        caller's own lock attempt, which never waits, then decides). In WAL mode, also the
        look at the end of the wait when the only processes inside a transaction are readers
        that were reading when it began: long readers, not a transaction about to write.

    Raises:
        Busy: no quiet moment within ``wait_s``; the reason names the processes in the way (an
            application holding the database exclusively is named so: the smaller point of
            issue 45).
    """
    take = look or (lambda: app_look(path, wal))
    seen = take()
    if seen.quiet or not seen.known:
        return seen
    start = clock()
    first_readers = set(seen.readers)
    while True:
        waited = clock() - start
        if waited >= wait_s:
            if stats is not None:
                stats.waited(waited, seen)
            if wal and not seen.writers and set(seen.readers) <= first_readers:
                # Readers that stayed for the whole wait read for longer than a transaction that
                # reads to write does (a report, a backup): they pin the log, which the
                # compaction will say (blocked), but writing beside them fails none of them.
                return seen
            if stats is not None:
                stats.gave_up_waiting()
            raise Busy(f"{path} is in use by its application: no moment without an open transaction in "
                       f"{wait_s:g} s ({seen.describe()})")
        pause(min(QUIET_POLL_S, wait_s - waited))
        now = take()
        if now.quiet or not now.known:
            if stats is not None:
                stats.waited(clock() - start, seen)
            return now
        seen = now


def hold_exclusive(
    conn: apsw.Connection, path: str, wait_s: float, *, busy_timeout_s: float, keep: bool,
    pause: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
    look: Callable[[], AppLook] | None = None, stats: QuietStats | None = None,
) -> None:
    """Take the rollback-journal database's exclusive lock at a quiet moment, inside ``BEGIN EXCLUSIVE``.

    The lock is tried without a busy wait (an application that took its lock in the instant
    between the look and the attempt keeps it, and the attempt is let go and made again at the
    next quiet moment).

    Parameters:
        conn: the compaction's connection, in autocommit mode.
        wait_s: the longest wait for a quiet moment, all attempts together.
        busy_timeout_s: the connection's busy timeout, restored once the lock is held.
        keep: hold the lock past the transaction (``locking_mode=EXCLUSIVE``, committed): for a
            VACUUM, which cannot run inside a transaction; :func:`release_exclusive` lets it go.
            Otherwise the caller's transaction is open when this returns, and its ``COMMIT``
            ends it.
        pause, clock, look, stats: as :func:`wait_for_quiet`.

    Raises:
        Busy: no quiet moment within ``wait_s``.
        apsw.Error: anything else SQLite reports.
    """
    deadline = clock() + wait_s
    while True:
        wait_for_quiet(path, False, max(0.0, deadline - clock()), pause=pause, clock=clock, look=look, stats=stats)
        conn.set_busy_timeout(0)
        try:
            run(conn, "BEGIN EXCLUSIVE")
        except apsw.BusyError:
            rollback_quietly(conn)  # a failed BEGIN may leave the transaction open; it holds no lock
            if clock() >= deadline:
                if stats is not None:
                    stats.gave_up_waiting()
                raise Busy(f"{path} is in use by its application: its lock was taken again at every quiet "
                           f"moment for {wait_s:g} s") from None
            pause(QUIET_POLL_S)
            continue
        finally:
            conn.set_busy_timeout(int(busy_timeout_s * 1000))
        if keep:
            try:
                run(conn, "PRAGMA locking_mode=EXCLUSIVE")
                run(conn, "COMMIT")  # the exclusive lock outlives the transaction in this mode
            except apsw.Error:
                rollback_quietly(conn)
                release_exclusive(conn)
                raise
        return


def release_exclusive(conn: apsw.Connection) -> None:
    """Let go of the exclusive lock :func:`hold_exclusive` kept (back to normal locking; never raises)."""
    try:
        rollback_quietly(conn)
        run(conn, "PRAGMA locking_mode=NORMAL")
        # The mode changes at the next access: a read of the schema lets the lock go.
        run(conn, "SELECT 1 FROM sqlite_master LIMIT 1")
    except apsw.Error:
        pass  # a connection that cannot read lets its locks go when it is closed
