"""Every file SQLite opens for smoosh, checked by identity as it is opened (DESIGN §10, §12).

Checking a path before SQLite opens it leaves a window: the name can be pointed at another file
between the check and the open. An outside trial used it three ways (issue 45): a ``-shm`` hard
link to an outside file, placed as a WAL database's compaction started (SQLite truncates a
``-shm`` it opens first, so the outside file was cut); a ``-journal`` hard link planted
mid-VACUUM (a journal is written, then truncated or deleted); and ``renameat2(RENAME_EXCHANGE)``
of the database with a hard link to an outside database, raced against the start.

So the check is made on the open file itself, by the one function every open of SQLite's unix
VFS goes through. The unix VFS opens every file with its ``open`` system call, which it lets an
application replace (``sqlite3_vfs.xSetSystemCall``; apsw exposes it on a VFS that inherits the
default one). The replacement (``_openguard.c``), for a registered database's files (the
database, its ``-journal``, ``-wal``, ``-shm``):

1. opens the file's directory by name and checks, by the kernel's own name for the descriptor
   (``/proc/self/fd/N``), that it is the directory the path names (a directory component swapped
   for a symbolic link is refused: every open below is relative to that descriptor);
2. opens the file in it with ``O_PATH | O_NOFOLLOW``: a descriptor of the file that is there now,
   which reads and writes nothing, and whose close drops no POSIX lock this process holds on
   the file (another connection's locks stay);
3. checks that file by its ``fstat``: a regular file, one link (unless its root opts in), on its
   root's device and mount (unless its root opts in), and, for the database itself, the inode
   the compaction meant (the one its look read);
4. opens ``/proc/self/fd/N`` of that descriptor with the flags SQLite asked for: the same inode,
   whatever the name points at by now. A file not there yet is created with ``O_EXCL``, so a
   link planted meanwhile fails the create and is checked like any other.

A refused open fails with ``EPERM`` before SQLite has a descriptor, so no byte of the file is
read or written; SQLite reports ``SQLITE_CANTOPEN``, and the reason is kept for the caller
(:func:`take_refusal`). Other paths (SQLite's temporary files, the directory it syncs) open
exactly as SQLite asked. Reads and writes never pass through it.

The replacement is C, called with no Python in between: SQLite opens a ``-shm`` holding its
unix VFS's global mutex, and apsw closes a connection holding the GIL, so a Python callback
there waits for the GIL against a thread that waits for the mutex. Where the C part could not
be built (no compiler when the package was installed), nothing is replaced: the checks by path
stand alone, said once at start (:func:`installed`) and by ``smoosh doctor``.

Only apsw's SQLite is changed (its wheels carry their own copy): the job store, on the standard
library's ``sqlite3``, is a different library and opens its file as usual.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Sequence

import apsw

from smoosh.identity import (
    HARD_LINKS, OTHER_MOUNT, SIDE_HARD_LINKS, SIDE_NOT_REGULAR, SIDE_OTHER_MOUNT, Roots, root_of,
)
from smoosh.paths import THROUGH_SYMLINK

__all__ = ["install", "installed", "guard", "take_refusal", "NOT_REGULAR", "NOT_MEANT", "NOT_BUILT"]

log = logging.getLogger(__name__)

#: Reasons of a refusal that the identity templates of :mod:`smoosh.identity` do not cover.
NOT_REGULAR = "the file is not a regular file"
NOT_MEANT = "another file took its name between the look and the open (renamed over it, or exchanged)"
#: A side file whose name was unlinked or renamed as it was opened: a hard link planted there and
#: taken away again looks like this, and the file it named may be anywhere.
SIDE_NAME_GONE = "its {side} was unlinked or renamed as it was opened (a hard link planted and taken away again?)"
#: What is said where the C part is missing.
NOT_BUILT = ("the open check of SQLite's files is not built (no C compiler when smoosh was installed): "
             "files are checked by path only; reinstall with a C compiler and Python's headers")

@dataclass
class _Registration:
    """A registered database: its live connections, and the roots of the latest registration."""

    connections: int
    roots: Sequence[str] | None


# Refusal codes of _openguard.c.
_NOT_REGULAR, _HARD_LINKS, _OTHER_MOUNT, _NOT_MEANT, _THROUGH_SYMLINK, _NAME_GONE = 1, 2, 3, 4, 5, 6
_SIDE_BYTES = 16

_lib: ctypes.CDLL | None = None
_installed: list[object] = []
_install_lock = threading.Lock()
# The roots each registered database was last registered with, and its live connections (what a
# refusal's words name; the C side keeps its own copy of the policy): under the lock.
_registered: dict[bytes, _Registration] = {}
_registered_lock = threading.Lock()


def _load() -> ctypes.CDLL | None:
    try:
        from smoosh.compactors import _openguard  # type: ignore[attr-defined]  # the C part, built with the package
    except ImportError:
        return None
    lib = ctypes.CDLL(_openguard.__file__)
    lib.og_register.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_int, ctypes.c_int]
    lib.og_register.restype = ctypes.c_int
    lib.og_release.argtypes = [ctypes.c_char_p]
    lib.og_release.restype = None
    lib.og_take_refusal.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_longlong), ctypes.c_char_p, ctypes.c_size_t]
    lib.og_take_refusal.restype = ctypes.c_int
    lib.og_mean.argtypes = [ctypes.c_char_p, ctypes.c_longlong, ctypes.c_longlong]
    lib.og_mean.restype = ctypes.c_int
    return lib


def install() -> bool:
    """Route the ``open`` system call of apsw's unix VFS through the check (once per process).

    Returns:
        True when the check is in place; False where it could not be (the C part is not built,
        or apsw's SQLite has no unix VFS): the checks by path then stand alone.
    """
    global _lib
    with _install_lock:
        if _installed:
            return True
        lib = _load()
        if lib is None:
            return False
        try:
            vfs = _Inheritor()
            address = ctypes.cast(lib.og_open, ctypes.c_void_p).value
            if address is None or not vfs.xSetSystemCall("open", address):
                raise ValueError("the unix VFS refused to replace its open")
        except (apsw.Error, ValueError, TypeError, AttributeError):
            log.warning("SQLite's unix VFS lets no open be checked here; files are checked by path only.",
                        exc_info=True)
            return False
        # Kept for the life of the process: SQLite calls into the library from now on.
        _installed.extend((vfs, lib))
        _lib = lib
        return True


def installed() -> bool:
    """Whether every file SQLite opens for smoosh is checked as it is opened (see :data:`NOT_BUILT`)."""
    return bool(_installed)


class _Inheritor(apsw.VFS):
    """A VFS that inherits the unix one, registered only to reach its system-call table."""

    def __init__(self) -> None:
        super().__init__("smoosh-open-check", "unix")


class guard:
    """Register a database for the check while a connection to it lives, and say which file it means.

    Used by :func:`smoosh.compactors.sqlite_open.open_database` around the connection's
    constructor (the database file is opened there, on this thread; its side files later, by
    the statements run on it)::

        with guard(path, roots, meant) as registered:
            conn = apsw.Connection(...)
            registered.keep(conn)

    Does nothing where the check is not installed.

    Parameters:
        path: the database's canonical path.
        roots: the roots in force (a :class:`~smoosh.identity.Roots` carries the opt-ins and
            each root's identity); None checks the file's kind and links only.
        meant: ``(device, inode)`` the database file must be; None accepts the file there.
    """

    def __init__(self, path: str, roots: Sequence[str] | None, meant: tuple[int, int] | None) -> None:
        self._path = os.fsencode(path)
        self._roots = roots
        self._meant = meant
        self._kept = False

    def __enter__(self) -> guard:
        lib = _lib
        if lib is None:
            return self
        has_root, root_dev, root_mnt, links, mounts = _policy(os.fsdecode(self._path), self._roots)
        with _registered_lock:
            if lib.og_register(self._path, has_root, root_dev, root_mnt, links, mounts) != 0:
                raise MemoryError("registering a database for the open check")
            entry = _registered.setdefault(self._path, _Registration(0, None))
            entry.connections += 1
            entry.roots = self._roots
        if self._meant is not None:
            lib.og_mean(self._path, self._meant[0], self._meant[1])
        return self

    def keep(self, conn: object) -> None:
        """Keep the registration until ``conn`` is collected: its side files are opened later."""
        if _lib is not None:
            weakref.finalize(conn, _release, self._path)
            self._kept = True

    def __exit__(self, *exc: object) -> None:
        lib = _lib
        if lib is None:
            return
        if self._meant is not None:
            lib.og_mean(None, 0, 0)
        if not self._kept:
            _release(self._path)


def _release(path: bytes) -> None:
    lib = _lib
    if lib is None:
        return
    with _registered_lock:
        lib.og_release(path)
        entry = _registered.get(path)
        if entry is not None:
            entry.connections -= 1
            if not entry.connections:
                del _registered[path]


def _policy(path: str, roots: Sequence[str] | None) -> tuple[int, int, int, int, int]:
    """(has a root, root device, root mount id or -1, links allowed, mounts allowed) for ``path``."""
    root = root_of(path, roots) if roots else None
    if root is None or not isinstance(roots, Roots):
        return 0, 0, -1, 0, 1  # as identity_refusal: the links are checked, no mount
    ident = roots.identity(root)
    links, mounts = int(root in roots.allow_hard_links), int(root in roots.allow_mounts)
    if ident is None:
        return 0, 0, -1, links, mounts  # the root cannot be opened now: the file's open decides
    dev, mnt = ident
    return 1, dev, -1 if mnt is None else mnt, links, mounts


def take_refusal(path: str) -> str | None:
    """Why the last open of one of ``path``'s files was refused, in an operator's words, or None.

    Forgotten once taken.

    Parameters:
        path: the database's canonical path.
    """
    lib = _lib
    if lib is None:
        return None
    detail = ctypes.c_longlong(0)
    side_buf = ctypes.create_string_buffer(_SIDE_BYTES)
    code = lib.og_take_refusal(os.fsencode(path), ctypes.byref(detail), side_buf, _SIDE_BYTES)
    if not code:
        return None
    side = side_buf.value.decode("ascii", "replace")
    if code == _NOT_REGULAR:
        return SIDE_NOT_REGULAR.format(side=side) if side else NOT_REGULAR
    if code == _HARD_LINKS:
        return SIDE_HARD_LINKS.format(side=side, n=detail.value) if side else HARD_LINKS.format(n=detail.value)
    if code == _OTHER_MOUNT:
        with _registered_lock:
            entry = _registered.get(os.fsencode(path))
        roots = entry.roots if entry is not None else None
        root = (root_of(path, roots) if roots else None) or os.path.dirname(path)
        return SIDE_OTHER_MOUNT.format(side=side, root=root) if side else OTHER_MOUNT.format(root=root)
    if code == _THROUGH_SYMLINK:
        return THROUGH_SYMLINK
    if code == _NAME_GONE and side:
        return SIDE_NAME_GONE.format(side=side)
    return NOT_MEANT
