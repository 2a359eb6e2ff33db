"""Reading a SQLite file without disturbing it: the header, a side-effect-free connection, sizes.

Reading never creates a file. Opening a WAL database through a read-only connection creates
``-wal`` and ``-shm`` when they are missing and cannot delete them on close,
so the state comes from the 100-byte file header when there is no non-empty ``-wal`` (then
the main file is fully checkpointed and the header is the truth). Only a database with a live
WAL is opened, read-only: its ``-wal``/``-shm`` exist already and belong to the application.
A WAL database whose ``-wal``/``-shm`` are missing is opened read-write where a connection is
needed (the exact ``dbstat`` pass), because a read-write connection that closes last removes
the files it created, as any SQLite close does.

A database nobody is writing (no ``-wal``, no ``-journal``) is read for ``dbstat`` through an
``immutable=1`` connection instead (:func:`read_quietly`): it takes no lock and creates no
side file, so it costs a fraction of a normal open and sends the watcher no events.
Immutable means SQLite trusts the file not to
change, so the read is kept only if the file and its side files look the same afterwards.

Every connection comes from :func:`smoosh.compactors.sqlite_open.open_database` (inside the
roots, never through a symlink). The raw header read opens its file with ``O_NOFOLLOW``, so a
database swapped for a symlink reads as refused; a symlinked *directory* component is only
caught by the SQLite opens (the header read is on the enqueue hot path and gets no extra
syscall for it, and reading 100 bytes changes nothing). Sizes of side files come from
``lstat``: a ``-wal`` swapped for a symlink never lends its target's size to a priority.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import functools
import logging
import os
import stat
import struct
import threading
from typing import Any, Iterator, NamedTuple, Sequence, cast

import apsw

from smoosh.compactors.base import NOT_A_DATABASE, Look, Refused, Shared, file_signature, shared
from smoosh.compactors.sqlite_open import THROUGH_SYMLINK, close_quietly, open_database, pragma, refusal, refused
from smoosh.identity import identity_refusal, lstat_if_there, side_file_stats
from smoosh.paths import canonical_path

__all__ = [
    "LOOKS",
    "LookCounts",
    "DbState",
    "parse_header",
    "read_state",
    "look",
    "open_for_read",
    "read_quietly",
    "still_copied",
    "changed_outside_sqlite",
    "file_size",
    "footprint_bytes",
    "sqlite_temp_dir",
    "in_use",
    "is_in_use",
    "AUTO_VACUUM_CODES",
]

log = logging.getLogger(__name__)

class LookCounts:
    """How many looks at a database read it without a lock, and how many took one (a SQLite connection).

    In rollback-journal mode a read lock, however short, can hold back an application's commit,
    and every transaction of the application that read and now wants to write fails meanwhile:
    so the looks between compactions read the header and ``immutable=1`` files only, and what
    still takes a lock (a WAL database whose header is stale, where a read lock holds nobody
    back) is counted here. One per process (:data:`LOOKS`), written by any thread under its lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lockless = 0
        self._locked = 0

    def lockless(self) -> None:
        """Count a look that read the file without a lock."""
        with self._lock:
            self._lockless += 1

    def locked(self) -> None:
        """Count a look that took a SQLite lock."""
        with self._lock:
            self._locked += 1

    def snapshot(self) -> dict[str, int]:
        """``{"looks_lockless", "looks_locked"}``."""
        with self._lock:
            return {"looks_lockless": self._lockless, "looks_locked": self._locked}


#: The process's look counts.
LOOKS = LookCounts()

#: The first 16 bytes of every SQLite 3 database file.
MAGIC = b"SQLite format 3\x00"
#: Size of the database header at the start of page 1.
HEADER_BYTES = 100
#: ``PRAGMA auto_vacuum`` values by name.
AUTO_VACUUM_CODES = {"none": 0, "full": 1, "incremental": 2}
#: What ``open(..., O_NOFOLLOW)`` of a symlink fails with (ELOOP on Linux; EMLINK on the BSDs).
_SYMLINK_ERRNOS = frozenset({errno.ELOOP, errno.EMLINK})


