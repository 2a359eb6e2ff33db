"""Pieces shared by the embedded stores: key ranges, mutations, atomic add, versionstamp splicing.

A transaction records its mutations in issue order; a store turns them into writes at commit
with :func:`writes_of` and applies those to its own storage (versioned dicts, an SQLite
table), so the semantics of every operation are written once.
"""

from __future__ import annotations

import bisect
import struct
from typing import Callable, Collection, Iterable, Iterator

from smoosh.store.errors import CLIENT_INVALID_OPERATION, StoreError

#: Mutation kinds, in the tuples ``(kind, key_or_begin, value_or_end_or_param, stamp_offset)``.
OP_SET = 0
OP_CLEAR = 1
OP_CLEAR_RANGE = 2
OP_ADD = 3
OP_VS_KEY = 4
OP_VS_VALUE = 5

#: Length of the commit stamp a versionstamped operation splices in (8-byte version + 2-byte order).
STAMP_BYTES = 10
#: Length of the little-endian offset trailer on a versionstamp operand (API version >= 520).
TRAILER_BYTES = 4

Mutation = tuple[int, bytes, bytes, int]


def key_after(key: bytes) -> bytes:
    """The first key after ``key`` (so ``[key, key_after(key))`` holds just ``key``)."""
    return key + b"\x00"


def make_stamp(version: int, batch_order: int = 0) -> bytes:
    """The 10-byte versionstamp of a commit: 8-byte big-endian version, 2-byte big-endian batch order."""
    return struct.pack(">QH", version, batch_order)


def atomic_add(old: bytes | None, param: bytes) -> bytes:
    """FoundationDB's ADD: little-endian sum, width ``len(param)``, wrapping; a missing value is zeros."""
    width = len(param)
    base = (old or b"")[:width].ljust(width, b"\x00")
    total = int.from_bytes(base, "little") + int.from_bytes(param, "little")
    return (total % (1 << (8 * width))).to_bytes(width, "little") if width else b""


def parse_stamp_operand(operand: bytes, what: str) -> tuple[bytes, int]:
    """Split a versionstamp operand into (body, offset) and check the stamp fits.

    Raises:
        StoreError: 2000 client_invalid_operation when the operand is too short or the offset
            points outside the body (FoundationDB rejects these at call time too).
    """
    if len(operand) < STAMP_BYTES + TRAILER_BYTES:
        raise StoreError(CLIENT_INVALID_OPERATION, f"versionstamped {what} is shorter than 14 bytes")
    body = operand[:-TRAILER_BYTES]
    (offset,) = struct.unpack("<L", operand[-TRAILER_BYTES:])
    if offset + STAMP_BYTES > len(body):
        raise StoreError(CLIENT_INVALID_OPERATION, f"versionstamp offset {offset} is outside the {what}")
    return body, offset


def splice(body: bytes, offset: int, stamp: bytes) -> bytes:
    """``body`` with its 10 bytes at ``offset`` replaced by ``stamp``."""
    return body[:offset] + stamp + body[offset + STAMP_BYTES :]


class RangeSet:
    """A set of disjoint, coalesced half-open byte ranges ``[begin, end)`` with O(log n) lookups."""

    __slots__ = ("_begins", "_ends")

    def __init__(self) -> None:
        self._begins: list[bytes] = []
        self._ends: list[bytes] = []

    def __bool__(self) -> bool:
        return bool(self._begins)

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        return iter(zip(self._begins, self._ends))

    def __len__(self) -> int:
        return len(self._begins)

    def add(self, begin: bytes, end: bytes) -> None:
        """Add ``[begin, end)``, merging with ranges it overlaps or touches."""
        if begin >= end:
            return
        i = bisect.bisect_left(self._ends, begin)
        j = bisect.bisect_right(self._begins, end)
        if i < j:
            begin = min(begin, self._begins[i])
            end = max(end, self._ends[j - 1])
        self._begins[i:j] = [begin]
        self._ends[i:j] = [end]

    def contains(self, key: bytes) -> bool:
        """Whether ``key`` lies in one of the ranges."""
        i = bisect.bisect_right(self._begins, key) - 1
        return i >= 0 and key < self._ends[i]

    def intersects(self, begin: bytes, end: bytes) -> bool:
        """Whether ``[begin, end)`` shares a key with one of the ranges."""
        if begin >= end:
            return False
        i = bisect.bisect_right(self._begins, begin) - 1
        if i >= 0 and self._ends[i] > begin:
            return True
        return i + 1 < len(self._begins) and self._begins[i + 1] < end

    def overlapping(self, begin: bytes, end: bytes) -> list[tuple[bytes, bytes]]:
        """The ranges that share a key with ``[begin, end)``, in order."""
        if begin >= end:
            return []
        i = max(0, bisect.bisect_right(self._begins, begin) - 1)
        out = []
        while i < len(self._begins) and self._begins[i] < end:
            if self._ends[i] > begin:
                out.append((self._begins[i], self._ends[i]))
            i += 1
        return out

    def size_bytes(self) -> int:
        """Bytes of every range's bounds (FoundationDB counts conflict ranges in the transaction size)."""
        return sum(len(b) + len(e) for b, e in self)


