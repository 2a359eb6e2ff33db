"""The WAL beside a compaction: its checkpoint, the ``cleanup:`` job, a pinned or moved log.

In WAL mode a database's file only shrinks when its log is checkpointed back:
:func:`truncate_wal` after every compaction of a WAL database, and alone for a ``cleanup:``
job (:func:`cleanup`). Before compacting, :func:`refuse_pinned_wal` ends the run
:class:`~smoosh.compactors.base.Blocked` when a reader pins a whole rewrite in the log;
after a rename over the path, :func:`empty_moved_wal` empties the old file's log.
"""

from __future__ import annotations

import logging
import os
import threading

import apsw

from smoosh.compactors.base import Blocked, Busy, CompactionContext, Interrupted
from smoosh.compactors.sqlite_compact import interrupt_quietly, raise_mapped
from smoosh.compactors.sqlite_open import pragma, run

__all__ = ["cleanup", "truncate_wal", "refuse_pinned_wal", "empty_moved_wal", "wal_bytes"]

log = logging.getLogger("smoosh.compactors.sqlite_compact")  # the compaction's lines, one logger

def cleanup(conn: apsw.Connection, path: str, ctx: CompactionContext) -> None:
    """A ``cleanup:`` job on an existing database: truncate its WAL (never delete a side file of it).

    Raises:
        Busy: the WAL checkpoint could not complete (readers or a writer hold the log).
        Interrupted: cancelled through ``ctx``.
    """
    cancelled = threading.Event()

    def cancel() -> None:
        cancelled.set()
        interrupt_quietly(conn)

    ctx.on_cancel(cancel)
    if cancelled.is_set():
        raise Interrupted(f"cleanup of {path} was interrupted before it started")
    if pragma(conn, "journal_mode") == "wal":
        truncate_wal(conn, path, required=True)


def truncate_wal(conn: apsw.Connection, path: str, *, required: bool) -> None:
    """``PRAGMA wal_checkpoint(TRUNCATE)``: the only way a WAL database's footprint shrinks.

    Parameters:
        required: a cleanup job, which exists for this checkpoint, so a blocked or failed one
            raises :class:`Busy`; after a compaction, frames a reader keeps in the log mean the
            compaction gave nothing back yet (the new pages are all in the WAL), which is
            :class:`Blocked`, while a checkpoint that only could not truncate is logged.

    Raises:
        Busy: ``required`` and the checkpoint could not complete.
        Blocked: not ``required``, and frames stayed in the WAL (a reader's snapshot pins them).
        apsw.Error: ``required`` and SQLite reported anything else.
    """
    try:
        rows = run(conn, "PRAGMA wal_checkpoint(TRUNCATE)")
    except apsw.Error as exc:
        if not required:
            log.debug("WAL checkpoint of %r failed after compaction.", path, exc_info=True)
            return
        raise_mapped(exc, path, busy_message=f"WAL checkpoint of {path} could not complete: {exc}")
        raise
    row = rows[0] if rows else None
    if row and row[0]:
        if required:
            raise Busy(f"WAL checkpoint of {path} could not complete: readers or a writer hold the log")
        log_frames, done_frames = int(row[1]), int(row[2])
        if log_frames > done_frames:
            # The database file shrinks only once every frame is copied back: until then the
            # compacted pages sit in the WAL beside the old file, and the footprint grew.
            raise Blocked(f"a reader holds the WAL: {wal_bytes(path)} bytes still in {path}-wal")
        log.debug("WAL checkpoint of %r after compaction could not truncate the log; it shrinks later.", path)


def refuse_pinned_wal(conn: apsw.Connection, path: str) -> None:
    """Before compacting a WAL database: end :class:`Blocked` when a reader still pins a whole rewrite in its log.

    A compaction blocked by a reader leaves its pages in the WAL; compacting again while the
    reader stays would append another copy of the database to the log at every retry. A
    passive checkpoint (it waits for nobody) copies back what it can; when the frames it could
    not copy are at least as many as the database has pages, a whole rewrite is still pinned,
    and this run would only add another.

    Raises:
        Blocked: as after a compaction whose checkpoint a reader blocked.
    """
    try:
        if pragma(conn, "journal_mode") != "wal":
            return
        rows = run(conn, "PRAGMA wal_checkpoint(PASSIVE)")
        page_count = int(pragma(conn, "page_count") or 0)
    except apsw.Error:
        return  # busy or locked: the compaction itself meets it and says so
    if not rows or rows[0][1] is None or int(rows[0][1]) < 0:
        return
    pinned_frames = int(rows[0][1]) - int(rows[0][2])
    if pinned_frames > 0 and pinned_frames >= page_count:
        raise Blocked(f"a reader holds the WAL: {wal_bytes(path)} bytes still in {path}-wal")


def empty_moved_wal(conn: apsw.Connection, path: str) -> None:
    """Empty the ``-wal`` of a WAL database whose path now names another file, before closing it.

    SQLite opens any non-empty ``-wal`` it finds beside a database, whatever the database's
    header says, and it leaves the old file's log in place when a connection to a moved file
    closes. Left as it is, that log would be read as the new file's. Checkpointed (into the old
    inode, through the connection's own descriptors) and truncated, it is empty and harmless.
    Failing that, the risk is said in the ERROR line of the ``replaced`` result.
    """
    try:
        if pragma(conn, "journal_mode") == "wal":
            run(conn, "PRAGMA wal_checkpoint(TRUNCATE)")
    except apsw.Error:
        log.debug("Emptying the WAL of %r, renamed over, failed.", path, exc_info=True)


def wal_bytes(path: str) -> int:
    """The size of ``path``'s ``-wal`` file, 0 when there is none."""
    try:
        return os.stat(path + "-wal").st_size
    except OSError:
        return 0
