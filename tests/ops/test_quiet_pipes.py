"""Quiet pipes: every command ends quietly when the reader of its output goes away
(`smoosh status --jobs | head -1`), with its usual exit code and no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from opslib import PausedDaemon

from helpers.daemon import write_config


def run_with_reader_gone(*args: str, cwd: Path | None = None) -> tuple[int, str]:
    """Run ``python -m smoosh ARGS`` with its stdout a pipe whose reader is gone before it writes.

    The read end is closed at once, so every write the command makes meets a closed pipe
    (what ``| head -1`` does to all but the first chunk), whatever its timing.

    Returns:
        The exit code and what the command wrote to stderr.
    """
    env = dict(os.environ)
    env.pop("SMOOSH_TOKEN", None)
    proc = subprocess.Popen([sys.executable, "-m", "smoosh", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=cwd, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    stderr = proc.stderr.read().decode(errors="replace")
    return proc.wait(30), stderr


@pytest.mark.parametrize("args", [
    ("status",), ("status", "--json"), ("status", "--jobs"), ("status", "--jobs", "--json"),
    ("status", "--watch"), ("status", "--state", "pending", "--limit", "1"),
], ids=lambda a: " ".join(a))
def test_status_ends_quietly_when_its_reader_goes_away(paused: PausedDaemon, args: tuple[str, ...]) -> None:
    code, stderr = run_with_reader_gone(*args, "--url", paused.url)
    assert stderr == ""
    assert code == 0


def test_enqueue_ends_quietly_with_its_usual_code_when_its_reader_goes_away(paused: PausedDaemon,
                                                                           tmp_path: Path) -> None:
    # A key outside roots is rejected: the usual exit code 1 survives the closed pipe.
    code, stderr = run_with_reader_gone("enqueue", "--url", paused.url, str(tmp_path / "elsewhere.db"))
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr
    assert code == 1


@pytest.mark.parametrize("json_flag", [(), ("--json",)], ids=["text", "json"])
def test_explain_ends_quietly_when_its_reader_goes_away(paused: PausedDaemon, json_flag: tuple[str, ...]) -> None:
    assert run_with_reader_gone("explain", *json_flag, "--url", paused.url, paused.fresh) == (0, "")


def test_config_check_and_help_end_quietly_when_their_reader_goes_away(tmp_path: Path) -> None:
    config = write_config(tmp_path, port=5986)
    assert run_with_reader_gone("config", "check", "--config", str(config)) == (0, "")
    assert run_with_reader_gone("config", "check", "--json", "--config", str(config)) == (0, "")
    assert run_with_reader_gone("--help") == (0, "")
    assert run_with_reader_gone("run", "--help") == (0, "")


def test_jobs_list_ends_quietly_when_its_reader_goes_away(tmp_path: Path) -> None:
    from smoosh.jobs import Jobs
    from smoosh.store import open_store

    url = f"sqlite:{tmp_path / 'jobs.db'}"
    with open_store(url) as store, Jobs(store, monitors=False) as jobs:
        jobs.set_type_timeout("t", 30)
        for i in range(2000):  # more than a pipe's buffer of output
            jobs.add("t", f"job-{i:05d}", {})
    assert run_with_reader_gone("jobs", "--store", url, "list") == (0, "")
