"""The embedded stores' fast paths against the general code they shortcut.

The memory store applies a commit in one loop instead of ``writes_of`` + ``_put``, a
transaction reads a key it has not written without folding its writes, takes a well-formed
versionstamp operand without the general checks, and a limited range read of the memory
store is one locked pass instead of the chunked scan. Each test runs the same random
operations through both and asserts the same outcome: every read's value or error code,
every commit's result, the stamps, and the store's contents at every version read back.
"""

from __future__ import annotations

import struct
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from smoosh.store.errors import StoreError
from smoosh.store.memory import MemoryStore
from smoosh.store._mutations import writes_of
from smoosh.store._txn import BufferedTransaction

KEYS = [b"a", b"ab", b"b", b"b\x00", b"c", b"\x01\x02", b"\xfe", b"\xff", b"\xff\x01"]
VALUES = [b"", b"x", b"\x01\x00\x00\x00\x00\x00\x00\x00", b"\xff\xff"]


class _SlowTransaction(BufferedTransaction):
    """Takes every general path: reads fold the writes first, stamped writes are fully checked."""

    def _clear_state(self) -> None:
        super()._clear_state()
        self._wide = True  # "a write of wider reach was made": every read folds the writes

    def set_versionstamped_key(self, key: bytes, value: bytes) -> None:
        self._set_versionstamped_key_checked(key, value)

    def set_versionstamped_value(self, key: bytes, value: bytes) -> None:
        self._set_versionstamped_value_checked(key, value)


class _ReferenceStore(MemoryStore):
    """The memory store with the general transaction and the general apply and range read."""

    def create_transaction(self) -> BufferedTransaction:
        return _SlowTransaction(self)

    def _apply(self, mutations: Any, stamp: bytes, version: int) -> Any:
        points: list[bytes] = []
        cleared: list[tuple[bytes, bytes]] = []
        touched = points
        for key, value, end in writes_of(mutations, stamp, self._latest):
            if end is not None:
                cleared.append((key, end))
                if touched is points:
                    touched = list(points)
                for k in list(self._live.irange(key, end, inclusive=(True, False))):
                    self._put(k, None, version)
                    touched.append(k)
                continue
            points.append(key)
            if touched is not points:
                touched.append(key)
            self._put(key, value, version)
        return tuple(points), tuple(cleared), tuple(touched)

    def _open_snapshot(self) -> Any:
        snap = super()._open_snapshot()
        snap.read_range = lambda b, e, r, limit: _general_read_range(snap, b, e, r, limit)  # type: ignore[assignment]
        return snap


def _general_read_range(snap: Any, begin: bytes, end: bytes, reverse: bool, limit: int) -> list[tuple[bytes, bytes]]:
    # Every key the store holds, its value at the read version: no index, no chunks.
    pairs = []
    for key in sorted(snap._store._data, reverse=reverse):
        if begin <= key < end:
            value = None
            for version, v in snap._store._data[key]:
                if version <= snap.read_version:
                    value = v
            if value is not None:
                pairs.append((key, value))
    return pairs[:limit] if limit else pairs


def _stamped(body: bytes, offset: int) -> bytes:
    return body + struct.pack("<L", offset)


_key = st.sampled_from(KEYS)
_value = st.sampled_from(VALUES)
_stamp_body = st.builds(lambda head, tail: head + b"\x00" * 10 + tail, st.sampled_from([b"", b"k", b"\xff", b"\x01\x02"]), st.sampled_from([b"", b"z"]))
_stamp_operand = st.one_of(
    st.builds(lambda body, off: _stamped(body, off), _stamp_body, st.integers(0, 4)),
    st.sampled_from([b"short", b"\xff" * 20, b"k" + b"\x00" * 9]),
)
_op = st.one_of(
    st.tuples(st.just("get"), _key),
    st.tuples(st.just("sget"), _key),
    st.tuples(st.just("range"), _key, _key, st.integers(0, 3), st.booleans(), st.booleans()),
    st.tuples(st.just("set"), _key, _value),
    st.tuples(st.just("clear"), _key),
    st.tuples(st.just("clear_range"), _key, _key),
    st.tuples(st.just("add"), _key, st.sampled_from([b"\x01", b"\x01\x00\x00\x00\x00\x00\x00\x00"])),
    st.tuples(st.just("vs_key"), _stamp_operand, _value),
    st.tuples(st.just("vs_value"), _key, _stamp_operand),
    st.tuples(st.just("add_read_conflict_key"), _key),
    st.tuples(st.just("commit")),
)


