"""``memory:`` — an in-process store with FoundationDB's transaction semantics, nothing on disk.

For embedding and fast tests; a real store, not a stand-in. Every key keeps a short history
of ``(commit_version, value)`` (multi-version concurrency control), so a transaction reads the
state at its read version however many commits happen meanwhile. A commit is checked, as
FoundationDB's resolver does, against the write ranges of commits newer than its read version
(kept for :attr:`~BufferedStore.retention_s`); only a real overlap with a read conflict range
fails it with 1020. History older than the retention is pruned, and a transaction whose read
version predates the pruned history fails with 1007 (it is older than the age limit anyway).

Thread-safe: one lock guards the data; scans copy small chunks under it, so a long range read
never blocks commits.

Deleted keys stay in ``_data`` (as a history ending in a deletion) for the retention window,
because an older snapshot may still read them. A job queue deletes a key per dequeue, so
a range scan that walked ``_data`` would step over thousands of such tombstones on every
read (measured: 60% of the time of a job round trip, ~2,200 round trips/s). Scans therefore
walk ``_live`` (keys whose newest version holds a value) plus the few keys deleted *after*
the snapshot's read version (from ``_deletions``): exactly the keys that can hold a value
at that version, whatever the number of tombstones.
"""

from __future__ import annotations

import bisect
import collections
import heapq
import operator
import struct
import threading
import time
from typing import Callable, Iterator, Optional, Union

from sortedcontainers import SortedList  # type: ignore[import-untyped]

from smoosh.store.base import (
    MAX_WATCHES,
    TRANSACTION_MAX_AGE_S,
    TRANSACTION_SIZE_LIMIT_BYTES,
)
from smoosh.store.errors import NOT_COMMITTED, TRANSACTION_TOO_OLD, StoreError
from smoosh.store._commit import CommitRequest, PendingWatch, Snapshot
from smoosh.store._mutations import (
    OP_ADD,
    OP_CLEAR,
    OP_CLEAR_RANGE,
    OP_SET,
    OP_VS_KEY,
    OP_VS_VALUE,
    STAMP_BYTES,
    Mutation,
    atomic_add,
)
from smoosh.store._txn import BufferedStore

#: Pairs copied per lock acquisition during a range scan.
SCAN_CHUNK = 256
#: Seconds between two prunings of the conflict log and the deletions record. Pruning late
#: only keeps them a little longer; checking on every commit was a visible part of its cost.
PRUNE_INTERVAL_S = 0.05
#: Seconds between two trims of old key versions. A key written by every commit (a job
#: type's watch key) holds retention x commit rate versions; trimming it on every commit
#: moved that whole list each time (80% of a round trip's time at 5,000 commits/s).
HISTORY_TRIM_INTERVAL_S = 1.0
#: Versions a key's history holds as a tuple; a longer one is a list, appended in place (a
#: key written by every commit). The cyclic collector stops tracking a tuple of bytes and
#: ints, where a list per key, kept for the store's life, was walked by every full collection.
TUPLE_HISTORY_MAX = 8

_version_of = operator.itemgetter(0)
_pack_stamp = struct.Struct(">QH").pack

#: ``(version, value or None for a deletion)`` pairs, ascending versions: a tuple while short
#: (replaced as a whole on each write), a list once longer (see :data:`TUPLE_HISTORY_MAX`).
_History = Union[tuple[tuple[int, Optional[bytes]], ...], list[tuple[int, Optional[bytes]]]]


def take_politely(lock: threading.Lock) -> None:
    """Acquire ``lock``, yielding the GIL between tries instead of blocking on it.

    Under the GIL, a thread preempted while it held the store's lock made every other thread
    block on it, and each then needed a thread hand-off to get the lock back: a convoy that
    outlived its cause, with context switches on most commits of four workers. A thread that
    yields instead lets the holder, which only waits for the GIL, finish first.
    """
    while not lock.acquire(False):
        time.sleep(0)


class _PoliteLock:
    """``with`` on a lock, taken politely (see :func:`take_politely`)."""

    __slots__ = ("_lock",)

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock

    def __enter__(self) -> None:
        if not self._lock.acquire(False):
            take_politely(self._lock)

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def _value_at(history: _History, version: int) -> bytes | None:
    for v, value in reversed(history):
        if v <= version:
            return value
    return None


