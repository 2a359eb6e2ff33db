"""Read-your-writes: what one transaction wrote, and the committed state seen through it.

A :class:`WriteBuffer` holds a transaction's writes by key (atomic adds whose base is not
read yet included), the ranges it cleared, and the ranges a versionstamped key of it may
land on. The transaction's reads go through it: a key its own writes decide is answered
without the snapshot (so it adds no read conflict), any other is the snapshot's value with
the buffered adds applied, and a range read or a key selector walks the snapshot's pairs
merged with the buffered keys. Limits, conflict ranges, the mutation log and the commit
belong to the transaction (:mod:`smoosh.store._txn`).
"""

from __future__ import annotations

from typing import Callable, Iterator

from sortedcontainers import SortedList  # type: ignore[import-untyped]

from smoosh.store.base import KeySelector
from smoosh.store.errors import ACCESSED_UNREADABLE, StoreError
from smoosh.store._commit import Snapshot
from smoosh.store._mutations import RangeSet, atomic_add, key_after

#: The end of the normal keyspace: keys must sort before it; reads are clamped to it.
KEYSPACE_END = b"\xff"


class Entry:
    """The transaction's own view of one key it wrote."""

    __slots__ = ("known", "value", "adds", "unreadable")

    def __init__(self, value: bytes | None = None, *, known: bool = True, unreadable: bool = False) -> None:
        self.known = known  # False: ``adds`` apply on top of the snapshot value
        self.value = value
        self.adds: list[bytes] = []
        self.unreadable = unreadable  # a versionstamped value: unknown until commit


