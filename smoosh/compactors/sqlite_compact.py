"""Compacting one open SQLite database: VACUUM and an upgrade (incremental chunks and the WAL beside).

Incremental chunks live in :mod:`~smoosh.compactors.sqlite_incremental`, the WAL's checkpoint
and the ``cleanup:`` job in :mod:`~smoosh.compactors.sqlite_wal`; both use this module's
:func:`raise_mapped`.

This module owns the ways a database is compacted once it is open; which way a database
gets, the settings and the roots belong to :class:`~smoosh.compactors.sqlite.SqliteCompactor`,
which passes each function what it needs. Three ways to compact (their costs beside bare
SQLite are in bench/RESULTS.md):

* ``auto_vacuum = INCREMENTAL`` with free pages (:func:`~smoosh.compactors.sqlite_incremental.incremental`): chunks of
  ``PRAGMA incremental_vacuum(N)``, each its own short ``BEGIN IMMEDIATE`` write transaction,
  with a chunk boundary (``ctx.checkpoint()``) between chunks where no lock is held. Progress
  is exact (pages freed / starting freelist). The pragma frees one page per ``sqlite3_step``,
  returning an empty row each time. apsw runs statements as its cursor is stepped, so
  ``conn.execute(chunk)`` alone frees ONE page and leaves the transaction open, its ``COMMIT``
  unrun, and ``fetchone`` frees one too; stepped to the end
  (:func:`~smoosh.compactors.sqlite_open.run`), a chunk frees its N pages and commits
  (``tests/compactor`` pins this). (The stdlib ``sqlite3`` needed ``executescript`` for the
  same reason.)
* otherwise an in-place ``VACUUM`` (:func:`vacuum`, the only safe primitive for a file others
  have open), with a short busy timeout (locked -> :class:`Busy`), an estimated progress from progress-handler ticks
  (:class:`TickRate`), and cancellation through ``ctx.on_cancel`` -> ``Connection.interrupt``
  (SQLite rolls the VACUUM back; the file stays intact). The room it writes is reserved first
  (:func:`vacuum_needs`, :mod:`smoosh.disk_room`).
* an upgrade (:func:`upgrade`: ``page_size`` / ``auto_vacuum`` differ from the configured
  targets): the pragmas, then a full VACUUM. In WAL mode a page size change needs
  journal_mode=DELETE for the VACUUM and WAL again afterwards; leaving WAL needs exclusive
  access, so a database someone holds open gives :class:`Busy` ("needs exclusive access").

With an I/O budget (``max_io_rate``, :class:`~smoosh.io_budget.IoBudget`), an incremental
chunk is charged its freed pages' bytes as it commits, and ``ctx.checkpoint()`` (the worker's
chunk boundary) waits until the budget is out of debt before the next chunk; a VACUUM is
charged the file's size as it ends (the part it got through, estimated, when it is stopped),
a debt the next start waits out.

Afterwards, with ``analyze = true``, ``PRAGMA optimize`` refreshes the query planner's
statistics (:func:`optimize`), and a WAL database's log is copied back, emptied and its file
cut (:func:`~smoosh.compactors.sqlite_wal.truncate_after_compaction`): in WAL mode the file
only shrinks when the log is checkpointed. ``cleanup:<path>`` jobs do only that
checkpoint (:func:`~smoosh.compactors.sqlite_wal.cleanup`).

SQLite errors that mean "locked", "interrupted" or "read-only" become :class:`Busy`,
:class:`Interrupted` and :class:`Blocked` (:func:`raise_mapped`); a failed statement is rolled
back first. A file SQLite opened read-only (its permissions, a read-only mount) is
:class:`Blocked` before anything runs. A compaction whose final checkpoint leaves frames in the
WAL (a reader's snapshot pins them) gave nothing back yet: that is :class:`Blocked` too, with
the bytes still in the WAL, never "ok, reclaimed 0 bytes".
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable

import apsw

from smoosh.compactors.base import (
    READ_ONLY, Blocked, Busy, CompactionContext, Gone, InsufficientSpace, Interrupted, Replaced, Shared,
)
from smoosh.compactors.sqlite_file import DbState, sqlite_temp_dir
from smoosh.compactors.sqlite_identity import FileIdentity
from smoosh.compactors.sqlite_openers import open_elsewhere, others_have_open
from smoosh.disk_room import DiskRoom, NoRoom, Reservation
from smoosh.io_budget import IoBudget
from smoosh.units import format_duration
from smoosh.compactors.sqlite_open import (
    SQLITE_BUSY,
    SQLITE_CANTOPEN,
    SQLITE_INTERRUPT,
    SQLITE_LOCKED,
    SQLITE_NOTADB,
    SQLITE_READONLY,
    close_quietly,
    errcode,
    open_database,
    pragma,
    refusal_error,
    rollback_quietly,
    run,
)

__all__ = [
    "TickRate",
    "open_for_compaction",
    "check_database",
    "raise_mapped",
    "check_space",
    "vacuum_needs",
    "reserve",
    "vacuum",
    "upgrade",
    "optimize",
    "interrupt_quietly",
]

log = logging.getLogger(__name__)

#: VDBE instructions between two progress-handler calls during a VACUUM.
PROGRESS_HANDLER_INSTRUCTIONS = 1000
#: Starting guess of progress-handler ticks per page for the VACUUM progress estimate; it is
#: learned from finished VACUUMs (the true figure varies a hundredfold with the row size).
INITIAL_TICKS_PER_PAGE = 0.1
#: Starting guess of a VACUUM's copy-back time over its ticking time (measured near 1.5 on
#: the benchmark machine; learned from finished VACUUMs): it decides how early ``max_lock_hold``
#: must give up, since the copy-back cannot be interrupted.
INITIAL_COPY_BACK_RATIO = 2.0
#: The estimated VACUUM progress never claims more than this before the VACUUM returns.
MAX_ESTIMATED_PROGRESS = 0.99
#: The extended code of a write refused because the database file was renamed or unlinked.
SQLITE_READONLY_DBMOVED = apsw.SQLITE_READONLY_DBMOVED
#: Progress-handler ticks between two checks that the path still names the file being
#: VACUUMed: often enough that a rename is noticed within a fraction of the VACUUM, rarely
#: enough that the ``stat`` costs nothing beside the VDBE work in between.
REPLACEMENT_CHECK_TICKS = 64
#: Most page cache a VACUUM's connection may use to hold the rewritten database. A cache too
#: small for the rewrite spills one page to the database for each page it journals, so the
#: writes alternate between the file and its ``-journal``: inotify merges only identical
#: consecutive events, and the alternation floods the watcher's kernel queue with one event
#: per page (an overflow loses the application's events too). A cache that holds the rewrite
#: writes the journal, then the file, in two runs that merge. The cap bounds the memory of a
#: VACUUM of a large database, whose events may still alternate once the cache is full.
VACUUM_CACHE_MAX_BYTES = 64 * 1024 * 1024
#: What a VACUUM's room is counted with beyond its live pages (x) and in whole pages (+): b-tree
#: pages rebuilt differently, a page size change, the schema.
VACUUM_ROOM_MARGIN = 1.1
VACUUM_ROOM_PAGES = 64
#: Times the switch back to WAL is tried after a page-size upgrade (each waits the busy timeout).
WAL_RESTORE_ATTEMPTS = 10
#: A gap this long between two progress ticks of a VACUUM (normally microseconds apart) means
#: smoosh was stopped (SIGSTOP, a cgroup freezer, a debugger, a paused VM) or starved while the
#: VACUUM held the database's write lock, every application writer waiting: the VACUUM gives
#: up at once (rolls back, releasing the lock) rather than hold it for the rest of its run,
#: and says so (seconds; counted on the monotonic clock, which runs on while a process is stopped).
STALLED_TICK_GAP_S = 5.0


class TickRate:
    """Progress-handler ticks per page of a VACUUM, and how long its silent copy-back takes, learned from the VACUUMs that finished.

    A VACUUM first copies the database into a temporary one (the progress handler ticks), then
    copies that back over the file in one piece of C code that never calls out
    (``sqlite3BtreeCopyFile``): ``copy_back_ratio`` is the second phase's time over the
    first's, so the first phase tells when the whole statement will end.

    One per compactor, shared by its concurrent compactions: two floats, read when a VACUUM
    starts and folded in when one ends, so a race only blurs an estimate.
    """

    def __init__(self, per_page: float = INITIAL_TICKS_PER_PAGE, copy_back_ratio: float = INITIAL_COPY_BACK_RATIO) -> None:
        self.per_page = per_page
        self.copy_back_ratio = copy_back_ratio

    def learn_copy_back(self, ticking_s: float, silent_s: float) -> None:
        """Fold a finished VACUUM's two phases (seconds with ticks, seconds after the last one) into the ratio."""
        if ticking_s > 0 and silent_s >= 0:
            self.copy_back_ratio = 0.5 * self.copy_back_ratio + 0.5 * silent_s / ticking_s

    def expected(self, page_count: int) -> float:
        """The ticks a VACUUM of ``page_count`` pages is expected to take (at least 1)."""
        return max(1.0, page_count * self.per_page)

    def learn(self, ticks: int, page_count: int) -> None:
        """Fold a finished VACUUM's ``ticks`` over ``page_count`` pages into the rate."""
        if page_count > 0 and ticks > 0:
            self.per_page = 0.5 * self.per_page + 0.5 * ticks / page_count


