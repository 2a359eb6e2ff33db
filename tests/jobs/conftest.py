"""Fixtures for the job-layer tests: a store of each embedded kind and a layer over it."""

from __future__ import annotations

import os
import random
import sys
from typing import Any, Callable, Iterator

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from jobs_testlib import T1, T1_TIMEOUT_S, T2, T2_TIMEOUT_S  # noqa: E402

from smoosh.jobs import Jobs  # noqa: E402
from smoosh.store import open_store  # noqa: E402
from smoosh.store.base import Store  # noqa: E402

STORE_KINDS = ["memory", "sqlite"]


@pytest.fixture(params=STORE_KINDS)
def store(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Store]:
    """A fresh store: ``memory:`` or ``sqlite:`` on a file in tmp_path."""
    if request.param == "memory":
        st = open_store("memory:")
    else:
        st = open_store(f"sqlite:{tmp_path / 'jobs.db'}")
    yield st
    st.close()


@pytest.fixture
def make_jobs(store: Store) -> Iterator[Callable[..., Jobs]]:
    """Factory of layers over the test's store; every layer made is closed afterwards."""
    made: list[Jobs] = []

    def make(**kwargs: Any) -> Jobs:
        kwargs.setdefault("rng", random.Random(7))
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
