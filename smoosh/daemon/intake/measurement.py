"""What the intake knows of a database between its event and its compaction.

A :class:`Measurement` is taken once per decision and carried with the key to its start;
:func:`signature` says whether it still holds. :class:`StatusSizer` sizes, for the status
table, the queued keys nobody measured in this process. :func:`own_paths` names smoosh's own
files, which are never keys.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable, Iterable, NamedTuple

from smoosh.compactors.base import Sizes, file_signature
from smoosh.config import Config
from smoosh.daemon.keypool import KeyPool
from smoosh.daemon.intake.router import db_path

__all__ = ["Measurement", "StatusSizer", "signature", "own_paths"]

log = logging.getLogger(__name__)


def signature(path: str) -> tuple[int, ...] | None:
    """What changes when a database is written: inode, size and mtime of the file and its ``-wal``
    (:func:`~smoosh.compactors.base.file_signature`; a compactor's look at a file carries the same)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    try:
        wal: os.stat_result | None = os.stat(path + "-wal")
    except OSError:
        wal = None
    return file_signature(st, wal)


class Measurement(NamedTuple):
    """A database's sizes as measured for the decision to queue it, carried to its start.

    ``signature`` is the file's :func:`signature` taken just before the measurement: while it
    holds, the sizes still hold.
    """

    sizes: Sizes
    signature: tuple[int, ...] | None
    exact: bool


class StatusSizer:
    """Sizes queued keys nobody measured in this process, for the status table; never routes them.

    Such keys were restored from a checkpoint or taken back from the job store: without a
    size, keys restored at the top of a channel would read as 0 B reclaimable.

    Ownership: the intake owns it and the measurement table it writes to (a dict whose single
    operations the GIL makes atomic: the sizing thread only ever ``setdefault``s, so a
    measurement the examination took meanwhile wins). :meth:`reclaimable` is the one way in,
    from any thread; ``_lock`` guards the keys being sized.

    Parameters:
        measurements: the intake's measurement table.
        compactor_for: the compactor of a key (or None).
        examining: whether a key is being examined now (its examination measures it).
    """

    def __init__(
        self,
        measurements: dict[str, Measurement],
        compactor_for: Callable[[str], Any],
        examining: Callable[[str], bool],
    ) -> None:
        self._measurements = measurements
        self._compactor_for = compactor_for
        self._examining = examining
        self._lock = threading.Lock()
        self._sizing: set[str] = set()
        self._pool: KeyPool[str] = KeyPool(self._size_only, 1, "smoosh-size")

    def start(self) -> None:
        """Start the sizing thread."""
        self._pool.start()

    def stop(self) -> None:
        """Stop sizing: keys not yet taken by the thread are dropped."""
        self._pool.stop()

    def reclaimable(self, keys: Iterable[str]) -> int:
        """Bytes the measured keys among ``keys`` would give back (file - active).

        A key with no measurement is sized in the background, so the next reading counts it.
        """
        total = 0
        measurements = self._measurements
        unmeasured = []
        for key in keys:
            m = measurements.get(key)
            if m is not None:
                total += m.sizes.reclaimable_bytes
            else:
                unmeasured.append(key)
        if unmeasured:
            with self._lock:
                new = [k for k in unmeasured if k not in self._sizing and not self._examining(k)]
                self._sizing.update(new)
            for key in new:
                if not self._pool.submit(key):  # stopped: the daemon is stopping
                    with self._lock:
                        self._sizing.difference_update(new)
                    break
        return total

    def _size_only(self, key: str) -> None:
        """Measure ``key`` cheaply; it stays where it is queued."""
        try:
            compactor = self._compactor_for(key)
            if compactor is not None and key not in self._measurements:
                before = signature(db_path(key))
                sizes = compactor.sizes(key)
                if sizes is not None:
                    self._measurements.setdefault(key, Measurement(sizes, before, False))
        except Exception:
            log.exception("sizing %r for the status table failed", key)
        finally:
            with self._lock:
                self._sizing.discard(key)


def own_paths(cfg: Config) -> tuple[str, ...]:
    """smoosh's own files: never keys (state_dir, and a SQLite store with its side files)."""
    own = [os.path.realpath(cfg.state_dir)]
    scheme, _, rest = cfg.store.partition(":")
    if scheme == "sqlite" and rest:
        db = os.path.realpath(rest)
        own += [db, db + "-wal", db + "-shm", db + "-journal"]
    return tuple(own)