class DbState(NamedTuple):
    """What the compactor knows about one database file without reading its pages.

    A named tuple: as immutable as a frozen dataclass, and built without the per-field
    ``object.__setattr__`` a frozen dataclass pays (one is built per database examined).
    """

    file_bytes: int
    page_size: int
    page_count: int
    freelist_count: int
    auto_vacuum: int  # 0 none, 1 full, 2 incremental
    wal: bool  # the header says WAL mode (file format versions 2/2)
    #: The file change counter (header bytes 24-27): bumped by every write transaction of a
    #: rollback-journal database. None where it counts nothing: in WAL mode SQLite leaves it
    #: alone (the WAL index detects changes), and a state read through a connection has none.
    change_counter: int | None = None
    inode: int = 0  # the file's inode when it was read (0: unknown), to tell a file renamed over
    #: The file's device when it was read (with ``inode``: the identity a compaction compares
    #: against, taken by the same ``fstat`` as the size; 0: unknown).
    device: int = 0
    #: The database's size its header states (in-header page count times page size) when the
    #: header vouches for it (see :func:`parse_header`); 0 otherwise, and for a state read
    #: through a connection. A file shorter than this is not whole yet (:func:`still_copied`).
    header_bytes: int = 0


#: The header fields a state needs, in one unpack (sqlite.org/fileformat.html, 1.3): the magic,
#: page size, write and read versions, change counter, in-header page count, first freelist
#: trunk, freelist count, largest root b-tree page, incremental vacuum flag, version-valid-for.
_HEADER = struct.Struct(">16sHBB4xIIII12xI8xI24xI4x")


def parse_header(header: bytes, file_bytes: int, inode: int = 0, device: int = 0) -> DbState | None:
    """Decode a database header; None when it is not a SQLite 3 header."""
    if len(header) < HEADER_BYTES:
        return None
    (magic, raw_page_size, write_version, read_version, change_counter, in_header_pages, _trunk, freelist,
     largest_root, incremental, valid_for) = _HEADER.unpack_from(header)
    if magic != MAGIC:
        return None
    page_size = 65536 if raw_page_size == 1 else raw_page_size
    if page_size < 512 or page_size & (page_size - 1):
        return None
    # The in-header size is only trusted when written by a SQLite that maintains it (3.7.0+),
    # which it proves by matching the change counter; otherwise the file size decides.
    trusted = bool(in_header_pages) and change_counter == valid_for
    pages = in_header_pages if trusted else file_bytes // page_size
    auto_vacuum = 0 if largest_root == 0 else (2 if incremental else 1)
    wal = write_version == 2 and read_version == 2
    return DbState(file_bytes, page_size, pages, min(freelist, pages), auto_vacuum, wal,
                   None if wal else change_counter, inode, device, pages * page_size if trusted else 0)


#: Paths :func:`still_copied` has said are not whole, oldest first; at most this many are kept.
_COPIED_SAID_MAX = 4096
_copied_said: collections.OrderedDict[str, None] = collections.OrderedDict()
_copied_lock = threading.Lock()


def still_copied(path: str, state: DbState) -> str | None:
    """Why the database at ``path`` is not whole yet, or None: a file shorter than its header
    says, with no SQLite journal beside it, is being written by something other than SQLite
    (a copy under its final name: ``cp`` writes the header first) or was cut short.

    Examined or compacted now, SQLite would call it malformed, and a VACUUM's rollback would
    cut the copy's next bytes off. Said once per path at INFO (until it is whole again): a
    copy in progress is news, not a fault. A short file with a ``-journal`` beside it is
    SQLite's own commit in progress, and a state read through a connection vouches for no
    size (its ``header_bytes`` is 0).

    Parameters:
        path: the database file.
        state: its state, as :func:`read_state` or :func:`look` read it.

    Returns:
        The reason, naming both sizes; None for a whole file.
    """
    if state.header_bytes <= state.file_bytes or os.path.lexists(path + "-journal"):
        if _copied_said and path in _copied_said:
            with _copied_lock:
                _copied_said.pop(path, None)
        return None
    reason = (f"shorter than its header says ({state.file_bytes} of {state.header_bytes} bytes) with no SQLite "
              "journal beside it: still being copied (or cut short)? It is compacted once it is whole")
    with _copied_lock:
        new = path not in _copied_said
        if new:
            _copied_said[path] = None
            if len(_copied_said) > _COPIED_SAID_MAX:
                _copied_said.popitem(last=False)
    if new:
        log.info("Not examining %r yet: %s.", path, reason)
    return reason