def open_for_compaction(
    path: str, roots: tuple[str, ...] | None, busy_timeout_s: float, meant: tuple[int, int] | None = None,
    *, check: bool = True,
) -> apsw.Connection:
    """A read-write connection whose file proved to be a database: the one place a compaction opens one.

    Every file SQLite opens through it is checked by identity as it is opened
    (:mod:`~smoosh.compactors.sqlite_guard`); a side file refused later, by a statement,
    surfaces through :func:`raise_mapped`.

    Parameters:
        path: the database's canonical path.
        roots: the roots in force.
        busy_timeout_s: the connection's busy timeout.
        meant: ``(device, inode)`` of the file the look that chose it read; None: whichever is there.
        check: read the schema now, so a file that is not a database fails here. False for a
            rollback-journal database: a read takes a lock, which it may only take at a quiet
            moment (:mod:`~smoosh.compactors.sqlite_quiet`); the caller runs
            :func:`check_database` once it holds one.

    Raises:
        Refused: outside ``roots`` or through a symlink (in any component: SQLite checks).
        Blocked: the file (or its ``-shm``, opened by the first read of a WAL database) was
            refused by its identity; or SQLite could open it only read-only (``read-only``).
        Gone: missing, or not a database.
        Busy: locked beyond the busy timeout while reading the schema.
    """
    conn = None
    try:
        conn = open_database(path, "rw", timeout_s=busy_timeout_s, roots=roots, meant=meant)
        if check:
            pragma(conn, "schema_version")  # the header is read lazily: make a foreign file fail here
    except Shared as exc:
        raise Blocked(exc.reason) from None
    except apsw.Error as exc:
        if conn is not None:
            close_quietly(conn)
        refused_side = refusal_error(path)
        if refused_side is not None:
            raise Blocked(refused_side.reason) from exc
        if errcode(exc) in (SQLITE_CANTOPEN, SQLITE_NOTADB):
            raise Gone(f"{path}: {exc}") from exc
        raise_mapped(exc, path)
        raise
    # A write-protected file opens read-only without an error (SQLite's fallback): say so now,
    # before a VACUUM fails on it with a traceback.
    if conn.readonly("main"):
        close_quietly(conn)
        raise Blocked(READ_ONLY, read_only=True)
    return conn


