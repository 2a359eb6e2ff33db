"""The transaction of the embedded stores, written once: RYW buffer, selectors, conflicts, limits.

A :class:`BufferedTransaction` reads from a :class:`Snapshot` (the committed state at its read
version, supplied by the store) merged with its own buffered writes, records FoundationDB's
conflict ranges and mutations in issue order, and at commit hands a :class:`CommitRequest` to
its :class:`BufferedStore`, which checks the read conflict ranges against writes committed
after the read version, applies the mutations and arms the watches.
"""

from __future__ import annotations

import abc
import time
import weakref
from dataclasses import dataclass, field
from typing import Callable, Iterator

from sortedcontainers import SortedList  # type: ignore[import-untyped]

from smoosh.store.base import (
    KEY_SIZE_LIMIT_BYTES,
    MAX_WATCHES,
    TRANSACTION_MAX_AGE_S,
    TRANSACTION_SIZE_LIMIT_BYTES,
    VALUE_SIZE_LIMIT_BYTES,
    KeySelector,
    ReadView,
    Store,
    Transaction,
    Watch,
)
from smoosh.store.errors import (
    ACCESSED_UNREADABLE,
    CLIENT_INVALID_OPERATION,
    INVERTED_RANGE,
    KEY_OUTSIDE_LEGAL_RANGE,
    KEY_TOO_LARGE,
    TRANSACTION_CANCELLED,
    TRANSACTION_TOO_LARGE,
    TRANSACTION_TOO_OLD,
    VALUE_TOO_LARGE,
    StoreError,
)
from smoosh.store._mutations import (
    OP_ADD,
    OP_CLEAR,
    OP_CLEAR_RANGE,
    OP_SET,
    OP_VS_KEY,
    OP_VS_VALUE,
    STAMP_BYTES,
    Mutation,
    RangeSet,
    atomic_add,
    key_after,
    make_stamp,
    parse_stamp_operand,
    splice,
)
from smoosh.store._watches import StoreWatch, WatchRegistry

#: The end of the normal keyspace: keys must sort before it; reads are clamped to it.
KEYSPACE_END = b"\xff"
#: Extra seconds the conflict log and old versions are kept beyond the transaction age limit.
RETENTION_MARGIN_S = 1.0

_OPEN, _COMMITTED, _CANCELLED = range(3)


class Snapshot(abc.ABC):
    """The committed state at one read version, as a store exposes it to one transaction."""

    #: The store's commit version this snapshot shows.
    read_version: int
    #: Whether an abandoned transaction must give this snapshot back (an SQLite read
    #: transaction pins the WAL); a snapshot that holds nothing says False.
    needs_release: bool = True

    @abc.abstractmethod
    def get(self, key: bytes) -> bytes | None:
        """The committed value of ``key`` at the read version."""

    @abc.abstractmethod
    def scan(self, begin: bytes, end: bytes, reverse: bool, first_chunk: int = 0) -> Iterator[tuple[bytes, bytes]]:
        """Committed pairs in ``[begin, end)`` in key order (reversed if asked), fetched lazily.

        ``first_chunk`` (0: the store's usual chunk) is how many pairs the caller expects to
        need: a limited read of a few keys at the head of a long range (an accept's pick)
        then fetches a few, not a whole chunk, so its cost does not grow with the range.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Release the snapshot; idempotent."""

    def abandon(self) -> None:
        """Release the snapshot from a garbage-collection finalizer.

        A finalizer runs wherever the collector happens to run, possibly while this thread
        holds one of the store's locks: this must take none of them.
        """
        self.close()


@dataclass
class PendingWatch:
    """A watch waiting for its transaction's commit, with what its baseline will be."""

    watch: StoreWatch
    key: bytes
    #: The value the transaction saw at its read version (used when it did not write the key).
    seen: bytes | None
    #: The transaction wrote the key: the baseline is the committed value after its commit.
    use_committed: bool = False