class WriteBuffer:
    """One transaction's own writes, and its reads through them (see the module docstring)."""

    __slots__ = ("writes", "cleared", "unreadable", "_order")

    def __init__(self) -> None:
        #: Our writes by key.
        self.writes: dict[bytes, Entry] = {}
        # Most transactions write a handful of keys and never scan them, so the sorted index
        # the range reads need is built at the first such read and kept up to date from then
        # on: a sorted map made for every transaction cost a large share of a point read.
        self._order: SortedList | None = None
        #: Ranges we cleared: a key in one reads as absent unless written since.
        self.cleared = RangeSet()
        #: Ranges a versionstamped key of ours may land on: unknown until commit, unreadable.
        self.unreadable = RangeSet()

    def wrote(self, key: bytes) -> bool:
        """Whether we wrote or cleared ``key``: its value after our commit is ours, not the snapshot's."""
        return key in self.writes or self.cleared.contains(key)

    def decides(self, key: bytes) -> bool:
        """Whether our writes alone decide ``key``'s value, whatever was committed."""
        entry = self.writes.get(key)
        return (entry is not None and entry.known) or self.cleared.contains(key)

    # -- reads ------------------------------------------------------------------------
    def read(self, key: bytes, snapshot: Callable[[], Snapshot]) -> tuple[bytes | None, bool]:
        """``key``'s value as the transaction sees it, and whether the committed value was read.

        ``snapshot`` opens (or returns) the transaction's snapshot; it is called only when
        our writes do not decide the key.

        Raises:
            StoreError: 1036 for a key a versionstamped write of ours made unreadable.
        """
        if self.unreadable.contains(key):
            raise StoreError(ACCESSED_UNREADABLE)
        entry = self.writes.get(key)
        if entry is not None:
            if entry.unreadable:
                raise StoreError(ACCESSED_UNREADABLE)
            if entry.known:
                return entry.value, False  # fully decided by our own writes: no read conflict
            value = snapshot().get(key)
            for param in entry.adds:
                value = atomic_add(value, param)
            return value, True
        if self.cleared.contains(key):
            return None, False
        return snapshot().get(key), True

    def merged(
        self, snapshot: Callable[[], Snapshot], begin: bytes, end: bytes, reverse: bool, first_chunk: int = 0
    ) -> Iterator[tuple[bytes, bytes]]:
        """Pairs in ``[begin, end)``: the snapshot overlaid with our writes and clears.

        Lazy, as the snapshot's scan is: nothing is read (and the snapshot is not opened)
        until the first pair is asked for.

        Raises:
            StoreError: 1036 when the scan reaches a range a versionstamped key of ours may land on.
        """
        if begin >= end:
            return
        barrier = None  # a versionstamped key may land here: scanning past it is unreadable
        unreadable = self.unreadable.overlapping(begin, end)
        if unreadable:
            barrier = unreadable[-1][1] if reverse else unreadable[0][0]
        base = snapshot().scan(begin, end, reverse, first_chunk)
        local = iter(self._written_in(begin, end, reverse))
        nb = next(base, None)
        nl = next(local, None)
        value: bytes | None
        while nb is not None or nl is not None:
            if nl is None or (nb is not None and ((nb[0] > nl) if reverse else (nb[0] < nl))):
                assert nb is not None  # for mypy: the loop's condition says so
                key, value = nb
                nb = next(base, None)
                if self.cleared.contains(key):
                    continue
            else:
                key = nl
                nl = next(local, None)
                base_value = None
                if nb is not None and nb[0] == key:
                    base_value = nb[1]
                    nb = next(base, None)
                entry = self.writes[key]
                if entry.unreadable:
                    raise StoreError(ACCESSED_UNREADABLE)
                if entry.known:
                    value = entry.value
                else:
                    # An unknown-base entry never lies in a cleared range (a clear makes it known).
                    value = base_value
                    for param in entry.adds:
                        value = atomic_add(value, param)
                if value is None:
                    continue
            if barrier is not None and ((key < barrier) if reverse else (key >= barrier)):
                raise StoreError(ACCESSED_UNREADABLE)
            assert value is not None  # a base pair always has a value
            yield key, value
        if barrier is not None:
            raise StoreError(ACCESSED_UNREADABLE)

    def resolve(self, snapshot: Callable[[], Snapshot], sel: KeySelector) -> bytes:
        """The key ``sel`` names in our merged view (``b""`` / ``b"\\xff"`` off either end)."""
        pivot = key_after(sel.key) if sel.or_equal else sel.key
        if sel.offset >= 1:
            n = sel.offset
            for key, _ in self.merged(snapshot, pivot, KEYSPACE_END, False, sel.offset):
                n -= 1
                if n == 0:
                    return key
            return KEYSPACE_END
        n = 1 - sel.offset
        for key, _ in self.merged(snapshot, b"", min(pivot, KEYSPACE_END), True, 1 - sel.offset):
            n -= 1
            if n == 0:
                return key
        return b""

    # -- writes -----------------------------------------------------------------------
    def _written_in(self, begin: bytes, end: bytes, reverse: bool) -> list[bytes]:
        """Keys we wrote in ``[begin, end)``, in order (a copy: callers may change the writes)."""
        order = self._order
        if order is None:
            if not self.writes:
                return []
            order = self._order = SortedList(self.writes)
        return list(order.irange(begin, end, inclusive=(True, False), reverse=reverse))

    def _put(self, key: bytes, entry: Entry) -> Entry:
        if self._order is not None and key not in self.writes:
            self._order.add(key)
        self.writes[key] = entry
        return entry

    def set(self, key: bytes, value: bytes) -> None:
        """Buffer ``key = value``."""
        self._put(key, Entry(value))

    def clear(self, key: bytes) -> None:
        """Buffer the deletion of ``key``."""
        self._put(key, Entry(None))

    def clear_range(self, begin: bytes, end: bytes) -> None:
        """Buffer the deletion of every key in ``[begin, end)`` (a non-empty range)."""
        for key in self._written_in(begin, end, False):
            del self.writes[key]
            assert self._order is not None
            self._order.remove(key)
        self.cleared.add(begin, end)

    def add(self, key: bytes, param: bytes) -> None:
        """Buffer an atomic add: applied at once to a value we know, else kept for the committed one."""
        entry = self.writes.get(key)
        if entry is None:
            if self.cleared.contains(key):
                self._put(key, Entry(atomic_add(None, param)))
            else:
                entry = self._put(key, Entry(known=False))
                entry.adds.append(param)
        elif entry.known:
            entry.value = atomic_add(entry.value, param)
        elif not entry.unreadable:
            entry.adds.append(param)

    def set_unreadable_value(self, key: bytes) -> None:
        """Buffer a versionstamped value for ``key``: unknown, so unreadable, until commit."""
        self._put(key, Entry(known=False, unreadable=True))

    def set_unreadable_range(self, begin: bytes, end: bytes) -> None:
        """Mark ``[begin, end)`` unreadable: a versionstamped key of ours may land there."""
        self.unreadable.add(begin, end)
