"""The WAL beside a compaction: its checkpoint, the ``cleanup:`` job, a pinned or moved log.

In WAL mode a database's file only shrinks when its log is checkpointed back:
after every compaction of a WAL database (:func:`copy_back`, then :func:`truncate_after_compaction`),
and alone for a ``cleanup:`` job (:func:`cleanup`). Before compacting, :func:`refuse_pinned_wal` ends the run
:class:`~smoosh.compactors.base.Blocked` when a reader pins a whole rewrite in the log;
after a rename over the path, :func:`empty_moved_wal` empties the old file's log.

The ``cleanup:`` job supervises a log that grew past half of ``wal_max_size`` (the compactor's
``WAL_ACT_FRACTION``), so that it is dealt with before it reaches the limit: a passive
checkpoint (which waits for nobody) copies back what it can; then, only at a moment when no
reader holds a snapshot with log frames in it (read from the kernel's lock list,
:func:`wal_readers`), a ``RESTART`` checkpoint with a short busy timeout, after which the
application's next commit writes the log from the start of its file again: the file stops
growing, and the log in it starts from nothing (:func:`wal_content_bytes` reads how much of
the file the log uses, which is what calls for the next job). Only a file past
``wal_max_size`` itself, or one its application has stopped writing (:data:`WAL_QUIET_S`), is
cut (:func:`cut_wal`): cutting a file holds the application's writers for as long as freeing
its blocks takes, which grows with the file (and is slow where the file system discards what
it frees: ext4 mounted with ``discard``), while a ``RESTART``'s hold does not, so beside an
application that has the database open the file is cut in steps. Either way the application's
writers are never held while smoosh waits for its readers,
and every ``RESTART`` or ``TRUNCATE`` (this one, and the one after a compaction) follows a
passive checkpoint, so what it copies back while it holds the writers is only what was
committed since. A reader that does not let go within :data:`READERS_WAIT_S` of a log past
``wal_max_size`` is named in the ``blocked`` reason (its pid and command line: ``/jobs``,
``explain``, one WARNING), so an operator can act; below the limit the job ends there quietly
(its passive checkpoint done), and the next look at the growing log starts another.
"""

from __future__ import annotations

import logging
import os
import stat
import struct
import threading
import time
from typing import Any, Callable

import apsw

from smoosh.compactors.base import Blocked, Busy, CompactionContext, Interrupted
import smoosh.compactors.sqlite_quiet as sqlite_quiet
from smoosh.compactors.sqlite_compact import interrupt_quietly, raise_mapped
from smoosh.compactors.sqlite_open import pragma, run
from smoosh.compactors.sqlite_openers import PinningReaders, Reader, others_have_open, wal_readers

__all__ = ["cleanup", "restart_wal", "truncate_wal", "cut_wal", "copy_back", "truncate_after_compaction", "refuse_pinned_wal", "empty_moved_wal", "wal_bytes",
           "wal_content_bytes", "wal_quiet", "pinned_reason", "WalPinned", "READERS_WAIT_S", "WAL_QUIET_S"]

log = logging.getLogger("smoosh.compactors.sqlite_compact")  # the compaction's lines, one logger

