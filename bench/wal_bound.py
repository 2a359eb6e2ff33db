"""The WAL beside a reader: how large it grows with smoosh and without, and how soon a reader that never lets go is named (issue 27).

An application commits steadily to a WAL database (batches of ten 4 KB rows every 10 ms,
about 4 MB/s, keeping its newest 20,000 rows) and leaves checkpoints to a background
checkpointer (``wal_autocheckpoint = 0``, as litestream advises write-heavy applications,
which keeps checkpoints off their commits). A reader holds read transactions open for
``READ_HOLD_S`` seconds at a time with ``READ_PAUSE_S`` between them. A reader's snapshot
keeps any checkpoint from emptying the log, so a checkpoint has to land in its pauses. How
large the log grows is sampled every 100 ms over ``DURATION_S``:

* **no smoosh**: nothing checkpoints, so the log grows for the whole run;
* **smoosh**: ``smoosh run`` watching the database with ``wal_max_size = 64MiB``: from half of
  it on, its cleanup job checkpoints passively and restarts the log in a moment with no reader.

Budget (DESIGN §9): the WAL at most 64 MiB at p99 with smoosh. The application's commit
times are printed beside it, with the commits over 100 ms (DESIGN's aim: none stalled that
long by a checkpoint): a ``TRUNCATE`` holds the application's writers from its wait for
readers to its end, and the passive checkpoint before it leaves it little to copy back, but
cutting the log's file is itself slow where the file system discards what it frees (ext4
mounted with ``discard``, as cloud disks often are), so the cleanup job cuts only a file past
``wal_max_size`` and otherwise restarts the log in its file.

Why not the application's own autocheckpoint: with it, SQLite restarts the log itself in any
pause of the reader (the log stays near what one held transaction lets grow); and with a
reader that never pauses (transactions back to back) no checkpoint can empty the log, smoosh's
or SQLite's, without holding the application's writers for up to two of the reader's
transactions: that reader is the one to name.

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
#: Seconds the reader pauses between its transactions.
READ_PAUSE_S = 0.2
#: Rows of 4 KB the application commits at once, and how often (seconds).
ROWS_PER_COMMIT = 10
COMMIT_EVERY_S = 0.01
#: wal_max_size of the naming run: the time from crossing it is what counts, not its size.
NAMING_WAL_MAX = 8 * MiB

WRITER = """
import json, sqlite3, sys, time
c = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
c.execute("PRAGMA wal_autocheckpoint=0")
rows, every, end = int(sys.argv[2]), float(sys.argv[3]), time.monotonic() + float(sys.argv[4])
blob = b"x" * 4000
n = c.execute("SELECT coalesce(max(id), 0) + 1 FROM log").fetchone()[0]
took = []
while time.monotonic() < end:
    t = time.monotonic()
    c.execute("BEGIN IMMEDIATE")
    c.executemany("INSERT INTO log(id, body) VALUES (?, ?)", [(n + i, blob) for i in range(rows)])
    n += rows
    c.execute("DELETE FROM log WHERE id < ?", (n - 20000,))
    c.execute("COMMIT")
    took.append(time.monotonic() - t)
    time.sleep(every)
took.sort()
print(json.dumps({"slowest_commit_s": took[-1], "p999_commit_s": took[int(len(took) * 0.999)],
                  "commits_over_100ms": sum(1 for x in took if x > 0.1), "commits": len(took)}), flush=True)
"""

READER = """
import sqlite3, sys, time
c = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
hold, pause, end = float(sys.argv[2]), float(sys.argv[3]), time.monotonic() + float(sys.argv[4])
print("reading", flush=True)
while time.monotonic() < end:
    c.execute("BEGIN")
    c.execute("SELECT max(id) FROM log").fetchone()
    time.sleep(hold)
    c.execute("COMMIT")
    time.sleep(pause)
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


def _writer(path: str, duration_s: float) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", WRITER, path, str(ROWS_PER_COMMIT), str(COMMIT_EVERY_S),
                             str(duration_s)], stdout=subprocess.PIPE, text=True)


