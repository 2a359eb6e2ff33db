"""The built-in compactor: SQLite database files and their ``cleanup:<path>`` keys.

Three ways to compact, chosen per database (measurements in reference/peers_perf.md §2):

* ``auto_vacuum = INCREMENTAL`` with free pages: chunks of ``PRAGMA incremental_vacuum(N)``,
  each its own short ``BEGIN IMMEDIATE`` write transaction, with a chunk boundary
  (``ctx.checkpoint()``) between chunks where no lock is held. Progress is exact (pages freed
  / starting freelist). The pragma frees one page per ``sqlite3_step`` and declares no result
  columns, so ``Cursor.execute`` (even with ``fetchall``/``fetchone`` loops) frees ONE page
  (measured here); ``executescript`` steps it to completion, so chunks run through it.
* otherwise an in-place ``VACUUM`` (the only safe primitive for a file others have open),
  with a short busy timeout (locked -> :class:`Busy`), a free space check first, an estimated
  progress from progress-handler ticks, and cancellation through ``ctx.on_cancel`` ->
  ``Connection.interrupt`` (SQLite rolls the VACUUM back; the file stays intact).
* an upgrade (``page_size`` / ``auto_vacuum`` differ from the configured targets): the pragmas,
  then a full VACUUM. In WAL mode a page size change needs journal_mode=DELETE for the VACUUM
  and WAL again afterwards; leaving WAL needs exclusive access, so a database someone holds
  open gives :class:`Busy` ("needs exclusive access").

Afterwards a WAL database gets ``wal_checkpoint(TRUNCATE)``: in WAL mode the file only
shrinks when the log is checkpointed. ``cleanup:<path>`` jobs do only that checkpoint.

Reading sizes never creates or leaves a file (see :mod:`smoosh.compactors.sqlite_file`). SQLite
keeps no update sequence, so ``changes`` is None.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import threading
import time
from typing import Any, Callable

from smoosh.compactors.base import (
    Busy,
    CompactionContext,
    CompactionResult,
    Gone,
    InsufficientSpace,
    Interrupted,
    Sizes,
)
from smoosh.compactors.sqlite_file import (
    AUTO_VACUUM_CODES,
    SQLITE_BUSY,
    SQLITE_CANTOPEN,
    SQLITE_INTERRUPT,
    SQLITE_LOCKED,
    SQLITE_NOTADB,
    DbState,
    connect,
    errcode,
    file_size,
    footprint_bytes,
    in_use,
    open_for_read,
    pragma,
    read_quietly,
    read_state,
    rollback_quietly,
    sqlite_temp_dir,
)

__all__ = ["SqliteCompactor", "CLEANUP_PREFIX", "DEFAULT_WAL_MAX_SIZE_BYTES", "DEFAULT_EXACT_SIZE_INTERVAL_S"]

log = logging.getLogger(__name__)

#: Prefix of the keys whose job is to truncate a database's WAL (and remove smoosh leftovers).
CLEANUP_PREFIX = "cleanup:"
#: A ``-wal`` file larger than this (bytes) makes a cleanup key worth a job.
DEFAULT_WAL_MAX_SIZE_BYTES = 64 * 1024 * 1024
#: The exact ``dbstat`` payload of a key is taken at most this often (seconds).
DEFAULT_EXACT_SIZE_INTERVAL_S = 3600.0
#: The exact live payload of a database: bytes in use on its b-tree pages.
DBSTAT_QUERY = "SELECT SUM(pgsize - unused) FROM dbstat"
#: Pages freed per incremental chunk when the settings say nothing.
DEFAULT_INCREMENTAL_CHUNK_PAGES = 1000
#: How long a compaction waits for another connection's lock before giving up (seconds).
DEFAULT_BUSY_TIMEOUT_S = 1.0
#: Exact sizes remembered at most for this many keys (oldest forgotten first), bounding memory.
EXACT_MEMORY_MAX_KEYS = 100_000
#: VDBE instructions between two progress-handler calls during a VACUUM.
PROGRESS_HANDLER_INSTRUCTIONS = 1000
#: Starting guess of progress-handler ticks per page for the VACUUM progress estimate; it is
#: learned from finished VACUUMs (measured here: 0.003 for 5 KB rows to 0.3 for 20 B rows).
INITIAL_TICKS_PER_PAGE = 0.1
#: The estimated VACUUM progress never claims more than this before the VACUUM returns.
MAX_ESTIMATED_PROGRESS = 0.99
#: Times the switch back to WAL is tried after a page-size upgrade (each waits the busy timeout).
WAL_RESTORE_ATTEMPTS = 10

class SqliteCompactor:
    """Compacts SQLite database files in place; never corrupts one (SQLite's own transactions do the work).

    Parameters:
        settings: an object with ``page_size`` (int | None), ``auto_vacuum`` ("none" | "full" |
            "incremental" | None), ``incremental_chunk_pages`` and ``busy_timeout_s``
            (smoosh's ``SqliteConfig`` fits); None gives the defaults (no upgrade targets).
        wal_max_size_bytes: a ``-wal`` larger than this makes the cleanup key's priority 1.
        exact_size_interval_s: how often the exact ``dbstat`` size of one key may be taken.
        clock: monotonic seconds, for the exact-size bookkeeping.
        temp_dir: where VACUUM's temporary database goes (for the free space check only; SQLite
            picks it from ``SQLITE_TMPDIR``/``TMPDIR``, which is also the default here).
    """

    name = "sqlite"

    def __init__(
        self,
        settings: Any = None,
        *,
        wal_max_size_bytes: int = DEFAULT_WAL_MAX_SIZE_BYTES,
        exact_size_interval_s: float = DEFAULT_EXACT_SIZE_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        temp_dir: str | None = None,
    ) -> None:
        self.page_size: int | None = getattr(settings, "page_size", None)
        auto_vacuum = getattr(settings, "auto_vacuum", None)
        if auto_vacuum is not None and auto_vacuum not in AUTO_VACUUM_CODES:
            raise ValueError(f"auto_vacuum must be none, full or incremental, not {auto_vacuum!r}")
        self.auto_vacuum: str | None = auto_vacuum
        self.incremental_chunk_pages = int(getattr(settings, "incremental_chunk_pages", None) or DEFAULT_INCREMENTAL_CHUNK_PAGES)
        busy = getattr(settings, "busy_timeout_s", None)
        self.busy_timeout_s = float(DEFAULT_BUSY_TIMEOUT_S if busy is None else busy)
        self.wal_max_size_bytes = wal_max_size_bytes
        self.exact_size_interval_s = exact_size_interval_s
        self._clock = clock
        self._temp_dir = temp_dir
        self._lock = threading.Lock()
        # key -> (taken_at, file_bytes, active_bytes); insertion order = age, for the bound.
        self._exact: dict[str, tuple[float, int, int]] = {}
        self._ticks_per_page = INITIAL_TICKS_PER_PAGE

    # ------------------------------------------------------------------ keys

    def claims(self, key: str) -> bool:
        """Lexical: an absolute path, or ``cleanup:`` + an absolute path. No I/O.

        Parameters:
            key: any string.

        Returns:
            True for keys this compactor handles.
        """
        path = key[len(CLEANUP_PREFIX):] if key.startswith(CLEANUP_PREFIX) else key
        return bool(path) and "\x00" not in path and os.path.isabs(path)

    @staticmethod
    def _split(key: str) -> tuple[str, bool]:
        if key.startswith(CLEANUP_PREFIX):
            return key[len(CLEANUP_PREFIX):], True
        return key, False

    # ------------------------------------------------------------------ reading

    def read_state(self, path: str) -> DbState | None:
        """Page counts and format of a database, cheaply; None when missing or not SQLite."""
        return read_state(path, self.busy_timeout_s)

    def sizes(self, key: str, *, exact: bool = False) -> Sizes | None:
        """File and live bytes of a key's database.

        For a ``cleanup:`` key: ``file_bytes`` is the ``-wal`` size and ``active_bytes`` 0 (all
        of it is reclaimable by the cleanup job).

        Parameters:
            key: a claimed key.
            exact: take the exact ``dbstat`` payload (reads every page; remembered per key).

        Returns:
            ``Sizes(file_bytes, active_bytes, changes=None)``; None when missing or not SQLite.
            Without ``exact``, a fresh remembered exact size is used while the file size has
            not changed since it was taken; otherwise ``(page_count - freelist) * page_size``,
            a lower bound on what a VACUUM reclaims.
        """
        path, cleanup = self._split(key)
        state = self.read_state(path)
        if state is None:
            return None
        if cleanup:
            return Sizes(file_bytes=file_size(path + "-wal"), active_bytes=0)
        estimate = (state.page_count - state.freelist_count) * state.page_size
        if exact:
            active = self._exact_active(path, estimate)
            with self._lock:
                self._exact.pop(key, None)
                self._exact[key] = (self._clock(), state.file_bytes, active)
                while len(self._exact) > EXACT_MEMORY_MAX_KEYS:
                    self._exact.pop(next(iter(self._exact)))
            return Sizes(file_bytes=state.file_bytes, active_bytes=active)
        with self._lock:
            remembered = self._exact.get(key)
        if remembered is not None:
            taken_at, file_bytes, active = remembered
            if file_bytes == state.file_bytes and self._clock() - taken_at < self.exact_size_interval_s:
                return Sizes(file_bytes=state.file_bytes, active_bytes=min(active, estimate))
        return Sizes(file_bytes=state.file_bytes, active_bytes=estimate)

    def _exact_active(self, path: str, estimate: int) -> int:
        row = read_quietly(path, DBSTAT_QUERY)
        if row is not None:
            return int(row[0] or 0)
        try:
            conn = open_for_read(path, self.busy_timeout_s)
        except sqlite3.Error:
            return estimate
        try:
            row = conn.execute(DBSTAT_QUERY).fetchone()
            return int(row[0] or 0) if row else estimate
        except sqlite3.Error:
            log.debug("dbstat of %r unavailable; using the page estimate.", path, exc_info=True)
            return estimate
        finally:
            conn.close()

    def exact_size_due(self, key: str) -> bool:
        """True when the exact size of ``key`` was not taken within ``exact_size_interval_s``."""
        with self._lock:
            remembered = self._exact.get(key)
        return remembered is None or self._clock() - remembered[0] >= self.exact_size_interval_s

    def needs_upgrade(self, key: str) -> bool:
        """True when the database's page size or auto_vacuum differs from a configured target.

        Parameters:
            key: a claimed key (``cleanup:`` keys never need one).

        Returns:
            False when no target is set (the default), the database is missing, or it matches.
        """
        path, cleanup = self._split(key)
        if cleanup or (self.page_size is None and self.auto_vacuum is None):
            return False
        state = self.read_state(path)
        return state is not None and self._upgrade_needed(state)

    def _upgrade_needed(self, state: DbState) -> bool:
        if self.page_size is not None and state.page_size != self.page_size:
            return True
        return self.auto_vacuum is not None and state.auto_vacuum != AUTO_VACUUM_CODES[self.auto_vacuum]

    def leftovers(self, path: str) -> list[str]:
        """Files smoosh itself may leave beside a database (none yet; the cleanup job's hook)."""
        return []

    def cleanup_priority(self, key: str) -> float:
        """1.0 for a ``cleanup:`` key whose ``-wal`` exceeds ``wal_max_size_bytes`` (or with leftovers), else 0.0."""
        path, cleanup = self._split(key)
        if not cleanup or self.read_state(path) is None:
            return 0.0
        if file_size(path + "-wal") > self.wal_max_size_bytes or self.leftovers(path):
            return 1.0
        return 0.0

    # ------------------------------------------------------------------ compacting

    def compact(self, key: str, ctx: CompactionContext) -> CompactionResult:
        """Compact the key's database (or truncate its WAL, for a ``cleanup:`` key).

        Parameters:
            key: a claimed key.
            ctx: progress, chunk boundaries and cancellation (see :class:`CompactionContext`).

        Returns:
            Footprint (database + ``-wal``) before and after.

        Raises:
            Busy: the database stayed locked for the busy timeout, or an upgrade needs
                exclusive access, or a WAL checkpoint could not complete.
            Interrupted: cancelled through ``ctx``; the database is intact.
            Gone: the file is missing or not SQLite.
            InsufficientSpace: a VACUUM would not fit on disk.
            sqlite3.Error: anything else SQLite reports.
        """
        path, cleanup = self._split(key)
        state = self.read_state(path)
        if state is None:
            raise Gone(f"{path} is missing or not a SQLite database")
        before = footprint_bytes(path)
        with in_use(path):
            self._compact_open(path, cleanup, state, ctx)
        with self._lock:
            self._exact.pop(key, None)
        if not os.path.exists(path):
            raise Gone(f"{path} vanished while it was being compacted")
        after = footprint_bytes(path)
        ctx.progress(1.0)
        return CompactionResult(size_before_bytes=before, size_after_bytes=after)

    def _compact_open(self, path: str, cleanup: bool, state: DbState, ctx: CompactionContext) -> None:
        conn = self._open_for_compaction(path)
        try:
            if cleanup:
                self._cleanup(conn, path, ctx)
            elif self._upgrade_needed(state):
                self._upgrade(conn, path, state, ctx)
            elif state.auto_vacuum == 2 and state.freelist_count > 0:
                self._incremental(conn, path, ctx)
            else:
                self._check_space(path, state.file_bytes)
                self._vacuum(conn, path, state, ctx)
            if not cleanup and pragma(conn, "journal_mode") == "wal":
                self._truncate_wal(conn, path, required=False)
        finally:
            conn.close()

    def _open_for_compaction(self, path: str) -> sqlite3.Connection:
        try:
            conn = connect(path, "rw", self.busy_timeout_s)
            pragma(conn, "schema_version")  # opening is lazy: make a missing/foreign file fail here
            return conn
        except sqlite3.Error as exc:
            if errcode(exc) in (SQLITE_CANTOPEN, SQLITE_NOTADB):
                raise Gone(f"{path}: {exc}") from exc
            self._raise_mapped(exc, path)
            raise

    @staticmethod
    def _raise_mapped(exc: sqlite3.Error, path: str, busy_message: str | None = None) -> None:
        code = errcode(exc)
        if code in (SQLITE_BUSY, SQLITE_LOCKED):
            raise Busy(busy_message or f"{path} is locked: {exc}") from exc
        if code == SQLITE_INTERRUPT:
            raise Interrupted(f"compaction of {path} was interrupted") from exc

    def _check_space(self, path: str, file_bytes: int) -> None:
        """A VACUUM writes a temporary copy and a journal (or WAL), each up to the file's size."""
        db_dir = os.path.dirname(path) or "."
        needed = 2 * file_bytes
        free = shutil.disk_usage(db_dir).free
        if free < needed:
            raise InsufficientSpace(
                f"not enough free disk space to VACUUM {path}: needs {needed} bytes in {db_dir}, {free} free",
                directory=db_dir, needed_bytes=needed, free_bytes=free,
            )
        temp_dir = self._temp_dir or sqlite_temp_dir()
        try:
            same_device = os.stat(temp_dir).st_dev == os.stat(db_dir).st_dev
        except OSError:
            same_device = False
        if same_device:
            return  # the 2x above already counted the temporary copy
        free = shutil.disk_usage(temp_dir).free
        if free < file_bytes:
            raise InsufficientSpace(
                f"not enough free disk space to VACUUM {path}: needs {file_bytes} bytes in the temp dir {temp_dir}, {free} free",
                directory=temp_dir, needed_bytes=file_bytes, free_bytes=free,
            )

    def _vacuum(self, conn: sqlite3.Connection, path: str, state: DbState, ctx: CompactionContext) -> None:
        cancelled = threading.Event()

        def cancel() -> None:
            cancelled.set()
            conn.interrupt()

        ticks = 0
        expected_ticks = max(1.0, state.page_count * self._ticks_per_page)

        def on_progress() -> int:
            nonlocal ticks
            ticks += 1
            ctx.progress(min(MAX_ESTIMATED_PROGRESS, ticks / expected_ticks))
            return 1 if cancelled.is_set() else 0

        ctx.on_cancel(cancel)
        if cancelled.is_set():  # cancelled before the statement started: interrupt() was a no-op
            raise Interrupted(f"compaction of {path} was interrupted before it started")
        conn.set_progress_handler(on_progress, PROGRESS_HANDLER_INSTRUCTIONS)
        try:
            conn.execute("VACUUM")
        except sqlite3.Error as exc:
            rollback_quietly(conn)
            self._raise_mapped(exc, path)
            raise
        finally:
            conn.set_progress_handler(None, 0)
        if state.page_count > 0 and ticks > 0:
            # Learn the tick rate so the next estimate is closer (one float: races are harmless).
            self._ticks_per_page = 0.5 * self._ticks_per_page + 0.5 * ticks / state.page_count

    def _incremental(self, conn: sqlite3.Connection, path: str, ctx: CompactionContext) -> None:
        # No on_cancel callback: interrupting a chunk would only waste it; the worker's stop
        # and hold both act at the next ctx.checkpoint(), at most one short chunk away.
        start_free = pragma(conn, "freelist_count")
        freed = 0
        ctx.progress(0.0)
        script = f"BEGIN IMMEDIATE; PRAGMA incremental_vacuum({self.incremental_chunk_pages}); COMMIT;"
        while freed < start_free:
            ctx.checkpoint()  # no transaction is open here: a hold waits holding no lock
            free_before = pragma(conn, "freelist_count")
            if free_before == 0:
                break
            try:
                conn.executescript(script)
            except sqlite3.Error as exc:
                rollback_quietly(conn)
                self._raise_mapped(exc, path)
                raise
            free_after = pragma(conn, "freelist_count")
            if free_after >= free_before:
                break  # nothing moved (should not happen): never loop forever
            freed += free_before - free_after
            ctx.progress(min(1.0, freed / start_free))

    def _upgrade(self, conn: sqlite3.Connection, path: str, state: DbState, ctx: CompactionContext) -> None:
        self._check_space(path, state.file_bytes)
        page_size_change = self.page_size is not None and state.page_size != self.page_size
        leave_wal = page_size_change and pragma(conn, "journal_mode") == "wal"
        if leave_wal:
            try:
                mode = pragma(conn, "journal_mode=DELETE")
            except sqlite3.Error as exc:
                self._raise_mapped(exc, path, busy_message="needs exclusive access")
                raise
            if mode != "delete":
                raise Busy("needs exclusive access")
        try:
            if self.page_size is not None:
                conn.execute(f"PRAGMA page_size={int(self.page_size)}")
            if self.auto_vacuum is not None:
                conn.execute(f"PRAGMA auto_vacuum={self.auto_vacuum.upper()}")
            self._vacuum(conn, path, state, ctx)
        finally:
            if leave_wal:
                self._restore_wal(conn, path)

    def _restore_wal(self, conn: sqlite3.Connection, path: str) -> None:
        # The application chose WAL; a database left in DELETE mode works but behaves differently
        # (readers block on writers), so keep trying for a while before giving up loudly.
        for _ in range(WAL_RESTORE_ATTEMPTS):
            try:
                if pragma(conn, "journal_mode=WAL") == "wal":
                    return
            except sqlite3.Error:
                log.debug("Switching %r back to WAL failed; retrying.", path, exc_info=True)
            time.sleep(self.busy_timeout_s / 4)
        log.error("Could not switch %r back to WAL mode after its upgrade; it is in DELETE mode.", path)

    def _cleanup(self, conn: sqlite3.Connection, path: str, ctx: CompactionContext) -> None:
        cancelled = threading.Event()

        def cancel() -> None:
            cancelled.set()
            conn.interrupt()

        ctx.on_cancel(cancel)
        if cancelled.is_set():
            raise Interrupted(f"cleanup of {path} was interrupted before it started")
        if pragma(conn, "journal_mode") == "wal":
            self._truncate_wal(conn, path, required=True)
        for leftover in self.leftovers(path):
            try:
                os.remove(leftover)
            except FileNotFoundError:
                pass

    def _truncate_wal(self, conn: sqlite3.Connection, path: str, *, required: bool) -> None:
        try:
            row = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.Error as exc:
            if not required:
                log.debug("WAL checkpoint of %r failed after compaction.", path, exc_info=True)
                return
            self._raise_mapped(exc, path, busy_message=f"WAL checkpoint of {path} could not complete: {exc}")
            raise
        if row and row[0]:
            if required:
                raise Busy(f"WAL checkpoint of {path} could not complete: readers or a writer hold the log")
            log.debug("WAL checkpoint of %r after compaction was blocked; the log shrinks later.", path)
