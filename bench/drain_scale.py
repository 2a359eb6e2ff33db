"""A fleet of 100,000 small databases drained end to end, beside the same drain of 1,000 (DESIGN §9).

The budget (issue 48): 100,000 small databases in one directory drain at no worse a time per
database than 1,000 do, and the daemon stays under 300 MB RSS meanwhile. From it, the purge of
a million tenants is projected (its time per database, a million times; RSS is not projected:
the daemon's memory bench measures a million databases watched).

Each drain: ``--files`` copies (100,000 by default) of one small bloated database (~30 KiB, 80%
of its rows deleted: a tenant that had a few rows) in one watched directory, in place before the
daemon starts; ``smoosh run`` (a subprocess, the embedded SQLite job store) on the drain
benchmark's config (``min_size = 0``, ``wait_secs = 0``, ``staleness = 0``) with the ratio
channel's ``capacity`` raised to hold the whole fleet (an operator with such a fleet sets it so;
at the default 9,999 the queue evicts the rest until the next rescan), timed from its first
answer to ``GET /status`` until ``/metrics`` counts every file compacted ok. Its RSS is read
every poll (``VmRSS``), and its peak (``VmHWM``) at the end.

Long (ten minutes and more): it runs once unless ``--runs`` says otherwise.
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
from bench._fixtures import make_bloated_db  # noqa: E402
from bench._harness import Metric, parse_args, repeat, report  # noqa: E402
from bench.drain import compacted_ok, config_text, copies, last_finish_wall  # noqa: E402

#: Rows of 400 bytes in the template: a ~30 KiB file.
TEMPLATE_ROWS = 40
#: The fleets drained: the small one the drain benchmark measures, and the large one.
SMALL, LARGE = 1_000, 100_000
#: A drain this long is declared failed (seconds).
DRAIN_TIMEOUT_S = 3 * 3600.0
#: Seconds between two looks at the daemon's counters. Each look sums the reclaimable bytes of
#: the whole queue; the drain's end is read from the daemon's own record, not from when a look
#: noticed it, so a rarer look costs the timing nothing.
POLL_S = 2.0
#: A million tenants, for the projection.
MILLION = 1_000_000


def memory_kb(pid: int) -> tuple[int, int]:
    """``(VmRSS, VmHWM)`` of process ``pid`` in KiB (0, 0 off Linux)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        return 0, 0
    return int(fields.get("VmRSS", "0 kB").split()[0]), int(fields.get("VmHWM", "0 kB").split()[0])


def drain(template: str, count: int) -> tuple[float, float | None, int]:
    """Seconds ``smoosh run`` takes to compact ``count`` copies, its CPU seconds meanwhile, and its
    peak RSS (KiB)."""
    base = Path(tempfile.mkdtemp(prefix="smoosh-bench-scale-"))
    try:
        copies(template, base / "dbs", count)
        (base / "state").mkdir()
        port = free_port()
        config = base / "smoosh.ini"
        text = config_text(base, 1, port)
        config.write_text(text.replace("concurrency = 1\n", f"concurrency = 1\ncapacity = {count + 1}\n", 1))
        daemon = Daemon(config, port)
        try:
            daemon.wait_ready()
            pid = daemon.proc.pid
            t0_wall, t0 = time.time(), time.perf_counter()
            cpu0 = process_cpu_s(pid)
            peak = 0
            deadline = t0 + DRAIN_TIMEOUT_S
            while compacted_ok(daemon) < count:
                if time.perf_counter() > deadline:
                    raise RuntimeError(f"drain of {count} files did not finish in {DRAIN_TIMEOUT_S:.0f} s")
                time.sleep(POLL_S)
                peak = max(peak, memory_kb(pid)[0])
            cpu1 = process_cpu_s(pid)
            peak = max(peak, memory_kb(pid)[1])
            end_wall = last_finish_wall(daemon)
            seconds = end_wall - t0_wall if end_wall is not None else time.perf_counter() - t0
            return seconds, (cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None), peak
        finally:
            daemon.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv, extra=lambda p: p.add_argument("--files", type=int, default=None), default_runs=1)
    large = args.files or (10_000 if args.quick else LARGE)
    d = tempfile.mkdtemp(prefix="smoosh-bench-tpl-")
    try:
        template = os.path.join(d, "tenant.db")
        size = make_bloated_db(template, rows=TEMPLATE_ROWS, row_bytes=400, delete_fraction=0.8)

        def one() -> dict[str, float]:
            out: dict[str, float] = {}
            for name, count in (("small", SMALL), ("large", large)):
                seconds, cpu_s, peak_kb = drain(template, count)
                out[name + "_ms"] = seconds * 1000 / count
                out[name + "_rss"] = peak_kb / 1024
                if cpu_s is not None:
                    out[name + "_cpu_ms"] = cpu_s * 1000 / count
            return out

        res = repeat(one, args.runs)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    small_ms = sorted(res["small_ms"])[len(res["small_ms"]) // 2]
    metrics = [
        Metric(f"time per database, {SMALL:,} databases", "ms", res["small_ms"], higher_is_better=False),
        Metric(f"time per database, {large:,} databases", "ms", res["large_ms"], higher_is_better=False,
               budget=small_ms, budget_text=f"<= {SMALL:,} databases' ({small_ms:.2f} ms)", reference=small_ms,
               reference_name=f"{SMALL:,} databases"),
        Metric(f"daemon peak RSS (VmHWM), {large:,} databases", "MB", [v * 1.048576 for v in res["large_rss"]],
               higher_is_better=False, budget=300, budget_text="< 300 MB"),
        Metric(f"daemon peak RSS (VmHWM), {SMALL:,} databases", "MB", [v * 1.048576 for v in res["small_rss"]],
               higher_is_better=False),
        Metric("a million tenants purged, projected from the large fleet's time per database", "h",
               [v * MILLION / 1000 / 3600 for v in res["large_ms"]], higher_is_better=False),
    ]
    if "large_cpu_ms" in res:
        metrics += [
            Metric(f"daemon CPU per database, {SMALL:,} databases", "ms", res["small_cpu_ms"], higher_is_better=False),
            Metric(f"daemon CPU per database, {large:,} databases", "ms", res["large_cpu_ms"], higher_is_better=False),
        ]
    notes = [
        f"copies of a {size / 1024:.0f} KiB database with 80% of its rows deleted, in one watched directory, in place "
        "before the daemon starts; smoosh run with min_size = 0, wait_secs = 0, staleness = 0 and the ratio channel's "
        "capacity above the fleet's size; default config otherwise (one slot, batches on).",
        "MB = 10^6 bytes; the projection is the large fleet's time per database times a million, one slot, this disk.",
    ]
    report("drain_scale", "A fleet of 100,000 small databases drained, beside 1,000", metrics, args, notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
