"""Canonical paths, cheaply: the kernel resolves the whole path in one lookup.

``os.path.realpath`` resolves a path in Python, one ``lstat`` per component: six syscalls
for ``/srv/tenants/a/b/x.db``, each a GIL hand-off, and on the enqueue path of a new key it
was the largest single cost (bench/HISTORY.md, "Why the misses miss"). On Linux an
``O_PATH`` descriptor names the file without opening it, and ``/proc/self/fd/N`` reads back
the path the kernel resolved. Closing an ``O_PATH`` descriptor does not release the POSIX
locks this process holds on the file (an in-process ``BEGIN EXCLUSIVE`` still blocks
another process afterwards, where a plain ``open``/``close`` lets it write), so it
is safe inside the daemon, whose compactions hold such locks (see ``smoosh.daemon.watch.scan``).
A missing file is resolved through its nearest existing directory, found by bisection (a
few ``O_PATH`` opens), not by ``os.path.realpath``'s walk, which calls ``lstat`` on every prefix of
the path: quadratic in its depth, so ten requests of a thousand 2,000-component keys held
every handler thread for a minute (issue 25). Callers bound the depth (:data:`MAX_COMPONENTS`).
Without ``/proc`` (not Linux) ``os.path.realpath`` is the answer.
"""

from __future__ import annotations

import functools
import os
from typing import Sequence

__all__ = [
    "canonical_path", "MAX_COMPONENTS", "TEMPORARY_SUFFIXES", "temporary_name", "SIDE_SUFFIXES", "inside", "inside_any", "refusal", "refused_at_use", "NOT_CANONICAL", "THROUGH_SYMLINK", "RENAMED_MEANWHILE", "NO_ROOTS",
    "CLEANUP_PREFIX", "NAME_MAX_BYTES", "SQLITE_MAX_PATH_BYTES", "NOT_UTF8", "name_refusal", "shown_path",
]

#: Prefix of a cleanup key, ``cleanup:<db path>``: the job restarts (or cuts) the database's WAL, or
#: removes what a deleted database left behind. Match patterns, ignore entries and roots
#: apply to the path after it.
CLEANUP_PREFIX = "cleanup:"
#: The files SQLite keeps beside a database, named after it: the write-ahead log, its index,
#: the rollback journal. Events on them are the database's; they move with it.
SIDE_SUFFIXES = ("-wal", "-shm", "-journal")

_O_PATH = getattr(os, "O_PATH", 0)
_PROC_FD = "/proc/self/fd/"
_USABLE = bool(_O_PATH) and os.path.isdir(_PROC_FD)
_DELETED = " (deleted)"
#: Most components a key's path may have (a database fleet's paths have a handful): bounds
#: the work one key costs.
MAX_COMPONENTS = 256


def canonical_path(path: str) -> str:
    """``os.path.realpath(path)``: symlinks resolved, absolute; faster for existing files.

    Parameters:
        path: an absolute path.

    Returns:
        The canonical path, exactly as ``os.path.realpath`` gives it.
    """
    if not _USABLE or path.startswith("//"):
        # POSIX lets a path keep a leading "//" (realpath does; the kernel's name drops it).
        return os.path.realpath(path)
    resolved = _resolved(path)
    if resolved is not None:
        return resolved
    if os.path.normpath(path) != path:
        # A ``..`` after a missing component may climb back to a symlink, which realpath
        # resolves: its walk decides (callers bound the components, see MAX_COMPONENTS).
        return os.path.realpath(path)
    # Missing (or unreadable): resolve the nearest directory that exists and keep the rest as
    # written, as realpath does for a name that leads nowhere (no component below a missing
    # one can be a symlink). The nearest existing directory is found by bisection (existence
    # holds for every prefix of an existing path): a few opens however deep the path.
    parts = path.split("/")[1:]
    if len(parts) > MAX_COMPONENTS:
        return os.path.realpath(path)  # deeper than any key may be: the caller refuses it
    found, lo, hi = "/", 0, len(parts) - 1
    # Most often only the file itself is missing (a key for a database not yet created, a
    # mistyped name): its directory answers in one open, before any bisection.
    parent = _resolved("/" + "/".join(parts[:-1])) if len(parts) > 1 else None
    if parent is not None:
        found, lo = parent, hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        resolved = _resolved("/" + "/".join(parts[:mid]))
        if resolved is None:
            hi = mid - 1
        else:
            found, lo = resolved, mid
    if os.path.islink("/" + "/".join(parts[:lo + 1])):
        return os.path.realpath(path)  # a dangling symlink: realpath follows its text
    return found.rstrip("/") + "/" + "/".join(parts[lo:])


