"""The loads `make test-under-load` runs beside the suite, each a process of its own.

Run as ``python loaders.py disk DIR WRITE_BYTES``: a loop of writes of ``WRITE_BYTES``, each
followed by ``fsync``, in a file under ``DIR`` (the filesystem the tests' temporary directories
are on); on SIGTERM it prints one JSON line ``{"fsyncs": n, "p50_ms": ..., "p90_ms": ...}`` (its
own fsync latencies).

``python loaders.py cpu``: one core kept busy until SIGTERM.

``python loaders.py probe DIR N``: N SQLite commits (``synchronous = FULL``, a rollback journal:
each commit syncs the journal and the database, as smoosh's compaction chunks do) in a scratch
database under ``DIR``; prints ``{"commits": N, "p50_ms": ..., "p90_ms": ...}``: what a commit
costs on the disk as it is loaded now.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sqlite3
import sys
import tempfile
import time

#: The disk loader starts over at the front of its file past this size (its file stays small).
WRAP_BYTES = 64 * 1024 * 1024


def die_with_parent() -> None:
    """Have the kernel send SIGTERM here when the parent (the run) ends, however it ends: a
    killed run leaves no loader behind."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def percentiles_ms(seconds: list[float]) -> dict[str, float]:
    """The median and 90th percentile of ``seconds``, in milliseconds (0 for none)."""
    if not seconds:
        return {"p50_ms": 0.0, "p90_ms": 0.0}
    ordered = sorted(seconds)
    return {"p50_ms": round(ordered[len(ordered) // 2] * 1e3, 2),
            "p90_ms": round(ordered[len(ordered) * 9 // 10] * 1e3, 2)}


def disk(directory: str, write_bytes: int) -> None:
    stop = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    die_with_parent()
    fd, path = tempfile.mkstemp(prefix="smoosh-disk-load-", dir=directory)
    os.unlink(path)  # nothing to clean up, whatever ends this process
    block = os.urandom(write_bytes)
    took: list[float] = []
    offset = 0
    try:
        while not stop:
            t0 = time.perf_counter()
            os.pwrite(fd, block, offset)
            os.fsync(fd)
            took.append(time.perf_counter() - t0)
            offset = (offset + write_bytes) % WRAP_BYTES
    finally:
        os.close(fd)
        try:
            print(json.dumps({"fsyncs": len(took), **percentiles_ms(took)}), flush=True)
        except BrokenPipeError:
            pass  # the run that would have read it is gone


def cpu() -> None:
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    die_with_parent()
    n = 0
    while True:
        n += 1


def probe(directory: str, commits: int) -> None:
    with tempfile.TemporaryDirectory(prefix="smoosh-probe-", dir=directory) as scratch:
        conn = sqlite3.connect(os.path.join(scratch, "probe.db"), isolation_level=None)
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("CREATE TABLE t(x BLOB)")
        took = []
        for _ in range(commits):
            t0 = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t VALUES (randomblob(100))")
            conn.execute("COMMIT")
            took.append(time.perf_counter() - t0)
        conn.close()
    print(json.dumps({"commits": commits, **percentiles_ms(took)}), flush=True)


def main() -> None:
    kind = sys.argv[1]
    if kind == "disk":
        disk(sys.argv[2], int(sys.argv[3]))
    elif kind == "cpu":
        cpu()
    elif kind == "probe":
        probe(sys.argv[2], int(sys.argv[3]))
    else:
        raise SystemExit(f"usage: {sys.argv[0]} disk DIR WRITE_BYTES | cpu | probe DIR N")


if __name__ == "__main__":
    main()
