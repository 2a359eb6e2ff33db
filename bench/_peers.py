"""Peer job queues for ``bench.jobs``, run as a subprocess; prints one JSON line.

Cases (each fills nothing up front: every job is a full round trip, like ours):

* ``huey``   huey's ``SqliteHuey`` storage API: ``enqueue`` then ``dequeue`` (two commits per
  job; huey's dequeue deletes the task, so a worker that dies mid-task loses it).
* ``pq_ack`` persist-queue ``SQLiteAckQueue``: ``put``, ``get``, ``ack`` (three commits).
* ``bare3``  stdlib sqlite3 doing our three durable commits per job (insert = add,
  ``UPDATE .. RETURNING`` claim = accept, ``UPDATE`` = finish), WAL, ``synchronous=FULL``:
  the single-worker floor of any design with three commits per job.

huey and persist-queue are not project dependencies: ``bench.jobs`` runs this file with
``.venv-bench/bin/python`` (see bench/README.md); ``bare3`` needs only the stdlib.
Every case reports the ``journal_mode`` and ``synchronous`` its connection ended up with, so
the durability of the comparison is on record.

Usage: python bench/_peers.py CASE N [WORKERS]
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import sys
import tempfile
import threading
import time


def _job(i: int) -> dict:
    return {"channel": "ratio_dbs", "key": f"/srv/dbs/tenant-{i:08d}.sqlite", "priority": 5.0, "progress": 0.0}


def _pragmas(path: str) -> dict:
    c = sqlite3.connect(path)
    try:
        return {"journal_mode": c.execute("PRAGMA journal_mode").fetchone()[0]}
    finally:
        c.close()


def run_huey(d: str, n: int, workers: int) -> dict:
    import pickle

    # huey is installed only in .venv-bench (not a project dependency), so mypy, which runs in
    # .venv, cannot find it (and huey ships no type information either).
    from huey import SqliteHuey  # type: ignore[import-not-found]

    h = SqliteHuey("bench", filename=os.path.join(d, "huey.db"))
    st = h.storage
    sync = st.conn.execute("PRAGMA synchronous").fetchone()[0]

    def work(count: int, base: int) -> None:
        for i in range(count):
            st.enqueue(pickle.dumps(_job(base + i)), 5)
            while st.dequeue() is None:  # another worker took ours: take the next one
                pass

    t0 = time.perf_counter()
    _threads(work, n, workers)
    dt = time.perf_counter() - t0
    return {"per_s": n / dt, "synchronous": sync, **_pragmas(os.path.join(d, "huey.db"))}


def run_pq_ack(d: str, n: int, workers: int) -> dict:
    # persist-queue is installed only in .venv-bench (not a project dependency): mypy, which runs
    # in .venv, cannot find it.
    from persistqueue import SQLiteAckQueue  # type: ignore[import-not-found]

    q = SQLiteAckQueue(os.path.join(d, "pq"), auto_commit=True, multithreading=True)
    sync = q._getter.execute("PRAGMA synchronous").fetchone()[0] if hasattr(q, "_getter") else None

    def work(count: int, base: int) -> None:
        for i in range(count):
            q.put(_job(base + i))
            while True:
                try:
                    item = q.get(block=False, raw=True)
                    break
                except Exception:  # persistqueue.Empty: another worker took ours
                    continue
            q.ack(id=item["pqid"])

    t0 = time.perf_counter()
    _threads(work, n, workers)
    dt = time.perf_counter() - t0
    db = os.path.join(d, "pq", "data.db")
    return {"per_s": n / dt, "synchronous": sync, **(_pragmas(db) if os.path.exists(db) else {})}


def run_bare3(d: str, n: int, workers: int) -> dict:
    import msgpack

    path = os.path.join(d, "bare.db")
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("CREATE TABLE jobs(id TEXT PRIMARY KEY, state INTEGER NOT NULL, lock TEXT, body BLOB NOT NULL)")
    c.execute("CREATE INDEX jobs_pending ON jobs(state, id)")
    c.close()
    local = threading.local()

    def conn() -> sqlite3.Connection:
        cc = getattr(local, "c", None)
        if cc is None:
            cc = local.c = sqlite3.connect(path, isolation_level=None, timeout=30, check_same_thread=False)
            cc.execute("PRAGMA synchronous=FULL")
        return cc

    def work(count: int, base: int) -> None:
        cc = conn()
        for i in range(count):
            job = _job(base + i)
            cc.execute("BEGIN IMMEDIATE")  # add
            cc.execute("INSERT INTO jobs VALUES (?, 0, NULL, ?)", (job["key"], msgpack.packb(job)))
            cc.execute("COMMIT")
            cc.execute("BEGIN IMMEDIATE")  # accept
            row = cc.execute(
                "UPDATE jobs SET state = 1, lock = ? WHERE id = (SELECT id FROM jobs WHERE state = 0 LIMIT 1) "
                "RETURNING id, body", (f"lock{base + i}",)).fetchone()
            cc.execute("COMMIT")
            job = msgpack.unpackb(row[1])
            job["result"] = "ok"
            cc.execute("BEGIN IMMEDIATE")  # finish
            cc.execute("UPDATE jobs SET state = 2, lock = NULL, body = ? WHERE id = ?", (msgpack.packb(job), row[0]))
            cc.execute("COMMIT")

    t0 = time.perf_counter()
    _threads(work, n, workers)
    dt = time.perf_counter() - t0
    sync = conn().execute("PRAGMA synchronous").fetchone()[0]
    return {"per_s": n / dt, "synchronous": sync, **_pragmas(path)}


def _threads(work, n: int, workers: int) -> None:
    share = n // workers
    threads = [threading.Thread(target=work, args=(share, k * share)) for k in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


CASES = {"huey": run_huey, "pq_ack": run_pq_ack, "bare3": run_bare3}


def main() -> int:
    case, n = sys.argv[1], int(sys.argv[2])
    workers = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    d = tempfile.mkdtemp(prefix="smoosh-bench-peer-")
    try:
        out = CASES[case](d, n - n % workers, workers)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    out.update(case=case, n=n, workers=workers)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