#: How long a ``cleanup:`` job looks for a moment when no reader pins the log (seconds): a
#: reader that holds its transactions for a few seconds at a time lets go within it; one that
#: never does is named (within this of the log outgrowing ``wal_max_size``: see the intake's
#: look at a busy database's WAL).
READERS_WAIT_S = 3.0
#: A ``-wal`` nobody has written for this long belongs to an application gone quiet (seconds):
#: its file is cut rather than restarted, since no writer waits for the cut (its mtime, wall
#: time: a clock step misjudges it at most once, one bounded cut or one kept file). Shorter than
#: the rescans' margin (a minute), so that a rescan after the last write finds the log quiet.
WAL_QUIET_S = 30.0
#: How often it looks meanwhile (one read of ``/proc/locks``; seconds).
READERS_POLL_S = 0.05
#: The busy timeout of a ``RESTART`` or ``TRUNCATE`` checkpoint, tried only when no reader pins
#: the log: it holds the application's writers while it waits, so it waits briefly (seconds).
#: A writer caught waiting holds the very read mark a ``RESTART`` waits for (its transaction
#: began before the checkpoint took the write lock): each waits for the other until this ends
#: it. A shorter wait ends that sooner, but also gives up on a writer's ordinary commit (its
#: fsync) and lets the log grow until the next try (bench/HISTORY.md: 20 ms, tried).
RESET_BUSY_TIMEOUT_S = 0.1
#: The longest a checkpoint or a cut step waits for a moment with no application transaction
#: open before it takes the log's write lock anyway (seconds; see :func:`_quiet_moment`).
QUIET_BEFORE_LOCK_S = 0.1
#: Bytes of a ``-wal`` file cut per hold of the application's writers (see :func:`cut_wal`):
#: freeing a file's blocks takes time in proportion to them where the file system discards
#: what it frees, ext4 mounted with ``discard`` (bench/HISTORY.md has the figures).
CUT_STEP_BYTES = 8 << 20
#: Seconds between two steps of a cut: the application's writers' turn at the write lock
#: (their busy handler sleeps 1, 2, 5, 10... ms between tries).
CUT_PAUSE_S = 0.02
#: Steps in a row that may find the write lock taken for :data:`RESET_BUSY_TIMEOUT_S` before
#: the cut stops (what is left waits for the next job; waiting for the lock holds nothing).
CUT_LOCK_MISSES = 5
#: How long the ``TRUNCATE`` that ends a cut waits for readers (seconds): it is optional (what
#: it cuts is the application's own log, under a step), so it gives up soon.
LAST_TRUNCATE_WAIT_S = 0.02


class WalPinned(Blocked):
    """Raised when readers keep a WAL database's log from being checkpointed (the reason names them)."""


def pinned_reason(path: str, readers: list[Reader] | None = None) -> str:
    """The ``blocked`` reason of a log a reader pins: its bytes, and who holds it when that is known."""
    reason = f"a reader holds the WAL: {wal_bytes(path)} bytes still in {path}-wal"
    if readers is None:
        readers = wal_readers(path)
    if readers:
        reason += "; held by " + ", ".join(str(r) for r in readers)
    return reason

