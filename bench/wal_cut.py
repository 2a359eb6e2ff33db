"""After compacting a WAL database in use: how long its application waits while smoosh cuts the log (issue 27).

A VACUUM of a WAL database leaves the whole new database in its log, so the space comes back
only when the log is emptied and the ``-wal`` cut. Where the file system discards what it
frees (ext4 mounted with ``discard``, as cloud disks often are), cutting a file holds the
application's writers in proportion to its size. Measured on fresh copies of a ~200 MB WAL
database with half of its rows deleted, an application committing every 5 ms beside it
(``bench/_app_writer.py``: ``BEGIN IMMEDIATE``, busy timeout 5 s), the compactor run in this
process, in one run each:

* **steps**: smoosh's cut (``cut_wal``: at most 8 MiB off the file per hold of the writers);
* **whole file**: the same with one step as large as the file, which holds the writers as
  long as a ``TRUNCATE`` does.

Reported for each: the application's longest commit among those begun in the phase after the
VACUUM (smoosh's checkpoints and cut, from ``copy_back`` to the end of
``truncate_after_compaction``; the VACUUM's own hold, bounded by ``max_lock_hold``, is before
it), how long that phase took,
and the ``-wal`` left. DESIGN §9's aim: no application commit stalled over 100 ms by a
checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._fixtures import NullContext, make_bloated_db  # noqa: E402
from bench._harness import REPO_ROOT, Metric, parse_args, repeat, report  # noqa: E402

#: Rows of 400 bytes in the database (about 200 MB), and the fraction deleted.
ROWS, QUICK_ROWS = 400_000, 20_000
DELETE_FRACTION = 0.5
#: The application's commits per second, and its busy timeout (Python's default).
APP_RATE_PER_S = 200.0
APP_BUSY_TIMEOUT_S = 5.0
#: Seconds the application runs: long enough for the compaction and its cut.
APP_RUN_S = 8.0
#: A step as large as any file: the whole file cut in one hold.
WHOLE_FILE = 1 << 62


def run_once(template: str, work: str, step_bytes: int) -> dict[str, float]:
    """Compact a fresh copy of ``template`` beside the application, cutting in ``step_bytes``."""
    from smoosh.compactors import SqliteCompactor, sqlite_wal
    from smoosh.config.sections import SqliteConfig

    db = os.path.join(work, "app.db")
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(db + suffix):
            os.remove(db + suffix)
    shutil.copyfile(template, db)
    app = subprocess.Popen(
        [sys.executable, "-m", "bench._app_writer", db, str(APP_RUN_S), str(APP_RATE_PER_S), str(APP_BUSY_TIMEOUT_S)],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True,
    )
    assert app.stdout is not None
    assert app.stdout.readline().strip() == "ready"
    time.sleep(0.3)  # the application under way
    # From the first copy back's start (the passive checkpoint run first thing after the VACUUM;
    # the cut's own checkpoints call it again) to the cut's end.
    starts: list[float] = []
    ends: list[float] = []
    copy_back, cut = sqlite_wal.copy_back, sqlite_wal.truncate_after_compaction

    def timed_copy_back(*args: Any, **kwargs: Any) -> list[Any]:
        starts.append(time.monotonic())
        return copy_back(*args, **kwargs)

    def timed_cut(*args: Any, **kwargs: Any) -> None:
        try:
            cut(*args, **kwargs)
        finally:
            ends.append(time.monotonic())

    saved_step = sqlite_wal.CUT_STEP_BYTES
    sqlite_wal.copy_back, sqlite_wal.truncate_after_compaction = timed_copy_back, timed_cut
    sqlite_wal.CUT_STEP_BYTES = step_bytes
    try:
        result = SqliteCompactor(SqliteConfig()).compact(db, NullContext())
    finally:
        sqlite_wal.copy_back, sqlite_wal.truncate_after_compaction = copy_back, cut
        sqlite_wal.CUT_STEP_BYTES = saved_step
    wal_left = os.path.getsize(db + "-wal") if os.path.exists(db + "-wal") else 0
    out, _ = app.communicate(timeout=APP_RUN_S + 60)
    data = json.loads(out.strip().splitlines()[-1])
    if data["errors"]:
        raise RuntimeError(f"the application saw errors: {data['errors'][:3]}")
    if not starts or len(ends) != 1:
        raise RuntimeError(f"the compaction ran {len(starts)} copy backs and {len(ends)} cuts: expected one cut after them")
    begin, end = starts[0], ends[0]
    # Commits begun in the phase: one begun earlier may have waited for the VACUUM's own hold.
    overlapping = [lat for start, lat in data["commits"] if begin <= start < end]
    return {
        "worst_ms": max(overlapping, default=0.0) * 1000,
        "phase_s": end - begin,
        "wal_left_mb": wal_left / 1e6,
        "reclaimed_mb": result.reclaimed_bytes / 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    from smoosh.compactors import sqlite_wal

    args = parse_args(__doc__, argv)
    rows = QUICK_ROWS if args.quick else ROWS
    work = tempfile.mkdtemp(prefix="smoosh-bench-walcut-")
    try:
        template = os.path.join(work, "template.db")
        make_bloated_db(template, rows=rows, row_bytes=400, delete_fraction=DELETE_FRACTION, journal_mode="wal")
        size_mb = os.path.getsize(template) / 1e6

        def one() -> dict[str, float]:
            # Each way right after the other, so that a change in the disk's speed falls on both.
            r: dict[str, float] = {}
            for name, step in (("steps", sqlite_wal.CUT_STEP_BYTES), ("whole", WHOLE_FILE)):
                for key, value in run_once(template, work, step).items():
                    r[f"{name}_{key}"] = value
            return r

        res = repeat(one, args.runs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {k: sorted(v)[len(v) // 2] for k, v in res.items()}
    metrics = [
        Metric("longest application commit while smoosh cuts the log, in steps", "ms", res["steps_worst_ms"],
               higher_is_better=False, budget=100.0, reference=med["whole_worst_ms"], reference_name="the whole file at once",
               note="commits every 5 ms, BEGIN IMMEDIATE, begun in the phase; the VACUUM's own hold (max_lock_hold) is before it"),
        Metric("longest application commit while smoosh cuts the whole file at once", "ms", res["whole_worst_ms"],
               higher_is_better=False, note="as a TRUNCATE holds the writers"),
        Metric("checkpoint and cut after the VACUUM, in steps", "s", res["steps_phase_s"], higher_is_better=False,
               reference=med["whole_phase_s"], reference_name="the whole file at once"),
        Metric("-wal left, in steps", "MB", res["steps_wal_left_mb"], higher_is_better=False),
        Metric("-wal left, the whole file at once", "MB", res["whole_wal_left_mb"], higher_is_better=False),
        Metric("reclaimed, in steps", "MB", res["steps_reclaimed_mb"]),
    ]
    notes = [f"A {size_mb:.0f} MB WAL database, {DELETE_FRACTION:.0%} of its {rows:,} rows of 400 bytes deleted; "
             f"fresh copy per run; the compactor in this process with the default [smoosh.sqlite] settings."]
    report("wal_cut", "The cut after a WAL compaction: the application's longest commit", metrics, args, notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