def check_database(conn: apsw.Connection, path: str) -> None:
    """Make a file that is not a database fail now (what :func:`open_for_compaction` checks by default).

    Raises:
        Gone: the file is not a database (any more).
        Busy, Blocked: as :func:`raise_mapped` maps SQLite's error.
    """
    try:
        pragma(conn, "schema_version")
    except apsw.Error as exc:
        if errcode(exc) in (SQLITE_CANTOPEN, SQLITE_NOTADB):
            refused_side = refusal_error(path)
            if refused_side is not None:
                raise Blocked(refused_side.reason) from exc
            raise Gone(f"{path}: {exc}") from exc
        raise_mapped(exc, path)
        raise


def raise_mapped(exc: apsw.Error, path: str, busy_message: str | None = None) -> None:
    """Raise :class:`Blocked` (a file refused by its identity, or read-only), :class:`Busy` (locked)
    or :class:`Interrupted` (an interrupt); else return.

    The caller re-raises ``exc`` itself when this returns: any other SQLite error is not ours
    to name. Read-only covers a write-protected file and a directory where the journal cannot
    be created (SQLite's ``SQLITE_READONLY_DIRECTORY``), both ``SQLITE_READONLY`` at heart.
    """
    refused_side = refusal_error(path)
    if refused_side is not None:
        raise Blocked(refused_side.reason) from exc
    code = errcode(exc)
    if code == SQLITE_READONLY:
        if getattr(exc, "extendedresult", 0) == SQLITE_READONLY_DBMOVED:
            # SQLite's own guard: it will not open a journal for a file that was renamed or
            # unlinked since it was opened.
            if not os.path.lexists(path):
                raise Gone(f"{path} vanished while it was being compacted") from exc
            raise Replaced(path) from exc
        raise Blocked(READ_ONLY, read_only=True) from exc
    if code in (SQLITE_BUSY, SQLITE_LOCKED):
        raise Busy(busy_message or f"{path} is locked: {exc}") from exc
    if code == SQLITE_INTERRUPT:
        raise Interrupted(f"compaction of {path} was interrupted") from exc