@dataclass
class CommitRequest:
    """What a store needs to commit one transaction."""

    read_version: int | None
    read_ranges: RangeSet
    mutations: list[Mutation]
    watches: list[PendingWatch] = field(default_factory=list)


class _Entry:
    """The transaction's own view of one key it wrote."""

    __slots__ = ("known", "value", "adds", "unreadable")

    def __init__(self, value: bytes | None = None, *, known: bool = True, unreadable: bool = False) -> None:
        self.known = known  # False: ``adds`` apply on top of the snapshot value
        self.value = value
        self.adds: list[bytes] = []
        self.unreadable = unreadable  # a versionstamped value: unknown until commit


class _Resources:
    """What an abandoned transaction must give back; referenced by its finalizer, never the reverse."""

    __slots__ = ("snapshot", "watches", "registry")

    def __init__(self, registry: WatchRegistry) -> None:
        self.snapshot: Snapshot | None = None
        self.watches: list[PendingWatch] = []
        self.registry = registry

    def release(self, watch_error: int | None = TRANSACTION_CANCELLED) -> None:
        snap, self.snapshot = self.snapshot, None
        if snap is not None:
            snap.close()
        if watch_error is not None:
            self.registry.fail([p.watch for p in self.watches], watch_error)
        self.watches.clear()

    def abandon(self) -> None:
        """The finalizer of a transaction dropped without commit or cancel."""
        snap, self.snapshot = self.snapshot, None
        if snap is not None:
            snap.abandon()
        # Only unarmed watches are listed here; settling them takes the registry's RLock,
        # which is safe even if this thread is inside the registry already.
        self.registry.fail([p.watch for p in self.watches], TRANSACTION_CANCELLED)
        self.watches.clear()


