"""Fixtures of the store contract suite: every test runs on every available store.

``memory`` and ``sqlite`` always run; ``fdb`` runs where ``SMOOSH_TEST_FDB_CLUSTER`` names a
cluster file and is skipped (with the reason in the summary) elsewhere; ``fdb-standin`` runs
the same adapter over a stand-in for the binding that behaves as the real client does
(``helpers/fdb_standin.py``). On both every test works under a fresh random prefix, cleared
before and after, and a write outside it fails the test (``helpers/key_fence.py``).

``faulty-memory`` runs every test through ``faulty:SEED:RATE:memory:`` (FoundationDB's errors
injected into every ``transact``, before and after real commits; the seed comes from the
test's name, so a failure repeats); ``faulty-sqlite`` does the same around ``sqlite:`` under
``make soak`` only.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from helpers.fdb_variants import FDB_KINDS, FdbVariant, fresh_raw_prefix, skip_without_cluster
from smoosh.store.base import Store

STORE_KINDS = ["memory", "sqlite", "fdb", "fdb-standin", "faulty-memory", pytest.param("faulty-sqlite", marks=pytest.mark.slow)]
#: Chance that a write commit of a ``transact`` fails in the faulty variants.
FAULT_RATE = 0.3


@dataclass
class StoreCtx:
    """What a contract test gets: a store, its kind, a key prefix, and a factory for more handles."""

    kind: str
    store: Store
    prefix: bytes
    make: Callable[..., Store]
    path: Path | None

    def k(self, name: bytes) -> bytes:
        """A test key under this test's prefix."""
        return self.prefix + name

    @property
    def faulty(self) -> bool:
        """Whether errors are injected into this store's ``transact`` calls."""
        return self.kind.startswith("faulty-")

    def after_commit_faults(self) -> int:
        """Faults injected so far after a real commit (0 on a store without faults)."""
        faults = getattr(self.store, "faults", None)
        return sum(faults.after_commit.values()) if faults is not None else 0

    def without_faults(self, *more: Store) -> None:
        """Stop injecting faults into this store (and ``more``), for a test that counts
        attempts or runs a body that is not idempotent."""
        for s in (self.store, *more):
            if hasattr(s, "enabled"):
                s.enabled = False  # type: ignore[attr-defined]

    def only(self, *kinds: str, why: str) -> None:
        """Skip unless the store is one of ``kinds``."""
        if self.kind not in kinds:
            pytest.skip(f"{self.kind}: {why}")


def _open(kind: str, tmp_path: Path, opts: dict[str, Any], seed: int = 0, fdb: FdbVariant | None = None) -> Store:
    if kind.startswith("faulty-"):
        from smoosh.store.faulty import FaultyStore

        return FaultyStore(_open(kind.removeprefix("faulty-"), tmp_path, opts), seed=seed, rate=FAULT_RATE, max_retry_delay_s=0.002)
    if kind == "memory":
        from smoosh.store.memory import MemoryStore

        return MemoryStore(**opts)
    if kind == "sqlite":
        from smoosh.store.sqlite import SqliteStore

        return SqliteStore(str(tmp_path / "store.db"), **opts)
    if opts:
        pytest.skip(f"FoundationDB limits are the cluster's: cannot set {sorted(opts)}")
    assert fdb is not None
    return fdb.open()


@pytest.fixture
def path(tmp_path: Path) -> str:
    """A SQLite store's file in the test's own directory (the SQLite-only tests)."""
    return str(tmp_path / "jobs.db")


@pytest.fixture(params=STORE_KINDS)
def ctx(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreCtx]:
    kind = request.param
    skip_without_cluster(kind)
    opened: list[Store] = []
    seed = zlib.crc32(request.node.nodeid.encode())
    prefix = fresh_raw_prefix() if kind in FDB_KINDS else b"t/"
    fdb = FdbVariant(kind, prefix) if kind in FDB_KINDS else None

    def make(**opts: Any) -> Store:
        s = _open(kind, tmp_path, opts, seed + len(opened), fdb)
        opened.append(s)
        return s

    store = make()
    if fdb is not None:
        fdb.clear(store)
    try:
        yield StoreCtx(kind, store, prefix, make, tmp_path / "store.db" if kind.endswith("sqlite") else None)
    finally:
        if fdb is not None:
            fdb.clear(store)
        for s in reversed(opened):
            s.close()
        if fdb is not None:
            fdb.close()
