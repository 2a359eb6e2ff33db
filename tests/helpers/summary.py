"""Lines for the end of a test run, gathered across pytest-xdist workers.

A test process adds to :data:`FAULT_TOTALS`; under xdist each worker sends its totals to the
controller when it finishes (``workeroutput``), and the controller, which runs no tests
itself, prints the sum. The suite-wide hooks that do this live in ``tests/conftest.py``.
"""

from __future__ import annotations

import os
from typing import Any

#: The environment variable naming a FoundationDB cluster file for the ``fdb`` variants.
FDB_CLUSTER_ENV = "SMOOSH_TEST_FDB_CLUSTER"

#: Totals over the job layer's faulty-store variants of this run.
FAULT_TOTALS: dict[str, int] = {"tests": 0, "faults": 0, "after_commit": 0, "retries": 0, "max_retries": 0, "gave_up": 0}


def merge_fault_totals(other: dict[str, int]) -> None:
    """Add another process's totals to this one's (the largest retry count is kept, not summed)."""
    for name, value in other.items():
        if name == "max_retries":
            FAULT_TOTALS[name] = max(FAULT_TOTALS[name], int(value))
        else:
            FAULT_TOTALS[name] = FAULT_TOTALS.get(name, 0) + int(value)


def summary_lines(skipped_reports: list[Any]) -> list[str]:
    """The lines to print at the end of the run: fault totals, FoundationDB variants and browser tests skipped."""
    lines = []
    t = FAULT_TOTALS
    if t["tests"]:
        lines.append(
            f"job layer under faults: {t['tests']} tests, {t['faults']} faults injected "
            f"({t['after_commit']} after a real commit), {t['retries']} retries, "
            f"at most {t['max_retries']} in one call, {t['gave_up']} calls gave up"
        )
    if not os.environ.get(FDB_CLUSTER_ENV):
        for label, folder in (("store contract", "tests/store_contract/"), ("job layer", "tests/jobs/")):
            n = sum(1 for r in skipped_reports if folder in r.nodeid and _wants_a_cluster(r))
            if n:
                lines.append(f"{label}: {n} FoundationDB variants skipped (set {FDB_CLUSTER_ENV} to a cluster file to run them)")
    browser = [_reason(r) for r in skipped_reports if "tests/browser/" in r.nodeid]
    if browser:
        # Said plainly: the operators' page was not tried in a browser on this machine.
        lines.append(f"the operators' page: {len(browser)} browser tests skipped: "
                     f"{browser[0].split('browser tests skipped: ', 1)[-1]}")
    return lines


def _reason(report: Any) -> str:
    """A skipped test's reason."""
    longrepr = report.longrepr
    return str(longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else longrepr)


def _wants_a_cluster(report: Any) -> bool:
    """Whether a skipped test was skipped for want of a cluster (not an ``fdb-standin`` variant
    skipped for a reason of its own)."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return FDB_CLUSTER_ENV in reason