def cleanup(
    conn: apsw.Connection, path: str, ctx: CompactionContext, *, busy_timeout_s: float = 1.0,
    readers_wait_s: float = READERS_WAIT_S, clock: Callable[[], float] = time.monotonic,
    wal_max_bytes: int | None = None,
) -> None:
    """A ``cleanup:`` job on an existing database: start its log over (never delete a side file of it).

    A passive checkpoint first; then, at a moment when no reader pins the log (see the module
    docstring), ``wal_checkpoint(RESTART)`` with a short busy timeout, or ``TRUNCATE`` for a
    ``-wal`` file past ``wal_max_bytes`` (or with no ``wal_max_bytes``) or one its application
    has not written for :data:`WAL_QUIET_S`.

    Parameters:
        busy_timeout_s: the connection's busy timeout, restored after the ``RESTART`` or ``TRUNCATE``.
        readers_wait_s: how long to look for a moment without pinning readers.
        clock: monotonic seconds, for that wait.
        wal_max_bytes: the size the log is kept under (``wal_max_size``): a log readers kept
            pinned for ``readers_wait_s`` that is no larger ends the job quietly (a job started
            early, before the limit), and one no larger is restarted, not cut; None names the
            readers whatever the log's size, and cuts the file.

    Raises:
        Blocked: readers kept the log pinned for ``readers_wait_s`` and it is past
            ``wal_max_bytes`` (named in the reason).
        Busy: the checkpoint could not complete for another reason (a writer held the log).
        Interrupted: cancelled through ``ctx``.
    """
    cancelled = threading.Event()

    def cancel() -> None:
        cancelled.set()
        interrupt_quietly(conn)

    ctx.on_cancel(cancel)
    if cancelled.is_set():
        raise Interrupted(f"cleanup of {path} was interrupted before it started")
    if pragma(conn, "journal_mode") != "wal":
        return
    try:
        run(conn, "PRAGMA wal_checkpoint(PASSIVE)")
    except apsw.Error as exc:
        raise_mapped(exc, path)
        raise
    deadline = clock() + readers_wait_s
    pinning = PinningReaders(path)
    while True:
        readers = pinning.look()
        if not readers:  # none, or it cannot be told: SQLite's busy timeout decides
            try:
                if wal_max_bytes is not None and wal_bytes(path) <= wal_max_bytes and not wal_quiet(path):
                    restart_wal(conn, path, busy_timeout_s=busy_timeout_s)
                else:
                    cut_wal(conn, path, busy_timeout_s=busy_timeout_s, cancelled=cancelled, pinning=pinning)
                return
            except Busy:
                if readers is None or clock() >= deadline:
                    raise
        elif clock() >= deadline:
            if wal_max_bytes is not None and wal_bytes(path) <= wal_max_bytes:
                log.debug("%r: readers pin its WAL, still under wal_max_size; not restarted this time.", path)
                return
            raise WalPinned(pinned_reason(path, readers))
        if cancelled.wait(READERS_POLL_S):
            raise Interrupted(f"cleanup of {path} was interrupted")


def _checkpoint_after_passive(
    conn: apsw.Connection, path: str, mode: str, busy_timeout_s: float, wait_s: float = RESET_BUSY_TIMEOUT_S
) -> list[Any]:
    """A passive checkpoint, then ``PRAGMA wal_checkpoint(mode)`` waiting for readers at most
    ``wait_s``; the connection gets ``busy_timeout_s`` back. Its rows.

    A ``RESTART`` or ``TRUNCATE`` checkpoint holds the application's writers from its busy wait
    to its end, the copy back included. The passive one first copies back what the log holds
    while they go on (it waits for nobody), so the second copies only what was committed since:
    after a VACUUM that is the whole database in the log, and behind a reader the seconds of
    commits made while smoosh waited for it to let go. Failing (another checkpoint runs), it
    leaves the whole copy to the second, as before.

    Raises:
        apsw.Error: the second checkpoint failed.
    """
    copy_back(conn, path)
    _quiet_moment(path)
    conn.set_busy_timeout(int(wait_s * 1000))
    try:
        return run(conn, f"PRAGMA wal_checkpoint({mode})")
    finally:
        conn.set_busy_timeout(int(busy_timeout_s * 1000))


def _quiet_moment(path: str) -> None:
    """Wait, briefly, for a moment with no application transaction open, before taking the log's write lock.

    A ``RESTART`` or ``TRUNCATE`` checkpoint holds the write lock while it waits for readers, and
    a cut step holds it while it cuts: an application transaction that read and then wants to
    write fails at once meanwhile (see :mod:`~smoosh.compactors.sqlite_quiet`). Taken from a
    quiet moment, none is caught. Past :data:`QUIET_BEFORE_LOCK_S` the step goes on as before
    (what it holds is short); the wait holds no lock.
    """
    try:
        sqlite_quiet.wait_for_quiet(path, True, QUIET_BEFORE_LOCK_S)
    except Busy:
        pass


def restart_wal(conn: apsw.Connection, path: str, *, busy_timeout_s: float) -> None:
    """``PRAGMA wal_checkpoint(RESTART)``: the log starts over at the application's next commit, its file kept.

    Like :func:`truncate_wal`, but it does not cut the file: a ``TRUNCATE``'s hold on the
    application's writers grows with the log (freeing a file's blocks is slow where the file
    system discards them: ext4 mounted with ``discard``), a ``RESTART``'s does not. The log's
    next commit writes from the file's start, so the file stops growing at about the size it
    reached.

    Raises:
        Busy: the checkpoint could not complete (a reader or a writer held the log).
    """
    _reset(conn, path, "RESTART", busy_timeout_s, RESET_BUSY_TIMEOUT_S)


