"""The README is the contract with a new user: its examples run and its reference is complete."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

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
