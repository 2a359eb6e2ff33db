"""The transaction of the embedded stores, written once, and the store base it runs on.

A :class:`BufferedTransaction` reads from a :class:`~smoosh.store._commit.Snapshot` (the
committed state at its read version, supplied by the store) through its own buffered writes
(:mod:`smoosh.store._ryw`), records FoundationDB's conflict ranges and mutations in issue
order, and at commit hands a :class:`~smoosh.store._commit.CommitRequest` to its
:class:`BufferedStore`, which checks the read conflict ranges against writes committed after
the read version, applies the mutations and arms the watches. This module owns the
transaction's life (open, committed, cancelled, reset), FoundationDB's limits, the conflict
ranges of reads and key selectors, the mutation log, and the base class of the stores.

Errors surface where FoundationDB's client raises them (the rule is in
:mod:`smoosh.store.base`): a write's error is deferred to the next read and the commit, as
the client library's ``ThreadSafeTransaction`` does with every void call, and a cancelled
transaction (by ``cancel`` or a failed ``on_error``) answers 1025 until it is reset.
"""

from __future__ import annotations

import abc
import time
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
    TRAILER_BYTES,
    ConflictSet,
    Mutation,
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
#: What a read, a watch or the commit of a committed transaction raises (2000), and a write defers.
ALREADY_COMMITTED = "transaction already committed; reset() it to reuse it"


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

    __slots__ = ("_tr",)

    def __init__(self, tr: BufferedTransaction) -> None:
        self._tr = tr

    def get(self, key: bytes) -> bytes | None:
        tr = self._tr
        if tr._blocked or tr._wide or key in tr._written:
            return tr._get_slow(key, snapshot=True)
        return tr._snapshot().get(key)

    def get_key(self, selector: KeySelector) -> bytes:
        return self._tr._get_key(selector, snapshot=True)

    def get_range(
        self, begin: bytes | KeySelector, end: bytes | KeySelector, limit: int = 0, reverse: bool = False
    ) -> list[tuple[bytes, bytes]]:
        return self._tr._get_range(begin, end, limit, reverse, snapshot=True)


