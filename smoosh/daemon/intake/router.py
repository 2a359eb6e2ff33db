"""Routing decisions: which compactor owns a key, what its database measures, what each channel gives it.

The server walks a key's channels in the operator's order and offers the key to the first one
whose priority is above 0; this module supplies the measurements and the priorities, and
remembers which files were just compacted so an unchanged one is not compacted again.
"""

from __future__ import annotations

import fnmatch
import logging
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Iterator, Sequence

from smoosh.paths import CLEANUP_PREFIX
from smoosh.compactors import CompactorBase, compactor_for
from smoosh.compactors.base import Look, Sizes
from smoosh.config import ChannelConfig, Config
from smoosh.priority import compute

log = logging.getLogger(__name__)

#: Keys whose last compaction is remembered (to not compact an unchanged file again).
MAX_COMPACTED_KEYS = 100_000

#: One way to offer a key: the channel names to try, the sizes measured, the priority per
#: channel, and whether the sizes are exact.
Offer = tuple[Sequence[str], Any, Callable[[ChannelConfig], float], bool]
#: Yielded by ``offers(..., defer_exact=True)`` where the exact measurement is due.
EXACT_DUE: Offer = ((), None, lambda ch: 0.0, False)


def db_path(key: str) -> str:
    """The database file a key names (``cleanup:`` stripped)."""
    return key[len(CLEANUP_PREFIX):] if key.startswith(CLEANUP_PREFIX) else key


