"""An idle daemon's cost (DESIGN §9: under 0.1% of a core, about a dozen threads), as a user
meets it: `smoosh run` at its defaults watching a fleet of 1,000 databases that nobody writes,
alone and scraped by Prometheus every 15 seconds (``GET /metrics``, what the shipped rules and
dashboard read).

The daemon is started on the defaults (the SQLite job store in its state directory, the
channels of a config with nothing but its paths), its start-up scan and start-up pause let pass
(:data:`WARMUP_S`), then its CPU is read from ``/proc/PID/stat`` (every thread's, those that
ended included) over a window of :data:`WINDOW_S` without scrapes and one with them, in turn.
The bare alternative a user would otherwise run, a timer that vacuums now and then, costs
nothing between its runs: the budget is the comparison. ``--quick``: 100 databases, 10-second
windows.
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

from bench._daemon import Daemon, free_port, process_cpu_s  # noqa: E402
from bench._fixtures import SMALL_DB_ROWS, clone_fleet, make_bloated_db  # noqa: E402
from bench._harness import Metric, parse_args, repeat, report  # noqa: E402

#: Seconds from the daemon's first answer to the first window: its start-up scan, the
#: examination of every database it found, and the channels' start-up pause (30 s by default).
WARMUP_S = 40.0
#: Seconds of each window (0.1% of a core is 12 of /proc's 10 ms ticks in it).
WINDOW_S = 120.0
#: Seconds between two looks at the daemon's CPU count while a window waits for its next tick.
EDGE_POLL_S = 0.05
#: Longest wait for that tick (seconds): a daemon using no CPU at all has none to wait for.
EDGE_TIMEOUT_S = 60.0
#: Seconds between two scrapes in the scraped window (a common Prometheus scrape_interval).
SCRAPE_EVERY_S = 15.0
#: The budget: CPU milliseconds per second (0.1% of one core).
BUDGET_MS_PER_S = 1.0
#: DESIGN §9's "about a dozen threads" (tests/ops/test_idle.py asserts it too).
THREADS_BUDGET = 12


def threads(pid: int) -> int:
    """How many threads process ``pid`` runs now."""
    return len(os.listdir(f"/proc/{pid}/task"))


def window(daemon: Daemon, seconds: float, scrape_every_s: float | None) -> tuple[float, int]:
    """The daemon's CPU over about ``seconds`` (ms per second: 1 is 0.1% of a core) and the scrapes made in it.

    ``/proc`` gives a process's CPU in whole 10 ms ticks, floored from the kernel's exact count:
    a window read at arbitrary moments would be off by up to a tick at each end (an idle daemon
    spends about one in ten seconds). So the window starts and ends where the count steps to its
    next tick, found by looking every :data:`EDGE_POLL_S`; the scrapes go on meanwhile.
    """
    pid = daemon.proc.pid
    t0, cpu0 = _next_tick(pid, time.monotonic() + EDGE_TIMEOUT_S)
    scrapes = 0
    end_cpu: float | None = None
    while True:
        now = time.monotonic()
        elapsed = now - t0
        if scrape_every_s is not None and elapsed >= scrapes * scrape_every_s:
            status, _ = daemon.get("/metrics")
            if status != 200:
                raise RuntimeError(f"GET /metrics answered {status}")
            scrapes += 1
            continue
        if elapsed >= seconds:
            cpu = _cpu(pid)
            if end_cpu is None:
                end_cpu = cpu
            elif cpu != end_cpu or elapsed >= seconds + EDGE_TIMEOUT_S:
                return (cpu - cpu0) / elapsed * 1000.0, scrapes
            time.sleep(EDGE_POLL_S)
            continue
        next_scrape_s = scrapes * scrape_every_s if scrape_every_s is not None else seconds
        time.sleep(max(0.0, min(seconds, next_scrape_s) - elapsed))


def _cpu(pid: int) -> float:
    cpu = process_cpu_s(pid)
    if cpu is None:
        raise RuntimeError("no CPU figures for the daemon (not Linux?)")
    return cpu


def _next_tick(pid: int, deadline: float) -> tuple[float, float]:
    """When process ``pid``'s CPU count steps to its next tick (or ``deadline``), and the count then."""
    before = _cpu(pid)
    while True:
        now, cpu = time.monotonic(), _cpu(pid)
        if cpu != before or now >= deadline:
            return now, cpu
        time.sleep(EDGE_POLL_S)