def wal_run(with_smoosh: bool, duration_s: float) -> tuple[list[float], dict[str, float]]:
    """WAL sizes (MiB) sampled over a run of the writer beside the reader, and its commits' times
    (``slowest_commit_s``, ``p999_commit_s``, ``commits_over_100ms``, ``commits``)."""
    base = Path(tempfile.mkdtemp(prefix="smoosh-bench-wal-"))
    daemon = None
    try:
        path = _db(base)
        if with_smoosh:
            port = free_port()
            daemon = Daemon(_config(base, port), port)
            daemon.wait_ready()
        writer = _writer(path, duration_s)
        reader = subprocess.Popen([sys.executable, "-c", READER, path, str(READ_HOLD_S), str(READ_PAUSE_S),
                                   str(duration_s)], stdout=subprocess.PIPE, text=True)
        sizes = _wal_sizes(path, duration_s)
        out, _ = writer.communicate()
        reader.wait()
        return sizes, {k: float(v) for k, v in json.loads(out.strip().splitlines()[-1]).items()}
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
            reader = subprocess.Popen([sys.executable, "-c", READER, path, "3600", "0", "3600"], stdout=subprocess.PIPE,
                                      text=True)
            assert reader.stdout is not None and reader.stdout.readline().strip() == "reading"
            writer = _writer(path, timeout_s)
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
    bare_max: list[float] = []
    smoosh: list[float] = []
    smoosh_max: list[float] = []
    commits: dict[bool, dict[str, list[float]]] = {False: {}, True: {}}
    named: list[float] = []
    for _ in range(args.runs):
        for with_smoosh, p99s, maxes in ((False, bare, bare_max), (True, smoosh, smoosh_max)):
            sizes, took = wal_run(with_smoosh, duration)
            p99s.append(percentile(sizes, 0.99))
            maxes.append(max(sizes))
            for name, value in took.items():
                commits[with_smoosh].setdefault(name, []).append(value)
        named.append(time_to_name())

    def ms(with_smoosh: bool, name: str) -> list[float]:
        return [v * 1000 for v in commits[with_smoosh][name]]

    metrics = [
        Metric("WAL size p99, no smoosh (nothing checkpoints)", "MiB", bare, higher_is_better=False),
        Metric("WAL size max, no smoosh", "MiB", bare_max, higher_is_better=False),
        Metric("WAL size p99, smoosh run (wal_max_size = 64MiB)", "MiB", smoosh, higher_is_better=False,
               budget=64.0, budget_text="<= 64 MiB", reference=sorted(bare)[len(bare) // 2],
               reference_name="no smoosh"),
        Metric("WAL size max, smoosh run", "MiB", smoosh_max, higher_is_better=False),
        Metric("the application's commit p99.9, no smoosh", "ms", ms(False, "p999_commit_s"), higher_is_better=False),
        Metric("the application's commit p99.9, smoosh run", "ms", ms(True, "p999_commit_s"), higher_is_better=False),
        Metric("the application's slowest commit, no smoosh", "ms", ms(False, "slowest_commit_s"),
               higher_is_better=False),
        Metric("the application's slowest commit, smoosh run", "ms", ms(True, "slowest_commit_s"),
               higher_is_better=False),
        Metric("the application's commits over 100 ms, no smoosh", "commits",
               commits[False]["commits_over_100ms"], higher_is_better=False),
        Metric("the application's commits over 100 ms, smoosh run (DESIGN aim: none stalled by a checkpoint)",
               "commits", commits[True]["commits_over_100ms"], higher_is_better=False),
        Metric("a reader that never lets go: WAL past wal_max_size to its pid in /jobs", "s", named,
               higher_is_better=False, budget=5.0, budget_text="<= 5 s"),
    ]
    report("wal_bound", "The WAL beside a reader: its size, and naming the reader that never lets go", metrics, args,
           notes=[f"{duration:.0f} s runs: a writer committing {ROWS_PER_COMMIT} rows of 4 KB every "
                  f"{COMMIT_EVERY_S * 1000:.0f} ms with wal_autocheckpoint = 0, a reader holding read transactions "
                  f"{READ_HOLD_S:.0f} s at a time with {READ_PAUSE_S * 1000:.0f} ms between them; the WAL's size "
                  f"sampled every 100 ms."])
    return 0


if __name__ == "__main__":
    sys.exit(main())
