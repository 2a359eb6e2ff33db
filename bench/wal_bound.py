"""The WAL beside a reader: how large it grows with smoosh and without, and how soon a reader that never lets go is named (issue 27).

An application commits steadily to a WAL database (about 1 MB/s, rows of 4 KB, SQLite's
default autocheckpoint) while a reader holds read transactions open for ``READ_HOLD_S``
seconds at a time, back to back. A reader's snapshot keeps every checkpoint from emptying
the log, so it grows; how large is sampled every 100 ms over ``DURATION_S``:

* **no smoosh**: the application's own autocheckpoints only;
* **smoosh**: ``smoosh run`` watching the database with ``wal_max_size = 64MiB``: its cleanup
  job checkpoints passively and truncates the log in a moment with no reader.

Budget (DESIGN §9): the WAL at most 64 MiB at p99 with smoosh.

Then a reader that never ends its transaction: the time from the log passing
``wal_max_size`` (8 MiB for this run) until ``GET /jobs`` names the reader's pid (budget:
within 5 s).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._daemon import Daemon, free_port  # noqa: E402
from bench._harness import Metric, parse_args, percentile, report  # noqa: E402

MiB = 2**20
#: Seconds each run lasts.
DURATION_S = 60.0
#: Seconds the reader holds each read transaction.
READ_HOLD_S = 2.0
#: wal_max_size of the naming run: the time from crossing it is what counts, not its size.
NAMING_WAL_MAX = 8 * MiB

WRITER = """
import sqlite3, sys, time
c = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
blob = b"x" * 4000
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    c.execute("INSERT INTO log(body) VALUES (?)", (blob,))
    if c.execute("SELECT count(*) > 50000 FROM log").fetchone()[0]:
        c.execute("DELETE FROM log WHERE id IN (SELECT id FROM log ORDER BY id LIMIT 1000)")
    time.sleep(0.004)
"""

READER = """
import sqlite3, sys, time
c = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
hold, end = float(sys.argv[2]), time.monotonic() + float(sys.argv[3])
print("reading", flush=True)
while time.monotonic() < end:
    c.execute("BEGIN")
    c.execute("SELECT count(*) FROM log").fetchone()
    time.sleep(hold)
    c.execute("COMMIT")
"""


def _db(base: Path) -> str:
    (base / "dbs").mkdir(parents=True)
    path = str(base / "dbs" / "app.db")
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("CREATE TABLE log(id INTEGER PRIMARY KEY, body BLOB)")
    c.close()
    return path


def _config(base: Path, port: int, wal_max: str = "64MiB") -> Path:
    (base / "state").mkdir()
    config = base / "smoosh.ini"
    config.write_text(f"""[smoosh]
watch = {base / 'dbs'}
state_dir = {base / 'state'}
store = sqlite:{base / 'state' / 'jobs.db'}
node = bench
http = 127.0.0.1:{port}
wait_secs = 0
wal_max_size = {wal_max}
""")
    return config


def _wal_sizes(path: str, seconds: float) -> list[float]:
    sizes: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            sizes.append(os.path.getsize(path + "-wal") / MiB)
        except OSError:
            sizes.append(0.0)
        time.sleep(0.1)
    return sizes


def wal_run(with_smoosh: bool, duration_s: float) -> list[float]:
    """WAL sizes (MiB) sampled over a run of the writer beside the reader."""
    base = Path(tempfile.mkdtemp(prefix="smoosh-bench-wal-"))
    daemon = None
    try:
        path = _db(base)
        if with_smoosh:
            port = free_port()
            daemon = Daemon(_config(base, port), port)
            daemon.wait_ready()
        writer = subprocess.Popen([sys.executable, "-c", WRITER, path, str(duration_s)])
        reader = subprocess.Popen([sys.executable, "-c", READER, path, str(READ_HOLD_S), str(duration_s)],
                                  stdout=subprocess.PIPE, text=True)
        sizes = _wal_sizes(path, duration_s)
        writer.wait()
        reader.wait()
        return sizes
    finally:
        if daemon is not None:
            daemon.stop()
        shutil.rmtree(base, ignore_errors=True)


def time_to_name(timeout_s: float = 120.0) -> float:
    """Seconds from the WAL passing wal_max_size until /jobs names the reader that never lets go."""
    base = Path(tempfile.mkdtemp(prefix="smoosh-bench-wal-"))
    try:
        path = _db(base)
        port = free_port()
        daemon = Daemon(_config(base, port, f"{NAMING_WAL_MAX // MiB}MiB"), port)
        try:
            daemon.wait_ready()
            reader = subprocess.Popen([sys.executable, "-c", READER, path, "3600", "3600"], stdout=subprocess.PIPE, text=True)
            assert reader.stdout is not None and reader.stdout.readline().strip() == "reading"
            writer = subprocess.Popen([sys.executable, "-c", WRITER, path, str(timeout_s)])
            crossed: float | None = None
            named: float | None = None
            end = time.monotonic() + timeout_s
            while time.monotonic() < end and named is None:
                if crossed is None and os.path.exists(path + "-wal") and os.path.getsize(path + "-wal") > NAMING_WAL_MAX:
                    crossed = time.monotonic()
                if crossed is not None:
                    _status, body = daemon.request("GET", "/jobs")
                    if any(f"pid {reader.pid} (" in (j.get("last_error") or "") for j in body["jobs"]):
                        named = time.monotonic()
                time.sleep(0.05)
            writer.kill()
            reader.kill()
            writer.wait()
            reader.wait()
            if crossed is None or named is None:
                raise RuntimeError(f"the reader was not named within {timeout_s:.0f} s")
            return named - crossed
        finally:
            daemon.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__ or "", argv)
    duration = 10.0 if args.quick else DURATION_S
    bare: list[float] = []
    smoosh: list[float] = []
    named: list[float] = []
    for _ in range(args.runs):
        bare.append(percentile(wal_run(False, duration), 0.99))
        smoosh.append(percentile(wal_run(True, duration), 0.99))
        named.append(time_to_name())
    metrics = [
        Metric("WAL size p99, no smoosh (the application's autocheckpoints only)", "MiB", bare, higher_is_better=False),
        Metric("WAL size p99, smoosh run (wal_max_size = 64MiB)", "MiB", smoosh, higher_is_better=False,
               budget=64.0, budget_text="<= 64 MiB", reference=sorted(bare)[len(bare) // 2],
               reference_name="no smoosh"),
        Metric("a reader that never lets go: WAL past wal_max_size to its pid in /jobs", "s", named,
               higher_is_better=False, budget=5.0, budget_text="<= 5 s"),
    ]
    report("wal_bound", "The WAL beside a reader: its size, and naming the reader that never lets go", metrics, args,
           notes=[f"{duration:.0f} s runs: a writer committing 4 KB rows every ~4 ms, a reader holding read "
                  f"transactions {READ_HOLD_S:.0f} s at a time back to back; the WAL's size sampled every 100 ms."])
    return 0


if __name__ == "__main__":
    sys.exit(main())
