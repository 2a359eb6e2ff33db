"""The built-in compactor: SQLite database files and their ``cleanup:<path>`` keys.

This module owns :class:`SqliteCompactor`: its settings and roots (both live), the keys it
claims, what a database measures for the priority re-check (sizes, the exact ``dbstat``
payload remembered per key, whether it needs an upgrade, a cleanup key's priority), and
which way each compaction goes:

* an upgrade when ``page_size`` / ``auto_vacuum`` differ from the configured targets;
* else incremental chunks when ``auto_vacuum = INCREMENTAL`` and there are free pages;
* else an in-place ``VACUUM``;
* then, with ``analyze`` on, ``PRAGMA optimize`` (the planner's statistics, refreshed);
* and afterwards, for a WAL database, a passive checkpoint first thing, then the log emptied
  and its file cut (:func:`~smoosh.compactors.sqlite_wal.truncate_after_compaction`): in WAL
  mode the file only shrinks when the log is checkpointed. ``cleanup:<path>`` jobs checkpoint a log that grew
  past half of ``wal_max_size`` (restarting it, or cutting a file past the limit: see
  :mod:`~smoosh.compactors.sqlite_wal`), or, for a database that no longer exists, remove the
  side files it left behind
  (:meth:`SqliteCompactor.leftovers`). A side file whose database exists is never removed:
  a ``-wal`` or a ``-journal`` may hold committed transactions the database needs.

How each way runs on the open connection (locks, progress, cancellation, the WAL dance of a
page size change) is :mod:`smoosh.compactors.sqlite_compact`'s.

Reading sizes never creates or leaves a file (see :mod:`smoosh.compactors.sqlite_file`).

The exact ``dbstat`` payload and ``changes`` (write transactions since smoosh last compacted
the database, from SQLite's file change counter) are measured and remembered per key by
:mod:`smoosh.compactors.sqlite_measure`, whose docstring says when ``changes`` is unknown.

Every open goes through :func:`~smoosh.compactors.sqlite_open.open_database`: the path is
re-checked against ``roots`` and no symlink is followed, at the priority re-check (``sizes``,
``needs_upgrade``, ``cleanup_priority``: None / False / 0.0 for a refused path, like a
missing file) and at the compaction (:class:`~smoosh.compactors.base.Refused`, a ``Gone``).
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Iterable

import apsw

import smoosh.compactors.sqlite_compact as sqlite_compact
import smoosh.compactors.sqlite_incremental as sqlite_incremental
import smoosh.compactors.sqlite_leftovers as sqlite_leftovers
import smoosh.compactors.sqlite_quiet as sqlite_quiet
import smoosh.compactors.sqlite_wal as sqlite_wal
from smoosh.paths import CLEANUP_PREFIX
from smoosh.compactors.base import (
    Blocked, Busy, CompactionContext, CompactionResult, CompactorBase, Gone, Look, PinnedWal, Refused, Replaced, Shared,
    Sizes,
)
from smoosh.compactors.sqlite_file import (
    AUTO_VACUUM_CODES, LOOKS, DbState, changed_outside_sqlite, file_size, footprint_bytes, in_use, read_state,
    still_copied,
)
from smoosh.compactors.sqlite_file import look as look_at
from smoosh.compactors.sqlite_identity import FileIdentity, replaced_error
from smoosh.compactors.sqlite_measure import DBSTAT_QUERY, KeyMemory, exact_active_bytes
from smoosh.compactors.sqlite_open import canonical_roots, close_quietly, pragma, refusal_error, rollback_quietly, run
from smoosh.disk_room import DiskRoom
from smoosh.identity import Roots, side_files
from smoosh.io_budget import IoBudget
from smoosh.sqlite_defaults import DEFAULT_BUSY_TIMEOUT_S, DEFAULT_INCREMENTAL_CHUNK_PAGES, DEFAULT_MAX_LOCK_HOLD_S

__all__ = [
    "SqliteCompactor", "CLEANUP_PREFIX", "DEFAULT_WAL_MAX_SIZE_BYTES", "WAL_ACT_FRACTION", "DEFAULT_EXACT_SIZE_INTERVAL_S", "DBSTAT_QUERY",
]

#: The size a ``-wal`` is kept under (bytes): see :data:`WAL_ACT_FRACTION`.
DEFAULT_WAL_MAX_SIZE_BYTES = 64 * 1024 * 1024
#: A log past this fraction of ``wal_max_size`` makes its cleanup key worth a job. Acting
#: only once the log is past the limit leaves it over the limit for as long as the job takes to
#: start and to find a moment no reader pins the log (up to a reader's whole transaction), while
#: the application keeps writing; acting at half of it gives that time room below the limit.
#: Below the limit a reader that pins the log is not reported: the job ends after its wait and
#: the next look at the log's growth starts another (see :func:`sqlite_wal.cleanup`).
WAL_ACT_FRACTION = 0.5
#: The exact ``dbstat`` payload of a key is taken at most this often (seconds).
DEFAULT_EXACT_SIZE_INTERVAL_S = 3600.0


def _quiet_pause(ctx: CompactionContext) -> Callable[[float], None]:
    """The wait between two looks for a quiet moment: the context's pause, then its checkpoint (no
    lock is held while waiting, so a stop or a hold acts there)."""

    def wait(seconds: float) -> None:
        ctx.pause(seconds)
        ctx.checkpoint()

    return wait


class SqliteCompactor(CompactorBase):
    """Compacts SQLite database files in place; never corrupts one (SQLite's own transactions do the work).

    Parameters:
        settings: an object with ``page_size`` (int | None), ``auto_vacuum`` ("none" | "full" |
            "incremental" | None), ``incremental_chunk_pages``, ``busy_timeout_s`` and
            optionally ``analyze`` (``PRAGMA optimize`` after each successful compaction; off
            when missing) and ``max_lock_hold_s`` (a missing one takes its default) (smoosh's
            ``SqliteConfig`` fits); None gives the defaults (no upgrade targets, no analyze).
        roots: directories every database path must be one of or lie below, re-checked at
            every open (see :meth:`set_roots`); None (the default, for library use) means no
            roots restriction. Symlinks are refused either way.
        wal_max_size_bytes: the size a ``-wal`` is kept under: past :data:`WAL_ACT_FRACTION` of
            it the cleanup key's priority is 1, and a reader pinning a log past it is named.
        exact_size_interval_s: how often the exact ``dbstat`` size of one key may be taken.
        clock: monotonic seconds, for the exact-size bookkeeping and a VACUUM's ``max_lock_hold``.
        temp_dir: where VACUUM's temporary database goes (for the free space check only; SQLite
            picks it from ``SQLITE_TMPDIR``/``TMPDIR``, which is also the default here).
        io_budget: the process's I/O budget, charged what compactions write (see
            :mod:`~smoosh.compactors.sqlite_compact`); None charges nothing.
        disk_room: the process's reservations of disk space (:mod:`smoosh.disk_room`); None
            gives this compactor its own, keeping the default ``min_free_space``.
    """

    name = "sqlite"

    def __init__(
        self,
        settings: object = None,
        *,
        roots: Iterable[str] | None = None,
        wal_max_size_bytes: int = DEFAULT_WAL_MAX_SIZE_BYTES,
        exact_size_interval_s: float = DEFAULT_EXACT_SIZE_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        temp_dir: str | None = None,
        io_budget: IoBudget | None = None,
        disk_room: DiskRoom | None = None,
    ) -> None:
        self.io_budget = io_budget
        self.disk_room = disk_room if disk_room is not None else DiskRoom()
        self.page_size: int | None = None
        self.auto_vacuum: str | None = None
        self.incremental_chunk_pages = DEFAULT_INCREMENTAL_CHUNK_PAGES
        self.busy_timeout_s = DEFAULT_BUSY_TIMEOUT_S
        self.analyze = False
        self.max_lock_hold_s = DEFAULT_MAX_LOCK_HOLD_S
        self.configure(settings, wal_max_size_bytes=wal_max_size_bytes, exact_size_interval_s=exact_size_interval_s)
        self._clock = clock
        self._temp_dir = temp_dir
        # Exact payloads and change counters per key, shared by re-checks and compactions.
        self._memory = KeyMemory(clock)
        # What the compactions saw of the applications: waits for a quiet moment, give-ups.
        self.quiet_stats = sqlite_quiet.QuietStats()
        self._looks = LOOKS
        # Databases whose log a reader pinned at their last compaction: path -> when first seen
        # (monotonic seconds: an age, which a wall clock step must not change). Written by compaction threads, read by scrapes: one dict, whole-key
        # writes and a copy to read (the GIL makes each atomic).
        self._pinned: dict[str, float] = {}
        self._tick_rate = sqlite_compact.TickRate()  # learned across this compactor's VACUUMs
        self._roots: Roots | None = None
        self.set_roots(roots)

    def configure(
        self, settings: object, *, wal_max_size_bytes: int | None = None, exact_size_interval_s: float | None = None,
    ) -> None:
        """Apply settings, live: compactions that start afterwards use them.

        Owned by one caller (the server, on every config reload); a compaction already running
        keeps what it read when it started.

        Parameters:
            settings: as for the constructor (None: the defaults).
            wal_max_size_bytes, exact_size_interval_s: None keeps the current value.

        Raises:
            ValueError: an unknown ``auto_vacuum``; nothing changed.
        """
        auto_vacuum = getattr(settings, "auto_vacuum", None)
        if auto_vacuum is not None and auto_vacuum not in AUTO_VACUUM_CODES:
            raise ValueError(f"auto_vacuum must be none, full or incremental, not {auto_vacuum!r}")
        self.page_size = getattr(settings, "page_size", None)
        self.auto_vacuum = auto_vacuum
        self.incremental_chunk_pages = int(getattr(settings, "incremental_chunk_pages", None) or DEFAULT_INCREMENTAL_CHUNK_PAGES)
        busy = getattr(settings, "busy_timeout_s", None)
        self.busy_timeout_s = float(DEFAULT_BUSY_TIMEOUT_S if busy is None else busy)
        self.analyze = bool(getattr(settings, "analyze", False))
        hold = getattr(settings, "max_lock_hold_s", None)
        self.max_lock_hold_s = float(DEFAULT_MAX_LOCK_HOLD_S if hold is None else hold)
        if wal_max_size_bytes is not None:
            self.wal_max_size_bytes = wal_max_size_bytes
        if exact_size_interval_s is not None:
            self.exact_size_interval_s = exact_size_interval_s

    def set_io_budget(self, budget: IoBudget | None) -> None:
        """Charge what compactions write to ``budget`` (the process's ``max_io_rate``); None: charge nothing.

        Owned by one caller (the server, once, before any compaction runs).
        """
        self.io_budget = budget

    def set_disk_room(self, room: DiskRoom) -> None:
        """Reserve what compactions write in ``room`` (the process's, shared by its compactors).

        Owned by one caller (the server, once, before any compaction runs).
        """
        self.disk_room = room

    # ------------------------------------------------------------------ roots

    @property
    def roots(self) -> Roots | None:
        """The canonical roots every open is checked against; None when unrestricted."""
        return self._roots

    def set_roots(
        self, roots: Iterable[str] | None, *, allow_hard_links: Iterable[str] | None = None,
        allow_mounts: Iterable[str] | None = None,
    ) -> None:
        """Replace the roots, live: opens that start afterwards are checked against the new ones.

        Owned by one caller (the server, which applies the config's ``roots`` at start and on
        every reload); a compaction already running keeps the roots it started with. An empty
        sequence refuses every path, as the server refuses every key without roots.

        Parameters:
            roots: directories (absolute; resolved with ``os.path.realpath`` here, since keys
                are realpaths), or None for no roots restriction.
            allow_hard_links: roots whose databases may have other hard links (see
                :mod:`smoosh.identity`; by default none may).
            allow_mounts: roots whose databases may lie on another mount than the root.

        Raises:
            ValueError: a root is not an absolute path, or an opt-in is not one of the roots.
        """
        # One attribute, replaced whole: readers take a consistent tuple without a lock.
        self._roots = canonical_roots(roots, allow_hard_links=allow_hard_links, allow_mounts=allow_mounts)

    # ------------------------------------------------------------------ keys

    def claims(self, key: str) -> bool:
        """Lexical: an absolute path, or ``cleanup:`` + an absolute path. No I/O.

        Parameters:
            key: any string.

        Returns:
            True for keys this compactor handles.
        """
        path = key[len(CLEANUP_PREFIX):] if key.startswith(CLEANUP_PREFIX) else key
        # Asked several times per key a fleet enqueues: os.path.isabs's test, without its call.
        return path.startswith("/") and "\x00" not in path

    @staticmethod
    def _split(key: str) -> tuple[str, bool]:
        if key.startswith(CLEANUP_PREFIX):
            return key[len(CLEANUP_PREFIX):], True
        return key, False

    # ------------------------------------------------------------------ reading

    def read_state(self, path: str) -> DbState | None:
        """Page counts and format of a database, cheaply.

        Parameters:
            path: the database file (canonical).

        Returns:
            The state; None when it is missing, not SQLite, or refused (outside the roots or
            through a symlink: logged at WARNING, never opened).
        """
        try:
            return read_state(path, self.busy_timeout_s, roots=self._roots)
        except Refused:
            return None

    def file_problem(self, path: str) -> str | None:
        """Why ``path`` is not a database this compactor would compact, in an operator's words; None when it is.

        For HTTP, the CLI and ``explain`` (not the hot path): the header read with the strict
        identity checks (links, the mount, its side files), as a compaction's start makes them.

        Parameters:
            path: a canonical path inside the roots, naming a regular file.

        Returns:
            ``"not a SQLite file"``, the reason of a refusal (:mod:`smoosh.identity`), or None.
        """
        return self.look(path).problem

    def look(self, path: str, *, strict: bool = True) -> Look:
        """One look at the database ``path`` (:func:`~smoosh.compactors.sqlite_file.look`): what
        :meth:`file_problem` says (``strict``), and what :meth:`sizes` and :meth:`cleanup_key`
        answer from when it is handed to them, so a new key's file is read once.

        Parameters:
            path: a canonical path inside the roots.
            strict: the identity checks a compaction's start makes (an operator's key); False:
                those of a measurement (links and device; the examination of a watched file).
        """
        return look_at(path, self.busy_timeout_s, roots=self._roots, strict=strict)

    def sizes(self, key: str, *, exact: bool = False, look: Look | None = None) -> Sizes | None:
        """File and live bytes of a key's database.

        For a ``cleanup:`` key: ``file_bytes`` is the ``-wal`` size (for a database that no
        longer exists, the size of its :meth:`leftovers`) and ``active_bytes`` 0 (all of it is
        reclaimable by the cleanup job).

        Parameters:
            key: a claimed key.
            exact: take the exact ``dbstat`` payload (reads every page; remembered per key).
            look: a :meth:`look` at the database just taken: its state is used instead of
                reading the header again (ignored for a ``cleanup:`` key).

        Returns:
            ``Sizes(file_bytes, active_bytes, changes)``; None when missing, not SQLite,
            or refused (outside the roots or through a symlink). ``changes`` counts write
            transactions since this compactor's last compaction of the key, or is None when
            unknown (see :mod:`~smoosh.compactors.sqlite_measure`). Without ``exact``, a fresh
            remembered exact size is used while the file size has not changed since it was
            taken; otherwise ``(page_count - freelist) * page_size``, a lower bound on what a
            VACUUM reclaims.
        """
        path, cleanup = self._split(key)
        roots = self._roots
        if look is not None and not cleanup and (look.problem is not None or isinstance(look.state, DbState)):
            state = look.state if isinstance(look.state, DbState) else None
        else:
            try:
                state = read_state(path, self.busy_timeout_s, roots=roots)
            except Refused:
                return None
        if state is None:
            left = self.leftovers(path) if cleanup else []
            return Sizes(file_bytes=sum(file_size(f) for f in left), active_bytes=0) if left else None
        if look is None and not cleanup and still_copied(path, state) is not None:
            return None  # not whole yet (a look said so itself): nothing to measure until it is
        if cleanup:
            return Sizes(file_bytes=file_size(path + "-wal"), active_bytes=0)
        estimate = (state.page_count - state.freelist_count) * state.page_size
        changes = self._memory.changes(key, state)
        if exact:
            try:
                active = exact_active_bytes(path, estimate, self.busy_timeout_s, roots, wal=state.wal)
            except Refused:
                return None  # a directory swapped for a symlink: the header read follows those
            if active is not None:
                self._memory.remember_exact(key, state.file_bytes, active)
                return Sizes(file_bytes=state.file_bytes, active_bytes=active, changes=changes)
            # Its application is writing it: measured without a lock later, the estimate meanwhile.
        remembered = self._memory.fresh_exact(key, state.file_bytes, self.exact_size_interval_s)
        if remembered is not None:
            return Sizes(file_bytes=state.file_bytes, active_bytes=min(remembered, estimate), changes=changes)
        return Sizes(file_bytes=state.file_bytes, active_bytes=estimate, changes=changes)

    def _remember_counter(self, key: str, path: str, roots: tuple[str, ...] | None) -> DbState | None:
        """Remember the file change counter of a database just compacted: ``changes`` counts from here.
        The state it read (its size is the compaction's result), or None.

        Read from the header once the compaction's connection is closed (the compaction's own
        transactions bumped the counter). A commit of the application between the compaction's
        end and this read is not counted: ``changes`` may lag by a transaction or two.
        """
        try:
            state = read_state(path, self.busy_timeout_s, roots=roots)
        except Refused:
            state = None
        self._memory.remember_counter(key, state)
        return state

    def pinned_wals(self) -> list[PinnedWal]:
        """``(path, WAL bytes now, pinned since: monotonic seconds)`` of each database whose log a reader
        kept pinned at its last compaction (until one empties it), oldest first."""
        pinned = dict(self._pinned)
        return sorted(((p, sqlite_wal.wal_bytes(p), since) for p, since in pinned.items()), key=lambda t: t[2])

    def exact_size_due(self, key: str) -> bool:
        """True when the exact size of ``key`` was not taken within ``exact_size_interval_s``."""
        return self._memory.exact_due(key, self.exact_size_interval_s)

    def needs_upgrade(self, key: str) -> bool:
        """True when the database's page size or auto_vacuum differs from a configured target.

        Parameters:
            key: a claimed key (``cleanup:`` keys never need one).

        Returns:
            False when no target is set (the default), the database is missing or refused
            (outside the roots, through a symlink), or it matches.
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
        """Side files left beside a database that no longer exists (see :func:`sqlite_leftovers.leftovers`)."""
        return sqlite_leftovers.leftovers(path, self._roots)

    @property
    def wal_act_bytes(self) -> int:
        """The ``-wal`` size past which a cleanup job is worth starting (:data:`WAL_ACT_FRACTION` of ``wal_max_size``)."""
        return int(self.wal_max_size_bytes * WAL_ACT_FRACTION)

    def cleanup_key(self, key: str, *, look: Look | None = None) -> str | None:
        """The cleanup key a database's state calls for now: its ``-wal`` passed :attr:`wal_act_bytes`.

        Cheap (one ``lstat``, none with a ``look``): the server asks it whenever it examines a
        database key.

        Parameters:
            key: a claimed key.
            look: a :meth:`look` at the database just taken: its ``-wal`` size is used.

        Returns:
            ``cleanup:<path>`` for a database key whose ``-wal`` is larger than
            :attr:`wal_act_bytes`; None otherwise (a ``cleanup:`` key itself included).
        """
        if look is not None and not look.wal_bytes:
            return None  # most databases examined have no log (asked for every one of them)
        path, cleanup = self._split(key)
        if cleanup:
            return None
        wal_bytes = look.wal_bytes if look is not None else file_size(path + "-wal")
        return CLEANUP_PREFIX + path if self._wal_calls_for_cleanup(path, wal_bytes) else None

    def _wal_calls_for_cleanup(self, path: str, wal_bytes: int) -> bool:
        """Whether a ``-wal`` of ``wal_bytes`` needs its cleanup job: its file is past
        ``wal_max_size``, or the log in it is past :attr:`wal_act_bytes`, or the file is past
        that size and nobody has written it for :data:`~smoosh.compactors.sqlite_wal.WAL_QUIET_S`.

        The log, not the file: a cleanup job restarts a log under ``wal_max_size`` rather than
        cut its file (:func:`~smoosh.compactors.sqlite_wal.restart_wal`), so the file keeps its
        size while the log starts over in it. Read only for a file past the act size (a few
        reads of 24 bytes: :func:`~smoosh.compactors.sqlite_wal.wal_content_bytes`). Once its
        application has gone quiet, such a file is cut after all: nobody is there to wait for
        it, and space is what smoosh is for (a rescan looks at a database once after its last
        write, which is when this is asked).
        """
        if wal_bytes <= self.wal_act_bytes:
            return False
        if wal_bytes > self.wal_max_size_bytes:
            return True
        in_use = sqlite_wal.wal_content_bytes(path)
        return in_use is None or in_use > self.wal_act_bytes or sqlite_wal.wal_quiet(path)

    def cleanup_priority(self, key: str) -> float:
        """1.0 for a ``cleanup:`` key with work to do, else 0.0.

        Work: the database's ``-wal`` exceeds :attr:`wal_act_bytes`, or the database no longer
        exists and left side files behind (:meth:`leftovers`).

        Parameters:
            key: a claimed key.

        Returns:
            0.0 also for a database path that is refused (outside the roots, through a symlink).
        """
        path, cleanup = self._split(key)
        if not cleanup:
            return 0.0
        try:
            state = read_state(path, self.busy_timeout_s, roots=self._roots)
        except Refused:
            return 0.0
        if state is None:
            return 1.0 if self.leftovers(path) else 0.0
        return 1.0 if self._wal_calls_for_cleanup(path, file_size(path + "-wal")) else 0.0

    # ------------------------------------------------------------------ compacting

    def compact(self, key: str, ctx: CompactionContext) -> CompactionResult:
        """Compact the key's database (for a ``cleanup:`` key: restart or cut its WAL, or remove its leftovers).

        Parameters:
            key: a claimed key.
            ctx: progress, chunk boundaries and cancellation (see :class:`CompactionContext`).

        Returns:
            Footprint (database + ``-wal``) before and after.

        Raises:
            Busy: the database stayed locked for the busy timeout, or an upgrade needs
                exclusive access, or a WAL checkpoint could not complete.
            Interrupted: cancelled through ``ctx``; the database is intact.
            Blocked: the database (or its directory) is read-only, or a reader's snapshot kept
                the compacted pages in the WAL (the message gives the bytes still there).
            Replaced: another file was renamed over the path meanwhile; the compaction was
                interrupted (or had finished on the old file) and the new file integrity-checked
                (see :mod:`~smoosh.compactors.sqlite_identity`).
            Refused: the path lies outside the roots or reaches its file through a symlink
                (a ``Gone``; logged at WARNING); nothing was opened through it.
            Blocked: also when the file is shared (other hard links, another mount, a side
                file that is a link: :mod:`smoosh.identity`); nothing was opened through it.
            Gone: the file is missing or not SQLite.
            Busy: also when the file is not whole yet (shorter than its header says: a copy in
                progress), or was written outside SQLite's locks while it was compacted, which
                SQLite then calls malformed (:func:`~smoosh.compactors.sqlite_file.changed_outside_sqlite`):
                rolled back, and tried again later rather than called corrupt.
            InsufficientSpace: what it would write does not fit on disk beside the room other
                compactions reserved and ``min_free_space`` (a ``Blocked``; nothing opened).
            apsw.Error: anything else SQLite reports.
        """
        path, cleanup = self._split(key)
        roots = self._roots  # one compaction, one set of roots, even across a reload
        try:
            state = read_state(path, self.busy_timeout_s, roots=roots, strict=True, warn=False)
            side, wal_bytes = side_files(path, roots) if state is not None else (None, 0)
            if side is not None:
                raise Blocked(side)
        except Shared as exc:
            # Not gone: the sharing is the operator's to end, and the key is worth compacting then.
            raise Blocked(exc.reason) from None
        if state is None:
            removed = sqlite_leftovers.remove_leftovers(path, roots) if cleanup else None
            if removed is not None:
                ctx.progress(1.0)
                return removed
            raise Gone(f"{path} is missing or not a SQLite database")
        copied = None if cleanup else still_copied(path, state)
        if copied is not None:
            raise Busy(f"{path} is {copied}")
        # The header read's fstat and the side files' lstat answer the identity and the footprint
        # (database and -wal): no stat of their own between the decision and the open.
        identity = FileIdentity(path, (state.device, state.inode) if state.inode else None)
        before = state.file_bytes + wal_bytes
        reservation = sqlite_compact.reserve(self.disk_room, self._needs(path, cleanup, state))
        try:
            with in_use(path), reservation:
                try:
                    self._compact_open(path, cleanup, state, ctx, roots, identity)
                except sqlite_wal.WalPinned as exc:
                    self._pinned.setdefault(path, time.monotonic())
                    exc.size_before_bytes = before  # what a later checkpoint of its pages is counted against
                    raise
                self._pinned.pop(path, None)
            try:
                identity.check()
            except Replaced:
                raise Replaced(path, rolled_back=False) from None
        except Replaced as exc:
            # The connection to the old file is closed (its journal rolled back and removed):
            # only now is the new file looked at, so the check cannot meet smoosh's own journal.
            raise replaced_error(path, roots, self.busy_timeout_s, rolled_back=exc.rolled_back) from None
        except (apsw.CorruptError, apsw.NotADBError) as exc:
            # Its connection is closed: the header is read afresh. A file a copy was still
            # writing is not corrupt, and must not be reported so.
            outside = changed_outside_sqlite(path, state, untouched=self._way(cleanup, state) == "vacuum")
            if outside is None:
                raise
            raise Busy(outside) from exc
        finally:
            self._memory.forget_exact(key)
        after_state = self._remember_counter(key, path, roots) if not cleanup else None
        after = after_state.file_bytes + file_size(path + "-wal") if after_state is not None else footprint_bytes(path)
        ctx.progress(1.0)
        return CompactionResult(size_before_bytes=before, size_after_bytes=after)

    def _way(self, cleanup: bool, state: DbState) -> str:
        """Which way the database is compacted: cleanup, upgrade, incremental or vacuum."""
        if cleanup:
            return "cleanup"
        if self._upgrade_needed(state):
            return "upgrade"
        if state.auto_vacuum == 2 and state.freelist_count > 0:
            return "incremental"
        return "vacuum"

    def _needs(self, path: str, cleanup: bool, state: DbState) -> dict[str, int]:
        """What the compaction will write, per directory (reserved before it starts).

        A VACUUM or an upgrade: its live size twice (:func:`~smoosh.compactors.sqlite_compact.vacuum_needs`);
        incremental chunks: one chunk's journal at a time; a cleanup: its WAL's checkpoint into
        the database, at most the WAL's size.
        """
        way = self._way(cleanup, state)
        directory = os.path.dirname(path) or "."
        if way == "cleanup":
            return {directory: file_size(path + "-wal")}
        if way == "incremental":
            return {directory: 2 * self.incremental_chunk_pages * state.page_size}
        return sqlite_compact.vacuum_needs(path, state, self._temp_dir)

    def _compact_open(
        self, path: str, cleanup: bool, state: DbState, ctx: CompactionContext, roots: tuple[str, ...] | None,
        identity: FileIdentity,
    ) -> None:
        """Choose the way this database is compacted and run it on one read-write connection.

        Its locks are taken as :mod:`~smoosh.compactors.sqlite_quiet` says: a rollback-journal
        database's exclusively, at a quiet moment, before its first read; a WAL database's
        write from a quiet moment.
        """
        rollback = not state.wal and not cleanup
        conn = sqlite_compact.open_for_compaction(path, roots, self.busy_timeout_s, identity.meant, check=not rollback)
        held = False
        pause = _quiet_pause(ctx)
        try:
            identity.check()  # the connection opened the file the identity was taken of
            if not cleanup:
                sqlite_wal.refuse_pinned_wal(conn, path)
            way = self._way(cleanup, state)
            if way in ("vacuum", "upgrade"):
                if rollback:
                    sqlite_quiet.hold_exclusive(conn, path, self.busy_timeout_s, busy_timeout_s=self.busy_timeout_s,
                                                keep=True, pause=pause, stats=self.quiet_stats)
                    held = True
                    sqlite_compact.check_database(conn, path)
                else:
                    sqlite_quiet.wait_for_quiet(path, True, self.busy_timeout_s, pause=pause, stats=self.quiet_stats)
            # The lock held goes with the VACUUM's end, unless the statistics below are taken under it.
            lets_go = held and not self.analyze
            if way == "cleanup":
                sqlite_wal.cleanup(conn, path, ctx, busy_timeout_s=self.busy_timeout_s,
                                   readers_wait_s=sqlite_wal.READERS_WAIT_S, wal_max_bytes=self.wal_max_size_bytes)
            elif way == "upgrade":
                sqlite_compact.upgrade(
                    conn, path, state, ctx, page_size=self.page_size, auto_vacuum=self.auto_vacuum,
                    busy_timeout_s=self.busy_timeout_s, temp_dir=self._temp_dir, rate=self._tick_rate,
                    identity=identity, budget=self.io_budget, max_lock_hold_s=self.max_lock_hold_s,
                    clock=self._clock, lets_go=lets_go,
                )
            elif way == "incremental":
                sqlite_incremental.incremental(conn, path, ctx, self.incremental_chunk_pages, identity, self.io_budget,
                                               begin=self._chunk_begin(conn, path, state, pause))
            else:
                sqlite_compact.vacuum(conn, path, state, ctx, self._tick_rate, identity, self.io_budget,
                                      self.max_lock_hold_s, self._clock, lets_go=lets_go)
            wal = not cleanup and sqlite_wal.has_wal_file(path) and pragma(conn, "journal_mode") == "wal"
            if wal:
                sqlite_wal.copy_back(conn, path)  # first: before the application's own checkpoint
            if not cleanup and self.analyze:
                # Before the cut: the statistics it writes go back into the file with the rest.
                if rollback and not held:
                    sqlite_quiet.hold_exclusive(conn, path, self.busy_timeout_s, busy_timeout_s=self.busy_timeout_s,
                                                keep=True, pause=pause, stats=self.quiet_stats)
                    held = True
                sqlite_compact.optimize(conn, path)
            if wal:
                sqlite_wal.truncate_after_compaction(conn, path, ctx, busy_timeout_s=self.busy_timeout_s,
                                                     wait_s=sqlite_wal.READERS_WAIT_S)
        except Replaced:
            sqlite_wal.empty_moved_wal(conn, path)
            raise
        except apsw.Error as exc:
            # A side file refused by the open check, whichever statement opened it (a hot
            # journal's look opens the -journal at any first read, not only at a VACUUM's write).
            refused_side = refusal_error(path)
            if refused_side is not None:
                raise Blocked(refused_side.reason) from exc
            raise
        finally:
            # Closing lets every lock go, and deletes a journal exclusive locking kept (a VACUUM that
            # never ran, or one followed by the statistics): no release_exclusive first (three
            # statements, same end).
            close_quietly(conn)

    def _chunk_begin(
        self, conn: apsw.Connection, path: str, state: DbState, pause: Callable[[float], None]
    ) -> Callable[[], None]:
        """How each incremental chunk opens its write transaction: at a quiet moment (see the module)."""
        checked: list[bool] = []

        def begin() -> None:
            if state.wal:
                sqlite_quiet.wait_for_quiet(path, True, self.busy_timeout_s, pause=pause, stats=self.quiet_stats)
                run(conn, "BEGIN IMMEDIATE")
                return
            sqlite_quiet.hold_exclusive(conn, path, self.busy_timeout_s, busy_timeout_s=self.busy_timeout_s,
                                        keep=False, pause=pause, stats=self.quiet_stats)
            if not checked:
                try:
                    sqlite_compact.check_database(conn, path)  # the first read of this compaction
                except BaseException:
                    rollback_quietly(conn)
                    raise
                checked.append(True)

        return begin

    def application(self) -> dict[str, float | int]:
        """What this compactor saw of the applications beside its databases (``/status``, ``/metrics``).

        Returns:
            ``{"waits", "wait_seconds", "gave_up"}`` (:class:`~smoosh.compactors.sqlite_quiet.QuietStats`)
            and ``looks_locked`` / ``looks_lockless``: the looks at a database that took a
            SQLite lock, and those that read the file without one.
        """
        out = self.quiet_stats.snapshot()
        out.update(self._looks.snapshot())
        return out