def changed_outside_sqlite(path: str, before: DbState, *, untouched: bool) -> str | None:
    """After SQLite found ``path`` malformed mid-compaction: why the file was written meanwhile
    by something outside SQLite's locks (a copy still in progress), or None (it is damaged).

    A file now shorter than its header says is a copy under way (``cp`` cuts the file, then
    writes the header first). With ``untouched`` (a VACUUM of a rollback-journal database:
    it held SQLite's lock throughout, so no SQLite writer committed, and its failed statement
    rolled back whole), a file of another size or another change counter than when the
    compaction began was written by another program too. Reads the header afresh: call it
    once the compaction's connection is closed.

    Parameters:
        path: the database file.
        before: its state when the compaction began.
        untouched: the compaction's failure left the file as it found it (see above).

    Returns:
        The reason for the operator (the compaction is then retried later, not called corrupt).
    """
    raw = _read_header(path, None, False)
    if not isinstance(raw, tuple):
        return None
    header, st = raw
    now = parse_header(header, st.st_size, st.st_ino, st.st_dev)
    if now is None or now.inode != before.inode:
        return None  # not a database any more, or another file: not this question
    if now.header_bytes > now.file_bytes:
        return (f"{path} is shorter than its header says ({now.file_bytes} of {now.header_bytes} bytes): written "
                "outside SQLite's locks while it was compacted (still being copied?); rolled back, tried again later")
    moved = (now.file_bytes, now.change_counter) != (before.file_bytes, before.change_counter)
    if untouched and not before.wal and moved:
        return (f"{path} changed while it was compacted ({before.file_bytes} -> {now.file_bytes} bytes, change counter "
                f"{before.change_counter} -> {now.change_counter}) while smoosh held its lock: written outside SQLite's "
                "locks (still being copied?); rolled back, tried again later")
    return None


def file_size(path: str) -> int:
    """Bytes of ``path``; 0 when it does not exist. A symlink is not followed (its own size)."""
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def footprint_bytes(path: str) -> int:
    """Database plus WAL: what a compaction gives back is measured on both."""
    return file_size(path) + file_size(path + "-wal")


def open_for_read(path: str, timeout_s: float, *, roots: Sequence[str] | None = None) -> apsw.Connection:
    """A connection for reading that leaves no ``-wal``/``-shm`` behind (see the module docstring).

    Parameters:
        path: the database file (canonical).
        timeout_s: busy timeout.
        roots: canonical roots the path must lie in, or None for no roots restriction.

    Returns:
        A read-only connection when the database's ``-wal`` and ``-shm`` exist already,
        otherwise a read-write one (read-only when the file is write-protected).

    Raises:
        Refused: outside ``roots`` or through a symlink (logged at WARNING).
        apsw.Error: SQLite could not open it.
    """
    if os.path.exists(path + "-wal") and os.path.exists(path + "-shm"):
        return open_database(path, "ro", timeout_s=timeout_s, roots=roots)
    try:
        return open_database(path, "rw", timeout_s=timeout_s, roots=roots)
    except apsw.CantOpenError:
        return open_database(path, "ro", timeout_s=timeout_s, roots=roots)


#: The first bytes of a rollback journal that holds a transaction (SQLite's journal header magic).
JOURNAL_MAGIC = bytes.fromhex("d9d505f920a163d7")