class BufferedTransaction(Transaction):
    """A FoundationDB-style transaction over a :class:`BufferedStore` (see the module docstring).

    Written for the common case, a few point reads then a few writes: a write is validated
    and appended to the mutation log, nothing more; the read-your-writes buffer is folded
    from that log only when a read comes after a write (:meth:`_fold`); a point read's
    conflict range is one entry in a set.
    """

    uses_timeout = False

    def __init__(self, store: BufferedStore) -> None:
        self._store = store
        self._held = Held(store.watches)
        self._clear_state()

    #: Whether the transaction has held a snapshot that must be given back or a watch
    #: (see :meth:`__del__`); a class default, so a half-built transaction has it too.
    _holds = False

    def __del__(self) -> None:
        # An abandoned transaction must still give back its snapshot (an SQLite read
        # transaction pins the WAL) and fail its uncommitted watches with 1025, as FDB does.
        # A transaction is in no reference cycle of its own (see ``snapshot``), so this runs
        # as soon as its last reference goes, and the cyclic collector runs it for one a
        # caller put in a cycle; it runs where the collector runs, hence Held.abandon takes
        # none of the store's locks. A weakref.finalize per transaction did the same for
        # several times the cost. Unlike that finalizer it is not run at interpreter exit
        # for a transaction still referenced then: nothing is lost, a read connection holds
        # no write, the process's exit releases its WAL read lock, and no thread is left to
        # wait on a watch of that process.
        if self._holds:
            held = self._held
            if held.snapshot is not None or held.watches:  # a commit gave both back already
                held.abandon()

    @property
    def snapshot(self) -> ReadView:  # type: ignore[override]
        """See :attr:`Transaction.snapshot`."""
        # Made on each use rather than kept: a view kept on the transaction would make the
        # two a reference cycle, so every transaction would outlive its last use until the
        # cyclic collector found it (that collector's passes were a visible share of a
        # transaction's cost).
        return _SnapshotView(self)

    def _clear_state(self) -> None:
        self._state = _OPEN
        #: Whether reads must stop at a deferred error or the transaction's state (not open).
        self._blocked = False
        self._snap_time = 0.0
        #: The read-your-writes view of ``_mutations[:_folded]`` (None until a read needs it).
        self._buf: WriteBuffer | None = None
        self._folded = 0
        self._mutations: list[Mutation] = []
        #: Keys of the point writes made so far (set, clear, add, versionstamped value), and
        #: whether a write of wider reach was made (a range clear, a versionstamped key): a
        #: read of a key outside both needs no read-your-writes buffer at all.
        self._written: set[bytes] = set()
        self._wide = False
        #: Where a versionstamped key may land, each fixed when its write was made: (body,
        #: stamp offset, read version then); :meth:`_fold` makes them ranges, if a read needs them.
        self._unreadable: list[tuple[bytes, int, int]] = []
        self._reads = ConflictSet()
        #: Bytes the mutations add to the transaction's size (with their write conflict ranges).
        self._mutation_bytes = 0
        self._stamp: bytes | None = None
        #: The first error a write deferred: (code, message or None for the code's own).
        self._deferred: tuple[int, str | None] | None = None

    # -- state and limits -------------------------------------------------------------
    def _check_open(self) -> None:
        """What a read, a watch or the commit meets first: a deferred error, then the state."""
        if not self._blocked:
            return
        code, message = self._blocker()
        raise StoreError(code, message)

    def _blocker(self) -> tuple[int, str | None]:
        # The client library checks the deferred error before the transaction's own state.
        if self._deferred is not None:
            return self._deferred
        if self._state == _CANCELLED:
            return TRANSACTION_CANCELLED, None
        return CLIENT_INVALID_OPERATION, ALREADY_COMMITTED

    def _defer(self, code: int, message: str | None = None) -> None:
        # FoundationDB keeps the first error and skips every later write of the attempt.
        if self._deferred is None:
            self._deferred = (code, message)
            self._blocked = True

    def _refuse_write(self) -> None:
        """A write on a transaction that takes none: ignored (cancelled, or an error already
        deferred), or deferred as the misuse it is (committed)."""
        if self._state == _COMMITTED:
            self._defer(CLIENT_INVALID_OPERATION, ALREADY_COMMITTED)

    @property
    def deferred_error(self) -> StoreError | None:
        """See :attr:`Transaction.deferred_error`."""
        return None if self._deferred is None else StoreError(*self._deferred)

    def _snapshot(self) -> Snapshot:
        snap = self._held.snapshot
        if snap is None:
            snap = self._held.snapshot = self._store._open_snapshot()
            self._snap_time = self._store.clock()
            if snap.needs_release:
                self._hold_resources()
            return snap
        max_age_s = self._store.max_age_s
        if max_age_s is not None and self._store.clock() - self._snap_time > max_age_s:
            raise StoreError(TRANSACTION_TOO_OLD)
        return snap

    def _hold_resources(self) -> None:
        self._holds = True

    @staticmethod
    def _key_error(key: bytes) -> int:
        """The code a write of ``key`` defers (0: none). Raises TypeError at once, as the binding does."""
        if not isinstance(key, bytes):
            raise TypeError(f"keys are bytes, not {type(key).__name__}")
        # FoundationDB checks the legal range before the length.
        if key >= KEYSPACE_END:
            return KEY_OUTSIDE_LEGAL_RANGE
        if len(key) > KEY_SIZE_LIMIT_BYTES:
            return KEY_TOO_LARGE
        return 0

    @staticmethod
    def _value_error(value: bytes) -> int:
        """The code a write of ``value`` defers (0: none). Raises TypeError at once."""
        if not isinstance(value, bytes):
            raise TypeError(f"values are bytes, not {type(value).__name__}")
        if len(value) > VALUE_SIZE_LIMIT_BYTES:
            return VALUE_TOO_LARGE
        return 0

    def _size_bytes(self) -> int:
        # FoundationDB's "affected data": mutations (keys and values), their write conflict
        # ranges (keys only) and the read conflict ranges; values read do not count.
        return self._mutation_bytes + self._reads.size_bytes()

    def _add_read_range(self, begin: bytes, end: bytes) -> None:
        if begin < end:
            self._snapshot()  # a conflict range is checked against the read version
            self._reads.add(begin, end)

    def _fold(self) -> WriteBuffer:
        """The read-your-writes buffer, brought up to date with every write made so far."""
        buf = self._buf
        if buf is None:
            buf = self._buf = WriteBuffer()
        mutations = self._mutations
        if self._folded < len(mutations):
            for kind, key, value, _ in mutations[self._folded :]:
                if kind == OP_SET:
                    buf.set(key, value)
                elif kind == OP_CLEAR:
                    buf.clear(key)
                elif kind == OP_CLEAR_RANGE:
                    buf.clear_range(key, value)
                elif kind == OP_ADD:
                    buf.add(key, value)
                elif kind == OP_VS_VALUE:
                    buf.set_unreadable_value(key)
            self._folded = len(mutations)
        if self._unreadable:
            for body, offset, read_version in self._unreadable:
                # As FDB's RYW layer: the keys this write may land on (any stamp after the
                # read version as it was at the write) cannot be read back by this transaction.
                low = splice(body, offset, make_stamp(read_version, 0))
                buf.set_unreadable_range(low, key_after(splice(body, offset, b"\xff" * STAMP_BYTES)))
            self._unreadable.clear()
        return buf

    # -- reads ------------------------------------------------------------------------
    def _get_slow(self, key: bytes, snapshot: bool) -> bytes | None:
        self._check_open()
        value, read_committed = self._fold().read(key, self._snapshot)
        if read_committed and not snapshot:
            self._add_read_range(key, key_after(key))
        return value

    def _get_key(self, sel: KeySelector, snapshot: bool) -> bytes:
        self._check_open()
        key = self._fold().resolve(self._snapshot, sel)
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
        if self._blocked:
            self._check_open()
        if limit < 0:
            raise ValueError("limit must be >= 0 (0 means no limit)")
        rb = self._get_key(begin, snapshot) if isinstance(begin, KeySelector) else begin
        re = self._get_key(end, snapshot) if isinstance(end, KeySelector) else end
        if re > KEYSPACE_END:
            re = KEYSPACE_END
        if rb >= re:
            return []
        out: list[tuple[bytes, bytes]]
        if self._mutations or self._buf is not None or self._unreadable:
            out = []
            for pair in self._fold().merged(self._snapshot, rb, re, reverse, limit):
                out.append(pair)
                if limit and len(out) >= limit:
                    break
        else:
            # Nothing written: the snapshot's own pairs, without the merge.
            out = self._snapshot().read_range(rb, re, reverse, limit)
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
        if self._blocked or self._wide or key in self._written:
            return self._get_slow(key, snapshot=False)
        value = self._snapshot().get(key)
        self._reads.points.add(key)
        return value

    def get_key(self, selector: KeySelector) -> bytes:
        """See :meth:`ReadView.get_key`."""
        return self._get_key(selector, snapshot=False)

    def get_range(
        self, begin: bytes | KeySelector, end: bytes | KeySelector, limit: int = 0, reverse: bool = False
    ) -> list[tuple[bytes, bytes]]:
        """See :meth:`ReadView.get_range`; adds the scanned range as a read conflict."""
        return self._get_range(begin, end, limit, reverse, snapshot=False)

    # -- writes -----------------------------------------------------------------------
    def set(self, key: bytes, value: bytes) -> None:
        """See :meth:`Transaction.set`; its errors are deferred."""
        if key.__class__ is not bytes or value.__class__ is not bytes or len(key) > KEY_SIZE_LIMIT_BYTES \
                or key >= KEYSPACE_END or len(value) > VALUE_SIZE_LIMIT_BYTES:
            error = self._key_error(key) or self._value_error(value)
        else:
            error = 0
        if self._blocked:
            return self._refuse_write()
        if error:
            return self._defer(error)
        self._mutations.append((OP_SET, key, value, 0))
        self._written.add(key)
        self._mutation_bytes += 3 * len(key) + 1 + len(value)

    def clear(self, key: bytes) -> None:
        """See :meth:`Transaction.clear`; its errors are deferred."""
        error = self._key_error(key)
        if self._blocked:
            return self._refuse_write()
        if error == KEY_TOO_LARGE:
            return  # no key is that long: nothing to clear (FoundationDB's client skips it too)
        if error:
            return self._defer(error)
        self._mutations.append((OP_CLEAR, key, b"", 0))
        self._written.add(key)
        self._mutation_bytes += 3 * len(key) + 1

    def clear_range(self, begin: bytes, end: bytes) -> None:
        """See :meth:`Transaction.clear_range`; 2005 (deferred) if ``begin > end``."""
        if self._blocked:
            return self._refuse_write()
        if begin > end:
            return self._defer(INVERTED_RANGE)
        if end > KEYSPACE_END:
            return self._defer(KEY_OUTSIDE_LEGAL_RANGE)
        if begin == end:
            return
        self._mutations.append((OP_CLEAR_RANGE, begin, end, 0))
        self._wide = True
        self._mutation_bytes += 2 * (len(begin) + len(end))

    def add(self, key: bytes, param: bytes) -> None:
        """See :meth:`Transaction.add`; its errors are deferred."""
        error = self._key_error(key) or self._value_error(param)
        if self._blocked:
            return self._refuse_write()
        if error:
            return self._defer(error)
        self._mutations.append((OP_ADD, key, param, 0))
        self._written.add(key)
        self._mutation_bytes += 3 * len(key) + 1 + len(param)

    def set_versionstamped_key(self, key: bytes, value: bytes) -> None:
        """See :meth:`Transaction.set_versionstamped_key`; 2000 (deferred) for a bad offset trailer."""
        # Every accept and update makes one: the usual well-formed operand (the stamp after
        # the key's first byte, so that byte alone decides the legal range) is taken here,
        # anything else by the checks below in their order.
        if key.__class__ is bytes and value.__class__ is bytes and not self._blocked \
                and STAMP_BYTES + TRAILER_BYTES < len(key) and len(value) <= VALUE_SIZE_LIMIT_BYTES:
            offset = int.from_bytes(key[-TRAILER_BYTES:], "little")
            body = key[:-TRAILER_BYTES]
            if 0 < offset and offset + STAMP_BYTES <= len(body) <= KEY_SIZE_LIMIT_BYTES and body < KEYSPACE_END:
                snap = self._held.snapshot
                self._unreadable.append((body, offset, snap.read_version if snap is not None else 0))
                self._mutations.append((OP_VS_KEY, body, value, offset))
                self._wide = True
                self._mutation_bytes += 3 * len(body) + 1 + len(value)
                return
        self._set_versionstamped_key_checked(key, value)

    def _set_versionstamped_key_checked(self, key: bytes, value: bytes) -> None:
        """``set_versionstamped_key`` with every check, in FoundationDB's order."""
        value_error = self._value_error(value)
        if self._blocked:
            return self._refuse_write()
        try:
            body, offset = parse_stamp_operand(key, "key")
        except StoreError as e:
            return self._defer(e.code, e.detail)
        error = self._key_error(splice(body, offset, b"\x00" * STAMP_BYTES)) or value_error
        if error:
            return self._defer(error)
        snap = self._held.snapshot
        self._unreadable.append((body, offset, snap.read_version if snap is not None else 0))
        self._mutations.append((OP_VS_KEY, body, value, offset))
        self._wide = True
        self._mutation_bytes += 3 * len(body) + 1 + len(value)

    def set_versionstamped_value(self, key: bytes, value: bytes) -> None:
        """See :meth:`Transaction.set_versionstamped_value`; 2000 (deferred) for a bad offset trailer."""
        # Every accept, update and finish makes two or three of these: the usual well-formed
        # operand is taken here, anything else by the checks below in their order.
        if key.__class__ is bytes and value.__class__ is bytes and not self._blocked and key < KEYSPACE_END \
                and len(key) <= KEY_SIZE_LIMIT_BYTES and STAMP_BYTES + TRAILER_BYTES <= len(value) <= VALUE_SIZE_LIMIT_BYTES:
            offset = int.from_bytes(value[-TRAILER_BYTES:], "little")
            body = value[:-TRAILER_BYTES]
            if offset + STAMP_BYTES <= len(body):
                self._mutations.append((OP_VS_VALUE, key, body, offset))
                self._written.add(key)
                self._mutation_bytes += 3 * len(key) + 1 + len(body)
                return
        self._set_versionstamped_value_checked(key, value)

    def _set_versionstamped_value_checked(self, key: bytes, value: bytes) -> None:
        """``set_versionstamped_value`` with every check, in FoundationDB's order."""
        key_error = self._key_error(key)
        if self._blocked:
            return self._refuse_write()
        if key_error:
            return self._defer(key_error)
        try:
            body, offset = parse_stamp_operand(value, "value")
        except StoreError as e:
            return self._defer(e.code, e.detail)
        error = self._value_error(body)
        if error:
            return self._defer(error)
        self._mutations.append((OP_VS_VALUE, key, body, offset))
        self._written.add(key)
        self._mutation_bytes += 3 * len(key) + 1 + len(body)

    def add_read_conflict_key(self, key: bytes) -> None:
        """See :meth:`Transaction.add_read_conflict_key`; a key we already wrote adds nothing."""
        if self._blocked:
            return
        if (self._wide or key in self._written) and self._fold().decides(key):
            return
        if self._held.snapshot is None:
            self.add_read_conflict_range(key, key_after(key))
        else:
            self._reads.points.add(key)

    def add_read_conflict_range(self, begin: bytes, end: bytes) -> None:
        """See :meth:`Transaction.add_read_conflict_range`; 2005 at the call if ``begin > end``."""
        if begin > end:
            raise StoreError(INVERTED_RANGE)  # the C API checks the range before deferring anything
        if self._blocked:
            return
        try:
            self._add_read_range(begin, end)
        except StoreError as e:  # taking the read version (1007, an SQLite error): a void call defers it
            self._defer(e.code, e.detail)

    def watch(self, key: bytes) -> Watch:
        """See :meth:`Transaction.watch`; its errors (1032 beyond the store's watch limit, a deferred
        error, 1025 once cancelled, 2004) are raised by the watch's ``wait``, as FoundationDB's are."""
        error = self._key_error(key)
        if self._blocked:
            code, _ = self._blocker()
            return self._failed_watch(key, code)
        if error:
            return self._failed_watch(key, error)
        w = self._store.watches.create(key)
        if w.is_ready():
            return w  # failed with 1032
        seen = None
        if not ((self._wide or key in self._written) and self._fold().wrote(key)):
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
        if self._blocked:
            self._check_open()
        held = self._held
        if held.watches:
            buf = self._fold() if self._mutations else None
            for p in held.watches:
                # Our own write decides the baseline: the value we commit, known only after commit.
                p.use_committed = buf is not None and buf.wrote(p.key)
        if not self._mutations:
            # Read-only: nothing to check (FDB never resolves read-only commits).
            self._store._arm_read_only(list(held.watches))
            held.release(watch_error=None)
            self._state = _COMMITTED
            self._blocked = True
            return
        reads = self._reads
        points = reads.points
        # _size_bytes(), written out for the usual transaction without a wide read range.
        size = self._size_bytes() if reads.ranges else self._mutation_bytes + 2 * sum(map(len, points)) + len(points)
        if size > self._store.size_limit_bytes:
            raise StoreError(TRANSACTION_TOO_LARGE)
        snap = held.snapshot
        watches = held.watches
        if snap is not None:
            store = self._store
            max_age_s = store.max_age_s
            if max_age_s is not None and store.clock() - self._snap_time > max_age_s:
                raise StoreError(TRANSACTION_TOO_OLD)
            # The read snapshot is not needed to commit: give it back now rather than pin the WAL.
            held.snapshot = None
            snap.close()
            req = CommitRequest(snap.read_version, reads, self._mutations, list(watches) if watches else None)
        else:
            req = CommitRequest(None, reads, self._mutations, list(watches) if watches else None)
        try:
            self._stamp = self._store._commit(req)
        except StoreError as e:
            if req.watches:
                self._store.watches.fail([p.watch for p in req.watches], e.code)
            watches.clear()
            raise
        watches.clear()
        self._state = _COMMITTED
        self._blocked = True

    def get_versionstamp(self) -> bytes:
        """See :meth:`Transaction.get_versionstamp`."""
        if self._stamp is None:
            raise StoreError(CLIENT_INVALID_OPERATION, "no versionstamp: the transaction has not committed a write")
        return self._stamp

    def reset(self) -> None:
        """See :meth:`Transaction.reset`."""
        self._held.release(TRANSACTION_CANCELLED)
        self._clear_state()

    def _failed_watch(self, key: bytes, code: int) -> Watch:
        w = self._store.watches.create(key)
        self._store.watches.settle(w, code)
        return w

    def cancel(self) -> None:
        """See :meth:`Transaction.cancel`."""
        self._held.release(TRANSACTION_CANCELLED)
        self._state = _CANCELLED
        self._blocked = True

    def on_error(self, error: StoreError) -> None:
        """See :meth:`Transaction.on_error`; 1025 once the transaction is cancelled."""
        if self._state == _CANCELLED:
            raise StoreError(TRANSACTION_CANCELLED)
        super().on_error(error)
