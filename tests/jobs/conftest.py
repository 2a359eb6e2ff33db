"""Fixtures for the job-layer tests: a store of each kind and a layer over it.

``memory`` and ``sqlite`` always run, on the layer's default prefix. ``fdb`` runs where
``SMOOSH_TEST_FDB_CLUSTER`` names a cluster file and is skipped, with the reason in the
summary, elsewhere; ``fdb-standin`` runs the same adapter over a stand-in for the binding that
behaves as the real client does. On both each test works under a fresh random prefix,
cleared before and after, and a write outside it fails the test (``helpers/key_fence.py``):
nothing a test does can touch a live deployment's keys. ``faulty-memory`` runs every test
through ``faulty:SEED:RATE:memory:`` (FoundationDB's errors injected into every transaction
the layer runs, before and after real commits; the seed comes from the test's name, so a
failure repeats); ``faulty-sqlite`` does the same around ``sqlite:`` under ``make soak``.
"""

from __future__ import annotations

import os
import random
import sys
import zlib
from typing import Any, Callable, Iterator

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from jobs_testlib import T1, T1_TIMEOUT_S, T2, T2_TIMEOUT_S, open_kind  # noqa: E402

from helpers.fdb_variants import FDB_KINDS, FdbVariant, fresh_tuple_prefix, skip_without_cluster  # noqa: E402
from helpers.summary import FAULT_TOTALS  # noqa: E402
from smoosh.jobs import Jobs  # noqa: E402
from smoosh.store.base import Store  # noqa: E402

STORE_KINDS = ["memory", "sqlite", "fdb", "fdb-standin", "faulty-memory", pytest.param("faulty-sqlite", marks=pytest.mark.slow)]


@pytest.fixture(params=STORE_KINDS)
def store_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    skip_without_cluster(kind)
    return kind


@pytest.fixture
def prefix(store_kind: str) -> bytes:
    """The job-layer prefix of this test: the default one, or a fresh one on FoundationDB."""
    if store_kind in FDB_KINDS:
        return fresh_tuple_prefix()
    from smoosh.jobs.layer import DEFAULT_PREFIX

    return DEFAULT_PREFIX


@pytest.fixture
def store(request: pytest.FixtureRequest, store_kind: str, prefix: bytes, tmp_path: Any) -> Iterator[Store]:
    """A fresh store of the test's kind (on FoundationDB: fenced to the test's prefix, cleared before and after)."""
    fdb = FdbVariant(store_kind, prefix) if store_kind in FDB_KINDS else None
    st = open_kind(store_kind, tmp_path, seed=zlib.crc32(request.node.nodeid.encode()), fdb=fdb)
    if fdb is not None:
        fdb.clear(st)
    yield st
    if fdb is not None:
        fdb.clear(st)
    faults = getattr(st, "faults", None)
    if faults is not None:
        stats = st.retry_stats.snapshot()
        FAULT_TOTALS["tests"] += 1
        FAULT_TOTALS["faults"] += faults.total()
        FAULT_TOTALS["after_commit"] += sum(faults.after_commit.values())
        FAULT_TOTALS["retries"] += stats["retries"]  # type: ignore[operator]
        FAULT_TOTALS["gave_up"] += stats["gave_up"]  # type: ignore[operator]
        FAULT_TOTALS["max_retries"] = max(FAULT_TOTALS["max_retries"], stats["max_retries"])  # type: ignore[call-overload]
    st.close()
    if fdb is not None:
        fdb.close()


@pytest.fixture
def make_jobs(store: Store, prefix: bytes) -> Iterator[Callable[..., Jobs]]:
    """Factory of layers over the test's store; every layer made is closed afterwards."""
    made: list[Jobs] = []

    def make(**kwargs: Any) -> Jobs:
        kwargs.setdefault("rng", random.Random(7))
        kwargs.setdefault("prefix", prefix)
        jobs = Jobs(store, **kwargs)
        made.append(jobs)
        return jobs

    yield make
    for jobs in made:
        jobs.close()


@pytest.fixture
def jobs(make_jobs: Callable[..., Jobs]) -> Jobs:
    """A layer with the upstream setup: types T1 (2 s) and T2 (3 s)."""
    layer = make_jobs()
    layer.set_type_timeout(T1, T1_TIMEOUT_S)
    layer.set_type_timeout(T2, T2_TIMEOUT_S)
    return layer
