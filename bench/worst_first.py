"""Worst first: how soon a skewed fleet gets most of its space back (DESIGN §9, issue 27).

A fleet as a database-per-tenant service has it: many small bloated databases and a few large
ones holding most of the reclaimable bytes. What matters on a filling disk is not when the
last file is done but when most of the space is back. Measured, each on fresh copies:

* **bare loop, best order**: one process VACUUMs the files with the most reclaimable bytes
  first (it knows them: file size minus the live size ``dbstat`` reports). The time at which
  90% of the fleet's reclaimable bytes are back is the reference.
* **smoosh, default config**: ``smoosh run`` over the same fleet (in place before it starts,
  so its start-up scan finds them), timed from its first answer on ``/status``; the fleet's
  footprint is sampled every few milliseconds, and the time at which 90% is back is read off.
  Budget: at most 1.0x the bare loop's.
* **smoosh under disk pressure**: the same, with ``disk_pressure`` set below the disk's use,
  so every database is taken worst-first by reclaimable bytes (issue 27).

The daemon runs with ``min_size = 0``, ``wait_secs = 0`` and ``staleness = 0``, as the drain
benchmark does; everything else is the default.
"""

from __future__ import annotations

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
from bench.drain import BARE_LOOP  # noqa: E402
from bench._fixtures import make_bloated_db  # noqa: E402
from bench._harness import Metric, parse_args, report  # noqa: E402
from smoosh.daemon.watch.scan import SETTLE_S  # noqa: E402

#: (copies, rows of 400 bytes, fraction deleted): many small tenants with most of their pages
#: free, a few big ones with less of theirs free but most of the fleet's reclaimable bytes.
FLEET = [(150, 400, 0.8), (4, 60_000, 0.5)]
QUICK_FLEET = [(40, 400, 0.8), (2, 15_000, 0.5)]
#: The share of the fleet's reclaimable bytes whose recovery is timed.
SHARE = 0.9
#: Seconds between two samples of the fleet's footprint.
SAMPLE_S = 0.005
#: Seconds a run may take.
TIMEOUT_S = 600.0

#: The drain benchmark's bare loop, VACUUMing its arguments in the order given.
BEST_ORDER_LOOP = BARE_LOOP


def _fleet(base: Path, shape: list[tuple[int, int, float]]) -> list[str]:
    templates = base / "templates"
    templates.mkdir(parents=True, exist_ok=True)
    (base / "dbs").mkdir()
    paths = []
    for n, (copies, rows, dead) in enumerate(shape):
        template = str(templates / f"t{n}.db")
        make_bloated_db(template, rows=rows, row_bytes=400, delete_fraction=dead, journal_mode="delete")
        for i in range(copies):
            path = str(base / "dbs" / f"s{n}-{i:04d}.db")
            shutil.copyfile(template, path)
            paths.append(path)
    os.sync()
    time.sleep(SETTLE_S + 0.5)  # written long before, as a real fleet is (see bench.drain.copies)
    return paths


def _footprint(paths: list[str]) -> int:
    total = 0
    for p in paths:
        for suffix in ("", "-wal"):
            try:
                total += os.stat(p + suffix).st_size
            except OSError:
                pass
    return total


def _reclaimable(path: str) -> int:
    c = sqlite3.connect(path)
    try:
        live = c.execute("SELECT coalesce(sum(pgsize - unused), 0) FROM dbstat").fetchone()[0]
    except sqlite3.OperationalError:  # no dbstat in this SQLite: the free pages alone
        page_size = c.execute("PRAGMA page_size").fetchone()[0]
        live = (c.execute("PRAGMA page_count").fetchone()[0] - c.execute("PRAGMA freelist_count").fetchone()[0]) * page_size
    finally:
        c.close()
    return max(0, os.path.getsize(path) - int(live))


