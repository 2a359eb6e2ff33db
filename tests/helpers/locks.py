"""SQLite connections and locks in other processes: the application beside smoosh.

A test that runs smoosh's compactor in its own process must not hold an application's
connection to the same database there too: the compactor opens user databases through apsw,
the stdlib ``sqlite3`` is a second SQLite library, and two libraries in one process neither
see each other's locks nor keep each other's (closing a descriptor drops all of the process's
POSIX locks on the file: sqlite.org "How To Corrupt", 2.2.1; DESIGN §11). The application's
connection lives in a child process instead, where locking works as it does in production.
"""

from __future__ import annotations

import ast
import select
import subprocess
import sys
from pathlib import Path
from typing import Any

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


# One statement per line in, one reply per line out: "ok <repr(rows)>" or "error <repr(msg)>".
# The reply comes after the statement has run, so "BEGIN IMMEDIATE" answers once the child
# holds the write lock, and holds it until the test sends "ROLLBACK" (or closes).
_CHILD = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=float(sys.argv[2]))
print("ready", flush=True)
for line in sys.stdin:
    try:
        rows = [tuple(r) for r in conn.execute(line.rstrip("\\n")).fetchall()]
        print("ok " + repr(rows), flush=True)
    except sqlite3.Error as e:
        print("error " + repr(str(e)), flush=True)
conn.close()
"""


class ChildConnectionError(Exception):
    """Raised when a statement run in the child process failed; the message is SQLite's."""


class ChildConnection:
    """A stdlib ``sqlite3`` connection to ``db`` held by a child process, driven statement by statement.

    Use it for anything that plays the application: a writer holding ``BEGIN IMMEDIATE``
    until told, an open reader pinning the WAL, an idle connection keeping ``-wal`` alive.

    Parameters:
        db: the database file.
        timeout_s: the child connection's busy timeout.
    """

    def __init__(self, db: Path | str, timeout_s: float = 5.0) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(db), str(timeout_s)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        if self._read() != "ready":
            self.close()
            raise RuntimeError(f"the child connection to {db} did not start")

    def _read(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the child connection died")
        return line.rstrip("\n")

    def execute(self, sql: str) -> list[tuple[Any, ...]]:
        """Run one statement (one line) in the child; its rows once it has finished.

        Raises:
            ChildConnectionError: SQLite's error in the child (e.g. "database is locked").
        """
        self.send(sql)
        return self.reply()

    def send(self, sql: str) -> None:
        """Start one statement (one line) in the child without waiting for it (:meth:`reply` waits)."""
        assert self.proc.stdin is not None and "\n" not in sql
        self.proc.stdin.write(sql + "\n")
        self.proc.stdin.flush()

    def replied(self, timeout_s: float) -> bool:
        """Whether the statement sent has answered within ``timeout_s`` (its answer stays to :meth:`reply`)."""
        assert self.proc.stdout is not None
        return bool(select.select([self.proc.stdout], [], [], timeout_s)[0])

    def reply(self) -> list[tuple[Any, ...]]:
        """The rows of the statement :meth:`send` started, once it has finished.

        Raises:
            ChildConnectionError: SQLite's error in the child.
        """
        status, _, payload = self._read().partition(" ")
        value = ast.literal_eval(payload)
        if status != "ok":
            raise ChildConnectionError(value)
        return value

    def close(self) -> None:
        """Close the connection (rolling back an open transaction) and end the child."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> ChildConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
