"""A stream of events for the fault tests: creates bloated SQLite files, then keeps bloating them.

Run as ``python db_writer.py DIR COUNT SEED``. Files are created once at their final path (as
an application does) and afterwards only modified in place with ordinary transactions, so any
damage found later is smoosh's, never this writer's. Busy databases are skipped.
"""

from __future__ import annotations

import os
import random
import sqlite3
import sys
import time

#: Rows each file starts with, and rows one "bloat" step inserts and deletes again.
START_ROWS = 300
BLOAT_ROWS = 150
#: Bytes of random payload per row.
ROW_BYTES = 1000


def create(path: str) -> None:
    conn = sqlite3.connect(path, timeout=2, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE IF NOT EXISTS docs(id INTEGER PRIMARY KEY, body BLOB NOT NULL)")
        insert_and_delete(conn, START_ROWS, keep=START_ROWS // 3)
    finally:
        conn.close()


def insert_and_delete(conn: sqlite3.Connection, rows: int, keep: int) -> None:
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(
        "INSERT INTO docs(body) WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < ?) "
        "SELECT randomblob(?) FROM n", (rows, ROW_BYTES))
    conn.execute("DELETE FROM docs WHERE id IN (SELECT id FROM docs ORDER BY id LIMIT ?)", (max(0, rows - keep),))
    conn.execute("COMMIT")


def main() -> None:
    directory, count, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    while True:
        path = os.path.join(directory, f"w{rng.randrange(count):03d}.db")
        try:
            if not os.path.exists(path):
                create(path)
            else:
                conn = sqlite3.connect(path, timeout=0.5, isolation_level=None)
                try:
                    insert_and_delete(conn, BLOAT_ROWS, keep=rng.randrange(0, 20))
                finally:
                    conn.close()
        except sqlite3.OperationalError:
            pass  # busy: a compaction holds it; the next event will do
        time.sleep(rng.uniform(0.0, 0.03))


if __name__ == "__main__":
    main()
