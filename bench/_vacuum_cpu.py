"""The thread CPU of smoosh's own VACUUM statements, so a drain's CPU can be split without a second run.

"CPU per compaction beyond the VACUUM" was read as the daemon's CPU per file less a bare loop's,
two processes run minutes apart. On a shared VM the bare loop's CPU per file moves by half a
millisecond between runs on its own, which is as much as the budget's whole margin. Timing each
VACUUM statement where it runs, in the same process and the same run, leaves nothing to subtract
from another run: what the process spent, less what its VACUUM statements spent, is the rest.

The compactor runs its VACUUM through ``smoosh.compactors.sqlite_compact.run``; while a
:class:`VacuumCpu` is entered, that name is wrapped to add the calling thread's CPU over each
``VACUUM`` statement (SQLite's work, its progress handler and the I/O it makes in that thread).
Statements that are not a VACUUM (the pragmas around it) count as the rest, as they should.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import Any

import smoosh.compactors.sqlite_compact as sqlite_compact

__all__ = ["VacuumCpu"]


class VacuumCpu:
    """While entered, sums the thread CPU seconds of every ``VACUUM`` the compactor runs (``seconds``)
    and counts them (``count``). Not reentrant; one at a time per process.

    Owner: the threads that compact add to it under its lock; the bench reads it after the drain.
    """

    def __init__(self) -> None:
        self.seconds = 0.0
        self.count = 0
        self._lock = threading.Lock()
        self._original: Any = None

    def __enter__(self) -> "VacuumCpu":
        original = self._original = sqlite_compact.run

        def timed(conn: Any, sql: str) -> Any:
            if sql != "VACUUM":
                return original(conn, sql)
            t0 = time.thread_time()
            try:
                return original(conn, sql)
            finally:
                spent = time.thread_time() - t0
                with self._lock:
                    self.seconds += spent
                    self.count += 1

        sqlite_compact.run = timed
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        sqlite_compact.run = self._original
