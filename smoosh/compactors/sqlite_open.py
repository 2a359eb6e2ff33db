"""The one way smoosh opens a user's SQLite database: inside the roots, never through a symlink.

A key is canonical and inside ``roots`` when it is enqueued, but the file system can change
before the database is opened: a queued ``dbs/q.db`` replaced by a symlink to a file outside
the roots used to be followed, and the outside file VACUUMed (issue 18). So every open of a
user database (priority re-check, worker, compactor, cleanup) goes through
:func:`open_database`, which

* checks lexically (no I/O) that the path is absolute, normalised and one of the roots or
  below one (a string prefix that includes the separator: ``/data2`` is not inside
  ``/data``; both sides are canonical, so no ``..`` or doubled slash can fool it);
* opens with ``SQLITE_OPEN_NOFOLLOW``: SQLite runs ``lstat`` on every component of the path
  and refuses a symlink in any of them (``SQLITE_CANTOPEN_SYMLINK``), then opens the file
  and its ``-journal``, ``-wal`` and ``-shm`` with ``O_NOFOLLOW`` (seen with strace on the
  bundled 3.54.1), so a side file swapped for a symlink fails the open too;
* never passes ``SQLITE_OPEN_CREATE``: a path that vanished is not recreated;
* registers the database with :mod:`~smoosh.compactors.sqlite_guard` for as long as the
  connection lives: every file SQLite then opens for it (the database, its ``-journal``,
  ``-wal`` and ``-shm``) is checked by identity as it is opened (a regular file, one link,
  its root's device and mount, and the inode the caller meant), and refused before a byte is
  read or written.

The connection comes from apsw, never the stdlib ``sqlite3``: two SQLite libraries in one
process do not see each other's POSIX locks, and either one closing a descriptor drops the
other's (sqlite.org "How To Corrupt", 2.2.1), so every user-database open in the daemon goes
through this one library (DESIGN §11). The job store is a different file and stays on the
stdlib. apsw runs SQL as its cursor is stepped and has no implicit transactions: the helpers
here (:func:`run`, :func:`pragma`) always step a statement to its end.

Left open: SQLite checks the directory components with ``lstat`` before its ``open``, so a
directory swapped for a symlink in that instant, or while a compaction holds the database
open (its journal and WAL are opened by name later), is not caught by name here; the file
opened through it is still checked by identity (its device and mount, its links).
"""

from __future__ import annotations

import logging
import os
import urllib.parse
from typing import Any, Iterable, Sequence

import apsw

from smoosh.compactors import sqlite_guard
from smoosh.compactors.base import Shared, refused, shared
from smoosh.identity import Roots
from smoosh.paths import NO_ROOTS, NOT_CANONICAL, THROUGH_SYMLINK, refusal

__all__ = [
    "open_database",
    "refusal_error",
    "refusal",
    "refused",
    "canonical_roots",
    "run",
    "pragma",
    "errcode",
    "close_quietly",
    "rollback_quietly",
    "NOT_CANONICAL",
    "THROUGH_SYMLINK",
    "NO_ROOTS",
    "SQLITE_BUSY",
    "SQLITE_LOCKED",
    "SQLITE_INTERRUPT",
    "SQLITE_READONLY",
    "SQLITE_CANTOPEN",
    "SQLITE_NOTADB",
]

log = logging.getLogger(__name__)

#: Primary result codes the compactor maps to its own errors.
SQLITE_BUSY = 5
SQLITE_LOCKED = 6
SQLITE_READONLY = 8
SQLITE_INTERRUPT = 9
SQLITE_CANTOPEN = 14
SQLITE_NOTADB = 26
#: The extended code of a CANTOPEN caused by ``SQLITE_OPEN_NOFOLLOW`` meeting a symlink.
SQLITE_CANTOPEN_SYMLINK = apsw.SQLITE_CANTOPEN_SYMLINK
_MODES = {"ro": apsw.SQLITE_OPEN_READONLY, "rw": apsw.SQLITE_OPEN_READWRITE}
_BASE_FLAGS = apsw.SQLITE_OPEN_NOFOLLOW | apsw.SQLITE_OPEN_URI

