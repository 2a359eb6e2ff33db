"""A corrupt job store: said in one line that names the way forward, and set aside on request.

The embedded store is one SQLite file. Damaged (a disk fault, a file overwritten by mistake),
it cannot be opened, and the daemon cannot start: what it held is this node's pending jobs and
crash records, which the channels' checkpoints and a rescan rebuild. So ``smoosh run
--reset-store`` moves a corrupt store aside, renamed with the time (never deleted, never
overwriting an earlier one: it may be wanted for a post-mortem), and starts with an empty one.

The flag is harmless on a healthy store: it moves a file only when SQLite itself says the file
is damaged, so a unit file that keeps the flag does not wipe the store at every restart. The
server calls :func:`open_job_store` after taking the ``state_dir`` lock, so no second daemon
of this ``state_dir`` has the file open while it moves; other processes sharing the store
(``smoosh worker``) must be stopped first.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
import urllib.parse
from typing import Callable

from smoosh.errors import CorruptStore
from smoosh.paths import SIDE_SUFFIXES
from smoosh.store import Store, open_store
from smoosh.store.errors import StoreUnavailable

__all__ = ["open_job_store", "corruption", "set_aside", "RESET_FLAG"]

log = logging.getLogger(__name__)

#: The command-line flag that moves a corrupt store aside.
RESET_FLAG = "--reset-store"
#: SQLite's primary result codes for a damaged file.
_SQLITE_CORRUPT = 11
_SQLITE_NOTADB = 26


def _sqlite_path(url: str) -> str | None:
    """The file of a ``sqlite:PATH`` store URL (also inside ``faulty:SEED:``); None for others."""
    if url.startswith("faulty:"):
        parts = url.split(":", 2)
        url = parts[2] if len(parts) == 3 else ""
    if not url.startswith("sqlite:"):
        return None
    path = url[len("sqlite:"):]
    return os.path.abspath(path) if path else None


def corruption(path: str) -> str | None:
    """Why SQLite calls the database at ``path`` damaged, or None when it is not (or is missing).

    Parameters:
        path: a SQLite file.

    Returns:
        SQLite's own words (``file is not a database``, ``database disk image is malformed``,
        or the first line of a failed ``quick_check``); None for a healthy or missing file, or
        one that fails for another reason (permissions, locks: not ours to move).
    """
    if not os.path.isfile(path):
        return None
    try:
        conn = sqlite3.connect("file:" + urllib.parse.quote(path) + "?mode=ro", uri=True, timeout=1.0)
    except sqlite3.Error:
        return None
    try:
        row = conn.execute("PRAGMA quick_check(1)").fetchone()
    except sqlite3.DatabaseError as exc:
        code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
        return str(exc) if code in (_SQLITE_CORRUPT, _SQLITE_NOTADB) else None
    finally:
        conn.close()
    verdict = str(row[0]) if row else "ok"
    if verdict == "ok":
        return None
    # One line for the one-line error: quick_check heads its report with the schema's name.
    lines = [line.strip() for line in verdict.splitlines() if line.strip() and not line.startswith("***")]
    return "; ".join(lines) or verdict.replace("\n", " ")


def set_aside(path: str, now: float) -> str:
    """Rename ``path`` (and its side files) to ``<path>.corrupt-<unix seconds>``; never overwrite.

    Parameters:
        path: the damaged file.
        now: unix seconds, for the name.

    Returns:
        The new path of the file.
    """
    stamp = int(now)
    target = f"{path}.corrupt-{stamp}"
    n = 0
    while any(os.path.lexists(target + s) for s in ("",) + SIDE_SUFFIXES):
        n += 1
        target = f"{path}.corrupt-{stamp}-{n}"
    os.rename(path, target)
    for suffix in SIDE_SUFFIXES:
        if os.path.lexists(path + suffix):
            os.rename(path + suffix, target + suffix)
    fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename survives a crash: the next start does not find the old file
    finally:
        os.close(fd)
    return target


def open_job_store(url: str, *, reset: bool = False, clock: Callable[[], float] = time.time) -> Store:
    """Open the job store; with ``reset``, a corrupt SQLite store is set aside first.

    Parameters:
        url: the store URL (``sqlite:PATH``, ``memory:``, ``fdb:``...).
        reset: move a corrupt SQLite store aside (see the module docstring).
        clock: unix seconds, for the set-aside name.

    Returns:
        The open store.

    Raises:
        CorruptStore: the SQLite store is damaged and ``reset`` is off; the message names
            the file, SQLite's words and the flag.
        StoreUnavailable: the store cannot be opened for any other reason.
    """
    path = _sqlite_path(url)
    if reset and path is not None:
        reason = corruption(path)
        if reason is not None:
            moved = set_aside(path, clock())
            log.warning("The job store %s was corrupt (%s); moved it aside to %s and started with an empty store.",
                        path, reason, moved)
        else:
            log.info("%s: the job store %s is not corrupt; nothing moved.", RESET_FLAG, path)
    try:
        return open_store(url)
    except StoreUnavailable:
        if path is None:
            raise
        reason = corruption(path)
        if reason is None:
            raise
        raise CorruptStore(path, reason) from None