def one_run(template: str, count: int, warmup_s: float, window_s: float) -> dict[str, float]:
    base = Path(tempfile.mkdtemp(prefix="smoosh-bench-idle-"))
    try:
        dbs = base / "dbs"
        clone_fleet(template, str(dbs), count)
        port = free_port()
        (base / "smoosh.ini").write_text(
            f"[smoosh]\nstate_dir = {base / 'state'}\nwatch = {dbs}\nhttp = 127.0.0.1:{port}\nnode = bench\n")
        daemon = Daemon(base / "smoosh.ini", port)
        try:
            daemon.wait_ready()
            time.sleep(warmup_s)
            daemon.get("/metrics")  # the first scrape builds the registry: Prometheus's came long ago
            alone, _ = window(daemon, window_s, None)
            scraped, scrapes = window(daemon, window_s, SCRAPE_EVERY_S)
            # The scrape itself, many times over: what each of the window's scrapes cost.
            cpu0 = _cpu(daemon.proc.pid)
            for _ in range(50):
                daemon.get("/metrics")
            per_scrape_ms = (_cpu(daemon.proc.pid) - cpu0) / 50 * 1000.0
            return {"alone": alone, "scraped": scraped, "scrapes": float(scrapes),
                    "threads": float(threads(daemon.proc.pid)), "scrape_ms": per_scrape_ms}
        finally:
            daemon.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv, default_runs=1)
    count, warmup_s, window_s = (100, WARMUP_S, 10.0) if args.quick else (1000, WARMUP_S, WINDOW_S)
    work = Path(tempfile.mkdtemp(prefix="smoosh-bench-idle-t-"))
    try:
        template = str(work / "compact.sqlite")
        make_bloated_db(template, rows=SMALL_DB_ROWS, row_bytes=400, delete_fraction=0.0)
        res = repeat(lambda: one_run(template, count, warmup_s, window_s), args.runs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    budget = f"< {BUDGET_MS_PER_S:.0f} ms/s (0.1% of a core)"
    metrics = [
        Metric(f"idle daemon CPU, {count:,} databases watched, nobody scraping", "ms/s", res["alone"],
               higher_is_better=False, budget=BUDGET_MS_PER_S, budget_text=budget),
        Metric(f"idle daemon CPU, {count:,} databases watched, scraped every {SCRAPE_EVERY_S:.0f} s",
               "ms/s", res["scraped"], higher_is_better=False, budget=BUDGET_MS_PER_S, budget_text=budget),
        Metric("threads of the idle daemon", "", res["threads"], higher_is_better=False,
               budget=THREADS_BUDGET, budget_text=f"<= {THREADS_BUDGET}"),
        Metric("CPU per scrape of GET /metrics (idle)", "ms", res["scrape_ms"], higher_is_better=False),
    ]
    notes = [
        f"`smoosh run` with a config naming only its state directory, its watched directory, its HTTP "
        f"address and its node (every other key at its default); {count:,} compact databases nobody "
        f"writes; {warmup_s:.0f} s after its first answer, then {window_s:.0f} s without scrapes and "
        f"{window_s:.0f} s with a GET /metrics every {SCRAPE_EVERY_S:.0f} s; CPU = user + system of the "
        "whole process from /proc, each window from one step of its 10 ms tick count to another, in ms a "
        "second of the window (1 ms/s is 0.1% of a core).",
        "The bare alternative (a timer that vacuums now and then) costs nothing between its runs.",
    ]
    report("idle", "An idle daemon: its CPU alone and scraped, its threads", metrics, args, notes,
           command="python -m bench.idle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
