"""Test material for the benchmarks: bloated SQLite files, fleets of copies, smoosh configs.

Kept apart from ``tests/`` on purpose: the benchmarks must not import the test suite.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import sys
import time
from pathlib import Path

#: Multiplier of the deterministic hash that picks scattered rows (Knuth's).
_HASH = 2654435761


#: Rows (of 400 bytes) of the small bloated template the fleet benchmarks clone: ~32 KiB.
#: Its cheap sizes qualify it for the slack channel (~8 KiB free > ``SMALL_MIN_SIZE``), so a
#: key is queued without a ``dbstat`` pass. The per-key cost (open, header read, routing) does not
#: depend on the file's size, and 212 KiB copies made a 20,000-key run write 4.2 GB, which
#: this VM's disk sometimes took minutes over.
SMALL_DB_ROWS = 40
#: ``min_size`` for channels fed those templates: below their size, so every key qualifies.
SMALL_MIN_SIZE = "4KiB"


def make_bloated_db(path: str, *, rows: int, row_bytes: int, delete_fraction: float = 0.6,
                    auto_vacuum: str = "none", scattered: bool = False, journal_mode: str = "delete") -> int:
    """Create ``path`` with ``rows`` rows of ``row_bytes`` random bytes, then delete a fraction.

    Fast on purpose (journal off, synchronous off while building): it is test material, and
    the 200 MB file of the compaction benchmark would otherwise take most of its time budget.

    Returns:
        The file size in bytes.
    """
    for suffix in ("", "-wal", "-shm", "-journal"):
        try:
            os.remove(path + suffix)
        except FileNotFoundError:
            pass
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(f"PRAGMA auto_vacuum={auto_vacuum.upper()}")
        conn.execute("PRAGMA journal_mode=OFF")
        conn.execute("PRAGMA synchronous=OFF")
        conn.execute("CREATE TABLE docs(id INTEGER PRIMARY KEY, key TEXT NOT NULL, body BLOB NOT NULL)")
        conn.execute("CREATE INDEX docs_key ON docs(key)")
        batch = 50_000
        for start in range(0, rows, batch):
            conn.execute("BEGIN")
            conn.execute(
                "INSERT INTO docs(key, body) "
                "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < ?) "
                "SELECT hex(randomblob(16)), randomblob(?) FROM n",
                (min(batch, rows - start), row_bytes),
            )
            conn.execute("COMMIT")
        if scattered:
            conn.execute("DELETE FROM docs WHERE ((id * ?) % 1000) < ?", (_HASH, int(delete_fraction * 1000)))
        else:
            conn.execute("DELETE FROM docs WHERE id <= ?", (int(rows * delete_fraction),))
        conn.execute(f"PRAGMA journal_mode={journal_mode.upper()}")
    finally:
        conn.close()
    return os.path.getsize(path)


def clone_fleet(template: str, directory: str, count: int, *, per_dir: int = 1000) -> list[str]:
    """``count`` copies of ``template`` under ``directory`` (``per_dir`` files per subdirectory).

    Copies are made with ``copy_file_range`` via :func:`shutil.copyfile`: creating 100,000
    tiny databases this way takes seconds, where building each with SQLite takes minutes.

    Returns:
        The paths, in creation order.
    """
    paths = []
    for i in range(count):
        sub = os.path.join(directory, f"d{i // per_dir:04d}")
        if i % per_dir == 0:
            os.makedirs(sub, exist_ok=True)
        path = os.path.join(sub, f"db{i:07d}.sqlite")
        shutil.copyfile(template, path)
        paths.append(path)
    return paths


def config_text(base: Path, *, store: str = "memory:", watch: str = "", roots: str | None = None,
                http: str = "", staleness: str = "5", extra: dict[str, str] | None = None,
                min_size: str = "64KiB") -> str:
    """A smoosh INI config for a benchmark rooted at ``base`` (state in ``base/state``)."""
    (base / "state").mkdir(parents=True, exist_ok=True)
    settings = {
        "watch": watch,
        "roots": roots if roots is not None else str(base / "dbs"),
        "state_dir": str(base / "state"),
        "store": store,
        "node": "bench",
        "wait_secs": "3600",  # channels stay paused: nothing starts, queues only fill
        "staleness": staleness,
    }
    if http:
        settings["http"] = http
    settings.update(extra or {})
    body = "\n".join(f"{k} = {v}" for k, v in settings.items())
    return f"""[smoosh]
{body}

[smoosh.ratio_dbs]
min_size = {min_size}

[smoosh.slack_dbs]
min_size = {min_size}
min_priority = {min_size}
"""


def python_of_project() -> str:
    """The interpreter running the benchmarks (the project venv's)."""
    return sys.executable


class NullContext:
    """A compaction's context where nothing watches it: progress goes nowhere, nothing cancels it."""

    def progress(self, fraction: float) -> None:
        pass

    def checkpoint(self) -> None:
        pass

    def on_cancel(self, fn: object) -> None:
        pass

    def pause(self, seconds: float) -> None:
        time.sleep(seconds)