def _run(store: MemoryStore, script: list[tuple[int, tuple[Any, ...]]]) -> list[Any]:
    """Run ``script`` (steps of two interleaved transactions); every step's outcome."""
    trs = [store.create_transaction(), store.create_transaction()]
    out: list[Any] = []
    for which, op in script:
        tr = trs[which]
        name, *args = op
        try:
            if name == "get":
                result: Any = tr.get(args[0])
            elif name == "sget":
                result = tr.snapshot.get(args[0])
            elif name == "range":
                begin, end, limit, reverse, snapshot = args
                view = tr.snapshot if snapshot else tr
                result = view.get_range(begin, end, limit=limit, reverse=reverse)
            elif name in ("set", "clear", "clear_range", "add", "add_read_conflict_key"):
                getattr(tr, name)(*args)
                result = None
            elif name == "vs_key":
                tr.set_versionstamped_key(*args)
                result = None
            elif name == "vs_value":
                tr.set_versionstamped_value(*args)
                result = None
            else:
                tr.commit()
                result = ("committed", tr.get_versionstamp() if tr.has_writes else None)
                trs[which] = store.create_transaction()
        except StoreError as e:
            result = ("error", e.code)
            if name == "commit":
                trs[which] = store.create_transaction()
        # What the step left behind must match too: the read conflict ranges (a read that
        # skipped the buffer must still add its conflict) and the mutation log.
        out.append((result, sorted(tr._reads.points), sorted(tr._reads.ranges), list(tr._mutations), tr._deferred))
    for tr in trs:
        tr.cancel()
    return out


def _contents(store: MemoryStore) -> list[Any]:
    """What a reader sees at every version, and the store's internal indexes."""
    seen = []
    for version in range(store._version + 1):
        snap = store._open_snapshot()
        snap.read_version = version
        seen.append(_general_read_range(snap, b"", b"\xff", False, 0))
    return [seen, list(store._live), list(store._deletions), [(v, p, c) for v, _, p, c in store._log]]


_WELL_FORMED_STAMP = _stamped(b"k" + b"\x00" * 10, 1)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), _op), max_size=40))
# The cases each fast path exists for, besides the random ones: a read after a stamped value
# of the same key (unreadable), a read then another commit of the key (a conflict), a read
# past a stamped key's landing range.
@example([(0, ("vs_value", b"a", _WELL_FORMED_STAMP)), (0, ("get", b"a")), (0, ("commit",))])
@example([(1, ("get", b"a")), (0, ("set", b"a", b"x")), (0, ("commit",)), (1, ("set", b"b", b"")), (1, ("commit",))])
@example([(0, ("clear", b"b")), (0, ("vs_key", _stamped(b"k" + b"\x00" * 10, 1), b"v")), (0, ("range", b"a", b"z", 0, False, True))])
@example([(0, ("vs_key", _stamped(b"a" + b"\x00" * 10, 1), b"v")), (0, ("get", b"a\xff")), (0, ("sget", b"a\xff"))])
def test_fast_paths_behave_as_the_general_code(script):
    fast, slow = MemoryStore(), _ReferenceStore()
    assert _run(fast, script) == _run(slow, script)
    assert _contents(fast) == _contents(slow)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(KEYS[:7]), st.one_of(st.none(), _value)), max_size=30),
    st.integers(0, 30),
    _key,
    _key,
    st.booleans(),
    st.integers(0, 300),
)
def test_limited_range_read_is_the_scan_cut_short(writes, at, begin, end, reverse, limit):
    store = MemoryStore()
    for key, value in writes:  # one commit each: a key may be deleted after an older read version
        store.transact(lambda tr, k=key, v=value: tr.set(k, v) if v is not None else tr.clear(k))
    snap = store._open_snapshot()
    snap.read_version = min(at, store._version)
    assert snap.read_range(begin, end, reverse, limit) == _general_read_range(snap, begin, end, reverse, limit)