def vacuum_needs(path: str, state: DbState, temp_dir: str | None) -> dict[str, int]:
    """What a VACUUM (or an upgrade's) of ``path`` writes, per directory: about its live size, up to twice.

    SQLite builds the new database in a temporary one (a file in its temp directory), then
    copies it back over the file, journaling (or logging to the WAL) what it overwrites: each
    about the live pages' size, never the file's (a file with 20% live needs at most 40% of its
    size, not 200%). The temporary database shares the VACUUM's page cache, which smoosh sizes to
    hold the rewrite (:func:`vacuum_cache_pages`): only what exceeds the cache spills to the temp
    directory. The live pages are ``page_count - freelist_count``, an upper bound of what the
    rewrite holds; :data:`VACUUM_ROOM_MARGIN` covers b-tree pages rebuilt differently and a page
    size change.

    Parameters:
        path: the database file.
        state: its header's counts.
        temp_dir: SQLite's temp directory; None asks SQLite's own rule.

    Returns:
        ``{database directory: bytes, temp directory: bytes}`` (one file system adds both).
    """
    live = max(0, state.page_count - state.freelist_count) * state.page_size
    journal = int(live * VACUUM_ROOM_MARGIN) + VACUUM_ROOM_PAGES * state.page_size
    spilled = max(0, live - vacuum_cache_pages(state) * state.page_size)
    temp = int(spilled * VACUUM_ROOM_MARGIN) + (VACUUM_ROOM_PAGES * state.page_size if spilled else 0)
    db_dir = os.path.dirname(path) or "."
    tmp = temp_dir or sqlite_temp_dir()
    if os.path.abspath(tmp) == os.path.abspath(db_dir):
        return {db_dir: journal + temp}
    return {db_dir: journal, tmp: temp}


