"""One SQLite library per database file (DESIGN §11): user databases are opened through apsw only.

Two SQLite libraries in one process do not see each other's POSIX locks, and either one
closing a descriptor drops the other's (sqlite.org "How To Corrupt", 2.2.1). smoosh opens
user databases through ``smoosh.compactors.sqlite_open.open_database`` (apsw); the stdlib
``sqlite3`` is for the job store alone. This test keeps a stdlib open of a user database from
slipping back in: no module of the daemon's packages may import ``sqlite3`` outside
``smoosh/store/``, except the files named below.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The daemon's packages: everything that runs in the process that compacts.
PACKAGES = ("smoosh", "channels", "persist")
#: Where the stdlib sqlite3 belongs: the job store, a file of smoosh's own.
ALLOWED_DIRS = ("smoosh/store/",)
#: Known exceptions, each with why it is tolerated for now. Remove an entry once it is fixed.
EXCEPTIONS: dict[str, str] = {
    "smoosh/daemon/control/store_reset.py": "probes the job store's own file (never a user database), with the library the store uses",
}


def stdlib_sqlite3_imports(source: str) -> list[int]:
    """Line numbers of ``import sqlite3`` / ``from sqlite3 import`` / ``import_module("sqlite3")``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "sqlite3" for a in node.names):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sqlite3" and node.level == 0:
            lines.append(node.lineno)
        elif (
            isinstance(node, ast.Call)
            and any(isinstance(a, ast.Constant) and a.value == "sqlite3" for a in node.args)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) in ("import_module", "__import__")
        ):
            lines.append(node.lineno)
    return lines


def test_no_daemon_module_imports_the_stdlib_sqlite3_outside_the_store() -> None:
    found: dict[str, list[int]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(ALLOWED_DIRS):
                continue
            lines = stdlib_sqlite3_imports(path.read_text(encoding="utf-8"))
            if lines:
                found[rel] = lines
    unexpected = {rel: lines for rel, lines in found.items() if rel not in EXCEPTIONS}
    assert unexpected == {}, (
        "open user databases through smoosh.compactors.sqlite_open.open_database (apsw), "
        f"never the stdlib sqlite3 (DESIGN §11): {unexpected}"
    )
    # An exception that no longer imports sqlite3 must leave the list, so it cannot hide a new one.
    assert sorted(found) == sorted(EXCEPTIONS)


def test_the_detector_sees_every_spelling() -> None:
    spellings = [
        "import sqlite3",
        "import os, sqlite3 as lite",
        "from sqlite3 import connect",
        "from sqlite3.dbapi2 import connect",
        "import importlib\nimportlib.import_module('sqlite3')",
        "__import__('sqlite3')",
    ]
    for source in spellings:
        assert stdlib_sqlite3_imports(source), source
    assert stdlib_sqlite3_imports("import apsw\nfrom .sqlite3 import x\nimport sqlite3_extra") == []