class _MemorySnapshot(Snapshot):
    needs_release = False  # holds no resource: close() is a no-op

    __slots__ = ("_store", "read_version")

    def __init__(self, store: MemoryStore, read_version: int) -> None:
        self._store = store
        self.read_version = read_version

    def _check_floor(self) -> None:
        if self.read_version < self._store._floor_version:
            raise StoreError(TRANSACTION_TOO_OLD)

    def get(self, key: bytes) -> bytes | None:
        store = self._store
        read_version = self.read_version
        # Without the lock when the key's newest version is the one we read (nearly always):
        # one read of the history's last item is atomic, and a commit only appends to a list
        # history, replaces its last item, or puts a new tuple in its place. The floor is checked after the read: a prune raises the floor before it
        # trims, so a read that raced a trim sees the raised floor and fails as too old.
        history = store._data.get(key)
        if history is None:
            value = None
        else:
            version, value = history[-1]
            if version > read_version:
                # An older version: walking the list must not race a trim of its head.
                with store._guard:
                    self._check_floor()
                    return _value_at(history, read_version)
        if read_version < store._floor_version:
            raise StoreError(TRANSACTION_TOO_OLD)
        return value

    def _collect(self, lo: bytes, hi: bytes, reverse: bool, count: int) -> list[tuple[bytes, bytes]]:
        """Up to ``count`` pairs of ``[lo, hi)`` at the read version, in order (one lock hold)."""
        store = self._store
        data = store._data
        lock = store._lock
        read_version = self.read_version
        chunk = []
        if not lock.acquire(False):
            take_politely(lock)
        try:
            self._check_floor()
            # Keys live now, plus keys deleted since our read version (they may still hold
            # a value at it); a key in both comes out of the merge twice.
            keys: Iterator[bytes] = store._live.irange(lo, hi, inclusive=(True, False), reverse=reverse)
            deletions = store._deletions
            if deletions and deletions[-1][0] > read_version:
                recent = store._deleted_since(read_version, lo, hi)
                if recent:
                    keys = heapq.merge(keys, sorted(recent, reverse=reverse), reverse=reverse)
            previous = None
            for key in keys:
                if key == previous:
                    continue
                previous = key
                history = data.get(key)
                if history is None:
                    continue
                # The newest version is nearly always the one we read.
                version, value = history[-1]
                if version > read_version:
                    value = _value_at(history, read_version)
                if value is not None:
                    chunk.append((key, value))
                    if len(chunk) >= count:
                        break
        finally:
            lock.release()
        return chunk

    def scan(self, begin: bytes, end: bytes, reverse: bool, first_chunk: int = 0) -> Iterator[tuple[bytes, bytes]]:
        lo, hi = begin, end
        # The merge above us reads one pair ahead; later chunks grow back to the usual size.
        chunk_size = min(first_chunk + 1, SCAN_CHUNK) if first_chunk > 0 else SCAN_CHUNK
        while True:
            chunk = self._collect(lo, hi, reverse, chunk_size)
            yield from chunk
            if len(chunk) < chunk_size:
                return
            chunk_size = min(chunk_size * 4, SCAN_CHUNK)
            if reverse:
                hi = chunk[-1][0]
            else:
                lo = chunk[-1][0] + b"\x00"

    def read_range(self, begin: bytes, end: bytes, reverse: bool, limit: int) -> list[tuple[bytes, bytes]]:
        if 0 < limit <= SCAN_CHUNK:
            return self._collect(begin, end, reverse, limit)  # one chunk: no generator
        return super().read_range(begin, end, reverse, limit)

    def close(self) -> None:
        pass