def _quiet_signature(path: str) -> tuple[int, int, int, int] | None:
    """(inode, size, mtime_ns, journal size) of a database nobody is writing; else None.

    Nobody is writing it when it has no ``-wal`` and no ``-journal`` in use: a ``-journal`` left
    empty (``journal_mode = TRUNCATE``) or with its header zeroed (``PERSIST``) holds no
    transaction.
    """
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if os.path.lexists(path + "-wal"):
        return None
    journal = lstat_if_there(path + "-journal")
    if journal is not None and journal.st_size and _journal_in_use(path + "-journal"):
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, journal.st_size if journal is not None else -1)


def _journal_in_use(journal: str) -> bool:
    """Whether a rollback journal holds a transaction (its header's magic), or cannot be read."""
    try:
        fd = os.open(journal, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return False  # the transaction ended meanwhile
    except OSError:
        return True
    try:
        return os.pread(fd, len(JOURNAL_MAGIC), 0) == JOURNAL_MAGIC
    except OSError:
        return True
    finally:
        os.close(fd)  # SQLite locks the database file, never its journal: this close drops nothing


def read_quietly(path: str, query: str, *, roots: Sequence[str] | None = None) -> tuple[Any, ...] | None:
    """The first row of ``query`` read through an ``immutable=1`` connection, or None.

    None when the database has a ``-wal`` or ``-journal`` (someone may be writing: use a
    normal connection), when SQLite fails, or when the file changed during the read (a
    write, a checkpoint or a replacement changes its inode, size or mtime, or brings a side
    file): the caller then takes the normal path. The connection comes from the same SQLite
    library as the compaction connections (apsw), so its close never drops POSIX locks this
    process holds on the file (SQLite defers it).

    Parameters:
        path: the database file (canonical).
        query: a query returning at least one row.
        roots: canonical roots the path must lie in, or None for no roots restriction.

    Returns:
        The first row, or None as above.

    Raises:
        Refused: outside ``roots`` or through a symlink (logged at WARNING); the caller must
            not fall back to another open.
    """
    before = _quiet_signature(path)
    if before is None:
        return None
    try:
        conn = open_database(path, "ro", timeout_s=0.0, roots=roots, immutable=True)
    except apsw.Error:
        return None
    try:
        rows = conn.execute(query).fetchall()
    except apsw.Error:
        return None
    finally:
        close_quietly(conn)
    if not rows or _quiet_signature(path) != before:
        return None
    return tuple(rows[0])


# Files this process holds a compaction connection on, with how many. POSIX advisory locks
# belong to the process, and closing ANY descriptor of a file drops all of them: a plain
# open()/close() of the header while a compaction holds the write lock would silently unlock
# the database for other processes. SQLite's own connections know about each other (they
# share one inode table and defer closes), so for these files the header is read through a
# connection instead of a raw descriptor.
_in_use: dict[str, int] = {}
_in_use_lock = threading.Lock()


@contextlib.contextmanager
def in_use(path: str) -> Iterator[None]:
    """Mark ``path`` as held by a connection of this process for the duration of the block."""
    real = canonical_path(path)  # realpath's answer, in three system calls instead of one per component
    with _in_use_lock:
        _in_use[real] = _in_use.get(real, 0) + 1
    try:
        yield
    finally:
        with _in_use_lock:
            left = _in_use[real] - 1
            if left:
                _in_use[real] = left
            else:
                del _in_use[real]


def is_in_use(path: str) -> bool:
    """Whether a connection of this process holds ``path`` (raw descriptors must not touch it)."""
    real = canonical_path(path)
    with _in_use_lock:
        return real in _in_use


#: What _read_header returns for a file a connection of this process holds.
_IN_USE = object()
#: What _read_header returns when the last component of the path is a symlink.
_SYMLINK = object()


def _read_header(path: str, roots: Sequence[str] | None, strict: bool) -> tuple[bytes, os.stat_result] | object | None:
    """The header and ``fstat`` of a regular file through a raw descriptor, ``_IN_USE``,
    ``_SYMLINK``, or the reason its identity refuses it (a ``str``: see :func:`_read_raw`).

    The read happens under ``_in_use_lock``: a compaction registers its file before opening
    its connection, so it cannot take its locks while this descriptor is open, and closing
    the descriptor cannot drop them. The canonical path runs outside the lock and only while
    some compaction runs: examine threads would otherwise queue on it.
    """
    with _in_use_lock:
        if not _in_use:
            return _read_raw(path, roots, strict)
    real = canonical_path(path)
    with _in_use_lock:
        return _IN_USE if real in _in_use else _read_raw(path, roots, strict)


def _read_raw(
    path: str, roots: Sequence[str] | None = None, strict: bool = False
) -> tuple[bytes, os.stat_result] | object | None:
    """Read the header through a descriptor; its ``fstat`` also answers the identity checks
    (links, device; with ``strict``, the mount id too), so they cost no system call of their own."""
    try:
        # O_NONBLOCK: a key naming a FIFO must not hang the caller; only regular files count.
        # O_NOFOLLOW: a database swapped for a symlink after it was enqueued is refused, not
        # read through (the flag costs no syscall; the errno is looked at only on failure).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError as exc:
        return _SYMLINK if exc.errno in _SYMLINK_ERRNOS else None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        problem = identity_refusal(path, st, roots, fd=fd if strict else None)
        if problem is not None:
            return problem
        return os.pread(fd, HEADER_BYTES, 0), st
    except OSError:
        return None
    finally:
        os.close(fd)


def _header_state(
    path: str, roots: Sequence[str] | None, strict: bool, warn: bool
) -> tuple[DbState | None, os.stat_result | None] | object:
    """The state the header says and the ``fstat`` it was read with, or ``_IN_USE``.

    ``(None, None)``: no regular file could be opened; ``(None, st)``: not a SQLite header.

    Raises:
        Refused, Shared: as :func:`read_state`.
    """
    reason = refusal(path, roots)
    if reason is not None:
        raise refused(path, reason)
    raw = _read_header(path, roots, strict)
    if raw is _IN_USE:
        return _IN_USE
    if raw is None:
        return None, None
    if raw is _SYMLINK:
        raise refused(path, THROUGH_SYMLINK)
    if isinstance(raw, str):
        raise shared(path, raw) if warn else Shared(path, raw)
    header, st = cast("tuple[bytes, os.stat_result]", raw)
    LOOKS.lockless()
    return parse_header(header, st.st_size, st.st_ino, st.st_dev), st


def read_state(
    path: str, timeout_s: float, *, roots: Sequence[str] | None = None, strict: bool = False, warn: bool = True
) -> DbState | None:
    """Page counts and format of a database, cheaply; None when missing or not SQLite.

    Parameters:
        path: the database file (canonical).
        timeout_s: busy timeout of the connection opened for a database with a live WAL.
        roots: canonical roots the path must lie in (checked lexically, before any I/O), or
            None for no roots restriction; a :class:`~smoosh.identity.Roots` also carries the
            opt-ins of the identity checks and each root's mount.
        strict: compare the file's mount id with its root's too (one small read of
            ``/proc``): where a compaction is about to start, or an operator asks. Without it
            the device alone is compared (a bind mount of the same file system passes).
        warn: log a :class:`Shared` refusal (once per path and reason); False where the caller
            reports it itself (a compaction's ``blocked`` outcome).

    Returns:
        The state from the file header, or from a read-only connection when the database has
        a live WAL (its header is stale until the next checkpoint) or is held by a
        compaction of this process.

    Raises:
        Refused: the path is not canonical, lies outside ``roots``, or reaches its file
            through a symlink (the header read refuses a symlink as the last component; the
            connection, when one is opened, one anywhere in the path). Logged at WARNING.
        Shared: the file has other hard links or lies on another mount than its root
            (:mod:`smoosh.identity`); logged at WARNING once per path and reason.
    """
    head = _header_state(path, roots, strict, warn)
    if head is _IN_USE:
        return _state_from_connection(path, timeout_s, roots)
    state = cast("tuple[DbState | None, os.stat_result | None]", head)[0]
    if state is None or not state.wal or file_size(path + "-wal") == 0:
        return state
    return _state_from_connection(path, timeout_s, roots, fallback=state)


def look(path: str, timeout_s: float, *, roots: Sequence[str] | None = None, strict: bool = False) -> Look:
    """One look at a database file: the state, the identity checks, the ``-wal`` and the signature
    from one open, one ``fstat`` and one header read (and the side files' ``lstat``).

    What :func:`read_state` reads, with what the examination asks next kept instead of read
    again: the ``-wal``'s size (the cleanup key, the footprint) and the file's signature (the
    re-check before a start). A refusal is the look's ``problem``, logged as
    :func:`read_state` logs it, never raised.

    Parameters:
        path: the database file (canonical).
        timeout_s: busy timeout of the connection opened for a database with a live WAL.
        roots: as for :func:`read_state`.
        strict: the checks a compaction's start makes, for an operator's key (HTTP, the CLI,
            explain): the mount id, and the side files (:func:`smoosh.identity.side_file_refusal`).

    Returns:
        The :class:`~smoosh.compactors.base.Look`; its ``state`` is a :class:`DbState`.
    """
    try:
        head = _header_state(path, roots, strict, True)
        if head is _IN_USE:
            # A compaction of this process holds it: read through a connection, as read_state does.
            state = _state_from_connection(path, timeout_s, roots)
            st, wal = lstat_if_there(path), lstat_if_there(path + "-wal")
        else:
            state, st = cast("tuple[DbState | None, os.stat_result | None]", head)
            if state is None:
                return Look(NOT_A_DATABASE)
            if strict:
                side, wal = side_file_stats(path, roots)
                if side is not None:
                    return Look(side)
            else:
                wal = lstat_if_there(path + "-wal")
            if state.wal and wal is not None and wal.st_size:
                state = _state_from_connection(path, timeout_s, roots, fallback=state)
    except Refused as exc:
        return Look(exc.reason)
    if state is None or st is None:
        return Look(NOT_A_DATABASE)
    copied = still_copied(path, state)
    if copied is not None:
        return Look(copied)
    wal_bytes = wal.st_size if wal is not None else 0
    return Look(None, signature=file_signature(st, wal), wal_bytes=wal_bytes, state=state)


def _state_from_connection(
    path: str, timeout_s: float, roots: Sequence[str] | None, fallback: DbState | None = None
) -> DbState | None:
    """The state read through a SQLite connection (safe beside this process's own connections).

    Raises:
        Refused: through a symlink (logged at WARNING).
    """
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        raise refused(path, THROUGH_SYMLINK)
    if not stat.S_ISREG(st.st_mode):
        return None
    problem = identity_refusal(path, st, roots)
    if problem is not None:
        raise shared(path, problem)
    try:
        conn = open_for_read(path, timeout_s, roots=roots)
    except apsw.Error:
        return fallback
    LOOKS.locked()
    try:
        return DbState(
            file_bytes=st.st_size,
            page_size=pragma(conn, "page_size"),
            page_count=pragma(conn, "page_count"),
            freelist_count=pragma(conn, "freelist_count"),
            auto_vacuum=pragma(conn, "auto_vacuum"),
            wal=pragma(conn, "journal_mode") == "wal",
            inode=st.st_ino,
            device=st.st_dev,
        )
    except apsw.Error:
        log.debug("Reading pragmas of %r failed; using its header.", path, exc_info=True)
        return fallback
    finally:
        close_quietly(conn)


def sqlite_temp_dir() -> str:
    """The directory SQLite's unix VFS puts VACUUM's temporary database in (its own search order)."""
    return _temp_dir_for(os.environ.get("SQLITE_TMPDIR"), os.environ.get("TMPDIR"))


@functools.lru_cache(maxsize=8)
def _temp_dir_for(sqlite_tmpdir: str | None, tmpdir: str | None) -> str:
    # Asked at every compaction's start (its room is reserved there): looked up once per
    # environment, as SQLite itself does at its start.
    for candidate in (sqlite_tmpdir, tmpdir, "/var/tmp", "/usr/tmp", "/tmp"):
        if candidate and os.path.isdir(candidate) and os.access(candidate, os.W_OK | os.X_OK):
            return candidate
    return "."
