"""The roots hold by identity, not by name: a file smoosh compacts is reachable only through its path.

A canonical path inside a root can still name a file that lives somewhere else:

* a hard link (``ln /outside/o.db /srv/dbs/hard.db``, a ``cp -al`` or rsnapshot snapshot):
  the compaction rewrites the outside file in place, and SQLite names its journal after the
  path it opened. Killed mid-compaction, it leaves ``hard.db-journal``; an application that
  opens the *other* name finds no hot journal beside it and reads a half-copied file, or
  commits over it before the inside name rolls the journal back (issue 25: one database
  malformed, two lost a committed row, in 10 trials);
* another mount below a root (a bind mount of an outside directory or file): the file
  belongs to another tree, and a bind-mounted file has its side files beside a different
  name again;
* a side file (``-journal``, ``-wal``, ``-shm``) that is a link: SQLite refuses to follow a
  symbolic one (``SQLITE_OPEN_NOFOLLOW``), and a hard-linked one is shared with a file
  elsewhere.

So a database file with more than one link, or on another mount than its root, and side
files that are links, are refused unless the operator opts in for that root
(``allow_hard_links``, ``allow_mounts``). The checks use what the caller already has: the
``stat`` of the descriptor its header read opened (links, device), and, where a compaction
is about to start or an operator enqueues a key, the descriptor's mount id (a bind mount of
the same file system keeps the device number; only the mount id tells it apart: so it is
asked of each file, never remembered per device). ``statx`` answers it in one system call;
``/proc/self/fdinfo`` (three, and a parse) where ``statx`` cannot.

:class:`Roots` carries the roots with the opt-ins and each root's identity; it is a tuple
of the canonical root paths, so every lexical check that takes a sequence of roots takes
it unchanged. It is immutable: a new config builds a new one.
"""

from __future__ import annotations

import ctypes
import os
import stat
import struct
import threading
from typing import Callable, Iterable, Sequence

from smoosh import libc
from smoosh.paths import SIDE_SUFFIXES, inside

__all__ = [
    "Roots",
    "root_of",
    "mount_id",
    "directory_identity",
    "identity_refusal",
    "side_file_refusal",
    "side_files",
    "side_file_stats",
    "lstat_if_there",
]

_O_PATH = getattr(os, "O_PATH", 0)
_FDINFO = "/proc/self/fdinfo/"

#: Reason templates of an identity refusal.
HARD_LINKS = "the file has {n} hard links: another name outside smoosh's view shares the file (allow_hard_links opts a root in)"
OTHER_MOUNT = "the file lies on another mount than its root {root} (allow_mounts opts a root in)"
SIDE_SYMLINK = "its {side} is a symbolic link"
SIDE_NOT_REGULAR = "its {side} is not a regular file"
SIDE_HARD_LINKS = "its {side} has {n} hard links (allow_hard_links opts a root in)"
SIDE_OTHER_MOUNT = "its {side} lies on another mount than its root {root} (allow_mounts opts a root in)"


#: ``statx`` flags and mask bits (linux/stat.h, fcntl.h): the descriptor itself, its mount id.
_AT_EMPTY_PATH = 0x1000
_STATX_MNT_ID = 0x1000
#: Size of ``struct statx`` and where its ``stx_mask`` and ``stx_mnt_id`` lie (a stable kernel ABI).
_STATX_SIZE = 256
_STX_MASK = struct.Struct("=I")
_STX_MNT_ID = struct.Struct("=Q")
_STX_MNT_ID_AT = 144


def _libc_statx() -> Callable[..., int] | None:
    """glibc's ``statx`` (2.28 and later), or None."""
    fn = libc.function("statx")
    if fn is None:
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


_statx = _libc_statx()
# One buffer per thread: the call fills it and the id is read before anything else can.
_statx_buffers = threading.local()


def _statx_mount_id(fd: int) -> int | None:
    """``stx_mnt_id`` of ``fd`` (Linux 5.8 and later), or None where the kernel or libc cannot say."""
    if _statx is None:
        return None
    try:
        buf = _statx_buffers.buf
    except AttributeError:
        buf = _statx_buffers.buf = ctypes.create_string_buffer(_STATX_SIZE)
    if _statx(fd, b"", _AT_EMPTY_PATH, _STATX_MNT_ID, buf) != 0:
        return None
    if not _STX_MASK.unpack_from(buf, 0)[0] & _STATX_MNT_ID:
        return None  # a kernel before 5.8 fills the rest and leaves the id out
    return int(_STX_MNT_ID.unpack_from(buf, _STX_MNT_ID_AT)[0])