class MemoryStore(BufferedStore):
    """The ``memory:`` store (see the module docstring).

    Parameters:
        url: the URL it was opened with.
        max_age_s: seconds a transaction may read and commit after its first read (1007 beyond).
        size_limit_bytes: transaction size limit (2101 beyond it).
        max_watches: outstanding watches allowed (1032 beyond).
        clock: monotonic seconds; tests inject one to age transactions without sleeping.
    """

    def __init__(
        self,
        url: str = "memory:",
        *,
        max_age_s: float | None = TRANSACTION_MAX_AGE_S,
        size_limit_bytes: int = TRANSACTION_SIZE_LIMIT_BYTES,
        max_watches: int = MAX_WATCHES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(url, max_age_s=max_age_s, size_limit_bytes=size_limit_bytes, max_watches=max_watches, clock=clock)
        self._lock = threading.Lock()
        #: ``with`` on the lock, taken politely.
        self._guard = _PoliteLock(self._lock)
        self._data: dict[bytes, _History] = {}
        #: Keys whose newest version holds a value, sorted (what scans walk).
        self._live: SortedList = SortedList()
        #: (version, key) of every key deleted within the retention, oldest first.
        self._deletions: collections.deque[tuple[int, bytes]] = collections.deque()
        self._version = 0
        #: When the next commit prunes the conflict log and old versions (clock seconds).
        self._next_prune_s = -float("inf")
        #: Reads below this version would need pruned history: they fail with 1007.
        self._floor_version = 0
        #: (commit_version, commit_time, keys written, ranges cleared) of recent commits, oldest
        #: first. Tuples, not sets and lists: the collector stops tracking a tuple of bytes,
        #: and it would otherwise walk every commit of the retention window on each full pass.
        self._log: collections.deque[tuple[int, float, tuple[bytes, ...], tuple[tuple[bytes, bytes], ...]]] = collections.deque()
        #: (commit_time, version, keys whose history changed) whose older history may be pruned later.
        self._touched: collections.deque[tuple[float, int, tuple[bytes, ...]]] = collections.deque()
        self._last_trim = -float("inf")

    def _deleted_since(self, read_version: int, begin: bytes, end: bytes) -> set[bytes]:
        """Keys in ``[begin, end)`` deleted by commits newer than ``read_version`` (under the lock)."""
        found = set()
        for version, key in reversed(self._deletions):
            if version <= read_version:
                break
            if begin <= key < end:
                found.add(key)
        return found

    def _open_snapshot(self) -> Snapshot:
        # No lock: a commit publishes its version only after applying every write of it.
        return _MemorySnapshot(self, self._version)

    def _prune(self, now: float) -> None:
        self._next_prune_s = now + PRUNE_INTERVAL_S
        cutoff = now - self.retention_s
        while self._log and self._log[0][1] < cutoff:
            self._floor_version = max(self._floor_version, self._log.popleft()[0])
        floor = self._floor_version
        # A deletion at or below the floor is older than every readable snapshot.
        while self._deletions and self._deletions[0][0] <= floor:
            self._deletions.popleft()
        if not self._touched or self._touched[0][0] >= cutoff or now - self._last_trim < HISTORY_TRIM_INTERVAL_S:
            return
        # Batched, and each key once: versions kept a little longer than needed cost nothing
        # (reads at or above the floor still find theirs), a trim per commit cost a lot.
        self._last_trim = now
        keys: set[bytes] = set()
        while self._touched and self._touched[0][0] < cutoff:
            keys.update(self._touched.popleft()[2])
        data = self._data
        for key in keys:
            history = data.get(key)
            if history is None:
                continue
            # Keep the newest value at or below the floor (what a read at the floor sees)
            # and everything newer.
            i = bisect.bisect_right(history, floor, key=_version_of) - 1
            if i > 0:
                # A new history, not one cut in place: a reader may walk the old one unlocked.
                history = history[i:]
                data[key] = tuple(history) if len(history) <= TUPLE_HISTORY_MAX else history
            if len(history) == 1 and history[0][1] is None and history[0][0] <= floor:
                del data[key]

    def _commit(self, req: CommitRequest) -> bytes:
        lock = self._lock
        if not lock.acquire(False):
            take_politely(lock)
        try:
            now = self.clock()
            if now >= self._next_prune_s:
                self._prune(now)
            reads = req.reads
            if reads.points or reads.ranges:
                read_version = req.read_version
                assert read_version is not None
                if read_version < self._floor_version:
                    raise StoreError(TRANSACTION_TOO_OLD)
                if read_version < self._version:
                    for version, _, points, ranges in reversed(self._log):
                        if version <= read_version:
                            break
                        if reads.intersects(points, ranges):
                            raise StoreError(NOT_COMMITTED)
            version = self._version + 1
            stamp = _pack_stamp(version, 0)  # make_stamp, without the call
            points, cleared, touched = self._apply(req.mutations, stamp, version)
            self._version = version
            self._log.append((version, now, points, cleared))
            self._touched.append((now, version, touched))
            if req.watches:
                self._arm(req.watches)
            # Watches are armed only under this lock: none armed means none to check.
            if self.watches._armed:
                keys = self.watches.affected(points, cleared)
                if keys:
                    self.watches.check({k: self._latest(k) for k in keys})
            return stamp
        finally:
            lock.release()

    def _apply(
        self, mutations: list[Mutation], stamp: bytes, version: int
    ) -> tuple[tuple[bytes, ...], tuple[tuple[bytes, bytes], ...], tuple[bytes, ...]]:
        """Apply one commit's mutations in issue order as versions ``version`` (under the lock).

        :func:`~smoosh.store._mutations.writes_of` and :meth:`_put` written out in one loop:
        every commit runs it, and a generator step and a call per write were most of its cost.
        The semantics are theirs (a test runs random mutations through both).

        Returns:
            ``(keys written, ranges cleared, keys whose history changed)`` (a key may repeat).
        """
        points: list[bytes] = []
        cleared: list[tuple[bytes, bytes]] = []
        touched = points
        data = self._data
        live = self._live
        value: bytes | None
        for kind, key, value, offset in mutations:
            if kind == OP_SET:
                pass
            elif kind == OP_VS_VALUE:
                value = value[:offset] + stamp + value[offset + STAMP_BYTES :]
            elif kind == OP_CLEAR:
                value = None
            elif kind == OP_VS_KEY:
                key = key[:offset] + stamp + key[offset + STAMP_BYTES :]
            elif kind == OP_ADD:
                history = data.get(key)
                value = atomic_add(None if history is None else history[-1][1], value)
            elif kind == OP_CLEAR_RANGE:  # only live keys can change
                cleared.append((key, value))
                if touched is points:
                    touched = list(points)
                for k in list(live.irange(key, value, inclusive=(True, False))):
                    self._put(k, None, version)
                    touched.append(k)
                continue
            else:  # pragma: no cover - the transaction only records the kinds above
                raise AssertionError(f"unknown mutation kind {kind}")
            points.append(key)
            if touched is not points:
                touched.append(key)
            # _put, inline.
            history = data.get(key)
            if history is None:
                if value is not None:
                    data[key] = ((version, value),)
                    live.add(key)
                continue
            last_version, last_value = history[-1]
            if last_version == version:
                if isinstance(history, tuple):
                    data[key] = history[:-1] + ((version, value),)
                else:
                    history[-1] = (version, value)
            elif last_value is not None or value is not None:
                if isinstance(history, list):
                    history.append((version, value))
                elif len(history) < TUPLE_HISTORY_MAX:
                    data[key] = history + ((version, value),)
                else:
                    data[key] = [*history, (version, value)]
            else:
                continue  # clearing a key that is already absent changes nothing
            if last_value is not None:
                if value is None:
                    live.remove(key)
                    self._deletions.append((version, key))
            elif value is not None:
                live.add(key)
        written = tuple(points)
        if not cleared:
            return written, (), written
        return written, tuple(cleared), tuple(touched)

    def _put(self, key: bytes, value: bytes | None, version: int) -> None:
        """Record ``key``'s value at ``version``; keeps the live-key index (under the lock)."""
        data = self._data
        history = data.get(key)
        if history is None:
            if value is not None:
                data[key] = ((version, value),)
                self._live.add(key)
            return
        last_version, last_value = history[-1]
        if last_version == version:
            if isinstance(history, tuple):
                data[key] = history[:-1] + ((version, value),)
            else:
                history[-1] = (version, value)
        elif last_value is not None or value is not None:
            if isinstance(history, list):
                history.append((version, value))
            elif len(history) < TUPLE_HISTORY_MAX:
                data[key] = history + ((version, value),)
            else:
                data[key] = [*history, (version, value)]
        else:
            return  # clearing a key that is already absent changes nothing
        if last_value is not None:
            if value is None:
                self._live.remove(key)
                self._deletions.append((version, key))
        elif value is not None:
            self._live.add(key)

    def _latest(self, key: bytes) -> bytes | None:
        history = self._data.get(key)
        return None if history is None else history[-1][1]

    def _arm(self, watches: list[PendingWatch]) -> None:
        # Called under the lock: no commit can slip between arming and the staleness check.
        for p in watches:
            current = self._latest(p.key)
            baseline = current if p.use_committed else p.seen
            if self.watches.arm(p.watch, baseline) and current != baseline:
                self.watches.settle(p.watch)

    def _arm_read_only(self, watches: list[PendingWatch]) -> None:
        if watches:
            with self._guard:
                self._arm(watches)

    def close(self) -> None:
        """Fail outstanding watches with 1101; the data stays readable by open transactions."""
        super().close()
