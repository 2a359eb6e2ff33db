"""Disk pressure: which file systems under the roots are fuller than ``disk_pressure``.

A file system past its ``disk_pressure`` use (``df``'s Use%: used over used plus available)
is not a normal day: its databases are taken worst-first by reclaimable bytes (the offer
queues such a key at the bytes it would give back when that is above its channel's priority,
so the largest reclaim runs first), and channels with ``under_pressure = ignore_window`` run
outside their windows until the pressure ends. Each change of state is one log line (WARNING
as it starts, INFO as it ends, with how long it lasted); ``/status``, ``/metrics`` and
``explain`` show it. CouchDB has nothing like it (apache/couchdb#3956).

Ownership: the server's loop checks (:meth:`DiskPressure.check`, from the housekeeping);
any thread reads (:meth:`DiskPressure.on`, :meth:`DiskPressure.snapshot`): the state is one
immutable mapping, replaced whole.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from smoosh.disk_room import DEFAULT_DISK_PRESSURE
from smoosh.identity import root_of

__all__ = ["DiskPressure", "FsUse"]

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class FsUse:
    """One file system under the roots: how full it is, and whether that is pressure."""

    #: The roots on it (by the config's order); the first names it in lines and metrics.
    roots: tuple[str, ...]
    #: Used over used plus available, as ``df`` shows it (0-1).
    used: float
    pressure: bool
    #: Since when (wall seconds) it has been under pressure; None when it is not.
    since: float | None = None


def _usage(directory: str) -> float:
    st = os.statvfs(directory)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    avail = st.f_bavail * st.f_frsize
    return used / (used + avail) if used + avail else 0.0


class DiskPressure:
    """The pressure state of the file systems under the roots (see the module docstring).

    Parameters:
        threshold: ``disk_pressure`` (0-1), or None: never under pressure.
        usage: ``directory -> used fraction``; tests give their own (None: ``statvfs``, looked up
            at each check).
        device: ``directory -> device number``; tests give their own.
        clock: wall seconds, for ``since`` and how long a pressure lasted.
    """

    def __init__(
        self,
        threshold: float | None = DEFAULT_DISK_PRESSURE,
        *,
        usage: Callable[[str], float] | None = None,
        device: Callable[[str], int] = lambda directory: os.stat(directory).st_dev,
        clock: Callable[[], float],
    ) -> None:
        self._threshold = threshold
        self._usage = usage if usage is not None else (lambda directory: _usage(directory))
        self._device = device
        self._clock = clock
        self._state: Mapping[int, FsUse] = {}
        self._pressured_roots: frozenset[str] = frozenset()
        self._roots: tuple[str, ...] = ()

    @property
    def threshold(self) -> float | None:
        """``disk_pressure`` in force (0-1), or None: never under pressure."""
        return self._threshold

    def set_threshold(self, threshold: float | None) -> None:
        """Change ``disk_pressure`` (live reload); the next :meth:`check` applies it."""
        self._threshold = threshold

    def check(self, roots: Sequence[str]) -> bool:
        """Look at every file system under ``roots`` now (the loop thread); log each change of state.

        Returns:
            Whether any file system started or ended a pressure.
        """
        now = self._clock()
        groups: dict[int, list[str]] = {}
        for root in roots:
            try:
                groups.setdefault(self._device(root), []).append(root)
            except OSError:
                continue  # a root that vanished: the roots check says so
        state: dict[int, FsUse] = {}
        changed = False
        for dev, on_it in groups.items():
            try:
                used = self._usage(on_it[0])
            except OSError:
                continue
            pressure = self._threshold is not None and used >= self._threshold
            before = self._state.get(dev)
            since = (before.since if before is not None and before.pressure else now) if pressure else None
            state[dev] = FsUse(tuple(on_it), used, pressure, since)
            changed = changed or pressure != (before is not None and before.pressure)
            if pressure and (before is None or not before.pressure):
                log.warning(
                    "Disk pressure on the file system of %s: %.0f%% used (disk_pressure %.0f%%): its databases are "
                    "compacted worst-first by reclaimable bytes, and channels with under_pressure = ignore_window run "
                    "outside their windows.", ", ".join(on_it), 100 * used, 100 * (self._threshold or 0),
                )
            elif not pressure and before is not None and before.pressure:
                log.info("Disk pressure ended on the file system of %s: %.0f%% used, after %.0f s.",
                         ", ".join(on_it), 100 * used, now - (before.since or now))
        self._state = state
        self._roots = tuple(roots)
        self._pressured_roots = frozenset(r for fs in state.values() if fs.pressure for r in fs.roots)
        return changed

    def on(self, path: str) -> bool:
        """Whether ``path`` (a canonical database path) lies on a file system under pressure (any thread)."""
        pressured = self._pressured_roots
        if not pressured:
            return False
        root = root_of(path, self._roots)
        return root is not None and root in pressured

    @property
    def any(self) -> bool:
        """Whether any file system under the roots is under pressure now."""
        return bool(self._pressured_roots)

    def snapshot(self) -> list[FsUse]:
        """Every file system under the roots as last checked (any thread)."""
        return list(self._state.values())
