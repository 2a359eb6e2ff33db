"""Compactors: the built-in SQLite one plus any registered under the entry point group ``smoosh.compactors``.

A third-party package registers a factory (called with no arguments, returning an object
that satisfies :class:`Compactor`)::

    [project.entry-points."smoosh.compactors"]
    lmdb = "smoosh_lmdb:make_compactor"

The built-in compactor comes first, so it keeps its keys; a plugin that fails to load or
returns something that is not a compactor is logged and skipped.
"""

from __future__ import annotations

import importlib.metadata
import logging
from typing import Iterable

from smoosh.compactors.base import (
    READ_ONLY,
    Blocked,
    Busy,
    CompactionContext,
    CompactionError,
    CompactionResult,
    Compactor,
    CompactorBase,
    Gone,
    InsufficientSpace,
    Interrupted,
    Refused,
    Replaced,
    Shared,
    Sizes,
    adapt,
)
from smoosh.compactors.sqlite import SqliteCompactor
from smoosh.disk_room import DiskRoom
from smoosh.io_budget import IoBudget

__all__ = [
    "load_compactors",
    "compactor_for",
    "ENTRY_POINT_GROUP",
    "Sizes",
    "CompactionResult",
    "CompactionContext",
    "Compactor",
    "CompactorBase",
    "adapt",
    "CompactionError",
    "Busy",
    "Blocked",
    "READ_ONLY",
    "Interrupted",
    "Gone",
    "Refused",
    "Replaced",
    "Shared",
    "InsufficientSpace",
    "SqliteCompactor",
]

log = logging.getLogger(__name__)

#: The entry point group third-party compactor factories register under.
ENTRY_POINT_GROUP = "smoosh.compactors"


def load_compactors(
    sqlite_settings: object = None,
    *,
    roots: Iterable[str] | None = None,
    wal_max_size_bytes: int | None = None,
    exact_size_interval_s: float | None = None,
    temp_dir: str | None = None,
    io_budget: IoBudget | None = None,
    disk_room: DiskRoom | None = None,
) -> list[CompactorBase]:
    """The built-in SQLite compactor followed by every loadable plugin.

    Parameters:
        sqlite_settings: smoosh's ``SqliteConfig`` (or None for the defaults).
        roots: the directories every database the SQLite compactor opens must lie in (the
            config's ``roots``); None for no roots restriction. Change them live with
            :meth:`SqliteCompactor.set_roots`. Plugins are not told: they get no arguments.
        wal_max_size_bytes, exact_size_interval_s, temp_dir, io_budget, disk_room: passed to
            :class:`SqliteCompactor` (None: its default).

    Returns:
        The compactors, built-in first, plugins in entry point order, each as the daemon holds
        it (:func:`~smoosh.compactors.base.adapt`).

    Raises:
        ValueError: a root is not an absolute path.
    """
    builtin = SqliteCompactor(sqlite_settings, roots=roots, temp_dir=temp_dir, io_budget=io_budget,
                              disk_room=disk_room)
    builtin.configure(sqlite_settings, wal_max_size_bytes=wal_max_size_bytes,
                      exact_size_interval_s=exact_size_interval_s)
    compactors: list[CompactorBase] = [builtin]
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            factory = ep.load()
            compactor = factory()
            if not isinstance(compactor, (Compactor, CompactorBase)):
                raise TypeError(f"factory returned {type(compactor).__name__}, which is not a Compactor")
        except Exception:
            # One broken plugin must not keep the daemon from compacting everything else.
            log.exception("Compactor plugin %r (%s) failed to load; skipping it.", ep.name, ep.value)
            continue
        adapted = adapt(compactor)
        log.info("Loaded compactor plugin %r (%s).", adapted.name, ep.value)
        compactors.append(adapted)
    return compactors


def compactor_for(key: str, compactors: Iterable[CompactorBase]) -> CompactorBase | None:
    """The first compactor that claims ``key``, or None.

    Parameters:
        key: any key.
        compactors: in priority order (as :func:`load_compactors` returns them).

    Returns:
        The claiming compactor, or None when no compactor claims the key.
    """
    for compactor in compactors:
        if compactor.claims(key):
            return compactor
    return None
