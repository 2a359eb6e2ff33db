"""Suite-wide pytest setup: slow soak/fault variants run only under `make soak` (SMOOSH_SOAK=1),
and the run's closing lines (fault totals, FoundationDB variants skipped), summed across
pytest-xdist workers."""

from __future__ import annotations

import os

import pytest

SOAK = os.environ.get("SMOOSH_SOAK") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if SOAK:
        return
    skip_slow = pytest.mark.skip(reason="slow soak variant: run `make soak` (SMOOSH_SOAK=1)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip_slow)


# Shared test helpers (tests/helpers/…) are importable as `helpers.…` from every test directory.
import sys  # noqa: E402

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

import json  # noqa: E402
from typing import Any  # noqa: E402

from helpers import summary  # noqa: E402


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: its totals go to the controller
        workeroutput["fault_totals"] = json.dumps(summary.FAULT_TOTALS)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    totals = getattr(node, "workeroutput", {}).get("fault_totals")
    if totals:
        summary.merge_fault_totals(json.loads(totals))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for line in summary.summary_lines(terminalreporter.stats.get("skipped", [])):
        terminalreporter.write_line(line)


from typing import Iterator  # noqa: E402

from helpers.daemon import Daemon  # noqa: E402


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    """Daemons a test starts (real ``smoosh run`` processes); any still running afterwards is killed."""
    started: list[Daemon] = []
    yield started
    for d in started:
        if d.proc.poll() is None:
            d.kill()


@pytest.fixture(autouse=True)
def _fdb_cluster_only_behind_the_key_fence(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a real cluster configured, an ``fdb:`` store opened other than through the suites'
    fenced variants fails the test (see ``helpers/key_fence.py``)."""
    from helpers.summary import FDB_CLUSTER_ENV

    if os.environ.get(FDB_CLUSTER_ENV):
        from helpers.key_fence import refuse_unfenced_stores

        refuse_unfenced_stores(monkeypatch)
