"""What smoosh watching costs an application's transactions (issue 46): with it, without it, in one run.

An application process (stdlib ``sqlite3`` at Python's defaults, a rollback journal: SQLite's
default and Django's) runs Django's read-modify-write as fast as it can for a while: a
deferred ``BEGIN``, a ``SELECT``, an ``UPDATE``, ``COMMIT``, over a few tenant databases in
one directory, in turn. Each such commit creates, writes, syncs and deletes a ``-journal`` and
writes the database: a dozen file events. Beside it, in runs alternated round by round:

* **nothing**: the application alone;
* **a bare inotify reader**: a process that watches the directory for the events smoosh asks
  of the kernel and reads them once a second, doing nothing else: what any watcher of the
  directory costs the application (the kernel queueing its events), smoosh's floor;
* **smoosh watching**: ``smoosh run`` on the directory with every channel at
  ``concurrency = 0`` (it watches and measures, never compacts): the application harness's
  watching-only config (:func:`bench.apps.runs.smoosh_config`), its defaults otherwise.

Per mode: the application's CPU per transaction (its process, user + system), transactions a
second, and its ``COMMIT`` latency (p50, p99); smoosh's CPU over the application's run and its
looks at the databases (``/status`` ``application``: with a SQLite lock, without). Each
transaction's cost with a watcher is set beside the run without one in the same round, so a
drift of the machine between rounds cancels. The application's errors (``database is
locked``) need several threads and many minutes to compare (the ``bench.apps`` harness); what
this bench measures is what could cause them, per transaction, in seconds.

Usage: python -m bench.watch_cost [--runs N] [--quick] [--no-write]
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._daemon import Daemon, free_port, process_cpu_s, smoosh_env  # noqa: E402
from bench._harness import REPO_ROOT, Metric, parse_args, report  # noqa: E402
from bench.apps.runs import smoosh_config  # noqa: E402
from smoosh.config.defaults import DEFAULT_CLEANUP_CHANNELS, DEFAULT_DB_CHANNELS  # noqa: E402

#: Tenant databases in the watched directory, and rows in each.
TENANTS = 4
ROWS = 200
#: Seconds the application runs in each mode (a short smoke run: :data:`QUICK_DURATION_S`).
DURATION_S = 10.0
QUICK_DURATION_S = 2.0
#: Seconds between smoosh answering and the application starting: its start-up scan of the
#: directory is over by then, so what is measured is watching, not the first look.
SETTLE_S = 2.0
#: How far above the bare reader's ratio smoosh's may be and still add nothing a run can show:
#: runs of the same mode differ by about this much.
WITHIN_X = 0.05
MODES = ("none", "reader", "smoosh")
MODE_NAMES = {"none": "the application alone", "reader": "beside a bare inotify reader (1 read/s)",
              "smoosh": "beside smoosh watching (concurrency 0)"}

#: The application: Django's ``transaction.atomic()`` read-modify-write at Python's sqlite3
#: defaults (deferred BEGIN, a 5 s busy timeout, a connection per tenant kept open).
_APP = """
import json, os, sys, time, sqlite3
paths, duration_s = sys.argv[1].split(","), float(sys.argv[2])
conns = [sqlite3.connect(p, timeout=5.0, isolation_level=None) for p in paths]
commit_s = []
print("go", flush=True)
cpu0, t0 = time.process_time(), time.perf_counter()
i = 0
while time.perf_counter() - t0 < duration_s:
    c = conns[i % len(conns)]
    row = i % ROWS + 1
    c.execute("BEGIN")
    v = c.execute("SELECT v FROM t WHERE id = ?", (row,)).fetchone()[0]
    c.execute("UPDATE t SET v = ? WHERE id = ?", (v + 1, row))
    t = time.perf_counter()
    c.execute("COMMIT")
    commit_s.append(time.perf_counter() - t)
    i += 1
cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
commit_s.sort()
print(json.dumps({"n": i, "cpu_us": cpu / i * 1e6, "per_s": i / wall,
                  "p50_ms": commit_s[len(commit_s) // 2] * 1e3, "p99_ms": commit_s[int(len(commit_s) * 0.99)] * 1e3}))
""".replace("ROWS", str(ROWS))

#: The bare reader: smoosh's own inotify mask on the directory, read once a second, dropped.
_READER = """
import sys, time
from inotify_simple import INotify
from smoosh.daemon.watch.inotify_watch import ADD_FLAGS, ALL_EVENTS, SELF_EVENTS
ino = INotify(nonblocking=True)
ino.add_watch(sys.argv[1], ALL_EVENTS | SELF_EVENTS | ADD_FLAGS)
print("ready", flush=True)
while True:
    time.sleep(1.0)
    ino.read(timeout=0)
"""


def make_fleet(directory: Path) -> list[str]:
    """:data:`TENANTS` small rollback-journal databases in ``directory``; their paths."""
    directory.mkdir(parents=True)
    paths = []
    for n in range(TENANTS):
        path = str(directory / f"tenant{n}.db")
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v INTEGER NOT NULL, pad TEXT)")
            conn.executemany("INSERT INTO t VALUES (?, 0, ?)", [(i + 1, "x" * 200) for i in range(ROWS)])
        conn.close()
        paths.append(path)
    return paths


def run_app(paths: list[str], duration_s: float, on_go: Any = None) -> dict[str, float]:
    """The application's run: its figures (see :data:`_APP`); ``on_go()`` is called as its loop starts."""
    proc = subprocess.Popen([sys.executable, "-c", _APP, ",".join(paths), str(duration_s)],
                            stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT)
    assert proc.stdout is not None
    first = proc.stdout.readline()
    if first.strip() != "go":
        proc.kill()
        raise RuntimeError(f"the application did not start: {first!r}")
    if on_go is not None:
        on_go()
    out, _ = proc.communicate(timeout=duration_s + 60)
    if proc.returncode:
        raise RuntimeError(f"the application failed ({proc.returncode})")
    result: dict[str, float] = json.loads(out)
    return result


def one_run(mode: str, duration_s: float) -> dict[str, float]:
    """One mode's run on a fresh fleet: the application's figures, and smoosh's where it ran."""
    base = Path(tempfile.mkdtemp(prefix="smoosh-bench-watch-"))
    try:
        fleet = base / "dbs"
        paths = make_fleet(fleet)
        if mode == "none":
            return run_app(paths, duration_s)
        if mode == "reader":
            reader = subprocess.Popen([sys.executable, "-c", _READER, str(fleet)], stdout=subprocess.PIPE,
                                      text=True, cwd=REPO_ROOT, env=smoosh_env())
            try:
                assert reader.stdout is not None
                reader.stdout.readline()
                return run_app(paths, duration_s)
            finally:
                reader.kill()
                reader.wait()
        port = free_port()
        config, _keys = smoosh_config(base, str(fleet), port, watch_only=True,
                                      channels=[*DEFAULT_DB_CHANNELS, *DEFAULT_CLEANUP_CHANNELS])
        daemon = Daemon(config, port)
        try:
            daemon.wait_ready()
            time.sleep(SETTLE_S)
            cpu: list[float] = []
            looks: list[dict[str, float]] = []

            def at_go() -> None:
                cpu.append(process_cpu_s(daemon.proc.pid) or 0.0)
                looks.append(daemon.application())

            result = run_app(paths, duration_s, at_go)
            used_s = (process_cpu_s(daemon.proc.pid) or 0.0) - cpu[0]
            end = daemon.application()
            result["smoosh_cpu_pct"] = 100.0 * used_s / duration_s
            for key in ("looks_locked", "looks_lockless"):
                result[key] = float(end.get(key, 0) - looks[0].get(key, 0))
            return result
        finally:
            daemon.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__ or "", argv)
    duration_s = QUICK_DURATION_S if args.quick else DURATION_S
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    for r in range(args.runs):
        order = MODES[r % len(MODES):] + MODES[:r % len(MODES)]  # each mode first in turn
        for mode in order:
            runs[mode].append(one_run(mode, duration_s))

    def col(mode: str, key: str) -> list[float]:
        return [run[key] for run in runs[mode]]

    def paired(mode: str) -> list[float]:
        return [w["cpu_us"] / n["cpu_us"] for w, n in zip(runs[mode], runs["none"])]

    metrics: list[Metric] = []
    for mode in MODES:
        name = MODE_NAMES[mode]
        metrics += [
            Metric(f"application CPU per transaction, {name}", "us", col(mode, "cpu_us"), higher_is_better=False),
            Metric(f"application transactions, {name}", "/s", col(mode, "per_s")),
            Metric(f"application COMMIT p50, {name}", "ms", col(mode, "p50_ms"), higher_is_better=False),
            Metric(f"application COMMIT p99, {name}", "ms", col(mode, "p99_ms"), higher_is_better=False),
        ]
    metrics += [
        Metric("application CPU per transaction beside the bare reader, over the same round alone", "x",
               paired("reader"), higher_is_better=False),
        # What the kernel charges the application for queueing its events to any watcher is the
        # bare reader's figure; smoosh's budget is to add nothing beyond it that a run can show.
        Metric("application CPU per transaction beside smoosh watching, over the same round alone", "x",
               paired("smoosh"), higher_is_better=False,
               budget=statistics.median(paired("reader")) + WITHIN_X,
               budget_text=f"<= the bare reader's + {WITHIN_X:g}"),
        Metric("smoosh's CPU while the application runs (share of one core)", "%", col("smoosh", "smoosh_cpu_pct"),
               higher_is_better=False),
        Metric("smoosh's looks at the databases with a SQLite lock, during the run", "", col("smoosh", "looks_locked"),
               higher_is_better=False, budget=0.0, budget_text="0"),
        Metric("smoosh's looks without a lock (a plain read of the header)", "", col("smoosh", "looks_lockless"),
               higher_is_better=False),
    ]
    report("watch_cost", "What watching costs an application's transactions", metrics, args, notes=[
        f"the application: one process, stdlib sqlite3 at its defaults (rollback journal, deferred BEGIN, 5 s busy "
        f"timeout), a SELECT then an UPDATE of one row and COMMIT, as fast as it can for {duration_s:g} s, over "
        f"{TENANTS} tenant databases of {ROWS} rows in one directory in turn; a fresh fleet per run.",
        "modes alternate round by round, each first in turn; the ratios are pair by pair (a run beside a watcher "
        "over the same round's run alone).",
        f"smoosh: `smoosh run` on this checkout, every default channel at concurrency = 0, its other keys at their "
        f"defaults (the log in JSON); measured from {SETTLE_S:g} s after it answers (its start-up look is over), over the "
        "application's run, as are its looks.",
        "the bare reader asks the kernel for the events smoosh asks for on the directory and reads them once a "
        "second.",
    ])
    return 0


if __name__ == "__main__":
    sys.exit(main())