def check_space(path: str, state: DbState, temp_dir: str | None, room: DiskRoom | None = None) -> None:
    """Refuse a VACUUM of ``path`` that would not fit now (:func:`vacuum_needs` against ``room``), reserving nothing.

    For a look from outside a compaction (``smoosh doctor``); a compaction reserves its room
    for as long as it runs instead.

    Raises:
        InsufficientSpace: the database's directory or the temp dir has too little room.
    """
    reserve(room or DiskRoom(), vacuum_needs(path, state, temp_dir)).release()


def reserve(room: DiskRoom, needs: dict[str, int]) -> Reservation:
    """``room.reserve(needs)``, its refusal as the compaction error :class:`InsufficientSpace`.

    Raises:
        InsufficientSpace: some file system lacks the room; nothing was reserved.
    """
    try:
        return room.reserve(needs)
    except NoRoom as exc:
        raise InsufficientSpace(str(exc), directory=exc.directory, needed_bytes=exc.needed_bytes,
                                free_bytes=exc.free_bytes) from None


def vacuum(
    conn: apsw.Connection, path: str, state: DbState, ctx: CompactionContext, rate: TickRate,
    identity: FileIdentity | None = None, budget: IoBudget | None = None,
    max_lock_hold_s: float = 0.0, clock: Callable[[], float] = time.monotonic, *, lets_go: bool = False,
) -> None:
    """Run an in-place ``VACUUM``, reporting an estimated progress and stopping when ``ctx`` cancels.

    Parameters:
        lets_go: the connection holds the database's lock in exclusive locking mode
            (:func:`~smoosh.compactors.sqlite_quiet.hold_exclusive` with ``keep``): the VACUUM
            starts on it and its end, or its rollback, lets it go.
        identity: the file being compacted; checked every :data:`REPLACEMENT_CHECK_TICKS`
            ticks, and a path that names another file interrupts the VACUUM at once.
        budget: charged the file's size as the VACUUM ends (only the estimated part it got
            through when it stopped early: a VACUUM that never got the lock wrote nothing).
        max_lock_hold_s: when another process has the database open (WAL mode: its ``-shm``
            locks; rollback mode: its descriptors, :func:`~smoosh.compactors.sqlite_openers.open_elsewhere`,
            or when that cannot be told), the VACUUM gives up (rolls back) as soon as it cannot
            end within this time of taking the write lock, so the application never waits past
            its busy timeout (0: no limit). Its copy-back phase cannot be stopped,
            so the ticking phase gets ``max_lock_hold_s / (1 + rate.copy_back_ratio)``, counted
            on ``clock`` from the first tick (the lock is taken just before it).

    Raises:
        Busy: locked beyond the busy timeout, stopped at ``max_lock_hold_s``, or given up after
            smoosh itself was stopped mid-statement (:data:`STALLED_TICK_GAP_S`; rolled back).
        Interrupted: cancelled (before or during the statement); SQLite rolled it back.
        Replaced, Gone: the path names another file, or none, now; SQLite rolled it back.
        apsw.Error: anything else SQLite reports.
    """
    cancelled = threading.Event()
    replaced = threading.Event()

    def cancel() -> None:
        cancelled.set()
        interrupt_quietly(conn)

    ticks = 0
    expected_ticks = rate.expected(state.page_count)
    overdue = threading.Event()
    stalled_s = 0.0
    # One VACUUM statement holds the write lock from its start to its end: an application
    # writer meanwhile waits in its busy handler, invisible to smoosh, and fails after its busy
    # timeout. Where another process has the database open, smoosh gives up first.
    # Whether another process has it open is asked once, when the ticking phase reaches its
    # budget, not before every VACUUM: in rollback mode the answer reads every descriptor of
    # every process, which costs a small database's whole VACUUM several times over, and a
    # VACUUM that ends within its budget never needs it.
    ticking_budget_s = max_lock_hold_s / (1.0 + rate.copy_back_ratio)
    limited: list[bool] = []
    first_tick = last_tick = 0.0

    def open_in_another_process() -> bool:
        if not limited:
            limited.append(others_have_open(path) is True if state.wal else open_elsewhere(path) is not False)
        return limited[0]

    def on_progress() -> bool:
        nonlocal ticks, first_tick, last_tick, stalled_s
        ticks += 1
        previous, last_tick = last_tick, clock()
        if ticks == 1:
            first_tick = last_tick
        elif last_tick - previous >= STALLED_TICK_GAP_S:
            stalled_s = last_tick - previous
            return True
        ctx.progress(min(MAX_ESTIMATED_PROGRESS, ticks / expected_ticks))
        if identity is not None and ticks % REPLACEMENT_CHECK_TICKS == 0 and not identity.same():
            replaced.set()
            return True
        if max_lock_hold_s > 0 and last_tick - first_tick >= ticking_budget_s and open_in_another_process():
            overdue.set()  # ending now, the silent copy-back would still outlast max_lock_hold
            return True
        return cancelled.is_set()  # True aborts the statement (apsw.InterruptError)

    ctx.on_cancel(cancel)
    if cancelled.is_set():  # cancelled before the statement started: interrupt() was a no-op
        raise Interrupted(f"compaction of {path} was interrupted before it started")
    run(conn, f"PRAGMA cache_size={vacuum_cache_pages(state)}")
    if lets_go:
        # Last before the VACUUM: the mode changes at the connection's next access (a statement
        # that reads, as the cache_size above does, would let the lock go there and then). The
        # VACUUM's write transaction starts on the lock already held, and its end lets it go and
        # deletes the journal inside the statement, where SQLite runs without the GIL; left to
        # the connection's close, the unlink held the GIL.
        run(conn, "PRAGMA locking_mode=NORMAL")
    conn.set_progress_handler(on_progress, PROGRESS_HANDLER_INSTRUCTIONS)
    written_fraction = 1.0
    try:
        run(conn, "VACUUM")
    except apsw.Error as exc:
        written_fraction = min(1.0, ticks / expected_ticks)
        rollback_quietly(conn)
        if replaced.is_set() and identity is not None:
            identity.check()
        if stalled_s and not cancelled.is_set():
            # Said here, once: the moment smoosh runs again after the stop.
            log.warning(
                "smoosh was stopped or starved for %.1f s while its VACUUM of %r held the database's write lock "
                "(SIGSTOP, a freezer, a debugger or a paused VM?); the VACUUM gave up and rolled back so the "
                "application's writers can go on.", stalled_s, path,
            )
            raise Busy(f"{path}: smoosh was stopped for {stalled_s:.1f} s mid-VACUUM, holding its write lock; "
                       "rolled back") from exc
        if overdue.is_set() and not cancelled.is_set():
            raise Busy(
                f"{path} is open in another process and its VACUUM would hold the write lock longer than "
                f"max_lock_hold ({format_duration(max_lock_hold_s)}): rolled back before its writers' busy timeout "
                "(give it a window when the application is closed, raise [smoosh.sqlite] max_lock_hold, "
                "or use auto_vacuum = INCREMENTAL)"
            ) from exc
        raise_mapped(exc, path)
        raise
    finally:
        conn.set_progress_handler(None)
        if budget is not None:
            budget.charge(int(state.file_bytes * written_fraction))
    rate.learn(ticks, state.page_count)
    if ticks > 1:
        rate.learn_copy_back(last_tick - first_tick, clock() - last_tick)