class BufferedStore(Store):
    """Base of the embedded stores: limits, clock and watch registry; subclasses store the data."""

    #: A local commit: it commits, or it reports an error and did not commit.
    commit_outcome_may_be_unknown = False

    def __init__(
        self,
        url: str,
        *,
        max_age_s: float | None = TRANSACTION_MAX_AGE_S,
        size_limit_bytes: int = TRANSACTION_SIZE_LIMIT_BYTES,
        max_watches: int = MAX_WATCHES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        #: Seconds a transaction may read / commit after its read version (None: no limit).
        self.max_age_s = max_age_s
        self.size_limit_bytes = size_limit_bytes
        self.clock = clock
        self.watches = WatchRegistry(max_watches)
        self.closed = False

    @property
    def retention_s(self) -> float:
        """How long committed write ranges and old versions are kept for conflict checks."""
        return max(self.max_age_s or 0.0, TRANSACTION_MAX_AGE_S) + RETENTION_MARGIN_S

    def create_transaction(self) -> BufferedTransaction:
        """A new transaction; its read version is taken at its first read."""
        if self.closed:
            raise StoreError(CLIENT_INVALID_OPERATION, "store is closed")
        return BufferedTransaction(self)

    @abc.abstractmethod
    def _open_snapshot(self) -> Snapshot:
        """A snapshot at the current committed version."""

    @abc.abstractmethod
    def _commit(self, req: CommitRequest) -> bytes:
        """Check, apply and arm; returns the 10-byte versionstamp. Raises StoreError (1020, 1007...)."""

    @abc.abstractmethod
    def _arm_read_only(self, watches: list[PendingWatch]) -> None:
        """Arm the watches of a transaction that wrote nothing, firing any already stale."""

    def close(self) -> None:
        """Fail the outstanding watches with 1101; subclasses release their resources too."""
        self.closed = True
        self.watches.close()


class _SnapshotView(ReadView):
    """``tr.snapshot``: the same reads, adding no read conflict ranges."""

    def __init__(self, tr: BufferedTransaction) -> None:
        self._tr = tr

    def get(self, key: bytes) -> bytes | None:
        return self._tr._get(key, snapshot=True)

    def get_key(self, selector: KeySelector) -> bytes:
        return self._tr._get_key(selector, snapshot=True)

    def get_range(
        self, begin: bytes | KeySelector, end: bytes | KeySelector, limit: int = 0, reverse: bool = False
    ) -> list[tuple[bytes, bytes]]:
        return self._tr._get_range(begin, end, limit, reverse, snapshot=True)


class BufferedTransaction(Transaction):
    """A FoundationDB-style transaction over a :class:`BufferedStore` (see the module docstring)."""

    def __init__(self, store: BufferedStore) -> None:
        self._store = store
        self._res = _Resources(store.watches)
        # An abandoned transaction must still give back its snapshot (an SQLite read
        # transaction pins the WAL) and fail its uncommitted watches with 1025, as FDB does.
        # The finalizer is made when the transaction first holds such a thing: most hold
        # neither (a memory snapshot), and one finalizer per transaction cost ~4% of a
        # key's examination.
        self._finalizer: weakref.finalize | None = None
        self.snapshot = _SnapshotView(self)
        self._clear_state()

    def _clear_state(self) -> None:
        self._state = _OPEN
        self._snap_time = 0.0
        # Our writes by key. Most transactions write a handful of keys and never scan them,
        # so the sorted index the range reads need is built at the first such read and kept
        # up to date from then on (a SortedDict per transaction cost ~16 us: a fifth of a
        # point read).
        self._writes: dict[bytes, _Entry] = {}
        self._order: SortedList | None = None
        self._cleared = RangeSet()
        self._unreadable = RangeSet()
        self._mutations: list[Mutation] = []
        self._read_ranges = RangeSet()
        self._mutation_bytes = 0
        self._write_range_bytes = 0
        self._stamp: bytes | None = None

    # -- state and limits -------------------------------------------------------------
    def _check_open(self) -> None:
        if self._state == _OPEN:
            return
        if self._state == _CANCELLED:
            raise StoreError(TRANSACTION_CANCELLED)
        raise StoreError(CLIENT_INVALID_OPERATION, "transaction already committed; reset() it to reuse it")

    def _snapshot(self) -> Snapshot:
        snap = self._res.snapshot
        if snap is None:
            snap = self._res.snapshot = self._store._open_snapshot()
            self._snap_time = self._store.clock()
            if snap.needs_release:
                self._hold_resources()
        else:
            self._check_age()
        return snap

    def _hold_resources(self) -> None:
        if self._finalizer is None:
            self._finalizer = weakref.finalize(self, self._res.abandon)

    def _check_age(self) -> None:
        max_age_s = self._store.max_age_s
        if max_age_s is not None and self._store.clock() - self._snap_time > max_age_s:
            raise StoreError(TRANSACTION_TOO_OLD)

    @staticmethod
    def _check_key(key: bytes) -> None:
        if not isinstance(key, bytes):
            raise TypeError(f"keys are bytes, not {type(key).__name__}")
        if len(key) > KEY_SIZE_LIMIT_BYTES:
            raise StoreError(KEY_TOO_LARGE)
        if key >= KEYSPACE_END:
            raise StoreError(KEY_OUTSIDE_LEGAL_RANGE)

    @staticmethod
    def _check_value(value: bytes) -> None:
        if not isinstance(value, bytes):
            raise TypeError(f"values are bytes, not {type(value).__name__}")
        if len(value) > VALUE_SIZE_LIMIT_BYTES:
            raise StoreError(VALUE_TOO_LARGE)

    def _size_bytes(self) -> int:
        # FoundationDB's "affected data": mutations (keys and values), their write conflict
        # ranges (keys only) and the read conflict ranges; values read do not count.
        return self._mutation_bytes + self._write_range_bytes + self._read_ranges.size_bytes()

    def _add_read_range(self, begin: bytes, end: bytes) -> None:
        if begin < end:
            self._snapshot()  # a conflict range is checked against the read version
            self._read_ranges.add(begin, end)

    # -- reads ------------------------------------------------------------------------
    def _get(self, key: bytes, snapshot: bool) -> bytes | None:
        self._check_open()
        if self._unreadable.contains(key):
            raise StoreError(ACCESSED_UNREADABLE)
        entry = self._writes.get(key)
        if entry is not None:
            if entry.unreadable:
                raise StoreError(ACCESSED_UNREADABLE)
            if entry.known:
                return entry.value  # fully decided by our own writes: no read conflict
            value = self._snapshot().get(key)
            for param in entry.adds:
                value = atomic_add(value, param)
        elif self._cleared.contains(key):
            return None
        else:
            value = self._snapshot().get(key)
        if not snapshot:
            self._add_read_range(key, key_after(key))
        return value

    def _merged(self, begin: bytes, end: bytes, reverse: bool, first_chunk: int = 0) -> Iterator[tuple[bytes, bytes]]:
        """Pairs in ``[begin, end)``: the snapshot overlaid with our writes and clears."""
        if begin >= end:
            return
        barrier = None  # a versionstamped key may land here: scanning past it is unreadable
        unreadable = self._unreadable.overlapping(begin, end)
        if unreadable:
            barrier = unreadable[-1][1] if reverse else unreadable[0][0]
        base = self._snapshot().scan(begin, end, reverse, first_chunk)
        local = iter(self._written_in(begin, end, reverse))
        nb = next(base, None)
        nl = next(local, None)
        value: bytes | None
        while nb is not None or nl is not None:
            if nl is None or (nb is not None and ((nb[0] > nl) if reverse else (nb[0] < nl))):
                assert nb is not None  # for mypy: the loop's condition says so
                key, value = nb
                nb = next(base, None)
                if self._cleared.contains(key):
                    continue
            else:
                key = nl
                nl = next(local, None)
                base_value = None
                if nb is not None and nb[0] == key:
                    base_value = nb[1]
                    nb = next(base, None)
                entry = self._writes[key]
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

    def _resolve(self, sel: KeySelector) -> bytes:
        """The key ``sel`` names in our merged view (``b""`` / ``b"\\xff"`` off either end)."""
        pivot = key_after(sel.key) if sel.or_equal else sel.key
        if sel.offset >= 1:
            n = sel.offset
            for key, _ in self._merged(pivot, KEYSPACE_END, False, sel.offset):
                n -= 1
                if n == 0:
                    return key
            return KEYSPACE_END
        n = 1 - sel.offset
        for key, _ in self._merged(b"", min(pivot, KEYSPACE_END), True, 1 - sel.offset):
            n -= 1
            if n == 0:
                return key
        return b""

    def _get_key(self, sel: KeySelector, snapshot: bool) -> bytes:
        self._check_open()
        key = self._resolve(sel)
        if not snapshot:
            # Every key between the selector's anchor and the answer decided the answer.
            lo, hi = min(sel.key, key), max(sel.key, key)
            self._add_read_range(lo, min(key_after(hi), KEYSPACE_END))
        return key

    def _get_range(
        self,
        begin: bytes | KeySelector,
        end: bytes | KeySelector,
        limit: int,
        reverse: bool,
        snapshot: bool,
    ) -> list[tuple[bytes, bytes]]:
        self._check_open()
        if limit < 0:
            raise ValueError("limit must be >= 0 (0 means no limit)")
        rb = self._get_key(begin, snapshot) if isinstance(begin, KeySelector) else begin
        re = self._get_key(end, snapshot) if isinstance(end, KeySelector) else end
        re = min(re, KEYSPACE_END)
        if rb >= re:
            return []
        out: list[tuple[bytes, bytes]] = []
        for pair in self._merged(rb, re, reverse, limit):
            out.append(pair)
            if limit and len(out) >= limit:
                break
        if not snapshot:
            # The range actually scanned: a limited read did not look past its last key.
            if limit and len(out) >= limit:
                if reverse:
                    rb = out[-1][0]
                else:
                    re = key_after(out[-1][0])
            self._add_read_range(rb, re)
        return out

    def get(self, key: bytes) -> bytes | None:
        """See :meth:`ReadView.get`; adds a read conflict on ``key``."""
        return self._get(key, snapshot=False)

    def get_key(self, selector: KeySelector) -> bytes:
        """See :meth:`ReadView.get_key`."""
        return self._get_key(selector, snapshot=False)

    def get_range(
        self, begin: bytes | KeySelector, end: bytes | KeySelector, limit: int = 0, reverse: bool = False
    ) -> list[tuple[bytes, bytes]]:
        """See :meth:`ReadView.get_range`; adds the scanned range as a read conflict."""
        return self._get_range(begin, end, limit, reverse, snapshot=False)

    # -- writes -----------------------------------------------------------------------
    def _record(self, mutation: Mutation, size_bytes: int) -> None:
        self._mutations.append(mutation)
        self._mutation_bytes += size_bytes
        kind, key, end = mutation[0], mutation[1], mutation[2]
        # A point write's conflict range is [key, key + b"\x00"); a clear_range's is itself.
        self._write_range_bytes += len(key) + len(end) if kind == OP_CLEAR_RANGE else 2 * len(key) + 1

    def _written_in(self, begin: bytes, end: bytes, reverse: bool) -> list[bytes]:
        """Keys we wrote in ``[begin, end)``, in order (a copy: callers may change the writes)."""
        order = self._order
        if order is None:
            if not self._writes:
                return []
            order = self._order = SortedList(self._writes)
        return list(order.irange(begin, end, inclusive=(True, False), reverse=reverse))

    def _put(self, key: bytes, entry: _Entry) -> _Entry:
        if self._order is not None and key not in self._writes:
            self._order.add(key)
        self._writes[key] = entry
        return entry

    def set(self, key: bytes, value: bytes) -> None:
        """See :meth:`Transaction.set`."""
        self._check_open()
        self._check_key(key)
        self._check_value(value)
        self._put(key, _Entry(value))
        self._record((OP_SET, key, value, 0), len(key) + len(value))

    def clear(self, key: bytes) -> None:
        """See :meth:`Transaction.clear`."""
        self._check_open()
        self._check_key(key)
        self._put(key, _Entry(None))
        self._record((OP_CLEAR, key, b"", 0), len(key))

    def clear_range(self, begin: bytes, end: bytes) -> None:
        """See :meth:`Transaction.clear_range`; 2005 if ``begin > end``."""
        self._check_open()
        if begin > end:
            raise StoreError(INVERTED_RANGE)
        if end > KEYSPACE_END:
            raise StoreError(KEY_OUTSIDE_LEGAL_RANGE)
        if begin == end:
            return
        for key in self._written_in(begin, end, False):
            del self._writes[key]
            assert self._order is not None
            self._order.remove(key)
        self._cleared.add(begin, end)
        self._record((OP_CLEAR_RANGE, begin, end, 0), len(begin) + len(end))

    def add(self, key: bytes, param: bytes) -> None:
        """See :meth:`Transaction.add`."""
        self._check_open()
        self._check_key(key)
        self._check_value(param)
        entry = self._writes.get(key)
        if entry is None:
            if self._cleared.contains(key):
                self._put(key, _Entry(atomic_add(None, param)))
            else:
                entry = self._put(key, _Entry(known=False))
                entry.adds.append(param)
        elif entry.known:
            entry.value = atomic_add(entry.value, param)
        elif not entry.unreadable:
            entry.adds.append(param)
        self._record((OP_ADD, key, param, 0), len(key) + len(param))

    def set_versionstamped_key(self, key: bytes, value: bytes) -> None:
        """See :meth:`Transaction.set_versionstamped_key`; 2000 for a bad offset trailer."""
        self._check_open()
        body, offset = parse_stamp_operand(key, "key")
        self._check_key(splice(body, offset, b"\x00" * STAMP_BYTES))
        self._check_value(value)
        # As FDB's RYW layer: the keys this write may land on (any stamp after our read
        # version) cannot be read back by this transaction.
        snap = self._res.snapshot
        low_stamp = make_stamp(snap.read_version if snap is not None else 0, 0)
        self._unreadable.add(splice(body, offset, low_stamp), key_after(splice(body, offset, b"\xff" * STAMP_BYTES)))
        self._record((OP_VS_KEY, body, value, offset), len(body) + len(value))

    def set_versionstamped_value(self, key: bytes, value: bytes) -> None:
        """See :meth:`Transaction.set_versionstamped_value`; 2000 for a bad offset trailer."""
        self._check_open()
        self._check_key(key)
        body, offset = parse_stamp_operand(value, "value")
        self._check_value(body)
        self._put(key, _Entry(known=False, unreadable=True))
        self._record((OP_VS_VALUE, key, body, offset), len(key) + len(body))

    def add_read_conflict_key(self, key: bytes) -> None:
        """See :meth:`Transaction.add_read_conflict_key`; a key we already wrote adds nothing."""
        self._check_open()
        entry = self._writes.get(key)
        if (entry is not None and entry.known) or self._cleared.contains(key):
            return
        self.add_read_conflict_range(key, key_after(key))

    def add_read_conflict_range(self, begin: bytes, end: bytes) -> None:
        """See :meth:`Transaction.add_read_conflict_range`."""
        self._check_open()
        if begin > end:
            raise StoreError(INVERTED_RANGE)
        self._add_read_range(begin, end)

    def watch(self, key: bytes) -> Watch:
        """See :meth:`Transaction.watch`; 1032 (raised by ``wait``) beyond the store's watch limit."""
        self._check_open()
        self._check_key(key)
        w = self._store.watches.create(key)
        if w.is_ready():
            return w  # failed with 1032
        seen = None
        if key not in self._writes and not self._cleared.contains(key):
            try:
                seen = self._snapshot().get(key)
            except BaseException:
                self._store.watches.settle(w, TRANSACTION_CANCELLED)
                raise
        self._res.watches.append(PendingWatch(w, key, seen))
        self._hold_resources()
        return w

    # -- commit -----------------------------------------------------------------------
    @property
    def has_writes(self) -> bool:
        """Whether the transaction holds any mutation."""
        return bool(self._mutations)

    def commit(self) -> None:
        """See :meth:`Transaction.commit`."""
        self._check_open()
        res = self._res
        for p in res.watches:
            # Our own write decides the baseline: the value we commit, known only after commit.
            p.use_committed = p.key in self._writes or self._cleared.contains(p.key)
        if not self._mutations:
            # Read-only: nothing to check (FDB never resolves read-only commits).
            self._store._arm_read_only(list(res.watches))
            res.release(watch_error=None)
            self._state = _COMMITTED
            return
        if self._size_bytes() > self._store.size_limit_bytes:
            raise StoreError(TRANSACTION_TOO_LARGE)
        snap = res.snapshot
        if snap is not None:
            self._check_age()
        req = CommitRequest(
            read_version=snap.read_version if snap is not None else None,
            read_ranges=self._read_ranges,
            mutations=self._mutations,
            watches=list(res.watches),
        )
        # The read snapshot is not needed to commit: give it back now rather than pin the WAL.
        res.release(watch_error=None)
        res.watches.extend(req.watches)
        try:
            self._stamp = self._store._commit(req)
        except StoreError as e:
            self._store.watches.fail([p.watch for p in req.watches], e.code)
            res.watches.clear()
            raise
        res.watches.clear()
        self._state = _COMMITTED

    def get_versionstamp(self) -> bytes:
        """See :meth:`Transaction.get_versionstamp`."""
        if self._stamp is None:
            raise StoreError(CLIENT_INVALID_OPERATION, "no versionstamp: the transaction has not committed a write")
        return self._stamp

    def reset(self) -> None:
        """See :meth:`Transaction.reset`."""
        self._res.release(TRANSACTION_CANCELLED)
        self._clear_state()

    def cancel(self) -> None:
        """See :meth:`Transaction.cancel`."""
        self._res.release(TRANSACTION_CANCELLED)
        if self._state == _OPEN:
            self._state = _CANCELLED
