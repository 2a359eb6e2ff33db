"""The layering contracts of pyproject.toml are not vacuous: each catches the import it forbids.

``make test`` runs ``lint-imports`` on the tree as it is. Here the three packages are copied
to a temporary directory, one forbidden import is written into the copy, and ``lint-imports``
runs with the project's own config against it: it must fail, naming the broken contract and
the import; the unchanged copy must pass.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[2]
CONFIG = PROJECT / "pyproject.toml"
PACKAGES = ("smoosh", "channels", "persist")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def contract_names() -> dict[str, str]:
    """Each contract's name by its id, as configured."""
    contracts = tomllib.loads(CONFIG.read_text())["tool"]["importlinter"]["contracts"]
    return {c["id"]: c["name"] for c in contracts}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the three packages: the tree lint-imports reads."""
    for package in PACKAGES:
        shutil.copytree(PROJECT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def lint_imports(tree: Path) -> tuple[int, str]:
    """Run lint-imports with the project's config on ``tree``; its exit code and its output,
    whitespace collapsed (it wraps long lines at the terminal's width)."""
    # The copy comes first on the path, ahead of the installed (editable) packages.
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run([str(LINT_IMPORTS), "--no-logo", "--no-cache", str(CONFIG)], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=60)
    return proc.returncode, " ".join((proc.stdout + proc.stderr).split())


def test_the_unchanged_tree_keeps_every_contract(tree: Path) -> None:
    code, out = lint_imports(tree)
    assert code == 0, out
    assert f"Contracts: {len(contract_names())} kept, 0 broken." in out


@pytest.mark.parametrize(
    ("module", "line", "contracts", "said"),
    [
        # A channels module importing smoosh.
        ("channels/window.py", "import smoosh.errors", ("pure",), "channels.window -> smoosh.errors"),
        # A run/ module importing api/: below api/ in the daemon's layers, and not the CLI.
        ("smoosh/daemon/run/rotation.py", "import smoosh.daemon.api.http", ("daemon", "admin-api"),
         "smoosh.daemon.run.rotation -> smoosh.daemon.api.http"),
        # The job layer importing the daemon: below it in the packages' layers, and one of its clients.
        ("smoosh/jobs/errors.py", "import smoosh.daemon.server", ("clients", "packages"),
         "smoosh.jobs.errors -> smoosh.daemon.server"),
    ],
)
def test_a_forbidden_import_breaks_its_contract(
    tree: Path, module: str, line: str, contracts: tuple[str, ...], said: str
) -> None:
    # Given one forbidden import written into the copy
    path = tree / module
    path.write_text(path.read_text() + f"\n{line}  # broken on purpose\n")

    # When lint-imports reads it
    code, out = lint_imports(tree)

    # Then it fails, naming each contract the import breaks, and the import
    assert code != 0, out
    names = contract_names()
    for contract in contracts:
        assert f"{names[contract]} BROKEN" in out, out
    assert said in out, out
