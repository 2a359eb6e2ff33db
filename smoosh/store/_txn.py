"""The transaction of the embedded stores, written once, and the store base it runs on.

A :class:`BufferedTransaction` reads from a :class:`~smoosh.store._commit.Snapshot` (the
committed state at its read version, supplied by the store) through its own buffered writes
(:mod:`smoosh.store._ryw`), records FoundationDB's conflict ranges and mutations in issue
order, and at commit hands a :class:`~smoosh.store._commit.CommitRequest` to its
:class:`BufferedStore`, which checks the read conflict ranges against writes committed after
the read version, applies the mutations and arms the watches. This module owns the
transaction's life (open, committed, cancelled, reset), FoundationDB's limits, the conflict
ranges of reads and key selectors, the mutation log, and the base class of the stores.
"""

from __future__ import annotations

import abc
import time
import weakref
from typing import Callable

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
from smoosh.store._commit import CommitRequest, Held, PendingWatch, Snapshot
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
    key_after,
    make_stamp,
    parse_stamp_operand,
    splice,
)
from smoosh.store._ryw import KEYSPACE_END, WriteBuffer
from smoosh.store._watches import WatchRegistry

#: Extra seconds the conflict log and old versions are kept beyond the transaction age limit.
RETENTION_MARGIN_S = 1.0

_OPEN, _COMMITTED, _CANCELLED = range(3)


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
        self._held = Held(store.watches)
        # An abandoned transaction must still give back its snapshot (an SQLite read
        # transaction pins the WAL) and fail its uncommitted watches with 1025, as FDB does.
        # The finalizer is made when the transaction first holds such a thing: most hold
        # neither (a memory snapshot), and a finalizer for every transaction was a visible
        # part of the cost of examining a key.
        self._finalizer: weakref.finalize | None = None
        self.snapshot = _SnapshotView(self)
        self._clear_state()

    def _clear_state(self) -> None:
        self._state = _OPEN
        self._snap_time = 0.0
        self._buf = WriteBuffer()
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
        snap = self._held.snapshot
        if snap is None:
            snap = self._held.snapshot = self._store._open_snapshot()
            self._snap_time = self._store.clock()
            if snap.needs_release:
                self._hold_resources()
        else:
            self._check_age()
        return snap

    def _hold_resources(self) -> None:
        if self._finalizer is None:
            self._finalizer = weakref.finalize(self, self._held.abandon)

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
        value, read_committed = self._buf.read(key, self._snapshot)
        if read_committed and not snapshot:
            self._add_read_range(key, key_after(key))
        return value

    def _get_key(self, sel: KeySelector, snapshot: bool) -> bytes:
        self._check_open()
        key = self._buf.resolve(self._snapshot, sel)
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
        for pair in self._buf.merged(self._snapshot, rb, re, reverse, limit):
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

    def set(self, key: bytes, value: bytes) -> None:
        """See :meth:`Transaction.set`."""
        self._check_open()
        self._check_key(key)
        self._check_value(value)
        self._buf.set(key, value)
        self._record((OP_SET, key, value, 0), len(key) + len(value))

    def clear(self, key: bytes) -> None:
        """See :meth:`Transaction.clear`."""
        self._check_open()
        self._check_key(key)
        self._buf.clear(key)
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
        self._buf.clear_range(begin, end)
        self._record((OP_CLEAR_RANGE, begin, end, 0), len(begin) + len(end))

    def add(self, key: bytes, param: bytes) -> None:
        """See :meth:`Transaction.add`."""
        self._check_open()
        self._check_key(key)
        self._check_value(param)
        self._buf.add(key, param)
        self._record((OP_ADD, key, param, 0), len(key) + len(param))

    def set_versionstamped_key(self, key: bytes, value: bytes) -> None:
        """See :meth:`Transaction.set_versionstamped_key`; 2000 for a bad offset trailer."""
        self._check_open()
        body, offset = parse_stamp_operand(key, "key")
        self._check_key(splice(body, offset, b"\x00" * STAMP_BYTES))
        self._check_value(value)
        # As FDB's RYW layer: the keys this write may land on (any stamp after our read
        # version) cannot be read back by this transaction.
        snap = self._held.snapshot
        low_stamp = make_stamp(snap.read_version if snap is not None else 0, 0)
        self._buf.set_unreadable_range(
            splice(body, offset, low_stamp), key_after(splice(body, offset, b"\xff" * STAMP_BYTES))
        )
        self._record((OP_VS_KEY, body, value, offset), len(body) + len(value))

    def set_versionstamped_value(self, key: bytes, value: bytes) -> None:
        """See :meth:`Transaction.set_versionstamped_value`; 2000 for a bad offset trailer."""
        self._check_open()
        self._check_key(key)
        body, offset = parse_stamp_operand(value, "value")
        self._check_value(body)
        self._buf.set_unreadable_value(key)
        self._record((OP_VS_VALUE, key, body, offset), len(key) + len(body))

    def add_read_conflict_key(self, key: bytes) -> None:
        """See :meth:`Transaction.add_read_conflict_key`; a key we already wrote adds nothing."""
        self._check_open()
        if self._buf.decides(key):
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
        if not self._buf.wrote(key):
            try:
                seen = self._snapshot().get(key)
            except BaseException:
                self._store.watches.settle(w, TRANSACTION_CANCELLED)
                raise
        self._held.watches.append(PendingWatch(w, key, seen))
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
        held = self._held
        for p in held.watches:
            # Our own write decides the baseline: the value we commit, known only after commit.
            p.use_committed = self._buf.wrote(p.key)
        if not self._mutations:
            # Read-only: nothing to check (FDB never resolves read-only commits).
            self._store._arm_read_only(list(held.watches))
            held.release(watch_error=None)
            self._state = _COMMITTED
            return
        if self._size_bytes() > self._store.size_limit_bytes:
            raise StoreError(TRANSACTION_TOO_LARGE)
        snap = held.snapshot
        if snap is not None:
            self._check_age()
        req = CommitRequest(
            read_version=snap.read_version if snap is not None else None,
            read_ranges=self._read_ranges,
            mutations=self._mutations,
            watches=list(held.watches),
        )
        # The read snapshot is not needed to commit: give it back now rather than pin the WAL.
        held.release(watch_error=None)
        held.watches.extend(req.watches)
        try:
            self._stamp = self._store._commit(req)
        except StoreError as e:
            self._store.watches.fail([p.watch for p in req.watches], e.code)
            held.watches.clear()
            raise
        held.watches.clear()
        self._state = _COMMITTED

    def get_versionstamp(self) -> bytes:
        """See :meth:`Transaction.get_versionstamp`."""
        if self._stamp is None:
            raise StoreError(CLIENT_INVALID_OPERATION, "no versionstamp: the transaction has not committed a write")
        return self._stamp

    def reset(self) -> None:
        """See :meth:`Transaction.reset`."""
        self._held.release(TRANSACTION_CANCELLED)
        self._clear_state()

    def cancel(self) -> None:
        """See :meth:`Transaction.cancel`."""
        self._held.release(TRANSACTION_CANCELLED)
        if self._state == _OPEN:
            self._state = _CANCELLED
