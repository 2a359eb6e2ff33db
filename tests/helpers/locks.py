"""Is a database's write lock still held? Ask another process to write to it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

WRITE_FROM_ANOTHER_PROCESS = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], timeout=0)
try:
    conn.execute("INSERT INTO docs (key, body) VALUES ('k', x'00')")
    conn.commit()
    print("wrote")
except sqlite3.OperationalError as e:
    print(e)
"""


def other_process_write(db: Path) -> str:
    """Insert a row into ``docs`` from a fresh process: ``"wrote"`` or SQLite's error text."""
    out = subprocess.run(
        [sys.executable, "-c", WRITE_FROM_ANOTHER_PROCESS, str(db)], capture_output=True, text=True, timeout=30
    )
    return out.stdout.strip()
