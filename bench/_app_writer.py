"""The application beside smoosh: one writer committing small transactions at a steady rate, in a process of its own.

``python -m bench._app_writer DB DURATION_S RATE_PER_S BUSY_TIMEOUT_S`` opens ``DB`` with the
stdlib ``sqlite3`` (as an application would; never in smoosh's process: two SQLite libraries
in one process break each other's locks), prints ``ready``, then for ``DURATION_S`` commits
one small ``INSERT`` every ``1 / RATE_PER_S`` seconds (``BEGIN IMMEDIATE`` ... ``COMMIT``,
WAL, ``synchronous = NORMAL``) with ``BUSY_TIMEOUT_S`` as its busy timeout. It prints one
JSON line at the end: ``{"commits": [[start, latency_s], ...], "errors": [[start, latency_s,
message], ...]}``, where ``start`` is ``time.monotonic()`` (one clock for every process on
the machine, so the benchmark can line commits up with the compaction).
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time


def main(argv: list[str]) -> int:
    db, duration_s, rate, busy_timeout_s = argv[0], float(argv[1]), float(argv[2]), float(argv[3])
    conn = sqlite3.connect(db, timeout=busy_timeout_s, isolation_level=None)
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("CREATE TABLE IF NOT EXISTS app_log(id INTEGER PRIMARY KEY, at REAL NOT NULL, payload BLOB NOT NULL)")
    commits: list[list[float]] = []
    errors: list[list[object]] = []
    print("ready", flush=True)
    interval_s = 1.0 / rate
    t0 = time.monotonic()
    n = 0
    while True:
        due = t0 + n * interval_s
        now = time.monotonic()
        if due - t0 >= duration_s:
            break
        if due > now:
            time.sleep(due - now)
        start = time.monotonic()
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO app_log(at, payload) VALUES (?, randomblob(100))", (start,))
            conn.execute("COMMIT")
            commits.append([start, time.monotonic() - start])
        except sqlite3.Error as exc:
            errors.append([start, time.monotonic() - start, f"{type(exc).__name__}: {exc}"])
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
        n += 1
    conn.close()
    print(json.dumps({"commits": commits, "errors": errors}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
