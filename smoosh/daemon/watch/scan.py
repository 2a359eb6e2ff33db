"""Finding SQLite databases on disk: the header test, watch entries, and the scan walk.

``walk`` reads the first 16 bytes of candidate files. SQLite's locks are POSIX ``fcntl``
locks, which belong to a process, and closing ANY descriptor of a file releases all of that
process's locks on it (sqlite.org/howtocorrupt.html §2.2): a header read inside the daemon,
whose workers hold compaction locks, could let another process write into a VACUUM in
progress (a raw header read does release an in-process ``BEGIN EXCLUSIVE``, and another
process can then commit). So the daemon runs the walk in a helper process,
``python -m smoosh.daemon.watch.scan``, whose descriptors cannot touch its locks (``smoosh.daemon.watch.watcher`` drives
it); as a bonus, walking a large fleet costs the daemon no GIL time.

Helper protocol: a JSON request on stdin (``{"entries": [[spec, root, recursive, pattern]],
"roots": [[root, recursive]], "changed_since": unix seconds or null}``), NUL-terminated records on stdout: ``P<path>`` a database,
``S<path>`` a database still being written, ``W<sentence>`` a warning, ``E<traceback>`` a failure.

A database still being written is one whose file changed within :data:`SETTLE_S` (a copy in
progress: ``cp`` and ``rsync`` write the header first, and a start-up scan once compacted a file
half copied in), one shorter than its header says it is (:func:`short_of_header`: a copy not
finished, however long ago its last write), or one with a ``-journal`` beside it (a transaction,
or a hot journal, in progress). The daemon treats it as a file event: debounced, and examined
through the compactor, which holds back a file still short of its header until it is whole.

A directory the walk cannot read (deeper than the path limit, no permission) is skipped and
named in a warning record, in the words :mod:`~smoosh.daemon.watch.hostile` gives the observer
too: the daemon says each once, from whichever side met it first.
"""

from __future__ import annotations

import errno
import fnmatch
import json
import os
import re
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Callable, Iterable, Sequence

from smoosh.daemon.watch.hostile import too_deep, unreadable
from smoosh.paths import CLEANUP_PREFIX, SIDE_SUFFIXES

__all__ = [
    "SQLITE_HEADER",
    "WatchEntry",
    "accepts",
    "changed_at",
    "is_sqlite_file",
    "main_db_path",
    "resolve_watch",
    "short_of_header",
    "walk",
    "watch_roots",
]

#: The first 16 bytes of every SQLite 3 database file (sqlite.org/fileformat.html §1.3).
SQLITE_HEADER = b"SQLite format 3\x00"
#: Bytes of the database header: what :func:`short_of_header` reads the database's size from.
HEADER_BYTES = 100
#: Side files SQLite keeps next to database X; an event on one of them is an event on X.
_GLOB_MAGIC = re.compile(r"[*?[]")
#: Threads reading headers in the scan helper. At start-up the headers are rarely in the page
#: cache, and one reader waits for each 4 KiB read in turn; several keep the disk busy.
HEADER_THREADS = 16
#: Candidate files per unit of work handed to a header thread (per-file hand-offs would
#: cost more than a cached header read).
HEADER_CHUNK = 64
#: A database whose file changed less than this long ago (mtime or ctime, seconds) is still
#: being written: reported as settling, to go through the debounce like a file event.
SETTLE_S = 2.0
#: What a scan makes of a candidate: not a database, a database, one still being written.
_NOT, _DB, _SETTLING = 0, 1, 2


def is_sqlite_file(path: str) -> bool:
    """Whether ``path`` is a regular file starting with the SQLite 3 header.

    Warning: this opens and closes the file. Never call it in a process that may hold SQLite
    locks on ``path`` (the daemon runs compactions in process): the close releases them (see
    the module docstring). The daemon calls it only in the scan helper process.

    Parameters:
        path: the file to look at.

    Returns:
        True for a SQLite database; False for anything else, including unreadable or missing
        files, directories and FIFOs (opened non-blocking, so a FIFO cannot hang the scan).
    """
    return _look(path, None) != _NOT


def _look(path: str, now: float | None) -> int:
    """``_NOT``, ``_DB``, or (when ``now`` is given) ``_SETTLING`` for a database written within
    :data:`SETTLE_S` of ``now``: the ``fstat`` of the descriptor the header read opened says so."""
    return _look_sized(path, now)[0]


