"""Incremental compaction: ``PRAGMA incremental_vacuum`` in chunks, each its own write transaction.

For a database with ``auto_vacuum = INCREMENTAL`` and free pages (see
:mod:`~smoosh.compactors.sqlite_compact` for how the pragma must be stepped). While another
process has the database open, chunks are sized to hold the write lock about
:data:`SHARED_CHUNK_LOCK_MAX_S` and each is followed by a gap the process's pace
(:attr:`~smoosh.io_budget.IoBudget.chunk_gap_factor`, set by the daemon's backlog controller;
:data:`SHARED_CHUNK_GAP_FACTOR` without a budget) times as long, so the application's writers
get the lock between them. Before each such chunk it yields to a writer seen in the last
:data:`YIELD_RECENT_S` (:func:`yield_to_writer`: the database's or its log's mtime), for at
most :data:`YIELD_MAX_S`, so the chunk starts in the application's pause rather than in the
middle of a burst of its commits.
"""

from __future__ import annotations

import os
import time
from typing import Callable

import apsw

from smoosh.compactors.base import CompactionContext
from smoosh.compactors.sqlite_compact import raise_mapped
from smoosh.compactors.sqlite_identity import FileIdentity
from smoosh.compactors.sqlite_open import pragma, rollback_quietly, run
from smoosh.compactors.sqlite_openers import others_have_open
from smoosh.io_budget import DEFAULT_CHUNK_GAP_FACTOR, IoBudget

__all__ = ["incremental", "yield_to_writer", "last_write_age", "SHARED_CHUNK_LOCK_MAX_S", "SHARED_CHUNK_GAP_FACTOR",
           "YIELD_RECENT_S", "YIELD_MAX_S"]

#: Longest an incremental chunk holds the write lock of a database another process has open
#: (DESIGN §9 aims at 10 ms per chunk at p99.9; the commit's own sync comes on top).
SHARED_CHUNK_LOCK_MAX_S = 0.005
#: After such a chunk, the lock stays free this many times as long as the chunk held it: a
#: writer sleeping in its busy handler then finds it free at most of its wake-ups. Used where
#: no budget carries the daemon's pace.
SHARED_CHUNK_GAP_FACTOR = DEFAULT_CHUNK_GAP_FACTOR
#: A shared chunk that waited this long for the write lock found the application writing: the
#: wait is noted on the budget as a sign of harm (the backlog controller slows the pace).
LOCK_WAIT_HARM_S = 0.01
#: The longest gap between two chunks, in seconds, whatever the pace. A context with a
#: ``pause`` (the worker's) ends the gap early on a stop or a hold; with a plain sleep, a stop
#: acts at the next chunk.
MAX_CHUNK_GAP_S = 5.0
#: A write to the database (or its log) this recent means the application is committing now,
#: perhaps in a burst: a shared chunk waits until its writes are this old (seconds).
YIELD_RECENT_S = 0.003
#: The longest a shared chunk yields so (seconds): a writer that never pauses cannot starve
#: the compaction; the chunk then goes, as it did before yielding existed.
YIELD_MAX_S = 0.05


def incremental(
    conn: apsw.Connection, path: str, ctx: CompactionContext, chunk_pages: int, identity: FileIdentity | None = None,
    budget: IoBudget | None = None, begin: Callable[[], None] | None = None,
) -> None:
    """Free the database's free pages in chunks of ``chunk_pages``, one write transaction each.

    While another process has the database open (WAL mode, seen in ``/proc/locks``), a chunk
    also ends after holding the write lock :data:`SHARED_CHUNK_LOCK_MAX_S`, and the next one
    starts only after the budget's ``chunk_gap_factor`` (:data:`SHARED_CHUNK_GAP_FACTOR`
    without one) times as long: the application's writers get the lock between chunks
    instead of waiting out a run of them.

    Every read of the database happens inside a chunk's transaction: outside one, a read would
    take a lock of its own at a moment the application did not choose.

    Parameters:
        identity: the file being compacted; checked before every chunk (no journal exists
            then), so a path renamed over ends the compaction before it writes again.
        budget: charged each chunk's freed pages (bytes) as it commits; the pacing itself
            is the wait in ``ctx.checkpoint()`` before the next chunk. Its pace, read before
            each gap, sets the gap after a shared chunk.
        begin: opens a chunk's write transaction (a rollback-journal database's exclusive
            lock at a quiet moment: :func:`~smoosh.compactors.sqlite_quiet.hold_exclusive`);
            ``BEGIN IMMEDIATE`` by default.

    Raises:
        Busy: a chunk stayed locked beyond the busy timeout (or found no quiet moment).
        Replaced, Gone: the path names another file, or none, now.
        apsw.Error: anything else SQLite reports.
    """
    # No on_cancel callback: interrupting a chunk would only waste it; the worker's stop
    # and hold both act at the next ctx.checkpoint(), at most one short chunk away.
    start_free = -1  # read by the first chunk, inside its transaction
    page_bytes = 0
    freed = 0
    pages = chunk_pages
    own_write_ns = time.time_ns()  # writes before this (the compaction's own checks) are not the application's
    shared = others_have_open(path) is True
    # The worker's pause ends at once on a stop, a hold or a rotation.
    pause = ctx.pause
    ctx.progress(0.0)
    while start_free < 0 or freed < start_free:
        if shared:
            # Before the checkpoint: a stop or a hold that ends this wait acts there, before the chunk.
            yield_to_writer(lambda: last_write_age(path, own_write_ns), pause)
        ctx.checkpoint()  # no transaction is open here: a hold waits holding no lock
        if identity is not None:
            identity.check()
        # Shared: another process has the database open and may want to write. Its writer
        # sleeps in its busy handler while a chunk holds the lock, and wakes at moments of
        # its own: chunks back to back leave it almost no chance to find the lock free.
        shared = others_have_open(path) is True
        done = _chunk(conn, path, pages if shared else chunk_pages, SHARED_CHUNK_LOCK_MAX_S if shared else None,
                      budget if shared else None, begin)
        own_write_ns = time.time_ns()
        if done is None:
            break  # no free page left
        free_before, free_after, held_s, page_size = done
        if start_free < 0:
            start_free, page_bytes = free_before, page_size if budget is not None else 0
        if free_after >= free_before:
            break  # nothing moved (should not happen): never loop forever
        freed += free_before - free_after
        if budget is not None:
            budget.charge((free_before - free_after) * page_bytes)
        ctx.progress(min(1.0, freed / start_free))
        if shared and freed < start_free:
            # Most of a chunk's hold is its commit writing the pages it moved, which stepping
            # cannot cut short: the next chunk is sized from this one's hold instead.
            pages = max(1, min(chunk_pages, int(pages * SHARED_CHUNK_LOCK_MAX_S / max(held_s, 1e-6))))
            # The lock is free for the pace's factor times as long as the chunk held it (read
            # each time: the controller changes it while a long compaction runs).
            factor = budget.chunk_gap_factor if budget is not None else SHARED_CHUNK_GAP_FACTOR
            pause(min(MAX_CHUNK_GAP_S, held_s * factor))