def mount_id(fd: int) -> int | None:
    """The id of the mount ``fd`` lies on (``mnt_id`` of ``/proc/self/fdinfo/FD``), or None.

    Asked of ``statx`` first: one system call, where the ``fdinfo`` read is three and a parse,
    and it is asked for every key an operator enqueues. Both give the same id (the one
    ``/proc/self/mountinfo`` lists). None where the kernel does not say (no ``/proc``, a
    kernel before 3.15).
    """
    found = _statx_mount_id(fd)
    if found is not None:
        return found
    try:
        # Raw descriptors, not a file object: the fallback runs once per key an operator enqueues.
        info = os.open(_FDINFO + str(fd), os.O_RDONLY | os.O_CLOEXEC)
        try:
            text = os.read(info, 4096)
        finally:
            os.close(info)
    except OSError:
        return None
    start = text.find(b"mnt_id:")
    if start < 0:
        return None
    end = text.find(b"\n", start)
    try:
        return int(text[start + 7:end if end >= 0 else None])
    except ValueError:
        return None


def directory_identity(directory: str) -> tuple[int, int | None] | None:
    """(device, mount id) of a directory (a root, say); None when it cannot be opened."""
    flags = (_O_PATH or os.O_RDONLY) | os.O_CLOEXEC | getattr(os, "O_DIRECTORY", 0)
    try:
        fd = os.open(directory, flags)
    except OSError:
        return None
    try:
        return os.fstat(fd).st_dev, mount_id(fd)
    except OSError:
        return None
    finally:
        os.close(fd)


class Roots(tuple[str, ...]):
    """Canonical roots (a tuple of their paths), with the roots that opted in to links and mounts.

    Parameters:
        roots: canonical root directories.
        allow_hard_links: roots (among ``roots``) whose databases may have more than one link.
        allow_mounts: roots whose databases may lie on another mount than the root itself.

    Raises:
        ValueError: an opt-in names a directory that is not one of ``roots``.
    """

    allow_hard_links: frozenset[str]
    allow_mounts: frozenset[str]
    _identity: dict[str, tuple[int, int | None] | None]
    _identity_lock: threading.Lock

    def __new__(
        cls, roots: Iterable[str], *, allow_hard_links: Iterable[str] = (), allow_mounts: Iterable[str] = ()
    ) -> Roots:
        self = super().__new__(cls, roots)
        self.allow_hard_links = _among(self, "allow_hard_links", allow_hard_links)
        self.allow_mounts = _among(self, "allow_mounts", allow_mounts)
        # Each root's (device, mount id), taken when first needed and again when a file seems
        # to lie elsewhere (the root may have been mounted over since). Written under the lock;
        # read without it (a dict read of a whole tuple).
        self._identity = {}
        self._identity_lock = threading.Lock()
        return self

    def identity(self, root: str, *, fresh: bool = False) -> tuple[int, int | None] | None:
        """(device, mount id) of ``root`` (one of these roots); ``fresh`` reads it again."""
        if not fresh and root in self._identity:
            return self._identity[root]
        found = directory_identity(root)
        with self._identity_lock:
            self._identity[root] = found
        return found


def _among(roots: tuple[str, ...], key: str, chosen: Iterable[str]) -> frozenset[str]:
    out = frozenset(chosen)
    strangers = sorted(out - set(roots))
    if strangers:
        raise ValueError(f"{key} names {strangers[0]!r}, which is not one of the roots ({', '.join(roots)})")
    return out


def root_of(path: str, roots: Sequence[str]) -> str | None:
    """The deepest of ``roots`` that ``path`` is or lies below (nested roots: the innermost decides)."""
    best: str | None = None
    for root in roots:
        if inside(path, root) and (best is None or len(root) > len(best)):
            best = root
    return best


def _links_allowed(root: str | None, roots: Sequence[str] | None) -> bool:
    return isinstance(roots, Roots) and root is not None and root in roots.allow_hard_links