def _look_sized(path: str, now: float | None) -> tuple[int, int]:
    """What :func:`_look` says of ``path``, and the file's size in bytes (0 when it is no database)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return _NOT, 0
    try:
        header = os.read(fd, HEADER_BYTES)
        if header[:len(SQLITE_HEADER)] != SQLITE_HEADER:
            return _NOT, 0
        st = os.fstat(fd)
        if now is None:
            return _DB, st.st_size
        if now - max(st.st_mtime, st.st_ctime) < SETTLE_S or short_of_header(header, st.st_size):
            return _SETTLING, st.st_size
        return _DB, st.st_size
    except OSError:
        return _NOT, 0
    finally:
        os.close(fd)


def short_of_header(header: bytes, size_bytes: int) -> bool:
    """Whether a file of ``size_bytes`` starting with ``header`` is shorter than the database its
    header describes: a copy not finished (or a truncated file), not a database to examine yet.

    The header's database size (bytes 28-31, in pages of the size at 16-17) is trusted only when
    the SQLite that wrote it maintained it, which it proves by matching the change counter
    (bytes 24-27) in bytes 92-95 (sqlite.org/fileformat.html §1.3.7). ``cp`` and ``rsync`` write
    the header first, so a file still being copied is shorter than that size until the end.

    Parameters:
        header: the first bytes of the file (a SQLite header, or fewer bytes than one).
        size_bytes: the file's size.

    Returns:
        True for a header shorter than :data:`HEADER_BYTES` or a file shorter than its header says.
    """
    if len(header) < HEADER_BYTES:
        return True
    raw_page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if raw_page_size == 1 else raw_page_size
    pages = int.from_bytes(header[28:32], "big")
    if not pages or header[24:28] != header[92:96]:
        return False  # no size it vouches for: the file's own size is the database's
    return pages * page_size > size_bytes


def main_db_path(path: str) -> str:
    """Map a SQLite side file (``X-wal``, ``X-journal``, ``X-shm``) to its database ``X``.

    Parameters:
        path: any path.

    Returns:
        The database path for a side file, else ``path`` unchanged.
    """
    for suffix in SIDE_SUFFIXES:
        if path.endswith(suffix):
            return path[: -len(suffix)]
    return path


@dataclass(frozen=True)
class WatchEntry:
    """One ``watch`` entry, resolved: the directory to watch and the filter for paths under it.

    Attributes:
        spec: the entry as configured.
        root: the canonical directory watched (a glob's static prefix).
        recursive: whether subdirectories are watched too.
        pattern: an ``fnmatch`` pattern the canonical path must match, or None for any file.
    """

    spec: str
    root: str
    recursive: bool
    pattern: str | None

    def accepts(self, path: str) -> bool:
        """Whether canonical ``path`` belongs to this entry.

        Parameters:
            path: a canonical absolute file path.

        Returns:
            True if the path lies under ``root`` (directly, unless recursive) and matches.
        """
        root = self.root
        if self.recursive:
            if not path.startswith(root if root.endswith("/") else root + "/"):
                return False
        elif os.path.dirname(path) != root:
            return False
        return self.pattern is None or fnmatch.fnmatchcase(path, self.pattern)


def resolve_watch(spec: str) -> WatchEntry:
    """Resolve one ``watch`` entry: a directory, a glob pattern, or a single file.

    A path that exists is taken literally, even with glob characters in its name. A glob
    (``/data/*/*.db``) watches its static directory prefix (``/data``) recursively and
    filters with ``fnmatch``, whose ``*`` also matches ``/`` (as in ``[smoosh.ignore]``).
    The prefix is canonicalised, and the pattern with it, because keys are canonical paths.

    Parameters:
        spec: the configured entry (absolute, or relative to the working directory).

    Returns:
        The resolved entry (its root may not exist yet).
    """
    path = os.path.abspath(spec)
    if _GLOB_MAGIC.search(path) and not os.path.exists(path):
        parts = path.split("/")
        first_magic = next(i for i, part in enumerate(parts) if _GLOB_MAGIC.search(part))
        prefix = "/".join(parts[:first_magic]) or "/"
        root = os.path.realpath(prefix)
        rest = "/".join(parts[first_magic:])
        return WatchEntry(spec, root, True, os.path.join(root, rest))
    real = os.path.realpath(path)
    if os.path.isfile(real):
        # A single file: watch its directory, accept only that file (escaped: no globbing).
        return WatchEntry(spec, os.path.dirname(real), False, _escape_glob(real))
    return WatchEntry(spec, real, True, None)


def _escape_glob(path: str) -> str:
    return re.sub(r"([*?[])", r"[\1]", path)


def accepts(entries: Iterable[WatchEntry], path: str) -> bool:
    """Whether canonical ``path`` belongs to any of ``entries``."""
    return any(entry.accepts(path) for entry in entries)


def watch_roots(entries: Iterable[WatchEntry]) -> dict[str, bool]:
    """The fewest directories to watch for ``entries``: root -> recursive.

    A root inside (or equal to) a recursive root is dropped, so no directory is watched or
    scanned twice.

    Parameters:
        entries: resolved watch entries.

    Returns:
        A dict from root to whether it is watched recursively, sorted by root.
    """
    merged: dict[str, bool] = {}
    for entry in entries:
        merged[entry.root] = merged.get(entry.root, False) or entry.recursive
    roots: dict[str, bool] = {}
    for root in sorted(merged):
        if any(rec and (root == r or root.startswith(r.rstrip("/") + "/")) for r, rec in roots.items()):
            continue
        roots[root] = merged[root]
    return roots


def walk(
    entries: Sequence[WatchEntry],
    roots: dict[str, bool],
    emit: Callable[[str], None],
    warn: Callable[[str], None],
    should_stop: Callable[[], bool] = lambda: False,
    header_threads: int = 1,
    changed_since: float | None = None,
    settling: Callable[[str], None] | None = None,
    now: float | None = None,
) -> int:
    """Walk ``roots`` and ``emit`` each SQLite database that belongs to ``entries``.

    Directory symlinks are not followed (no loops, and inotify does not follow them either);
    a symlinked file is resolved and must itself belong to an entry. Side files are skipped
    by name before any I/O. Reads headers: run it only where no SQLite locks can be held
    (the scan helper process).

    Parameters:
        entries: resolved watch entries (the filter).
        roots: root -> recursive, from ``watch_roots``.
        emit: called with each database's canonical path.
        warn: called with a sentence for each directory that cannot be read.
        should_stop: polled between directories; True ends the walk early.
        header_threads: threads reading the headers of one directory's files at once.
        changed_since: emit only databases whose file or ``-wal`` has an mtime or ctime at
            or after this (unix seconds); None emits every database.
        settling: called instead of ``emit`` for a database still being written (see the
            module docstring); None emits those too.
        now: the wall-clock time files' times are compared with (None: ``time.time()``).

    Returns:
        The number of databases emitted or reported settling.
    """
    if settling is None:
        now = None
    elif now is None:
        now = time.time()

    def serially(paths: list[str]) -> list[tuple[int, int]]:
        return [_wanted(path, changed_since, now) for path in paths]

    if header_threads <= 1:
        return _walk(entries, roots, emit, warn, should_stop, serially, settling)
    with ThreadPoolExecutor(max_workers=header_threads, thread_name_prefix="smoosh-scan") as pool:

        def check(paths: list[str]) -> list[tuple[int, int]]:
            if len(paths) <= HEADER_CHUNK:
                return serially(paths)
            chunks = [paths[i : i + HEADER_CHUNK] for i in range(0, len(paths), HEADER_CHUNK)]
            return [ok for chunk in pool.map(serially, chunks) for ok in chunk]

        return _walk(entries, roots, emit, warn, should_stop, check, settling)


def changed_at(path: str) -> float:
    """The latest mtime or ctime of ``path`` and its ``-wal`` (a WAL commit touches only the
    ``-wal``; a rename or a copy with preserved times still sets the ctime); 0 if missing."""
    latest = 0.0
    for candidate in (path, path + "-wal"):
        try:
            st = os.stat(candidate)
        except OSError:
            continue
        latest = max(latest, st.st_mtime, st.st_ctime)
    return latest


def _wanted(path: str, changed_since: float | None, now: float | None) -> tuple[int, int]:
    if changed_since is not None and changed_at(path) < changed_since:
        return _NOT, 0  # unchanged since the previous scan: its header is not even read
    return _look_sized(path, now)


def _walk(
    entries: Sequence[WatchEntry],
    roots: dict[str, bool],
    emit: Callable[[str], None],
    warn: Callable[[str], None],
    should_stop: Callable[[], bool],
    check: Callable[[list[str]], list[tuple[int, int]]],
    settling: Callable[[str], None] | None,
) -> int:
    count = 0
    for root, recursive in roots.items():
        stack = [root]
        while stack:
            if should_stop():
                return count
            directory = stack.pop()
            try:
                it = os.scandir(directory)
            except (FileNotFoundError, NotADirectoryError):
                continue  # gone, or replaced by a file, since it was listed
            except OSError as e:
                # One hostile directory costs its own files: named, skipped, the rest walked.
                warn(too_deep(os.path.dirname(directory)) if e.errno == errno.ENAMETOOLONG else unreadable(directory, e))
                continue
            candidates: list[str] = []
            names: set[str] = set()
            sides: list[str] = []
            with it:
                for dirent in it:
                    names.add(dirent.name)
                    try:
                        if dirent.is_dir(follow_symlinks=False):
                            if recursive:
                                stack.append(dirent.path)
                            continue
                        if dirent.name.endswith(SIDE_SUFFIXES):
                            if dirent.is_file(follow_symlinks=False):
                                sides.append(dirent.name)
                            continue
                        if not dirent.is_file():
                            continue
                        # The root is canonical and directory symlinks are not followed, so
                        # only a symlinked file needs resolving.
                        path = os.path.realpath(dirent.path) if dirent.is_symlink() else dirent.path
                        if accepts(entries, path):
                            candidates.append(path)
                    except OSError:
                        continue  # vanished or unreadable between listing and looking
            # Headers are read a directory at a time (_look_sized swallows OSError). Its
            # databases are reported largest file first: the daemon examines them in that
            # order, and with no start-up pause (wait_secs = 0) a channel starts the first key
            # it queues, so the most bytes a directory could give back are looked at first.
            # The whole directory's headers are read before any is reported, so it costs no
            # wait; equal sizes keep the listing's order.
            looked = sorted(
                ((path, found, size) for path, (found, size) in zip(candidates, check(candidates)) if found != _NOT),
                key=lambda item: -item[2],
            )
            for path, found, _size in looked:
                count += 1
                if settling is not None and (found == _SETTLING or _hot_journal(path, directory, sides)):
                    settling(path)
                else:
                    emit(path)
            for key in orphans(directory, names, sides, entries):
                emit(key)  # not counted: a database's leftovers, not a database
    return count


def _hot_journal(path: str, directory: str, sides: list[str]) -> bool:
    """Whether the listing of ``directory`` has a ``-journal`` beside the database ``path``."""
    return os.path.dirname(path) == directory and os.path.basename(path) + "-journal" in sides


def orphans(directory: str, names: set[str], sides: list[str], entries: Sequence[WatchEntry]) -> list[str]:
    """The ``cleanup:`` keys of the databases in ``directory`` that are gone but left side files.

    A ``-wal``, ``-journal`` or ``-shm`` whose database is not in the listing (``names``: every
    entry of the directory) was left by an application that crashed before its database was
    deleted; nothing else would ever remove it. The cleanup compactor checks again, before
    each removal, that the database is still absent.
    """
    gone: list[str] = []
    for name in sides:
        db = main_db_path(name)
        if db in names:
            continue
        key = CLEANUP_PREFIX + os.path.join(directory, db)
        if key not in gone and accepts(entries, os.path.join(directory, db)):
            gone.append(key)
    return gone


def _write(stream: IO[bytes], record: bytes) -> None:
    stream.write(record)


def _scan_helper_main(stdin: IO[bytes], stdout: IO[bytes]) -> int:
    """The scan helper process: JSON request on stdin, NUL-separated records on stdout.

    Records: ``P<path>`` a database, ``S<path>`` one still being written, ``W<sentence>`` a
    warning, ``E<traceback>`` a failure.
    """
    try:
        request = json.loads(stdin.read())
        entries = [WatchEntry(*e) for e in request["entries"]]
        roots = {root: bool(rec) for root, rec in request["roots"]}
        walk(
            entries,
            roots,
            lambda path: _write(stdout, b"P" + os.fsencode(path) + b"\0"),
            lambda msg: _write(stdout, b"W" + _record_text(msg) + b"\0"),
            header_threads=HEADER_THREADS,
            changed_since=request.get("changed_since"),
            settling=lambda path: _write(stdout, b"S" + os.fsencode(path) + b"\0"),
        )
        stdout.flush()
        return 0
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 1  # the daemon stopped reading (stop() during a scan)
    except Exception:
        stdout.write(b"E" + _record_text(traceback.format_exc()) + b"\0")
        stdout.flush()
        return 1


def _record_text(text: str) -> bytes:
    return text.replace("\0", "?").encode("utf-8", "backslashreplace")


if __name__ == "__main__":
    sys.exit(_scan_helper_main(sys.stdin.buffer, sys.stdout.buffer))
