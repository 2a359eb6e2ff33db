"""The instance lock of ``state_dir``, for ``smoosh doctor``: free, or held by which process."""

from __future__ import annotations

import os
from typing import Sequence

from smoosh.cli.doctor.findings import OK, WARN, Finding, user_name

__all__ = ["lock_holder", "check_lock"]


def lock_holder(path: str, *, proc_locks: str = "/proc/locks") -> tuple[bool, int | None] | None:
    """Who holds the ``flock`` on ``path``, read from ``/proc/locks`` without touching the lock.

    Taking the lock to test it, even for a moment, could make a daemon starting at that
    instant exit with "another smoosh is running": so the kernel's lock table is read instead.

    Parameters:
        path: the lock file (it exists).
        proc_locks: the kernel's lock table.

    Returns:
        ``(held, pid)``: ``(False, None)`` when nobody holds it; the holder's pid (None when the
        kernel does not say, e.g. another PID namespace); None when the table cannot be read.
    """
    try:
        st = os.stat(path)
        with open(proc_locks) as f:
            table = f.read()
    except OSError:
        return None
    # "1: FLOCK  ADVISORY  WRITE 4242 fe:00:2237474 0 EOF": major and minor in hex, inode in decimal.
    wanted = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in table.splitlines():
        parts = line.split()
        if "->" in parts:  # a waiter, blocked behind the holder: not a holder
            continue
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5] == wanted:
            pid = int(parts[4]) if parts[4].lstrip("-").isdigit() and int(parts[4]) > 0 else None
            return True, pid
    return False, None


def _argv(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def _looks_like_smoosh(argv: Sequence[str]) -> bool:
    # `smoosh run` (a console script: python /venv/bin/smoosh run) or `python -m smoosh run`;
    # a mere mention (the lock file's own path, smoosh.lock) does not count.
    return any(os.path.basename(a) == "smoosh" for a in argv)


def check_lock(state_dir: str, *, proc_locks: str = "/proc/locks") -> tuple[Finding, int | None]:
    """The instance lock of ``state_dir``: free, or held by a running daemon (named by its pid).

    Parameters:
        state_dir: the config's ``state_dir``.
        proc_locks: the kernel's lock table.

    Returns:
        The finding, and the holder's pid (None when free or unknown).
    """
    from smoosh.daemon.control.instance_lock import LOCK_FILE

    path = os.path.join(state_dir, LOCK_FILE)
    check = "lock"
    if not os.path.exists(path):
        return Finding(OK, check, f"{path}: free (no daemon has run on this state_dir yet)"), None
    try:
        with open(path, "rb") as f:
            text = f.read(32).decode("ascii", "replace").strip()
        recorded = int(text) if text.isdigit() else None  # the holder writes its pid there
    except OSError as e:
        return Finding(WARN, check, f"{path}: cannot read: {e.strerror or e}", f"chown {user_name()} {path}"), None
    holder = lock_holder(path, proc_locks=proc_locks)
    if holder is None:
        named = f"; the last holder wrote pid {recorded}" if recorded else ""
        return Finding(OK, check, f"{path}: not checked ({proc_locks} cannot be read){named}"), None
    held, pid = holder
    if not held:
        last = f" (last held by pid {recorded}, which has exited)" if recorded else ""
        return Finding(OK, check, f"{path}: free{last}: no daemon runs on this state_dir"), None
    if pid is None:
        # The pid in the file is the holder's in its own namespace: it may name another process here.
        named = f", pid {recorded} there" if recorded else ""
        return Finding(OK, check, f"{path}: held by a process in another PID namespace (a container?{named})"), None
    argv = _argv(pid)
    if argv is not None and not _looks_like_smoosh(argv):
        command = " ".join(argv)[:80]
        return Finding(WARN, check, f"{path}: held by pid {pid} ({command}), which does not look like smoosh: "
                       "no daemon can start on this state_dir", f"find out what pid {pid} is; stop it"), pid
    return Finding(OK, check, f"{path}: held by pid {pid}: a smoosh daemon runs on this state_dir"), pid
