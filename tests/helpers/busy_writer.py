"""An application that commits to one SQLite database every few milliseconds, in its own process.

Run as ``python busy_writer.py DB INTERVAL_S BUSY_TIMEOUT_S``. It prints ``ready`` once its
connection is open, then commits a small update every ``INTERVAL_S`` until SIGTERM, and
prints one JSON line on exit: ``{"commits": n, "errors": ["...", ...]}``. Each error is the
text of a ``sqlite3.Error`` it met (a busy timeout passed, a damaged file...): an application
beside smoosh must see none.

It is a separate process on purpose: the stdlib ``sqlite3`` here and smoosh's apsw must never
share a process (DESIGN §11; see ``helpers.locks``).
"""

from __future__ import annotations

import json
import signal
import sqlite3
import sys
import time


def main() -> None:
    db, interval_s, busy_timeout_s = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    stop = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    conn = sqlite3.connect(db, timeout=busy_timeout_s, isolation_level=None)
    commits = 0
    errors: list[str] = []
    print("ready", flush=True)
    try:
        while not stop:
            try:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("UPDATE docs SET key = hex(randomblob(8)) WHERE id = (SELECT max(id) FROM docs)")
                conn.execute("COMMIT")
                commits += 1
            except sqlite3.Error as e:
                errors.append(f"{type(e).__name__}: {e}")
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            time.sleep(interval_s)
    finally:
        conn.close()
        print(json.dumps({"commits": commits, "errors": errors}), flush=True)


if __name__ == "__main__":
    main()