def yield_to_writer(
    age: Callable[[], float | None], pause: Callable[[float], None], *, clock: Callable[[], float] = time.monotonic,
    recent_s: float = YIELD_RECENT_S, max_s: float = YIELD_MAX_S,
) -> float:
    """Wait while the application wrote within ``recent_s``, at most ``max_s`` in all; the seconds waited (0: none).

    Parameters:
        age: seconds since the application last wrote (None: unknown, which does not wait).
        pause: the wait (the worker's ``ctx.pause``: a stop, a hold or a rotation ends it).
        clock: monotonic seconds, for the bound.
    """
    start = clock()
    waited = 0.0
    while True:
        seen = age()
        if seen is None or seen >= recent_s or waited >= max_s:
            return waited
        pause(min(recent_s - max(seen, 0.0), max_s - waited))
        before, waited = waited, max(clock() - start, 1e-9)
        if waited - before < 1e-6:
            return waited  # the pause returned at once (stopped or held): the caller's checkpoint decides


def last_write_age(path: str, after_ns: int = 0) -> float | None:
    """Seconds since another connection last wrote ``path`` or its ``-wal`` (their mtimes: two ``stat`` calls).

    A commit writes the log in WAL mode and the database file in rollback mode.

    Parameters:
        after_ns: when this process last wrote the file itself (``time.time_ns()`` as its
            chunk committed): a newest write no later than it is its own, not the application's.

    Returns:
        The seconds, or None when unknown or when the newest write is this process's own. An
        mtime is wall-clock time: a clock step makes the age wrong, which costs at most one
        bounded wait (:data:`YIELD_MAX_S`) or none.
    """
    newest = 0
    for name in (path, path + "-wal"):
        try:
            newest = max(newest, os.stat(name).st_mtime_ns)
        except OSError:
            continue
    if newest <= after_ns:
        return None
    return (time.time_ns() - newest) / 1e9


def _chunk(conn: apsw.Connection, path: str, chunk_pages: int, lock_max_s: float | None,
           budget: IoBudget | None = None, begin: Callable[[], None] | None = None,
           ) -> tuple[int, int, float, int] | None:
    """One chunk: up to ``chunk_pages`` pages freed in one write transaction.

    With ``lock_max_s``, the chunk ends early once it has held the write lock that long: the
    pragma frees one page per step (module docstring), so stepping stops and the pages freed
    so far commit. With ``budget``, a wait of :data:`LOCK_WAIT_HARM_S` or more for the lock is
    noted on it.

    Returns:
        (free pages before, free pages after, seconds the lock was held, page size), read
        inside the transaction; None when there was no free page (nothing written).
    """
    started = time.monotonic()
    try:
        if begin is None:
            run(conn, "BEGIN IMMEDIATE")
        else:
            begin()
        got = time.monotonic()
        if budget is not None and got - started >= LOCK_WAIT_HARM_S:
            budget.note_lock_wait()  # the application held the lock: it was writing
        started = got  # the lock is held from here
        free_before = int(pragma(conn, "freelist_count") or 0)
        if free_before == 0:
            run(conn, "COMMIT")
            return None
        page_size = int(pragma(conn, "page_size") or 0)
        if lock_max_s is None:
            run(conn, f"PRAGMA incremental_vacuum({chunk_pages})")
        else:
            deadline = started + lock_max_s
            cursor = conn.execute(f"PRAGMA incremental_vacuum({chunk_pages})")
            try:
                for _ in cursor:
                    if time.monotonic() >= deadline:
                        break
            finally:
                cursor.close()
        free_after = int(pragma(conn, "freelist_count") or 0)
        run(conn, "COMMIT")
    except apsw.Error as exc:
        rollback_quietly(conn)
        raise_mapped(exc, path)
        raise
    return free_before, free_after, time.monotonic() - started, page_size