class Router:
    """Measures keys and prices them per channel; thread-safe.

    Parameters:
        compactors: the compactors, first claim wins.
        clock: monotonic seconds (the loop's clock): how long ago a key was compacted.
    """

    def __init__(self, compactors: list[CompactorBase], *, clock: Callable[[], float] = time.monotonic) -> None:
        self.compactors = compactors
        self._clock = clock
        self._lock = threading.Lock()
        # key -> (file bytes after its last successful compaction, when): see freshly_compacted.
        self._compacted: OrderedDict[str, tuple[int, float]] = OrderedDict()

    def compactor_for(self, key: str) -> CompactorBase | None:
        """The compactor that claims ``key``, or None."""
        return compactor_for(key, self.compactors)

    def cleanup_key(self, key: str, look: Look | None = None, compactor: CompactorBase | None = None) -> str | None:
        """The cleanup key ``key``'s database calls for now (its WAL grew past half of ``wal_max_size``), or None.

        Asked of the compactor that claims the key (``cleanup_key``, optional: a compactor
        without one never asks for cleanup); cheap, one ``lstat`` for SQLite, none with the
        compactor's ``look`` at the file (:class:`~smoosh.compactors.base.Look`).
        ``compactor``: the one that claims it, when the caller has it already.
        """
        owner = compactor if compactor is not None else self.compactor_for(key)
        return None if owner is None else owner.cleanup_key(key, look=look)

    @staticmethod
    def is_ignored(key: str, cfg: Config) -> bool:
        """Whether ``[smoosh.ignore]`` names the key's database (exactly or by glob)."""
        if not cfg.ignore:
            return False  # the usual case, asked for every key examined: no generator to start
        path = db_path(key)
        return any(path == pattern or fnmatch.fnmatchcase(path, pattern) for pattern in cfg.ignore)

    def offers(
        self, key: str, cfg: Config, *, defer_exact: bool = False, force: bool = False, look: Look | None = None,
        compactor: CompactorBase | None = None,
    ) -> Iterator[Offer]:
        """The ways to offer ``key`` to its channels, cheapest measurement first.

        Yields nothing for a missing database. One compacted recently that has not grown is
        offered to the upgrade channels alone: its size holds nothing to reclaim, but a target
        changed since (a live edit of ``[smoosh.sqlite] auto_vacuum``) is not in its file yet,
        and an upgrade channel's priority says only whether it needs one. For
        a database the cheap size estimate comes first; the exact one follows only when the
        compactor says it is due (at most once per ``exact_size_interval`` per key), because the
        estimate is a lower bound and may not qualify where the truth does. With
        ``defer_exact``, a due exact measurement is not taken: :data:`EXACT_DUE` is yielded
        in its place, for the caller to hand the key to a thread that may take its time.
        With ``force`` (``enqueue --force``: thresholds do not count) the cheap estimate is
        the only offer, and a database compacted recently is offered all the same. ``look``:
        the compactor's look at the database just taken (its ``look``), measured from instead
        of reading the file again; ``compactor``: the one that claims the key, when the caller
        has it already.
        """
        if compactor is None:
            compactor = self.compactor_for(key)
        if compactor is None:
            return
        if key.startswith(CLEANUP_PREFIX):
            priority = compactor.cleanup_priority(key)
            yield cfg.cleanup_channels, None, lambda ch: priority, False
            return
        sizes = compactor.sizes(key) if look is None else compactor.sizes(key, look=look)
        if sizes is None:
            return
        if not force and self.freshly_compacted(key, sizes.file_bytes, cfg):
            upgrades = tuple(n for n in cfg.db_channels if n in cfg.channels and cfg.channels[n].priority == "upgrade")
            if upgrades:
                yield upgrades, sizes, lambda ch: self.priority(ch, key, sizes, compactor), False
            return
        yield cfg.db_channels, sizes, lambda ch: self.priority(ch, key, sizes, compactor), False
        if force:
            return
        if compactor.exact_size_due(key):
            if defer_exact:
                yield EXACT_DUE
                return
            exact = compactor.sizes(key, exact=True) if look is None else compactor.sizes(key, exact=True, look=look)
            if exact is not None and exact != sizes:
                yield cfg.db_channels, exact, lambda ch: self.priority(ch, key, exact, compactor), True

    @staticmethod
    def priority(ch: ChannelConfig, key: str, sizes: Sizes, compactor: CompactorBase) -> float:
        """The channel's priority for a database of these sizes (not yet quantized)."""
        needs_upgrade = ch.priority == "upgrade" and compactor.needs_upgrade(key)
        return compute(
            ch.priority,
            file=sizes.file_bytes,
            active=sizes.active_bytes,
            min_priority=ch.min_priority,
            max_priority=ch.max_priority,
            min_size=ch.min_size_bytes,
            max_size=ch.max_size_bytes,
            changes=sizes.changes,
            min_changes=ch.min_changes,
            needs_upgrade=needs_upgrade,
        )

    def record_compacted(self, key: str, size_after_bytes: int, now: float) -> None:
        """Remember a successful compaction of ``key`` at ``now`` (the router's clock); not cleanup keys."""
        if key.startswith(CLEANUP_PREFIX):
            return
        with self._lock:
            self._compacted[key] = (size_after_bytes, now)
            self._compacted.move_to_end(key)
            while len(self._compacted) > MAX_COMPACTED_KEYS:
                self._compacted.popitem(last=False)

    def freshly_compacted(self, key: str, file_bytes: int, cfg: Config, *, forget_expired: bool = True) -> bool:
        """Whether ``key`` was compacted within ``exact_size_interval`` and its file has not grown since.

        Such a file holds nothing a new compaction could reclaim, whatever its measured sizes
        say: rows rarely fill pages completely, so even a freshly vacuumed file shows payload
        well below its size, and without this rule it would be compacted again and again.
        ``forget_expired=False`` leaves the memory as it is (``explain`` changes nothing).
        """
        with self._lock:
            done = self._compacted.get(key)
        if done is None:
            return False
        size_after_bytes, at = done
        age_s = self._clock() - at
        if age_s >= cfg.exact_size_interval_s or file_bytes > size_after_bytes:
            if not forget_expired:
                return False
            with self._lock:
                self._compacted.pop(key, None)
            return False
        log.debug("%r was compacted %.0f s ago and has not grown; not queued", key, age_s)
        return True
