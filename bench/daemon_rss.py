"""RSS of `smoosh run` watching a fleet (DESIGN §9): 100,000 databases with 10,000 queued
under 300 MB; with ``--scale``, 1,000,000 databases: the start-up scan within 60 s and RSS
under 1 GB.

The fleet is made by copying two template files (seconds instead of minutes of SQLite
work): 10% are bloated (60% of rows deleted: priority > 0, so they get queued), 90% are
compact (priority 0: examined, not queued). The daemon (SQLite job store, channels paused)
scans the tree at start-up; once the queues hold every bloated file and stay put, its
``VmRSS`` and peak ``VmHWM`` are read from ``/proc/PID/status``. Reported: the scan (the walk
that finds every database and hands it to the debouncer, from ``/status`` ``scan``) and the
time until every database has been examined and the queues settle. ``--quick`` uses 10,000
files. ``--scale`` needs ~35 GB free in the temp directory and ~10 minutes; it is not part
of ``make bench``.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._daemon import Daemon, free_port  # noqa: E402
from bench._fixtures import SMALL_DB_ROWS, SMALL_MIN_SIZE, clone_fleet, config_text, make_bloated_db  # noqa: E402
from bench._harness import Metric, parse_args, repeat, report, rss_bytes  # noqa: E402

MB = 1_000_000
#: Seconds the start-up scan may take before the run fails.
SCAN_TIMEOUT_S = 1800.0
#: The queue size must hold still this long before RSS is read.
SETTLE_S = 3.0


def one_run(work: Path, bloated: str, compact: str, n: int) -> dict[str, float]:
    base = Path(tempfile.mkdtemp(prefix="run-", dir=work))
    dbs = base / "dbs"
    n_queued = n // 10
    t0 = time.perf_counter()
    clone_fleet(bloated, str(dbs / "bloated"), n_queued)
    clone_fleet(compact, str(dbs / "compact"), n - n_queued)
    make_s = time.perf_counter() - t0
    port = free_port()
    text = config_text(base, store=f"sqlite:{base / 'state' / 'jobs.db'}", http=f"127.0.0.1:{port}",
                       watch=str(dbs), min_size=SMALL_MIN_SIZE)
    text = text.replace("[smoosh.ratio_dbs]\n", "[smoosh.ratio_dbs]\ncapacity = 100000\n")
    # Only the bloated tenth qualifies: the slack channel must not take the compact files.
    text = text.replace(f"min_priority = {SMALL_MIN_SIZE}", "min_priority = 1GiB")
    (base / "smoosh.ini").write_text(text)
    daemon = Daemon(base / "smoosh.ini", port)
    try:
        t0 = time.perf_counter()
        daemon.wait_ready(SCAN_TIMEOUT_S)
        deadline = time.monotonic() + SCAN_TIMEOUT_S
        last, since = -1, time.monotonic()
        while True:
            waiting = daemon.waiting()
            if waiting != last:
                last, since = waiting, time.monotonic()
            elif waiting >= n_queued and time.monotonic() - since >= SETTLE_S:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {waiting} of {n_queued} keys queued after the scan")
            time.sleep(0.25)
        settle_s = time.perf_counter() - t0 - SETTLE_S
        _, status = daemon.request("GET", "/status")
        return {
            "rss": rss_bytes(daemon.proc.pid) / MB,
            "hwm": hwm_bytes(daemon.proc.pid) / MB,
            "queued": float(waiting),
            "walk_s": float(status["scan"]["duration_s"]),
            "settle_s": settle_s,
            "make_s": make_s,
        }
    finally:
        daemon.stop()
        shutil.rmtree(base, ignore_errors=True)


def hwm_bytes(pid: int) -> int:
    """Peak resident set size of a process (VmHWM)."""
    with open(f"/proc/{pid}/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv, extra=lambda ap: ap.add_argument(
        "--scale", action="store_true", help="1,000,000 databases (DESIGN §9 scale budget)"))
    n = 10_000 if args.quick else 1_000_000 if args.scale else 100_000
    runs = args.runs if args.runs < 5 else 1  # each run builds a 100k-file tree: keep it short
    work = Path(tempfile.mkdtemp(prefix="smoosh-bench-rss-"))
    try:
        bloated, compact = str(work / "bloated.sqlite"), str(work / "compact.sqlite")
        size_b = make_bloated_db(bloated, rows=SMALL_DB_ROWS, row_bytes=400, journal_mode="wal")
        size_c = make_bloated_db(compact, rows=SMALL_DB_ROWS, row_bytes=400, delete_fraction=0.0, journal_mode="wal")
        res = repeat(lambda: one_run(work, bloated, compact, n), runs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.runs = runs
    rss_budget, walk_budget = (1000, 60) if args.scale else (300, None)
    metrics = [
        Metric(f"daemon RSS, {n:,} databases, {n // 10:,} queued", "MB", res["rss"], higher_is_better=False,
               budget=rss_budget, budget_text=f"< {rss_budget} MB"),
        Metric("peak RSS (VmHWM)", "MB", res["hwm"], higher_is_better=False,
               budget=rss_budget, budget_text=f"< {rss_budget} MB"),
        Metric("keys queued after the scan", "", res["queued"]),
        Metric("start-up scan: walk finding every database", "s", res["walk_s"], higher_is_better=False,
               budget=walk_budget, budget_text=f"<= {walk_budget} s" if walk_budget else ""),
        Metric("start-up until every database is examined and the queues settle", "s", res["settle_s"],
               higher_is_better=False),
        Metric("making the fleet (file copies)", "s", res["make_s"], higher_is_better=False),
    ]
    name, title = ("scale", "Scale: daemon over 1,000,000 databases") if args.scale else \
        ("rss", "Memory: daemon watching a fleet")
    notes = [f"templates: bloated {size_b // 1024} KiB, compact {size_c // 1024} KiB; min_size {SMALL_MIN_SIZE}; "
             "RSS = VmRSS of the `smoosh run` process (MB = 10^6 bytes); the walk is the start-up scan "
             "as `/status` `scan.duration_s` reports it."]
    report(name, title, metrics, args, notes, command="python -m bench.daemon_rss" + (" --scale" if args.scale else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
