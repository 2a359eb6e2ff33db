"""The README is the contract with a new user: its examples run and its reference is complete."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from helpers.daemon import Daemon, free_port, write_config

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def python_block_after(heading: str) -> str:
    section = README[README.index(heading):]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, f"no python block after {heading!r}"
    return match.group(1)


def test_the_job_layer_example_runs_as_written(tmp_path: Path) -> None:
    code = python_block_after("### The job layer")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr
    assert "('resize', 'img-1', 'finished'" in out.stdout


def test_every_config_key_is_in_the_readme_reference() -> None:
    from smoosh.config import defaults as config_defaults, sections as config_sections

    keys: set[str] = set()
    for module in (config_defaults, config_sections):
        for name in dir(module):
            value = getattr(module, name)
            if name.endswith("_KEYS") and isinstance(value, dict):
                keys |= set(value)
    assert len(keys) > 30
    missing = sorted(k for k in keys if f"`{k}`" not in README)
    assert missing == []


def test_the_readme_leads_with_the_two_commands() -> None:
    first_commands = README.index("make run")
    assert first_commands < README.index("## A five-minute tour")
    assert "make test" in README[:README.index("## A five-minute tour")]


# ------------------------------------------------------------------ the Python blocks, beside a running daemon


@pytest.fixture(scope="module")
def beside_make_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A scratch directory laid out as `make run` lays out the checkout, with a daemon running on its var/."""
    base = Path(os.path.realpath(tmp_path_factory.mktemp("beside")))
    (base / "var" / "databases").mkdir(parents=True)
    state = base / "var" / "smoosh"
    config = write_config(base, port=free_port(), extra_global=f"watch = {base / 'var' / 'databases'}\n"
                          f"state_dir = {state}\nstore = sqlite:{state / 'jobs.db'}")
    daemon = Daemon(config)
    try:
        daemon.wait_ready()
        yield base
    finally:
        daemon.kill()


def run_block(heading: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", python_block_after(heading)], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))


def test_the_library_pieces_example_runs_as_written_and_leaves_the_daemons_state_alone(beside_make_run: Path) -> None:
    before = sorted(p.name for p in (beside_make_run / "var" / "smoosh").iterdir())
    out = run_block("### Library pieces", beside_make_run)
    assert (out.returncode, out.stderr) == (0, "")
    # Its checkpoint went to a directory of its own, not the running daemon's state_dir
    assert sorted(p.name for p in (beside_make_run / "var" / "smoosh").iterdir()) == before
    assert "ratio_dbs.smooshq" not in before


def test_the_python_api_example_runs_as_written_beside_a_running_daemon(beside_make_run: Path) -> None:
    out = run_block("### Python API", beside_make_run)
    assert (out.returncode, out.stderr) == (0, "")


def test_the_python_api_says_how_keys_are_resolved() -> None:
    from smoosh import InvalidKey, Server
    from smoosh.config import Config

    section = README[README.index("### Python API"):README.index("**Compactors.**")]
    assert "a relative path is not resolved against anything but\nrefused, `InvalidKey` with the reason `not an absolute path`" in section
    # as the server does
    server = Server(Config.default(cwd="/srv"), workers=0, watch_config=False)
    with pytest.raises(InvalidKey) as caught:
        server.canonical_key("tenants/42.db")
    assert caught.value.reason == "not an absolute path"
