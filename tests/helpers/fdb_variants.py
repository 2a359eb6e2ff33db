"""The FoundationDB variants of the store contract and job-layer suites: ``fdb`` and ``fdb-standin``.

``fdb`` opens the cluster ``SMOOSH_TEST_FDB_CLUSTER`` names (skipped without one);
``fdb-standin`` opens the same adapter over :mod:`helpers.fdb_standin`, a stand-in for the
binding and a cluster that behaves as the real client does, so it runs everywhere. Both
work under a fresh prefix per test, cleared before and after, behind the key fence
(:mod:`helpers.key_fence`): a write outside the prefix fails the test.
"""

from __future__ import annotations

import os
import uuid

import pytest

from helpers.fdb_standin import Binding
from helpers.key_fence import fenced
from helpers.summary import FDB_CLUSTER_ENV
from smoosh.store import tuples
from smoosh.store.base import Store

#: The kinds of store that go through the ``fdb:`` adapter.
FDB_KINDS = ("fdb", "fdb-standin")
#: The reason an ``fdb`` variant is skipped without a cluster (the run's summary counts them).
NO_CLUSTER = f"no FoundationDB cluster: set {FDB_CLUSTER_ENV} to a cluster file"


def skip_without_cluster(kind: str) -> None:
    """Skip an ``fdb`` variant when no cluster is configured."""
    if kind == "fdb" and not os.environ.get(FDB_CLUSTER_ENV):
        pytest.skip(NO_CLUSTER)


def fresh_raw_prefix() -> bytes:
    """A store-contract test's prefix: ``smoosh-test/<random>/``."""
    return b"smoosh-test/" + uuid.uuid4().hex.encode() + b"/"


def fresh_tuple_prefix() -> bytes:
    """A job-layer test's prefix: the tuple ``('smoosh-test', <random>)``."""
    return tuples.pack(("smoosh-test", uuid.uuid4().hex))


class FdbVariant:
    """One test's FoundationDB: the configured cluster or a fresh stand-in, fenced to ``prefix``.

    Every handle :meth:`open` returns shares it, as processes share a cluster.
    """

    def __init__(self, kind: str, prefix: bytes) -> None:
        self.kind = kind
        self.prefix = prefix
        if kind == "fdb":
            from smoosh.store.fdb import load_fdb

            self.cluster_file: str | None = os.environ[FDB_CLUSTER_ENV]
            self.standin: Binding | None = None
            self.binding = fenced(load_fdb(), prefix)
        else:
            self.cluster_file = None
            self.standin = Binding()
            self.binding = fenced(self.standin, prefix)

    def open(self) -> Store:
        """A new handle (an ``FdbStore``) on this test's cluster."""
        from smoosh.store.fdb import FdbStore

        url = f"fdb:{self.cluster_file}" if self.cluster_file else "fdb:stand-in"
        return FdbStore(self.cluster_file, url=url, binding=self.binding)

    def clear(self, store: Store) -> None:
        """Clear the test's prefix (before the test, and after it)."""
        store.transact(lambda tr: tr.clear_range_startswith(self.prefix))

    def close(self) -> None:
        """Release the stand-in's data (a real cluster stays)."""
        if self.standin is not None:
            self.standin.cluster.close()