def identity_refusal(
    path: str, st: os.stat_result, roots: Sequence[str] | None, *, fd: int | None = None, side: str = ""
) -> str | None:
    """Why the database file ``path`` (or its side file) must not be compacted, judged by its identity; None when it may be.

    Parameters:
        path: the database's canonical path.
        st: the ``stat`` of the opened file (``fstat`` of its descriptor, or an ``lstat``).
        roots: the roots in force: a :class:`Roots` for the mount check and the opt-ins; a
            plain sequence (or None, library use) checks the links only.
        fd: the file's open descriptor: its mount id is compared with the root's too (a bind
            mount of the same file system keeps the device). None compares devices only.
        side: ``""`` when ``st`` is the database's own; a side suffix (``-journal``...) when
            it is that side file's (the same checks, said of the side file).

    Returns:
        A reason (see the templates above), or None.
    """
    root = root_of(path, roots) if roots else None
    if st.st_nlink > 1 and not _links_allowed(root, roots):
        return SIDE_HARD_LINKS.format(side=side, n=st.st_nlink) if side else HARD_LINKS.format(n=st.st_nlink)
    if not isinstance(roots, Roots) or root is None or root in roots.allow_mounts:
        return None
    ident = roots.identity(root)
    if ident is None:
        return None  # the root cannot be opened now: the open of the file decides
    if _elsewhere(st, fd, ident):
        ident = roots.identity(root, fresh=True)  # mounted over since it was read?
        if ident is not None and _elsewhere(st, fd, ident):
            return SIDE_OTHER_MOUNT.format(side=side, root=root) if side else OTHER_MOUNT.format(root=root)
    return None


def _elsewhere(st: os.stat_result, fd: int | None, root_ident: tuple[int, int | None]) -> bool:
    dev, root_mnt = root_ident
    if st.st_dev != dev:
        return True
    if fd is None or root_mnt is None:
        return False
    mnt = mount_id(fd)
    return mnt is not None and mnt != root_mnt


def side_file_refusal(path: str, roots: Sequence[str] | None) -> str | None:
    """Why the side files of the database ``path`` make it unsafe to compact; None when none does.

    One ``lstat`` per side file (``-journal``, ``-wal``, ``-shm``); a missing one is fine.

    Returns:
        :data:`SIDE_SYMLINK`, :data:`SIDE_NOT_REGULAR` or :data:`SIDE_HARD_LINKS`, filled in.
    """
    return side_files(path, roots)[0]


def side_files(path: str, roots: Sequence[str] | None) -> tuple[str | None, int]:
    """:func:`side_file_refusal`, and the ``-wal``'s size its ``lstat`` read (0: none; a
    compaction's footprint is the database and its ``-wal``, so it needs no ``stat`` of its own)."""
    refusal, wal = side_file_stats(path, roots)
    return refusal, wal.st_size if wal is not None else 0


def side_file_stats(path: str, roots: Sequence[str] | None) -> tuple[str | None, os.stat_result | None]:
    """:func:`side_file_refusal`, and the ``lstat`` of the ``-wal`` it read (None: none, or refused)."""
    links_ok: bool | None = None
    wal = None
    for side in SIDE_SUFFIXES:
        st = lstat_if_there(path + side)
        if st is None:
            continue
        if stat.S_ISLNK(st.st_mode):
            return SIDE_SYMLINK.format(side=side), None
        if not stat.S_ISREG(st.st_mode):
            return SIDE_NOT_REGULAR.format(side=side), None
        if st.st_nlink > 1:
            if links_ok is None:
                links_ok = _links_allowed(root_of(path, roots) if roots else None, roots)
            if not links_ok:
                return SIDE_HARD_LINKS.format(side=side, n=st.st_nlink), None
        if side == "-wal":
            wal = st
    return None, wal


_ACCESS_NOFOLLOW = os.access in os.supports_follow_symlinks


def lstat_if_there(path: str) -> os.stat_result | None:
    """``os.lstat(path)``, or None when nothing is there (or it cannot be looked at).

    Side files are missing more often than not (a database at rest has no ``-journal``, and
    SQLite removes a ``-wal`` and ``-shm`` at its last close): an ``access`` answers that
    without the exception a failed ``lstat`` raises, which costs several times the call.
    """
    if _ACCESS_NOFOLLOW and not os.access(path, os.F_OK, follow_symlinks=False):
        return None
    try:
        return os.lstat(path)
    except OSError:
        return None
