"""Prometheus's own ``promtool``, where the machine has it (Debian's ``prometheus`` package ships it).

Tests that use it skip when it is absent; the in-repo checks beside them (``helpers/promlint.py``,
``helpers/promql.py``) run everywhere.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

__all__ = ["promtool", "check_metrics", "expr_samples"]

#: Seconds promtool may take before the test fails (it answers in well under one).
PROMTOOL_TIMEOUT_S = 60.0


def promtool() -> str:
    """The path of ``promtool``; skips the calling test when the machine has none."""
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    return path


def check_metrics(exposition: str) -> subprocess.CompletedProcess[str]:
    """``promtool check metrics`` on the text ``exposition`` (exit 0: it passes the lint)."""
    return subprocess.run([promtool(), "check", "metrics"], input=exposition, capture_output=True, text=True,
                          timeout=PROMTOOL_TIMEOUT_S)


def expr_samples(expr: str, series: dict[str, float], expected: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    """``promtool test rules``: ``expr`` over ``series`` (each held at its value) gives exactly ``expected``.

    Parameters:
        expr: a PromQL expression (a rule's ``expr``).
        series: ``{'name{labels}': value}``, every one constant over the test's 10 minutes.
        expected: the samples ``expr`` must give at 5m, as promtool's ``exp_samples``
            (``{"labels": 'name{...}', "value": v}``); [] for none.

    Returns:
        promtool's run: exit 0 when Prometheus's own evaluation gives exactly ``expected``.
    """
    test = {
        "tests": [{
            "interval": "1m",
            "input_series": [{"series": name, "values": f"{value:g}x10"} for name, value in series.items()],
            "promql_expr_test": [{"expr": expr, "eval_time": "5m", "exp_samples": expected}],
        }],
    }
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "test.yml"
        path.write_text(yaml.safe_dump(test))
        return subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True, text=True,
                              timeout=PROMTOOL_TIMEOUT_S)
