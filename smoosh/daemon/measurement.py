"""What the intake knows of a database between its event and its compaction.

A :class:`Measurement` is taken once per decision and carried with the key to its start;
:func:`signature` says whether it still holds. :func:`own_paths` names smoosh's own files,
which are never keys.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from smoosh.compactors.base import Sizes
from smoosh.config import Config

__all__ = ["Measurement", "signature", "own_paths"]


def signature(path: str) -> tuple[int, ...] | None:
    """What changes when a database is written: inode, size and mtime of the file and its ``-wal``."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    try:
        wal = os.stat(path + "-wal")
        wal_part: tuple[int, ...] = (wal.st_size, wal.st_mtime_ns)
    except OSError:
        wal_part = ()
    return (st.st_ino, st.st_size, st.st_mtime_ns, *wal_part)


@dataclass(frozen=True)
class Measurement:
    """A database's sizes as measured for the decision to queue it, carried to its start.

    ``signature`` is the file's :func:`signature` taken just before the measurement: while it
    holds, the sizes still hold.
    """

    sizes: Sizes
    signature: tuple[int, ...] | None
    exact: bool


def own_paths(cfg: Config) -> tuple[str, ...]:
    """smoosh's own files: never keys (state_dir, and a SQLite store with its side files)."""
    own = [os.path.realpath(cfg.state_dir)]
    scheme, _, rest = cfg.store.partition(":")
    if scheme == "sqlite" and rest:
        db = os.path.realpath(rest)
        own += [db, db + "-wal", db + "-shm", db + "-journal"]
    return tuple(own)