# Before any connection: SQLite's system-call table must not change under an open.
sqlite_guard.install()


def canonical_roots(
    roots: Iterable[str] | None, *, allow_hard_links: Iterable[str] | None = None,
    allow_mounts: Iterable[str] | None = None,
) -> Roots | None:
    """Roots in the form the checks compare against: realpaths, absolute, with their opt-ins.

    Parameters:
        roots: directories, or None for no roots restriction.
        allow_hard_links: roots whose databases may have more than one hard link (see
            :mod:`smoosh.identity`); None keeps those of ``roots`` when it is a :class:`Roots`.
        allow_mounts: roots whose databases may lie on another mount; None as above.

    Returns:
        :class:`~smoosh.identity.Roots` of ``os.path.realpath`` of each root (duplicates
        dropped, order kept), or None.

    Raises:
        ValueError: a root is not an absolute path, or an opt-in is not one of the roots.
    """
    if roots is None:
        return None
    if isinstance(roots, str):
        raise ValueError(f"roots must be a sequence of directories, not the string {roots!r}")
    if isinstance(roots, Roots):
        allow_hard_links = roots.allow_hard_links if allow_hard_links is None else allow_hard_links
        allow_mounts = roots.allow_mounts if allow_mounts is None else allow_mounts
    out = _realpaths(roots, "root")
    return Roots(out, allow_hard_links=_realpaths(allow_hard_links or (), "allow_hard_links entry"),
                 allow_mounts=_realpaths(allow_mounts or (), "allow_mounts entry"))


def _realpaths(dirs: Iterable[str], what: str) -> list[str]:
    out: list[str] = []
    for root in dirs:
        if not isinstance(root, str) or not os.path.isabs(root) or "\x00" in root:
            raise ValueError(f"a {what} must be an absolute path, not {root!r}")
        # Keys are realpaths, so a root reached through a symlink must be compared resolved.
        real = os.path.realpath(root)
        if real not in out:
            out.append(real)
    return out


def open_database(
    path: str, mode: str, *, timeout_s: float, roots: Sequence[str] | None = None, immutable: bool = False,
    meant: tuple[int, int] | None = None,
) -> apsw.Connection:
    """Open a user's database: inside ``roots``, without following a symlink, never creating it.

    Parameters:
        path: an absolute, normalised (canonical) path.
        mode: ``"ro"`` or ``"rw"`` (``"rw"`` falls back to read-only on a write-protected file,
            as SQLite does).
        timeout_s: the busy timeout: how long a statement waits for another connection's lock.
        roots: canonical roots the path must be one of or lie below; None for no roots
            restriction (library use). The symlink refusal applies either way.
        immutable: open with ``immutable=1``: no locks, no side files; only for a file nobody
            writes (see :func:`smoosh.compactors.sqlite_file.read_quietly`).
        meant: ``(device, inode)`` the database file must be (what the look that decided to
            open it read); None accepts whichever regular file is there.

    Returns:
        An apsw connection in autocommit mode. Opening is lazy about the header: a file that is
        not a database raises ``apsw.NotADBError`` at its first statement.

    Raises:
        Refused: the path is not canonical, lies outside ``roots``, or reaches its file
            through a symlink; the file was not opened. Logged at WARNING.
        Shared: the file opened was refused by its identity (other links, another mount, not
            a regular file, not the file meant); logged at WARNING once per path and reason.
        apsw.CantOpenError: the file (or its directory) is missing, or unreadable.
        ValueError: an unknown mode.
    """
    reason = refusal(path, roots)
    if reason is not None:
        raise refused(path, reason)
    try:
        flags = _BASE_FLAGS | _MODES[mode]
    except KeyError:
        raise ValueError(f"mode must be 'ro' or 'rw', not {mode!r}") from None
    uri = "file:" + urllib.parse.quote(path) + ("?immutable=1" if immutable else "")
    with sqlite_guard.guard(path, roots, meant) as registered:
        try:
            conn = apsw.Connection(uri, flags=flags)
        except apsw.CantOpenError as exc:
            # The stubs declare no attributes on apsw's errors; ``extendedresult`` is always set.
            if getattr(exc, "extendedresult", 0) == SQLITE_CANTOPEN_SYMLINK:
                raise refused(path, THROUGH_SYMLINK) from exc
            error = refusal_error(path)  # asked while registered: the refusal goes with it
            if error is not None:
                raise error from exc
            raise
        registered.keep(conn)
    conn.set_busy_timeout(int(timeout_s * 1000))
    return conn