def vacuum_cache_pages(state: DbState) -> int:
    """The page cache, in pages, that holds the whole rewrite of ``state`` (live pages plus slack), capped.

    Counted in pages, not bytes: SQLite's per-page overhead is large beside a 512-byte page.
    See :data:`VACUUM_CACHE_MAX_BYTES` for why the rewrite should fit in the cache.
    """
    live_pages = max(0, state.page_count - state.freelist_count)
    # A quarter more for the b-tree pages VACUUM rebuilds and the schema; never below SQLite's default.
    want_pages = max(2000, live_pages + live_pages // 4)
    return max(1, min(want_pages, VACUUM_CACHE_MAX_BYTES // state.page_size))


def upgrade(
    conn: apsw.Connection,
    path: str,
    state: DbState,
    ctx: CompactionContext,
    *,
    page_size: int | None,
    auto_vacuum: str | None,
    busy_timeout_s: float,
    temp_dir: str | None,
    rate: TickRate,
    identity: FileIdentity | None = None,
    budget: IoBudget | None = None,
    max_lock_hold_s: float = 0.0,
    clock: Callable[[], float] = time.monotonic,
    lets_go: bool = False,
) -> None:
    """Set the target ``page_size`` / ``auto_vacuum`` (None: leave it) and VACUUM to apply them
    (``lets_go``: as :func:`vacuum`'s).

    Raises:
        Busy: "needs exclusive access" (a WAL database changing page size that someone holds
            open), or locked beyond the busy timeout.
        Interrupted, apsw.Error: as :func:`vacuum` (the caller has reserved its room).
    """
    page_size_change = page_size is not None and state.page_size != page_size
    leave_wal = page_size_change and pragma(conn, "journal_mode") == "wal"
    if leave_wal:
        try:
            mode = pragma(conn, "journal_mode=DELETE")
        except apsw.Error as exc:
            raise_mapped(exc, path, busy_message="needs exclusive access")
            raise
        if mode != "delete":
            raise Busy("needs exclusive access")
    try:
        if page_size is not None:
            run(conn, f"PRAGMA page_size={int(page_size)}")
        if auto_vacuum is not None:
            run(conn, f"PRAGMA auto_vacuum={auto_vacuum.upper()}")
        vacuum(conn, path, state, ctx, rate, identity, budget, max_lock_hold_s, clock, lets_go=lets_go)
    finally:
        if leave_wal:
            _restore_wal(conn, path, busy_timeout_s)


def _restore_wal(conn: apsw.Connection, path: str, busy_timeout_s: float) -> None:
    # The application chose WAL; a database left in DELETE mode works but behaves differently
    # (readers block on writers), so keep trying for a while before giving up loudly.
    for _ in range(WAL_RESTORE_ATTEMPTS):
        try:
            if pragma(conn, "journal_mode=WAL") == "wal":
                return
        except apsw.Error:
            log.debug("Switching %r back to WAL failed; retrying.", path, exc_info=True)
        time.sleep(busy_timeout_s / 4)
    log.error("Could not switch %r back to WAL mode after its upgrade; it is in DELETE mode.", path)


def optimize(conn: apsw.Connection, path: str) -> None:
    """``PRAGMA optimize=0x10002`` after a successful compaction (``[smoosh.sqlite] analyze = true``).

    A compaction rewrites every table and index, the moment the query planner's statistics
    (``sqlite_stat1``) are most worth refreshing. ``0x10002`` asks SQLite to look at every
    table, not only those this connection queried (it queried none), and to run ``ANALYZE``
    on those whose statistics are missing or stale; SQLite bounds each with its own analysis
    limit. Optional work: a failure (the application took the write lock meanwhile, the run
    was cancelled) is logged and the compaction's result stands.
    """
    try:
        run(conn, "PRAGMA optimize=0x10002")
    except apsw.Error as exc:
        rollback_quietly(conn)
        log.info("PRAGMA optimize after compacting %r did not complete: %s", path, exc)


def interrupt_quietly(conn: apsw.Connection) -> None:
    """``conn.interrupt()``, a no-op once the connection is closed.

    Cancel callbacks stay registered after the compaction returns, so a stop that comes later
    (a clean shutdown, a hold) finds the connection closed: nothing is left to interrupt.
    """
    try:
        conn.interrupt()
    except apsw.ConnectionClosedError:
        pass