def truncate_wal(conn: apsw.Connection, path: str, *, busy_timeout_s: float, wait_s: float = RESET_BUSY_TIMEOUT_S) -> None:
    """``PRAGMA wal_checkpoint(TRUNCATE)``: the log emptied and its file cut to nothing.

    After a passive checkpoint, waiting for readers at most ``wait_s`` (see
    :func:`_checkpoint_after_passive`); the connection gets ``busy_timeout_s`` back.

    Raises:
        Busy: the checkpoint could not complete (a reader, a writer or another checkpoint held the log).
    """
    _reset(conn, path, "TRUNCATE", busy_timeout_s, wait_s)


def _reset(conn: apsw.Connection, path: str, mode: str, busy_timeout_s: float, wait_s: float) -> None:
    """:func:`restart_wal` or :func:`truncate_wal`, as ``mode`` says; SQLite's busy answer raised as :class:`Busy`."""
    try:
        rows = _checkpoint_after_passive(conn, path, mode, busy_timeout_s, wait_s)
    except apsw.Error as exc:
        raise_mapped(exc, path, busy_message=f"WAL checkpoint of {path} could not complete: {exc}")
        raise
    if rows and rows[0][0]:
        raise Busy(f"WAL checkpoint of {path} could not complete: readers or a writer hold the log")


def cut_wal(
    conn: apsw.Connection, path: str, *, busy_timeout_s: float, cancelled: threading.Event | None = None,
    pinning: PinningReaders | None = None,
) -> None:
    """Empty a WAL database's log and cut its ``-wal`` file, holding the application's writers briefly.

    With no other process holding the database open (none in the kernel's lock list), a
    ``TRUNCATE`` checkpoint: nobody waits for its cut. Otherwise a cut of the whole file would
    hold that process's writers for as long as freeing its blocks takes (on ext4 mounted with
    ``discard``, 150 ms for 100 MB here), so: a ``RESTART`` checkpoint (see
    :func:`restart_wal`), after which the log starts over at the start of the file; then, in
    steps, each under the write lock taken as a writer takes it (``BEGIN IMMEDIATE``, waiting
    at most :data:`RESET_BUSY_TIMEOUT_S`), the file is cut by at most :data:`CUT_STEP_BYTES`,
    never into the log: only past the frames that carry the header's salts, the log since it
    started over (:func:`wal_content_bytes`), which no reader, writer or recovery reads past.
    SQLite itself cuts a ``-wal`` so (``journal_size_limit``, on the first commit after the
    log starts over). If the application has not started the log over yet, the first step
    does, with a commit of its own that changes nothing (``user_version`` set to what it is):
    cutting into a log that is not the current one would let a recovery replay part of it.
    Last, a ``TRUNCATE`` is tried once the file is down to a step: cutting what is left holds
    the writers no longer than a step did, and an idle application's log is then gone.

    Parameters:
        cancelled: set to stop between two steps (what is cut stays cut).
        pinning: the job's looks at the readers so far, the last one just taken (its lock list
            says whether another process has the database open); None: a look of its own.

    Raises:
        Busy: the checkpoint could not complete (a reader, a writer or another checkpoint held
            the log). Steps that cannot take the write lock, :data:`CUT_LOCK_MISSES` in a row
            after the first, end the cut quietly.
    """
    others_open = pinning.others_open if pinning is not None else others_have_open(path)
    if others_open is False:
        truncate_wal(conn, path, busy_timeout_s=busy_timeout_s)
        return
    restart_wal(conn, path, busy_timeout_s=busy_timeout_s)
    restarted_from = _log_extent(path)
    # The salts of the log the RESTART left: while the header still has them, the log has not
    # started over, and nothing may be cut.
    old_salts = restarted_from[1] if restarted_from is not None else None
    pause = cancelled if cancelled is not None else threading.Event()
    misses = 0
    while True:
        outcome = _cut_step(conn, path, busy_timeout_s, old_salts)
        if outcome is _CUT_DONE:
            break
        if outcome is _CUT_NO_LOCK:
            misses += 1
            if misses > CUT_LOCK_MISSES:
                break
        else:
            old_salts = None  # one commit of our own at most
            misses = 0
        if pause.wait(CUT_PAUSE_S):
            return
    # What is left is the log since it started over: a TRUNCATE's cut of it is one step's hold
    # at most. Worth a try when no reader is in the log, waiting for one only briefly (a
    # TRUNCATE holds the writers while it waits, and a writer retrying its BEGIN IMMEDIATE
    # holds a read mark for a moment each time): an idle application's log is then gone, our
    # own commit included; a busy one keeps its log, which starts over in its file.
    if wal_bytes(path) <= CUT_STEP_BYTES and not (pinning.look() if pinning is not None else wal_readers(path)):
        try:
            truncate_wal(conn, path, busy_timeout_s=busy_timeout_s, wait_s=LAST_TRUNCATE_WAIT_S)
        except (Busy, Interrupted, apsw.Error):
            log.debug("WAL of %r cut down to its log; the log itself stays for now.", path, exc_info=True)