def refusal_error(path: str) -> Shared | None:
    """The :class:`Shared` error for a file of ``path`` that the open check refused, or None.

    A statement that opens a side file (a VACUUM its ``-journal``, a WAL read its ``-shm``)
    fails with ``SQLITE_CANTOPEN`` when the check refuses it: the caller asks here why.

    Parameters:
        path: the database's canonical path.

    Returns:
        The error (logged at WARNING once per path and reason), or None when no open of the
        database's files was refused since it was last opened.
    """
    reason = sqlite_guard.take_refusal(path)
    return None if reason is None else shared(path, reason)


def run(conn: apsw.Connection, sql: str) -> list[Any]:
    """Run ``sql`` (one or more statements) to the end, stepping every statement to completion.

    apsw executes statements as its cursor is stepped: ``conn.execute(sql)`` alone stops at
    the first row, leaving later statements (a ``COMMIT``) unrun. Some pragmas do their work
    one row per step (``incremental_vacuum`` frees one page per row it returns), so they are
    done only when stepped to the end.

    Parameters:
        conn: an open connection.
        sql: the statements.

    Returns:
        Every row the statements returned.
    """
    return conn.execute(sql).fetchall()


def pragma(conn: apsw.Connection, name: str) -> Any:
    """The first column of ``PRAGMA name``, the statement stepped to its end.

    Parameters:
        conn: an open connection.
        name: the pragma, with its argument if any (``"journal_mode=DELETE"``).

    Returns:
        The first column of the first row, or None when it returns no row.

    Raises:
        apsw.Error: as SQLite reports it (BUSY, LOCKED, ...).
    """
    rows = run(conn, f"PRAGMA {name}")
    return rows[0][0] if rows and rows[0] else None


def errcode(exc: BaseException) -> int:
    """The primary SQLite result code of an apsw error.

    Parameters:
        exc: an exception, normally an ``apsw.Error``.

    Returns:
        ``exc.result`` masked to the primary code (``SQLITE_BUSY`` ...), or 0 when it has none.
    """
    return (getattr(exc, "result", 0) or 0) & 0xFF


def close_quietly(conn: apsw.Connection) -> None:
    """Close a connection without raising (SQLite rolls back any transaction still open).

    Parameters:
        conn: a connection, open or already closed.
    """
    # force=True: a cursor an exception left half-stepped must not turn a close in a finally
    # block into a second exception that hides the first.
    conn.close(True)


def rollback_quietly(conn: apsw.Connection) -> None:
    """Roll back an open transaction, if any, ignoring errors (logged at DEBUG).

    Parameters:
        conn: an open connection.
    """
    # After an interrupt SQLite has normally rolled back already; a chunk that failed between
    # BEGIN and COMMIT leaves the transaction open, and it must not outlive the chunk.
    try:
        if not conn.get_autocommit():
            run(conn, "ROLLBACK")
    except apsw.Error:
        log.debug("Rollback after a failed statement failed too.", exc_info=True)