class ConflictSet:
    """A transaction's read conflict ranges: single keys in a set, wider ranges in a list.

    Nearly every conflict range is one key (a ``get``, ``add_read_conflict_key``): kept as a
    set they cost one hash insert each, and checking them against another commit's written
    keys is one C-level set intersection. The rarer wider ranges (a conflicting range read)
    are compared one by one.
    """

    __slots__ = ("points", "ranges")

    def __init__(self) -> None:
        #: Keys ``k`` standing for the range ``[k, k + b"\x00")``.
        self.points: set[bytes] = set()
        #: Other ``[begin, end)`` ranges, unmerged.
        self.ranges: list[tuple[bytes, bytes]] = []

    def __bool__(self) -> bool:
        return bool(self.points) or bool(self.ranges)

    def add(self, begin: bytes, end: bytes) -> None:
        """Add ``[begin, end)`` (a no-op when empty)."""
        if begin >= end:
            return
        if end == begin + b"\x00":
            self.points.add(begin)
        else:
            self.ranges.append((begin, end))

    def size_bytes(self) -> int:
        """Bytes of every range's bounds (FoundationDB counts conflict ranges in the transaction size)."""
        total = 2 * sum(map(len, self.points)) + len(self.points)
        if self.ranges:
            merged = RangeSet()
            for b, e in self.ranges:
                merged.add(b, e)
            total += merged.size_bytes()
        return total

    def intersects(self, points: Collection[bytes], ranges: Iterable[tuple[bytes, bytes]]) -> bool:
        """Whether a commit that wrote ``points`` (single keys) and ``ranges`` touched one of these ranges."""
        mine = self.points
        if mine and points and not mine.isdisjoint(points):
            return True
        for b, e in ranges:
            for k in mine:
                if b <= k < e:
                    return True
            for rb, re in self.ranges:
                if rb < e and b < re:
                    return True
        for rb, re in self.ranges:
            for k in points:
                if rb <= k < re:
                    return True
        return False


def writes_of(
    mutations: Iterable[Mutation], stamp: bytes, current: Callable[[bytes], bytes | None]
) -> Iterator[tuple[bytes, bytes | None, bytes | None]]:
    """One transaction's mutations as the writes they make, in issue order.

    Each point write comes as ``(key, value, None)`` (value None: the key is cleared); a
    range clear as ``(begin, None, end)``. Versionstamped operands get ``stamp`` spliced in
    (the only place the commit's stamp is known) and an atomic add is computed on
    ``current(key)``, the key's latest value as the caller applies them: the committed one,
    not the transaction's snapshot, which is why an add adds no read conflict.
    """
    for kind, a, b, offset in mutations:
        if kind == OP_SET:
            yield a, b, None
        elif kind == OP_CLEAR:
            yield a, None, None
        elif kind == OP_VS_VALUE:
            yield a, b[:offset] + stamp + b[offset + STAMP_BYTES :], None
        elif kind == OP_VS_KEY:
            yield a[:offset] + stamp + a[offset + STAMP_BYTES :], b, None
        elif kind == OP_ADD:
            yield a, atomic_add(current(a), b), None
        elif kind == OP_CLEAR_RANGE:
            yield a, None, b
        else:  # pragma: no cover - the transaction only records the kinds above
            raise AssertionError(f"unknown mutation kind {kind}")
