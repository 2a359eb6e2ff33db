"""The fence around a test's keys on FoundationDB: a test may write under its own prefix only.

A FoundationDB cluster is shared: keys a test leaves behind stay for the next run (issue 28
found twelve per run), and a test that writes under the job layer's default prefix
``('jobs',)`` or at the root of the key space would write into a live deployment's keys if
pointed at its cluster. So every ``fdb`` and ``fdb-standin`` store of the suites is opened
over a binding wrapped by :func:`fenced`: a write (``set``, ``clear``, ``clear_range``, an
atomic op, a versionstamped set) outside the test's fresh prefix raises
:class:`OutsideTestPrefix` before the binding sees it. Keys at or after ``b"\\xff"`` (and
ranges that end past it) pass: the client itself refuses them (2004), and the adapter never
asks for system-key access.

:class:`KeyFence` refuses to be built around anything but a fresh test prefix (under
``smoosh-test``), so a fixture that hands the default prefix to a cluster test fails at setup.
And when ``SMOOSH_TEST_FDB_CLUSTER`` names a real cluster, the suite-wide conftest calls
:func:`refuse_unfenced_stores`: an ``fdb:`` store opened any other way fails its test.
"""

from __future__ import annotations

import types
from typing import Any

import pytest

from smoosh.store import tuples
from smoosh.store.base import strinc

#: Every test prefix on a cluster starts with one of these (raw for the store contract,
#: tuple-packed for the job layer).
TEST_NAMESPACES = (b"smoosh-test/", tuples.pack(("smoosh-test",)))
#: Where the client's own fence begins: it refuses writes there without system-key access.
SYSTEM_KEYS = b"\xff"


class OutsideTestPrefix(AssertionError):
    """Raised when a test writes (or would write) outside its own prefix on a cluster."""


class KeyFence:
    """The keys one test may write: those under ``prefix``.

    Raises:
        OutsideTestPrefix: ``prefix`` is not a fresh test prefix (the default job-layer
            prefix, the root of the key space, anything outside ``smoosh-test``).
    """

    def __init__(self, prefix: bytes) -> None:
        if not any(prefix.startswith(ns) and len(prefix) > len(ns) for ns in TEST_NAMESPACES):
            raise OutsideTestPrefix(
                f"test prefix {prefix!r} is not a fresh prefix under smoosh-test: on a cluster it could "
                "touch a live deployment's keys"
            )
        self.prefix = prefix
        self.end = strinc(prefix)

    def check(self, begin: bytes, end: bytes | None = None) -> None:
        """Refuse a write of ``begin`` (or of the range ``[begin, end)``) outside the prefix."""
        if begin >= SYSTEM_KEYS or (end is not None and end > SYSTEM_KEYS):
            return  # the client refuses the whole write (2004): nothing reaches the cluster
        inside = begin.startswith(self.prefix) if end is None else self.prefix <= begin and end <= self.end
        if not inside:
            what = repr(begin) if end is None else f"[{begin!r}, {end!r})"
            raise OutsideTestPrefix(
                f"test wrote {what} outside its prefix {self.prefix!r}: on a cluster it would stay "
                "behind, or touch a live deployment's keys"
            )


class _FencedTransaction:
    def __init__(self, tr: Any, fence: KeyFence) -> None:
        self._tr = tr
        self._fence = fence

    def __getattr__(self, name: str) -> Any:  # reads, options, commit, on_error...: the binding's own
        return getattr(self._tr, name)

    def set(self, key: bytes, value: bytes) -> None:
        self._fence.check(key)
        self._tr.set(key, value)

    def clear(self, key: bytes) -> None:
        self._fence.check(key)
        self._tr.clear(key)

    def clear_range(self, begin: bytes, end: bytes) -> None:
        self._fence.check(min(begin, end), max(begin, end))  # an inverted range is the client's to refuse
        self._tr.clear_range(begin, end)

    def add(self, key: bytes, param: bytes) -> None:
        self._fence.check(key)
        self._tr.add(key, param)

    def set_versionstamped_key(self, key: bytes, value: bytes) -> None:
        self._fence.check(key)  # the stamp lies past the prefix: the operand starts with it
        self._tr.set_versionstamped_key(key, value)

    def set_versionstamped_value(self, key: bytes, value: bytes) -> None:
        self._fence.check(key)
        self._tr.set_versionstamped_value(key, value)


class _FencedDatabase:
    def __init__(self, db: Any, fence: KeyFence) -> None:
        self._db = db
        self._fence = fence

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)

    def create_transaction(self) -> _FencedTransaction:
        return _FencedTransaction(self._db.create_transaction(), self._fence)


class _FencedBinding(types.ModuleType):
    def __init__(self, binding: types.ModuleType, fence: KeyFence) -> None:
        super().__init__(binding.__name__)
        self._binding = binding
        self._fence = fence

    def __getattr__(self, name: str) -> Any:  # FDBError, KeySelector, StreamingMode...
        return getattr(self._binding, name)

    def open(self, cluster_file: str | None = None) -> _FencedDatabase:
        return _FencedDatabase(self._binding.open(cluster_file), self._fence)


def fenced(binding: types.ModuleType, prefix: bytes) -> types.ModuleType:
    """``binding`` (the real ``fdb`` module or the stand-in) whose transactions write under ``prefix`` only.

    Raises:
        OutsideTestPrefix: ``prefix`` is not a fresh test prefix.
    """
    return _FencedBinding(binding, KeyFence(prefix))


def is_fenced(binding: object) -> bool:
    """Whether ``binding`` came from :func:`fenced`."""
    return isinstance(binding, _FencedBinding)


def refuse_unfenced_stores(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every ``FdbStore`` opened without a :func:`fenced` binding raise :class:`OutsideTestPrefix`.

    Unfenced, a store's writes could land in a live deployment's keys or stay behind on the
    cluster; the suites' FoundationDB fixtures (``helpers/fdb_variants.py``) always fence.
    """
    from smoosh.store import fdb as fdb_store

    unguarded = fdb_store.FdbStore.__init__

    def guarded(self: Any, cluster_file: str | None = None, *, url: str | None = None, binding: Any = None) -> None:
        if not is_fenced(binding):
            raise OutsideTestPrefix(
                f"a test opened the FoundationDB cluster ({cluster_file or 'the default'}) without the key "
                "fence: use the fdb variants' fixtures (helpers/fdb_variants.py)"
            )
        unguarded(self, cluster_file, url=url, binding=binding)

    monkeypatch.setattr(fdb_store.FdbStore, "__init__", guarded)
