"""What a deleted SQLite database leaves behind: its ``-wal``, ``-shm`` and ``-journal``.

A ``cleanup:<path>`` job for a database that no longer exists removes them: a stale ``-wal``
would be read as the log of a new database created under the same name. A side file is
removed only if it is a regular file that starts as SQLite writes it (:data:`SIDE_FILE_MAGIC`),
and only while nothing bears the database's name.
"""

from __future__ import annotations

import logging
import os
import stat

from smoosh.compactors.base import CompactionResult
from smoosh.compactors.sqlite_file import file_size
from smoosh.compactors.sqlite_open import refusal
from smoosh.paths import SIDE_SUFFIXES

__all__ = ["SIDE_FILE_MAGIC", "side_file_is_sqlites", "leftovers", "remove_leftovers"]

log = logging.getLogger("smoosh.compactors.sqlite")  # the compactor's lines, one logger

#: The first bytes of each kind of side file SQLite writes: a WAL's header magic (either
#: checksum byte order), a hot rollback journal's magic, and the wal-index's version number
#: (3007000, in the writer's byte order). A file named like a side file without them is
#: somebody else's, never removed.
SIDE_FILE_MAGIC: dict[str, tuple[bytes, ...]] = {
    "-wal": (bytes.fromhex("377f0682"), bytes.fromhex("377f0683")),
    "-journal": (bytes.fromhex("d9d505f920a163d7"),),
    "-shm": ((3007000).to_bytes(4, "little"), (3007000).to_bytes(4, "big")),
}


def side_file_is_sqlites(path: str, suffix: str) -> bool:
    """Whether ``path`` starts as SQLite writes a ``suffix`` side file (see :data:`SIDE_FILE_MAGIC`).

    An empty one is not: an empty WAL or journal holds nothing that could harm a new database,
    and an empty file named so may be anything of anyone's.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        head = os.read(fd, 8)
    except OSError:
        return False
    finally:
        os.close(fd)
    return any(head.startswith(magic) for magic in SIDE_FILE_MAGIC[suffix])


def leftovers(path: str, roots: tuple[str, ...] | None) -> list[str]:
    """Side files (``-wal``, ``-shm``, ``-journal``) left beside a database that no longer exists.

    Only those may be removed: beside an existing database a ``-wal`` or a hot ``-journal``
    holds transactions the database needs, so while anything (a file, a dangling symlink)
    bears the database's name, nothing is a leftover. A side file that is not a regular
    file (a symlink, a directory) is never one either. Without its database an old
    ``-wal`` is a hazard: SQLite would read it as the log of a new database created under
    the same name.

    Parameters:
        path: the database path (canonical).

    Returns:
        The leftover paths, in suffix order; empty while the database exists, or when the
        path is refused (outside the roots, not canonical).
    """
    if refusal(path, roots) is not None or os.path.lexists(path):
        return []
    found = []
    for suffix in SIDE_SUFFIXES:
        try:
            st = os.lstat(path + suffix)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and side_file_is_sqlites(path + suffix, suffix):
            found.append(path + suffix)
    return found


def remove_leftovers(path: str, roots: tuple[str, ...] | None) -> CompactionResult | None:
    """Remove the side files of a database that no longer exists; None when there were none.

    The database's absence is checked again right before each removal: an application
    creating a new database under the name meanwhile keeps whatever side files it has.
    """
    found = leftovers(path, roots)
    if not found:
        return None
    before = sum(file_size(f) for f in found)
    for leftover in found:
        if os.path.lexists(path):
            break
        try:
            os.remove(leftover)
        except FileNotFoundError:
            pass
        log.info("removed %r: its database %r no longer exists", leftover, path)
    after = sum(file_size(f) for f in found)
    return CompactionResult(size_before_bytes=before, size_after_bytes=after)