def _resolved(path: str) -> str | None:
    """The kernel's name of the existing file ``path``, or None when it cannot say."""
    try:
        fd = os.open(path, _O_PATH | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        resolved = os.readlink(_PROC_FD + str(fd))
    except OSError:
        return None
    finally:
        os.close(fd)
    if not resolved.startswith("/") or resolved.endswith(_DELETED):
        # Deleted meanwhile (the kernel appends " (deleted)"), or a pseudo-file name.
        return None
    return resolved


#: Suffixes of the names a file has while it is being written under a temporary name (downloads,
#: copies, editors' saves), to be renamed into place when complete: such a file is not
#: compacted; its final name is, once the rename brings it.
TEMPORARY_SUFFIXES = (".tmp", ".temp", ".part", ".partial", "~")


def temporary_name(path: str) -> bool:
    """Whether ``path``'s name is a temporary one (:data:`TEMPORARY_SUFFIXES`, any case)."""
    return path.lower().endswith(TEMPORARY_SUFFIXES)


#: Refusal reason: the path is relative, not normalised (``.``, ``..``, ``//``, a trailing
#: ``/``) or holds a NUL byte, so the lexical roots check could not be trusted.
NOT_CANONICAL = "not an absolute, normalised path"
#: Refusal reason: a component of the path is a symbolic link (now: it was not when queued).
THROUGH_SYMLINK = "reaches its file through a symbolic link"
#: The refusal of a path whose file was renamed, or exchanged with another, while it was looked at.
RENAMED_MEANWHILE = "its name changed while it was being opened (renamed or exchanged)"
#: Refusal reason: roots are enforced and there are none (the server refuses every key then too).
NO_ROOTS = "no roots configured"


#: Longest file name Linux's file systems take (NAME_MAX), in bytes.
NAME_MAX_BYTES = 255
#: Longest path SQLite's unix VFS opens, in bytes (its ``mxPathname``, MAX_PATHNAME in os_unix.c).
#: SQLite refuses to open a database whose path leaves no room for ``-journal`` within it, as the
#: journal could not even be looked for (``sqlite3PagerOpen``).
SQLITE_MAX_PATH_BYTES = 512
#: The longest suffix SQLite gives a file beside a database.
_JOURNAL = "-journal"
#: Longest database name, in bytes, that leaves room for its ``-journal`` beside it.
_MAX_DB_NAME_BYTES = NAME_MAX_BYTES - len(_JOURNAL)
#: Longest database path, in bytes, that SQLite opens.
_MAX_DB_PATH_BYTES = SQLITE_MAX_PATH_BYTES - len(_JOURNAL)
#: Refusal reason: the path holds bytes that are not UTF-8 (Python carries them as surrogates).
NOT_UTF8 = ("its path is not valid UTF-8: smoosh's keys are text (its job store, log and API carry them, and "
            "its SQLite library takes UTF-8 names only); rename it to have it compacted")


def name_refusal(path: str) -> str | None:
    """Why SQLite, or smoosh's keys, cannot carry the database at ``path``; None when they can.

    Judged on the string alone (no I/O), for every way a key comes in (the watcher names each
    such file once, the key check refuses it): a path that is not UTF-8 (:data:`NOT_UTF8`), a
    file name that leaves no room for SQLite's ``-journal`` beside it (a name longer than
    ``NAME_MAX - 8`` bytes: SQLite could open the file but never its journal), or a path that
    leaves none within SQLite's path limit (:data:`SQLITE_MAX_PATH_BYTES`: SQLite opens no such
    database). Without this, each was a key that crashed every compaction of it, again and again.

    Parameters:
        path: a canonical database path (a ``cleanup:`` key's, without the prefix).

    Returns:
        The reason, in an operator's words, or None.
    """
    if path.isascii():  # the usual case: one byte per character, no encoding to make
        size_bytes, name_bytes = len(path), len(path) - path.rfind("/") - 1
        if size_bytes <= _MAX_DB_PATH_BYTES and name_bytes <= _MAX_DB_NAME_BYTES:
            return None
    else:
        try:
            raw = path.encode("utf-8")
        except UnicodeEncodeError:
            return NOT_UTF8
        size_bytes, name_bytes = len(raw), len(raw) - raw.rfind(b"/") - 1
    if name_bytes > _MAX_DB_NAME_BYTES:
        return (f"its name ({name_bytes} bytes) leaves no room for SQLite's -journal file beside it: file names end "
                f"at {NAME_MAX_BYTES} bytes, so SQLite could never open its journal (a name of at most "
                f"{_MAX_DB_NAME_BYTES} bytes can be compacted)")
    if size_bytes > _MAX_DB_PATH_BYTES:
        return (f"its path ({size_bytes} bytes) leaves no room for SQLite's -journal file: SQLite opens no database "
                f"whose path is longer than {_MAX_DB_PATH_BYTES} bytes")
    return None


def shown_path(path: str) -> str:
    """``path`` as a log line or a message may carry it: bytes that are not UTF-8 as ``\\xNN``.

    A name Python carries with surrogates (``os.fsdecode``) cannot be written as UTF-8 text: a log
    file, the journal or JSON would refuse it or mangle it. Shown this way it reads as ``ls -b``
    shows it.
    """
    if path.isascii():
        return path
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def inside(path: str, root: str) -> bool:
    """Whether ``path`` is ``root`` or below it (both absolute, canonical).

    A string test: both are canonical, so no ``..`` or doubled slash can fool it, and it
    costs a tenth of ``os.path.commonpath``. ``/data2`` is not inside ``/data``: the prefix
    includes the separator.
    """
    return path == root or path.startswith(root.rstrip("/") + "/")


def inside_any(path: str, roots: Sequence[str]) -> bool:
    """Whether ``path`` is or lies below any of ``roots`` (:func:`inside` of each, in one test).

    Asked for every key and every open: the prefixes (each root and its separator) are made
    once per set of roots, and one ``startswith`` of their tuple answers for all of them.
    """
    return path in roots or path.startswith(_prefixes(roots if isinstance(roots, tuple) else tuple(roots)))


@functools.lru_cache(maxsize=64)
def _prefixes(roots: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(root.rstrip("/") + "/" for root in roots)


def refusal(path: str, roots: Sequence[str] | None) -> str | None:
    """Why ``path`` must not be opened, judged on the string alone (no I/O); None when it may.

    Parameters:
        path: a database path.
        roots: canonical roots, or None for no roots restriction.

    Returns:
        :data:`NOT_CANONICAL`, :data:`NO_ROOTS`, ``"outside roots (ROOT, ...)"``, or None.
    """
    if not path.startswith("/") or "\x00" in path or os.path.normpath(path) != path:
        return NOT_CANONICAL
    if roots is None:
        return None
    if inside_any(path, roots):
        return None
    return f"outside roots ({', '.join(roots)})" if roots else NO_ROOTS


def refused_at_use(path: str, roots: Sequence[str] | None) -> str | None:
    """Why the database at ``path`` must not be opened now, or None when it may be.

    Keys are canonical when they are queued; by the time a database is opened a part of its
    path may have been replaced by a symbolic link (to a file outside the roots), or the
    roots may have changed. So every use re-checks: :func:`refusal`, and the path must still
    be its own canonical form. (The SQLite compactor also opens the file without following a
    symbolic link, which closes the window between this check and the open.)

    Parameters:
        path: the database path a key names (canonical when it was queued).
        roots: the roots in force, or None for no roots restriction (a library caller).

    Returns:
        The reason (as :class:`~smoosh.compactors.base.Refused` carries it), or None.
    """
    reason = refusal(path, roots)
    if reason is None and canonical_path(path) != path:
        # The kernel's name for the file differs from the key: a symbolic link on the way, or
        # the file renamed (or exchanged) between the open and the name read back.
        return THROUGH_SYMLINK if _through_symlink(path) else RENAMED_MEANWHILE
    return reason


def _through_symlink(path: str) -> bool:
    """Whether a component of the absolute ``path`` is a symbolic link now (one ``lstat`` each)."""
    prefix = ""
    for part in path.split("/")[1:]:
        prefix += "/" + part
        try:
            if os.path.islink(prefix):
                return True
        except OSError:
            return False
    return False