class _Sampler:
    """Samples the fleet's footprint on a thread: the time at which it fell to ``target`` bytes."""

    def __init__(self, paths: list[str], target: int) -> None:
        self.paths, self.target = paths, target
        self.reached: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self, t0: float) -> None:
        self.t0 = t0
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if _footprint(self.paths) <= self.target:
                self.reached = time.perf_counter() - self.t0
                return
            time.sleep(SAMPLE_S)

    def wait(self, timeout_s: float) -> float:
        self._thread.join(timeout_s)
        self._stop.set()
        if self.reached is None:
            raise RuntimeError(f"{SHARE:.0%} of the reclaimable bytes not back within {timeout_s:.0f} s")
        return self.reached


def bare_best_order(shape: list[tuple[int, int, float]]) -> float:
    """Seconds until 90% of the reclaimable bytes are back, VACUUMing the most reclaimable first."""
    base = Path(tempfile.mkdtemp(prefix="smoosh-bench-worst-"))
    try:
        paths = _fleet(base, shape)
        gains = {p: _reclaimable(p) for p in paths}
        ordered = sorted(paths, key=lambda p: gains[p], reverse=True)
        sampler = _Sampler(paths, _footprint(paths) - int(SHARE * sum(gains.values())))
        proc = subprocess.Popen([sys.executable, "-c", BEST_ORDER_LOOP, *ordered], stdout=subprocess.PIPE, text=True)
        sampler.start(time.perf_counter())
        reached = sampler.wait(TIMEOUT_S)
        proc.wait()
        return reached
    finally:
        shutil.rmtree(base, ignore_errors=True)


def daemon_run(shape: list[tuple[int, int, float]], extra: str = "") -> float:
    """Seconds from ``smoosh run``'s first answer until 90% of the reclaimable bytes are back."""
    base = Path(tempfile.mkdtemp(prefix="smoosh-bench-worst-"))
    try:
        paths = _fleet(base, shape)
        gains = sum(_reclaimable(p) for p in paths)
        (base / "state").mkdir()
        port = free_port()
        config = base / "smoosh.ini"
        config.write_text(f"""[smoosh]
watch = {base / 'dbs'}
state_dir = {base / 'state'}
store = sqlite:{base / 'state' / 'jobs.db'}
node = bench
http = 127.0.0.1:{port}
wait_secs = 0
staleness = 0
{extra}
[smoosh.ratio_dbs]
min_size = 0

[smoosh.slack_dbs]
min_size = 0
""")
        sampler = _Sampler(paths, _footprint(paths) - int(SHARE * gains))
        daemon = Daemon(config, port)
        try:
            daemon.wait_ready()
            sampler.start(time.perf_counter())
            return sampler.wait(TIMEOUT_S)
        finally:
            daemon.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__ or "", argv)
    shape = QUICK_FLEET if args.quick else FLEET
    bare, smoosh = [], []
    pressured = []
    for _ in range(args.runs):
        bare.append(bare_best_order(shape))
        smoosh.append(daemon_run(shape))
        pressured.append(daemon_run(shape, "disk_pressure = 1%"))
    copies = sum(n for n, _r, _d in shape)
    reference = sorted(bare)[len(bare) // 2]
    metrics = [
        Metric("bare loop, most reclaimable first", "s", bare, higher_is_better=False),
        Metric("smoosh, default config", "s", smoosh, higher_is_better=False, budget=reference,
               budget_text="<= 1.0x the bare loop", reference=reference, reference_name="bare best order"),
        Metric("smoosh, under disk pressure (disk_pressure = 1%)", "s", pressured, higher_is_better=False,
               budget=reference, budget_text="<= 1.0x the bare loop", reference=reference,
               reference_name="bare best order"),
    ]
    report("worst_first", f"Worst first: time until {SHARE:.0%} of a skewed fleet's reclaimable bytes are back",
           metrics, args, notes=[
               f"The fleet: {', '.join(f'{n} x {r * 400 // 1000} KB of rows, {d:.0%} deleted' for n, r, d in shape)} "
               f"({copies} databases); most of the reclaimable bytes are in the few large ones.",
               "Each run on fresh copies; the daemon's time starts when it answers /status, the loop's at its first "
               "VACUUM; both end when the fleet's footprint (files and WALs, sampled every 5 ms) has given back "
               f"{SHARE:.0%} of what dbstat said was reclaimable.",
           ])
    return 0


if __name__ == "__main__":
    sys.exit(main())
