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
from typing import Any, Iterable

from smoosh.compactors.base import (
    READ_ONLY,
    Blocked,
    Busy,
    CompactionContext,
    CompactionError,
    CompactionResult,
    Compactor,
    Gone,
    InsufficientSpace,
    Interrupted,
    Refused,
    Replaced,
    Shared,
    Sizes,
)
from smoosh.compactors.sqlite import SqliteCompactor

__all__ = [
    "load_compactors",
    "compactor_for",
    "ENTRY_POINT_GROUP",
    "Sizes",
    "CompactionResult",
    "CompactionContext",
    "Compactor",
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


def load_compactors(sqlite_settings: Any = None, *, roots: Iterable[str] | None = None, **kw: Any) -> list[Compactor]:
    """The built-in SQLite compactor followed by every loadable plugin.

    Parameters:
        sqlite_settings: smoosh's ``SqliteConfig`` (or None for the defaults).
        roots: the directories every database the SQLite compactor opens must lie in (the
            config's ``roots``); None for no roots restriction. Change them live with
            :meth:`SqliteCompactor.set_roots`. Plugins are not told: they get no arguments.
        **kw: passed to :class:`SqliteCompactor` (``wal_max_size_bytes``,
            ``exact_size_interval_s``, ``clock``, ``temp_dir``, ``io_budget``).

    Returns:
        The compactors, built-in first, plugins in entry point order.

    Raises:
        ValueError: a root is not an absolute path.
    """
    compactors: list[Compactor] = [SqliteCompactor(sqlite_settings, roots=roots, **kw)]
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            factory = ep.load()
            compactor = factory()
            if not isinstance(compactor, Compactor):
                raise TypeError(f"factory returned {type(compactor).__name__}, which is not a Compactor")
        except Exception:
            # One broken plugin must not keep the daemon from compacting everything else.
            log.exception("Compactor plugin %r (%s) failed to load; skipping it.", ep.name, ep.value)
            continue
        log.info("Loaded compactor plugin %r (%s).", getattr(compactor, "name", ep.name), ep.value)
        compactors.append(compactor)
    return compactors


def compactor_for(key: str, compactors: Iterable[Compactor]) -> Compactor | None:
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
