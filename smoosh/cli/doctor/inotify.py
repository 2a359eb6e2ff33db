"""inotify's per-user limits, for ``smoosh doctor``: what the watcher needs against what the kernel allows."""

from __future__ import annotations

import os
from typing import Iterable

from smoosh.cli.doctor.disk import Survey, bound_note
from smoosh.cli.doctor.findings import FAIL, OK, WARN, Finding, user_name

__all__ = ["INOTIFY_PROC_DIR", "DEFAULT_MAX_QUEUED_EVENTS", "SUGGESTED_MAX_USER_WATCHES", "inotify_usage", "check_inotify"]

#: Where Linux shows inotify's per-user limits.
INOTIFY_PROC_DIR = "/proc/sys/fs/inotify"
#: The kernel's default inotify queue length; fewer drops events under a burst of writes.
DEFAULT_MAX_QUEUED_EVENTS = 16384
#: The watch limit the fix suggests at least (what the watcher's own error message suggests).
SUGGESTED_MAX_USER_WATCHES = 524288


def inotify_usage(*, uid: int | None = None, exclude_pids: Iterable[int] = (), proc: str = "/proc") -> tuple[int, int] | None:
    """The inotify instances and watches this user's processes hold now (the limits are per user).

    Parameters:
        uid: the user (default: this process's effective user).
        exclude_pids: processes not to count (a running smoosh: its watches are the ones asked about).
        proc: the proc filesystem.

    Returns:
        ``(instances, watches)``, or None when ``proc`` cannot be read.
    """
    uid = os.geteuid() if uid is None else uid
    skip = {str(p) for p in exclude_pids} | {str(os.getpid())}
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit() and p not in skip]
    except OSError:
        return None
    instances = watches = 0
    for pid in pids:
        try:
            if os.stat(f"{proc}/{pid}").st_uid != uid:
                continue
            fds = os.listdir(f"{proc}/{pid}/fd")
        except OSError:
            continue  # gone, or not ours to read
        for fd in fds:
            try:
                if os.readlink(f"{proc}/{pid}/fd/{fd}") != "anon_inode:inotify":
                    continue
                with open(f"{proc}/{pid}/fdinfo/{fd}") as info:
                    watches += sum(1 for line in info if line.startswith("inotify wd:"))
                instances += 1
            except OSError:
                continue
    return instances, watches


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def check_inotify(s: Survey, *, usage: tuple[int, int] | None, rescan_interval_s: float,
                  proc_dir: str = INOTIFY_PROC_DIR) -> list[Finding]:
    """inotify's per-user limits against what ``smoosh run`` needs.

    The daemon watches every directory under its watched roots (one watch each, plus one for
    the config's directory) through one inotify instance; past ``max_user_watches`` it falls
    back to polling every directory each second. Events past ``max_queued_events`` are dropped
    and only the next rescan finds their databases.

    Parameters:
        s: the walk's findings (directories to watch).
        usage: ``(instances, watches)`` other processes of this user hold, or None if unknown.
        rescan_interval_s: the config's ``rescan_interval`` (named when events can be dropped).
        proc_dir: where the limits are read.

    Returns:
        Findings for watches, instances and the queue.
    """
    from smoosh.units import format_duration

    max_watches = _read_int(os.path.join(proc_dir, "max_user_watches"))
    max_instances = _read_int(os.path.join(proc_dir, "max_user_instances"))
    max_queued = _read_int(os.path.join(proc_dir, "max_queued_events"))
    if max_watches is None or max_instances is None or max_queued is None:
        return [Finding(OK, "inotify", f"no inotify limits at {proc_dir}: nothing to check on this system")]
    findings: list[Finding] = []
    needed = s.watched_dirs + 1  # and the config file's directory
    other_instances, other_watches = usage if usage is not None else (0, 0)
    in_use = f", {other_watches} in use by {user_name()}'s other processes" if usage is not None else ""
    found = f"{needed} directories to watch{bound_note(s)}{in_use}"
    suggest = max(SUGGESTED_MAX_USER_WATCHES, 1 << (2 * (needed + other_watches)).bit_length())
    fix = (f"sysctl -w fs.inotify.max_user_watches={suggest} (and the same line in /etc/sysctl.d/ to keep it)")
    if needed > max_watches:
        findings.append(Finding(FAIL, "inotify watches", f"max_user_watches {max_watches} < {found}: the watcher "
                                "would fall back to polling every directory each second", fix))
    elif needed + other_watches > max_watches:
        findings.append(Finding(WARN, "inotify watches", f"max_user_watches {max_watches} < {found}: the watcher "
                                "may run out and fall back to polling", fix))
    else:
        findings.append(Finding(OK, "inotify watches", f"max_user_watches {max_watches} >= {found}"))
    used = f" ({other_instances} in use by {user_name()}'s other processes)" if usage is not None else ""
    if other_instances + 1 > max_instances:
        findings.append(Finding(FAIL, "inotify instances", f"max_user_instances {max_instances}{used}: none left for "
                                "smoosh, which would poll instead",
                                f"sysctl -w fs.inotify.max_user_instances={max(1024, 2 * max_instances)}"))
    else:
        findings.append(Finding(OK, "inotify instances", f"max_user_instances {max_instances}{used}; smoosh needs 1"))
    rescan = format_duration(rescan_interval_s)
    if max_queued < DEFAULT_MAX_QUEUED_EVENTS:
        findings.append(Finding(WARN, "inotify queue", f"max_queued_events {max_queued} is below the kernel's default "
                                f"{DEFAULT_MAX_QUEUED_EVENTS}: a burst of writes overflows it, and each overflow "
                                f"costs a rescan of what changed",
                                f"sysctl -w fs.inotify.max_queued_events={DEFAULT_MAX_QUEUED_EVENTS}"))
    else:
        findings.append(Finding(OK, "inotify queue", f"max_queued_events {max_queued}; an overflow is caught at "
                                f"once by a rescan of what changed (and by the rescan every {rescan})"))
    return findings
