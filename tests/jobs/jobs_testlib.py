"""Shared constants and helpers of the job-layer tests (imported by name: conftest puts this
directory on sys.path)."""

from __future__ import annotations

import threading
from typing import Any

from helpers.fdb_variants import FdbVariant
from smoosh.jobs.threads import THREAD_NAME_PREFIX
from smoosh.store import open_store
from smoosh.store.base import Store

#: The upstream suite's two types: a complex one and a simple one, with 2 s and 3 s timeouts.
T1: Any = ("t1", 1024)
T2: Any = ("t2", 42)
T1_TIMEOUT_S = 2
T2_TIMEOUT_S = 3
J1 = "j1"
J2 = "j2"


def job_threads() -> list[threading.Thread]:
    """Live threads of the job layer (by name)."""
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_NAME_PREFIX)]


def load_cases(file_stem: str) -> Any:
    """Import a test module of this directory by path, under a private name.

    By path rather than ``import test_api``: other test directories may have modules of the
    same name on sys.path.
    """
    import importlib.util
    import sys
    from pathlib import Path

    name = f"_smoosh_jobs_cases_{file_stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{file_stem}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


#: Chance that a write commit fails in the faulty variants (half of them after committing).
FAULT_RATE = 0.2
#: Backoff ceiling in the faulty variants: thousands of injected faults, short sleeps.
FAULTY_MAX_RETRY_DELAY_S = 0.002


def open_kind(kind: str, tmp_path: Any, seed: int = 0, fdb: FdbVariant | None = None) -> Store:
    """A fresh store of ``kind`` (see the conftest's docstring); ``fdb`` opens the FoundationDB kinds."""
    if kind.startswith("faulty-"):
        from smoosh.store.faulty import FaultyStore

        inner = open_kind(kind.removeprefix("faulty-"), tmp_path)
        return FaultyStore(inner, seed=seed, rate=FAULT_RATE, max_retry_delay_s=FAULTY_MAX_RETRY_DELAY_S)
    if kind == "memory":
        return open_store("memory:")
    if kind == "sqlite":
        return open_store(f"sqlite:{tmp_path / 'jobs.db'}")
    assert fdb is not None, f"{kind}: a FoundationDB store needs its test's FdbVariant (prefix and fence)"
    return fdb.open()
