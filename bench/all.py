"""Run every benchmark in turn (what `make bench` runs); each rewrites its section of RESULTS.md.

Then ``bench.summary`` rewrites the budgets at a glance from those sections and draws the plots of
the docs' benchmarks page (``bench.plots``, under docs/images/). A ``--quick`` run writes nothing,
so it skips that too.

Usage: python -m bench.all [--quick] [--runs N]   (options are passed to every benchmark)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._harness import REPO_ROOT  # noqa: E402

#: The benchmarks, cheapest first; `make bench` gives them modest run counts.
BENCHMARKS = [
    ("enqueue", ["--runs", "3"]),
    ("queue", ["--runs", "3"]),
    ("checkpoint", ["--runs", "3"]),
    ("compaction", ["--runs", "3"]),
    ("open_check", ["--runs", "5"]),
    ("rename_window", ["--runs", "3"]),
    ("jobs", ["--runs", "3"]),
    ("http_enqueue", ["--runs", "3"]),
    ("daemon_rss", ["--runs", "1"]),
    ("idle", ["--runs", "1"]),
    ("drain", ["--runs", "3"]),
    ("drain_scale", ["--runs", "1"]),
    ("worst_first", ["--runs", "3"]),
    ("wal_bound", ["--runs", "1"]),
    ("wal_cut", ["--runs", "3"]),
    ("writer", ["--runs", "3"]),
    ("watch_cost", ["--runs", "5"]),
    ("fleet", ["--runs", "1"]),
]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    failed = []
    for name, default_args in BENCHMARKS:
        args = argv if ("--runs" in argv or "--quick" in argv) else default_args
        t0 = time.monotonic()
        print(f"=== bench.{name} {' '.join(args)}", flush=True)
        rc = subprocess.call([sys.executable, "-m", f"bench.{name}", *args], cwd=REPO_ROOT)
        print(f"=== bench.{name}: exit {rc} in {time.monotonic() - t0:.0f} s", flush=True)
        if rc:
            failed.append(name)
    if "--quick" not in argv and "--no-write" not in argv:
        print("=== bench.summary", flush=True)
        if subprocess.call([sys.executable, "-m", "bench.summary"], cwd=REPO_ROOT):
            failed.append("summary")
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
