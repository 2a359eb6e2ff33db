"""The disk side of ``smoosh doctor``: one bounded walk of the watched directories and roots,
access to them and to ``state_dir``, and free space for the largest database's VACUUM."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from smoosh.cli.doctor.findings import FAIL, OK, WARN, Finding, examples, existing_ancestor, user_name
from smoosh.cli.format import fmt_bytes
from smoosh.disk_room import DEFAULT_MIN_FREE, DiskRoom, MinFree
from smoosh.identity import directory_identity
from smoosh.paths import SIDE_SUFFIXES, inside

__all__ = ["Survey", "MAX_FILES", "survey", "bound_note", "check_access", "check_databases_writable",
           "check_state_dir", "check_free_space", "check_discard", "mounts", "Mount", "MOUNTINFO"]

#: Files the walk under the watched directories and roots looks at before it stops (and says so).
MAX_FILES = 100_000


@dataclass
class Survey:
    """What one bounded walk of the watched directories and the roots found.

    Attributes:
        watched_dirs: directories inotify would watch (each watched root and, recursively, below it).
        databases: SQLite files found under the roots.
        largest: per filesystem (``st_dev``), the largest database: ``(path, size_bytes)``.
        unwritable: databases this user cannot write (they would end ``blocked: read-only``).
        unreadable_dirs: directories the walk could not list (databases there are never found).
        files_seen: files looked at.
        truncated: the walk stopped at its file bound, so the counts are lower bounds.
    """

    watched_dirs: int = 0
    databases: int = 0
    largest: dict[int, tuple[str, int]] = field(default_factory=dict)
    unwritable: list[str] = field(default_factory=list)
    unreadable_dirs: list[str] = field(default_factory=list)
    files_seen: int = 0
    truncated: bool = False


def survey(watch: Sequence[str], roots: Sequence[str], *, max_files: int = MAX_FILES) -> Survey:
    """Walk the watched directories and the roots once (directory symlinks not followed, as inotify).

    This reads database headers, which is safe here: ``smoosh doctor`` holds no SQLite lock
    that closing a descriptor could release (see :mod:`smoosh.daemon.watch.scan`).

    Parameters:
        watch: the config's ``watch`` entries (directories, files or glob patterns).
        roots: the config's ``roots`` (canonical directories).
        max_files: the walk stops after looking at this many files.

    Returns:
        The :class:`Survey`.
    """
    from smoosh.daemon.watch.scan import WatchEntry, is_sqlite_file, resolve_watch, watch_roots

    watched = watch_roots(resolve_watch(spec) for spec in watch)
    # One walk over both: the roots' databases and the watched directories usually coincide.
    tops = watch_roots([WatchEntry(r, r, True, None) for r in roots]
                       + [WatchEntry(r, r, rec, None) for r, rec in watched.items()])
    out = Survey()
    for top, recursive in tops.items():
        stack = [top]
        while stack:
            directory = stack.pop()
            try:
                it = os.scandir(directory)
            except FileNotFoundError:
                continue
            except OSError:
                out.unreadable_dirs.append(directory)
                continue
            if directory in watched or any(rec and inside(directory, r) for r, rec in watched.items()):
                out.watched_dirs += 1
            with it:
                for entry in it:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            if recursive:
                                stack.append(entry.path)
                            continue
                        if not entry.is_file(follow_symlinks=False):
                            continue
                    except OSError:
                        continue
                    if out.files_seen >= max_files:
                        out.truncated = True
                        return out
                    out.files_seen += 1
                    if entry.name.endswith(SIDE_SUFFIXES) or not any(inside(entry.path, r) for r in roots):
                        continue
                    if not is_sqlite_file(entry.path):
                        continue
                    _count_database(out, entry.path, directory)
    return out


def _count_database(out: Survey, path: str, directory: str) -> None:
    try:
        size = os.stat(path).st_size
        device = os.stat(directory).st_dev
    except OSError:
        return
    out.databases += 1
    best = out.largest.get(device)
    if best is None or size > best[1]:
        out.largest[device] = (path, size)
    if not os.access(path, os.W_OK):
        out.unwritable.append(path)


def bound_note(s: Survey) -> str:
    """What a finding adds when the walk stopped at its bound (empty when it did not)."""
    return f" (the walk stopped after {s.files_seen} files: at least that many)" if s.truncated else ""


def check_access(directories: Iterable[str], *, what: str = "directory") -> list[Finding]:
    """Each directory can be listed and written by this user (compaction writes journals beside databases).

    Parameters:
        directories: watched directories and roots.
        what: how the check names them.

    Returns:
        One finding per directory.
    """
    user = user_name()
    findings: list[Finding] = []
    for directory in dict.fromkeys(directories):
        check = f"access {directory}"
        if not os.path.isdir(directory):
            findings.append(Finding(FAIL, check, "no such directory", f"mkdir -p {directory}, or correct [smoosh] watch / roots"))
        elif not os.access(directory, os.R_OK | os.X_OK):
            findings.append(Finding(FAIL, check, f"{user} cannot list this {what}: no database in it is found",
                                    f"give {user} read access (chmod u+rx, or a group), or run smoosh as the databases' owner"))
        elif not os.access(directory, os.W_OK):
            findings.append(Finding(
                FAIL, check,
                f"{user} cannot write in this {what}: a compaction creates its journal beside the database, so every "
                "database here ends blocked: read-only",
                f"give {user} write access (chown, or chmod g+w with a shared group), or run smoosh as the databases' owner",
            ))
        else:
            findings.append(Finding(OK, check, f"readable and writable by {user}"))
    return findings


def check_databases_writable(s: Survey) -> list[Finding]:
    """The databases found are writable, and every directory under the roots could be listed.

    Parameters:
        s: the walk's findings.

    Returns:
        A warning for unwritable databases and one for unreadable directories; ok otherwise.
    """
    user = user_name()
    findings: list[Finding] = []
    if s.unwritable:
        findings.append(Finding(
            WARN, "databases", f"{len(s.unwritable)} of {s.databases} database(s) are not writable by {user} and end "
            f"blocked: read-only: {examples(s.unwritable)}",
            f"chmod u+w (or chown to {user}) the files meant to be compacted; [smoosh.ignore] the others",
        ))
    if s.unreadable_dirs:
        findings.append(Finding(
            WARN, "databases", f"{len(s.unreadable_dirs)} directories cannot be listed by {user}, so their databases are "
            f"never found: {examples(s.unreadable_dirs)}", f"give {user} read access (chmod u+rx) to them",
        ))
    if not findings:
        findings.append(Finding(OK, "databases", f"{s.databases} SQLite database(s) found, all writable by {user}"
                                + bound_note(s)))
    return findings


def check_state_dir(state_dir: str) -> Finding:
    """``state_dir`` is writable (checkpoints, suspension, the lock), or can be created.

    Parameters:
        state_dir: the config's ``state_dir``.

    Returns:
        One finding.
    """
    user = user_name()
    check = "state_dir"
    if os.path.isdir(state_dir):
        if os.access(state_dir, os.W_OK | os.X_OK):
            return Finding(OK, check, f"{state_dir} is writable by {user}")
        return Finding(FAIL, check, f"{state_dir} is not writable by {user}: queues are not checkpointed and the "
                       "instance lock cannot be taken", f"chown {user} {state_dir}, or set [smoosh] state_dir elsewhere")
    if os.path.lexists(state_dir):
        return Finding(FAIL, check, f"{state_dir} is not a directory", "set [smoosh] state_dir to a directory")
    parent = existing_ancestor(state_dir)
    if os.access(parent, os.W_OK | os.X_OK):
        return Finding(OK, check, f"{state_dir} does not exist yet; it will be created (in {parent}, writable by {user})")
    return Finding(FAIL, check, f"{state_dir} does not exist and {user} cannot create it: {parent} is not writable",
                   f"mkdir -p {state_dir} && chown {user} {state_dir}")


def check_free_space(s: Survey, *, temp_dir: str | None = None, min_free: MinFree = DEFAULT_MIN_FREE) -> list[Finding]:
    """Each filesystem holding databases has room to VACUUM its largest one, by the compactor's own rule.

    A VACUUM writes a temporary copy (in SQLite's temp directory) and a journal or WAL beside
    the database, each about its live size: the compactor reserves that room before it
    starts one (``min_free_space`` kept beside it), and a database whose room is never there
    is blocked every time it is tried.

    Parameters:
        s: the walk's findings (the largest database per filesystem).
        temp_dir: SQLite's temp directory (default: SQLite's own rule, ``SQLITE_TMPDIR``, ``TMPDIR``...).
        min_free: the config's ``min_free_space``.

    Returns:
        One finding per filesystem (one ok when no database was found).
    """
    import shutil

    from smoosh.compactors.base import InsufficientSpace
    from smoosh.compactors.sqlite_compact import check_space, vacuum_needs
    from smoosh.compactors.sqlite_file import DbState, read_state

    room = DiskRoom(min_free)
    if not s.largest:
        return [Finding(OK, "free space", "no SQLite database under the roots yet" + bound_note(s))]
    findings: list[Finding] = []
    for path, size in sorted(s.largest.values()):
        directory = os.path.dirname(path)
        largest = f"the largest database {path} ({fmt_bytes(size)}){' of those seen' if s.truncated else ''}"
        try:
            # Its live size from its header (a read, from this separate process: it holds no
            # SQLite lock to lose); a file that will not say is counted whole.
            state = read_state(path, 1.0) or DbState(file_bytes=size, page_size=4096, page_count=size // 4096,
                                                     freelist_count=0, auto_vacuum=0, wal=False)
            check_space(path, state, temp_dir, room)
        except InsufficientSpace as e:
            findings.append(Finding(
                FAIL, "free space",
                f"{fmt_bytes(e.free_bytes)} free in {e.directory}, {largest} needs {fmt_bytes(e.needed_bytes)} there "
                f"beside min_free_space {room.min_free}: its compaction is blocked every time",
                f"free space on that filesystem (or point SQLITE_TMPDIR at a larger one when the temp dir is short, "
                f"or lower min_free_space); until then, [smoosh.ignore] {path} = true",
            ))
            continue
        except OSError as e:
            findings.append(Finding(WARN, "free space", f"cannot measure free space for {path}: {e.strerror or e}",
                                    f"give {user_name()} access to {directory} (and to SQLite's temp directory)"))
            continue
        free = shutil.disk_usage(directory).free
        needs = sum(vacuum_needs(path, state, temp_dir).values())
        findings.append(Finding(OK, "free space", f"{fmt_bytes(free)} free in {directory}'s filesystem; {largest} "
                                f"needs about {fmt_bytes(needs)} to VACUUM (twice its live size), beside "
                                f"min_free_space {room.min_free}"))
    return findings


#: Where the kernel lists this process's mounts (proc(5): mountinfo).
MOUNTINFO = "/proc/self/mountinfo"


@dataclass(frozen=True)
class Mount:
    """One line of ``/proc/self/mountinfo``: where a file system is mounted, and how."""

    #: The mount's id (the one :func:`smoosh.identity.mount_id` gives for a file on it).
    id: int
    point: str
    fstype: str
    source: str
    #: The mount's own options and the file system's (its "super options"), as one set.
    options: frozenset[str]


def _unescape(field: str) -> str:
    # mountinfo writes a space, tab, newline and backslash in a path as \040, \011, \012, \134.
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def mounts(text: str) -> list[Mount]:
    """The mounts ``text`` (``/proc/self/mountinfo``'s format) lists; a line it cannot read is skipped."""
    found: list[Mount] = []
    for line in text.splitlines():
        fields = line.split(" ")
        try:
            dash = fields.index("-", 6)
            mount, point, mount_options = int(fields[0]), _unescape(fields[4]), fields[5]
            fstype, source, super_options = fields[dash + 1], _unescape(fields[dash + 2]), fields[dash + 3]
        except (ValueError, IndexError):
            continue
        found.append(Mount(mount, point, fstype, source,
                           frozenset(mount_options.split(",") + super_options.split(","))))
    return found


def _mount_id_of(directory: str) -> int | None:
    # A directory not made yet will lie on its nearest existing ancestor's mount.
    found = directory_identity(directory if os.path.isdir(directory) else existing_ancestor(directory))
    return None if found is None else found[1]


def check_discard(directories: Iterable[str], *, mountinfo: str | None = None,
                  mount_of: Callable[[str], int | None] = _mount_id_of) -> list[Finding]:
    """The file systems under the watched directories and roots are not mounted with ``discard``.

    With ``discard`` a file that is cut or shrunk waits for the device to discard the blocks it
    freed, one hold per cut: a ``-wal`` cut, a database shrunk by its VACUUM. smoosh restarts a
    WAL log in its file while its application writes, and cuts a ``-wal`` in steps beside it,
    but a database's shrink it cannot split, and the application's writers wait for it. A periodic trim
    (``fstrim``) frees the same blocks without anyone waiting.

    Parameters:
        directories: the watched directories and the roots (canonical).
        mountinfo: the mount table's text (None: read :data:`MOUNTINFO`).
        mount_of: a directory's mount id (by default :func:`smoosh.identity.directory_identity`'s,
            of its nearest existing ancestor when it does not exist yet); a directory the
            kernel names no mount for is not checked.

    Returns:
        One warning per file system mounted with ``discard``, or one ok.
    """
    if mountinfo is None:
        try:
            with open(MOUNTINFO, encoding="utf-8", errors="replace") as f:
                mountinfo = f.read()
        except OSError as e:
            return [Finding(OK, "discard", f"cannot read {MOUNTINFO} ({e.strerror or e}): not checked")]
    by_id = {m.id: m for m in mounts(mountinfo)}
    seen: dict[Mount, list[str]] = {}
    for directory in directories:
        mount = mount_of(directory)
        m = None if mount is None else by_id.get(mount)
        if m is not None and "discard" in m.options:
            seen.setdefault(m, []).append(directory)
    if not seen:
        return [Finding(OK, "discard", "no file system under the roots is mounted with discard")]
    return [
        Finding(WARN, "discard",
                f"{m.point} ({m.fstype} on {m.source}), under {examples(dirs)}, is mounted with discard: every file "
                "cut or shrunk there (a VACUUM's database, a -wal cut to 0) holds the application's writers while the "
                "device discards the freed blocks",
                f"mount {m.point} without discard and trim on a timer instead (systemctl enable --now fstrim.timer)")
        for m, dirs in seen.items()
    ]