#: What a step of :func:`cut_wal` ended with: more may be cut, nothing more can be, or it did
#: not get the write lock.
_CUT_MORE, _CUT_DONE, _CUT_NO_LOCK = object(), object(), object()


def _cut_step(conn: apsw.Connection, path: str, busy_timeout_s: float, old_salts: bytes | None) -> object:
    """One step of :func:`cut_wal`, under the write lock: ``_CUT_MORE``, ``_CUT_DONE`` or ``_CUT_NO_LOCK``.

    Parameters:
        old_salts: the salts of a log that has not started over since the RESTART, to be
            started over with a commit of our own when the header still has them; None: never.
    """
    _quiet_moment(path)
    conn.set_busy_timeout(int(RESET_BUSY_TIMEOUT_S * 1000))
    try:
        run(conn, "BEGIN IMMEDIATE")
    except apsw.Error:
        log.debug("Cutting the WAL of %r: the write lock stayed taken.", path, exc_info=True)
        return _CUT_NO_LOCK
    finally:
        conn.set_busy_timeout(int(busy_timeout_s * 1000))
    more = False
    try:
        fd = os.open(path + "-wal", os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            size = st.st_size
            # Only a regular file of one name is cut: a -wal hard-linked elsewhere is another
            # file's too (SQLite's own TRUNCATE would cut it whole; this leaves it to SQLite).
            extent = _extent(fd, size) if stat.S_ISREG(st.st_mode) and st.st_nlink == 1 else None
            if extent is not None:
                used, salts = extent
                if salts == old_salts:
                    # Not started over since the RESTART: a commit that changes nothing starts
                    # it over (its frames go to the start of the file, under new salts).
                    run(conn, f"PRAGMA user_version = {int(pragma(conn, 'user_version'))}")
                    more = True
                elif used < size:
                    os.ftruncate(fd, max(used, size - CUT_STEP_BYTES))
                    more = size - CUT_STEP_BYTES > used
        finally:
            os.close(fd)
    except (OSError, apsw.Error):
        log.debug("Cutting the WAL of %r failed.", path, exc_info=True)
        more = False
    finally:
        try:
            run(conn, "COMMIT")
        except apsw.Error:
            log.debug("Ending a step of cutting the WAL of %r failed.", path, exc_info=True)
            more = False
    return _CUT_MORE if more else _CUT_DONE


def copy_back(conn: apsw.Connection, path: str) -> list[Any]:
    """A passive checkpoint: what the log holds goes back into the database, a failure only logged.

    It waits for nobody and holds no lock the application's writers take. It comes before every
    ``RESTART`` or ``TRUNCATE`` (:func:`_checkpoint_after_passive`), and right after a VACUUM of
    a WAL database before anything else: while it runs, the application's own automatic
    checkpoint fails at once. Otherwise the application's first commit after the VACUUM, past
    ``wal_autocheckpoint``, copied the new database back itself, and its ``COMMIT`` returned
    only then (bench/RESULTS.md, the cut after a WAL compaction).

    Returns:
        Its row, ``(busy, frames in the log, frames copied back)`` (``-1`` frames: another
        checkpoint ran); ``[]`` when it failed.
    """
    try:
        return run(conn, "PRAGMA wal_checkpoint(PASSIVE)")
    except apsw.Error:
        log.debug("Passive WAL checkpoint of %r failed.", path, exc_info=True)
        return []


def truncate_after_compaction(
    conn: apsw.Connection, path: str, ctx: CompactionContext, *, busy_timeout_s: float,
    wait_s: float = READERS_WAIT_S, clock: Callable[[], float] = time.monotonic,
) -> None:
    """After compacting a WAL database: give its space back, its log emptied and its file cut (:func:`cut_wal`), retried.

    The VACUUM left the whole new database in the log, so until a checkpoint empties it the
    footprint is the old file plus the new one. Two things make a first try fail beside a
    working application, and both pass within moments:

    - The application's own automatic checkpoint: its first commit after the VACUUM finds the
      log past ``wal_autocheckpoint`` and copies it back, and checkpoints run one at a time
      (SQLite fails ours at once, without waiting). Its copy shrinks the database file, but it
      never cuts the log.
    - A reader's snapshot pins the new pages, or holds the read mark a ``TRUNCATE`` waits for.

    So, like the ``cleanup:`` job, it tries only at a moment when no reader shows in the
    kernel's lock list (never holding the application's writers while it waits for a reader),
    every :data:`READERS_POLL_S` for up to ``wait_s``. A stop or a hold of the job ends the wait.

    Raises:
        WalPinned: frames stayed in the log for ``wait_s``: a reader's snapshot pins them, and
            the compaction gave nothing back yet (the reason names the readers). A log that is
            all copied back but could not be cut is logged, and left to the ``cleanup:`` key.
    """
    cancelled = threading.Event()
    ctx.on_cancel(cancelled.set)
    deadline = clock() + wait_s
    pinning = PinningReaders(path)
    while True:
        readers = pinning.look()
        if not readers:  # none, or it cannot be told: SQLite's busy timeout decides
            try:
                cut_wal(conn, path, busy_timeout_s=busy_timeout_s, cancelled=cancelled, pinning=pinning)
                return
            except Busy:
                pass
            except (apsw.Error, Interrupted):
                # Interrupted: the job is stopping or held, and its cancel interrupted the
                # connection mid-checkpoint. The VACUUM is done: its result stands.
                log.debug("WAL checkpoint of %r failed after compaction.", path, exc_info=True)
                return
        if cancelled.is_set() or clock() >= deadline:
            break
        cancelled.wait(READERS_POLL_S)
    rows = copy_back(conn, path)
    if rows and int(rows[0][1]) > int(rows[0][2]) >= 0:
        # The database file shrinks only once every frame is copied back: until then the
        # compacted pages sit in the WAL beside the old file, and the footprint grew.
        raise WalPinned(pinned_reason(path, readers or None))
    log.debug("WAL checkpoint of %r after compaction could not truncate the log; the cleanup key cuts it later.", path)


def has_wal_file(path: str) -> bool:
    """Whether ``path`` has a ``-wal`` beside it (one ``stat``).

    Asked of a database this process holds a connection to, after that connection has read
    it: a connection in WAL mode keeps its ``-wal`` in place while it is open (SQLite deletes
    it only at the last close), so no ``-wal`` means the connection is not in WAL mode, and a
    ``PRAGMA journal_mode`` (a statement: a lock taken and given back, a hot-journal check)
    need not be asked. A ``-wal`` does not prove WAL mode: the pragma decides then.
    """
    return os.path.lexists(path + "-wal")


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
    if not has_wal_file(path):
        return  # not in WAL mode (asked without a statement: see has_wal_file)
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
        raise WalPinned(pinned_reason(path))


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


#: The WAL file's header (bytes) and each frame's, before its page (sqlite.org/fileformat.html §4.1).
WAL_HEADER_BYTES = 32
WAL_FRAME_HEADER_BYTES = 24
#: The WAL header's magic numbers (the last bit: the checksums' byte order).
WAL_MAGICS = (0x377F0682, 0x377F0683)


def wal_content_bytes(path: str) -> int | None:
    """The bytes of ``path``'s log written since it last started over: its header and its current frames.

    A log restarts (after a checkpoint copied all of it back and no reader is left in it) by
    writing its frames again from the start of the file, which keeps its size: the file's size
    says how large the log once grew, this says how much of it is in use. Frames of the current
    log carry the header's two salts (a restart changes them), and they come first in the file,
    so the first frame without them is found by bisection: about 15 reads of 24 bytes for a
    10,000-frame log. SQLite takes no lock on a ``-wal`` (its locks are on the database and
    the ``-shm``), so opening and closing it here releases none of this process's locks.

    Returns:
        The bytes; 0 for a log shorter than its header; None when there is no ``-wal`` or it
        cannot be read or is not a log (a link is not followed).
    """
    extent = _log_extent(path)
    return None if extent is None else extent[0]


def _log_extent(path: str) -> tuple[int, bytes] | None:
    """(:func:`wal_content_bytes`, the header's salts) of ``path``'s log; None as there."""
    try:
        fd = os.open(path + "-wal", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return _extent(fd, os.fstat(fd).st_size)
    except OSError:
        return None
    finally:
        os.close(fd)


def _extent(fd: int, size: int) -> tuple[int, bytes] | None:
    """:func:`_log_extent` of the ``-wal`` open as ``fd``, ``size`` bytes long."""
    head = os.pread(fd, WAL_HEADER_BYTES, 0)
    if len(head) < WAL_HEADER_BYTES:
        return 0, b""
    magic, _version, page_bytes = struct.unpack(">III", head[:12])
    if magic not in WAL_MAGICS or page_bytes < 512 or page_bytes & (page_bytes - 1):
        return None
    salts = head[16:24]
    frame_bytes = WAL_FRAME_HEADER_BYTES + page_bytes
    first_stale, last = 0, (size - WAL_HEADER_BYTES) // frame_bytes  # frames [0, first_stale) are current
    while first_stale < last:
        middle = (first_stale + last) // 2
        frame = os.pread(fd, 16, WAL_HEADER_BYTES + middle * frame_bytes)
        if frame[8:16] == salts:
            first_stale = middle + 1
        else:
            last = middle
    return WAL_HEADER_BYTES + first_stale * frame_bytes, salts


def wal_quiet(path: str, quiet_s: float = WAL_QUIET_S) -> bool:
    """Whether nobody has written ``path``'s ``-wal`` for ``quiet_s`` (its mtime; False when there is none).

    A checkpoint does not write the ``-wal`` (it reads it, and writes the database and the
    ``-shm``), so smoosh's own checkpoints leave a quiet log quiet.
    """
    try:
        return time.time() - os.stat(path + "-wal").st_mtime >= quiet_s
    except OSError:
        return False


def wal_bytes(path: str) -> int:
    """The size of ``path``'s ``-wal`` file, 0 when there is none."""
    try:
        return os.stat(path + "-wal").st_size
    except OSError:
        return 0
