"""What `pip install` gives a user: our distribution, its licence, and `smoosh --version`."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tomllib
from pathlib import Path

import smoosh

ROOT = Path(__file__).resolve().parents[2]
DIST = "smoosh-compactor"


def _pyproject() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def test_smoosh_version_prints_the_installed_distribution_version() -> None:
    out = subprocess.run([sys.executable, "-m", "smoosh", "--version"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"smoosh {importlib.metadata.version(DIST)}"
    assert out.stdout.strip() == f"smoosh {smoosh.__version__}"


def test_the_distribution_is_not_the_unrelated_smoosh_on_the_index() -> None:
    project = _pyproject()["project"]
    # The command and the import packages keep the project's names; the distribution does not.
    assert project["name"] == DIST
    assert project["scripts"]["smoosh"] == "smoosh.cli:main"
    assert importlib.metadata.metadata(DIST)["Name"] == DIST


def test_the_licence_ships_and_the_build_floor_reads_it() -> None:
    project = _pyproject()
    assert project["project"]["license"] == "Apache-2.0"
    assert project["project"]["license-files"] == ["LICENSE"]
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    # An SPDX licence string and license-files need setuptools 77 (PEP 639).
    floor = [r for r in project["build-system"]["requires"] if r.startswith("setuptools")]
    assert floor == ["setuptools>=77"]
    assert importlib.metadata.metadata(DIST)["License-Expression"] == "Apache-2.0"
