"""The SQLite store's conflict log as one process sees it: the file's commit log, mirrored in memory.

Every SQLite transaction of the store writes one ``commit_log`` row: its version and the keys
and ranges its commits wrote (:mod:`smoosh.store._sqlite_schema`). A commit is checked
against the rows newer than its read version. Reading and decoding those rows for every
commit was most of a commit's SQL when one process does all the writing, so the committer
keeps the rows in memory: its own as it writes them, and other processes' as it finds them
(one query, only when the file's newest version is not the one it wrote last). Rows older
than the memory holds (a transaction older than this store handle) are read from the file.
"""

from __future__ import annotations

import collections
import sqlite3
import time
from typing import Callable

from smoosh.store._mutations import ConflictSet
from smoosh.store._sqlite_schema import decode_writes

_Entry = tuple[int, float, "set[bytes] | frozenset[bytes]", "list[tuple[bytes, bytes]]"]


class CommitLog:
    """The commit log rows of one store handle's view, newest last (used under the write lock only).

    Parameters:
        retention_s: how long rows are kept in memory (the file keeps them as long).
        clock: monotonic seconds, for the memory's own retention.
    """

    def __init__(self, retention_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.retention_s = retention_s
        self._clock = clock
        self._entries: collections.deque[_Entry] = collections.deque()
        #: Memory holds every commit with a version in (``_from``, ``known``]; None until the
        #: first group tells the file's version.
        self._from: int | None = None
        #: The newest version whose writes memory holds.
        self.known = 0

    def catch_up(self, conn: sqlite3.Connection, version: int, pruned_through: int) -> bool:
        """Bring memory up to ``version`` (the file's newest, read under the write lock).

        Returns:
            Whether another process committed since this one last looked.
        """
        if self._from is None:
            self._from = self.known = version
            return False
        if version == self.known:
            return False
        now = self._clock()
        for row_version, raw in conn.execute("SELECT version, writes FROM commit_log WHERE version > ? ORDER BY version", (self.known,)):
            points, ranges = decode_writes(raw)
            self._entries.append((row_version, now, points, ranges))
        if pruned_through > self.known:
            # Rows between the last ones we saw and the pruned ones are gone from the file:
            # memory is complete only above the pruned version (older readers fail 1007 first).
            self._from = max(self._from, pruned_through)
        self.known = version
        return True

    def append(self, version: int, points: set[bytes], ranges: list[tuple[bytes, bytes]]) -> None:
        """Record this handle's own committed row (after its COMMIT succeeded)."""
        now = self._clock()
        self._entries.append((version, now, points, ranges))
        self.known = version
        cutoff = now - self.retention_s
        entries = self._entries
        while entries and entries[0][1] < cutoff:
            self._from = entries.popleft()[0]

    def conflicts(self, conn: sqlite3.Connection, reads: ConflictSet, read_version: int) -> bool:
        """Whether a commit newer than ``read_version`` wrote into ``reads`` (the member's ranges)."""
        for version, _, points, ranges in reversed(self._entries):
            if version <= read_version:
                return False
            if reads.intersects(points, ranges):
                return True
        assert self._from is not None
        if read_version >= self._from:
            return False
        # Older than memory: the file's rows between the read version and memory's oldest.
        rows = conn.execute("SELECT writes FROM commit_log WHERE version > ? AND version <= ?", (read_version, self._from))
        return any(reads.intersects(*decode_writes(raw)) for (raw,) in rows)
