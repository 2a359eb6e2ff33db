"""`smoosh demo`: five bloated databases compacted by an in-process daemon, reported byte for byte."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from smoosh.cli.demo import DATABASES, run_demo

LINE = re.compile(r"^(?P<name>\S+): reclaimed (?P<n>\d+) bytes$")


def test_the_demo_compacts_every_database_reports_the_bytes_and_cleans_up(tmp_path: Path) -> None:
    # TMPDIR points the demo's temp dir into tmp_path, so the clean-up can be checked.
    env = {"TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "smoosh", "demo"], capture_output=True, text=True,
                         timeout=90, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    reclaimed = {m["name"]: int(m["n"]) for m in map(LINE.match, out.stdout.splitlines()) if m}
    total = reclaimed.pop("total")
    assert set(reclaimed) == {db.name for db in DATABASES}
    assert all(n > 0 for n in reclaimed.values()), reclaimed
    assert total == sum(reclaimed.values())
    assert f"integrity check: all {len(DATABASES)} databases ok" in out.stdout
    assert "\x1b[" not in out.stdout  # a pipe gets plain lines, never a redraw
    assert list(tmp_path.iterdir()) == []


def test_a_demo_that_runs_out_of_time_says_so_exits_1_and_still_cleans_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    out = io.StringIO()
    assert run_demo(out, timeout_s=0) == 1
    lines = out.getvalue().splitlines()
    assert lines[-1] == "demo failed; gave up after 0 s"
    failed = [line for line in lines if re.match(r"^\S+\.db: FAILED: not compacted within 0 s \(state \w+\)$", line)]
    assert failed, lines
    assert lines[-3].startswith("total: reclaimed ")
    assert list(tmp_path.iterdir()) == []
