"""What an application writer feels while smoosh compacts its database (DESIGN §9, §11; issue 16).

An application process (``bench/_app_writer.py``, stdlib ``sqlite3``) commits one small
transaction every 5 ms (200/s) to a ~200 MB WAL database, with a busy timeout of
:data:`WRITER_BUSY_TIMEOUT_S`, while ``SqliteCompactor`` (the daemon's compactor, with the
worker's ``JobContext`` and the process's I/O budget) compacts it in this process, started
:data:`LEAD_S` into the writer's run:

* baseline: the same writer, the same file, no compaction;
* incremental: the ``auto_vacuum = INCREMENTAL`` twin with the defaults (chunks of 1000
  pages, unlimited budget); and again with chunks of :data:`SMALL_CHUNK_PAGES` paced by
  ``max_io_rate`` = :data:`PACED_RATE`; and at the backlog controller's two ends of the pace
  (issue 27): the gentle one it sets when little else waits (a small backlog: the gap after a
  chunk :data:`GAP_FACTOR_GENTLE` times its hold); the defaults' pace is the brisk one it
  sets at ``backlog_full`` (:data:`GAP_FACTOR_BRISK` times, as before the controller);
* full: the in-place ``VACUUM`` path (the file is larger than a VACUUM can rewrite within the
  writer's busy timeout, as DESIGN §11 asks), with the default ``max_lock_hold`` (1 s) and
  with it below the writer's busy timeout (:data:`LOCK_HOLD_BELOW_WRITER_S`), as the docs
  (docs/guides/sharing-the-disk.md) tell an operator to set it.

A compaction still running when the writer's run ends is stopped there (as a worker stops
one) and reported with its progress.

Per scenario: commits, errors, p50/p99/max commit latency (start of ``BEGIN IMMEDIATE`` to the
end of ``COMMIT``) over the commits that started while the compaction ran (the whole run for
the baseline), the compaction's result and duration, and whether it finished within the
writer's run. Budgets (issue 16): incremental adds at most 25 ms to the baseline's p99 and
causes no error; full never makes the writer wait past its own busy timeout and causes no
error (smoosh must give up first). Issue 27: at the small backlog's pace, the writer's p99 is
within 10% of the baseline's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._fixtures import make_bloated_db  # noqa: E402
from bench._harness import REPO_ROOT, Metric, parse_args, percentile, report  # noqa: E402
from smoosh.daemon.control.backlog import GAP_FACTOR_BRISK, GAP_FACTOR_GENTLE  # noqa: E402

#: Commits per second of the application writer.
WRITER_RATE = 200.0
#: The application's busy timeout (seconds): what it waits for a lock before it fails.
WRITER_BUSY_TIMEOUT_S = 0.25
#: How long into the writer's run the compaction starts (seconds): the writer is warm.
LEAD_S = 0.5
#: How long the writer runs (seconds).
WRITER_RUN_S = 6.0
#: Rows (of 400 bytes) of the database: ~226 MB, whose VACUUM outlasts the busy timeout.
ROWS = 450_000
ROW_BYTES = 400
#: ``max_io_rate`` of the paced incremental scenario (bytes/s).
PACED_RATE = 50 * 1024 * 1024
#: ``incremental_chunk_pages`` of the paced incremental scenario.
SMALL_CHUNK_PAGES = 100
#: ``max_lock_hold`` of the second full scenario: below the writer's busy timeout (seconds).
LOCK_HOLD_BELOW_WRITER_S = 0.2
#: smoosh's defaults.
DEFAULT_CHUNK_PAGES = 1000
DEFAULT_MAX_LOCK_HOLD_S = 1.0
#: Added p99 the incremental path may cost the writer (seconds; issue 16).
INCREMENTAL_P99_BUDGET_S = 0.025
#: At the small backlog's pace, the writer's p99 may be this many times the baseline's (issue 27).
SMALL_BACKLOG_P99_RATIO = 1.1


@dataclass
class Scenario:
    name: str
    template: str | None  # None: no compaction
    full: bool = False
    rate: float | None = None
    chunk_pages: int = DEFAULT_CHUNK_PAGES
    max_lock_hold_s: float = DEFAULT_MAX_LOCK_HOLD_S
    #: Judged against the budgets (False: shown for information, e.g. a setting this writer is outside of).
    budgeted: bool = True
    #: The pace set on the budget as the backlog controller would (None: the budget's default).
    gap_factor: float | None = None
    #: Judged against the small backlog's budget (p99 within 10% of the baseline's).
    small_backlog: bool = False


@dataclass
class Result:
    commits: list[tuple[float, float]]
    errors: list[tuple[float, float, str]]
    compaction: dict[str, Any] = field(default_factory=dict)

    def span(self) -> tuple[float, float] | None:
        """When the compaction ran, ``(start, end)`` on the monotonic clock; None without one."""
        start, end = self.compaction.get("start"), self.compaction.get("end")
        if start is None:
            return None
        if end is None:  # the compaction thread sets "end" whenever it set "start"
            raise RuntimeError("the compaction has a start but no end")
        return start, end

    def window(self) -> list[float]:
        """What each commit that started while the compaction ran waited (the whole run without one).

        A commit that failed counts with the time it waited before failing: that is what
        its writer felt.
        """
        span = self.span()
        waits = [(t, lat) for t, lat in self.commits] + [(t, lat) for t, lat, _ in self.errors]
        if span is None:
            return [lat for _, lat in waits]
        start, end = span
        return [lat for t, lat in waits if start <= t <= end]

    def errors_in_window(self) -> int:
        span = self.span()
        if span is None:
            return len(self.errors)
        start, end = span
        return sum(1 for t, _, _ in self.errors if start <= t <= end)


class ChunkTimer:
    """The worker's context, timing each incremental chunk: from one chunk boundary's return to the next call.

    That is the chunk's write transaction (and the compactor's two ``freelist_count`` reads
    around it): the time the write lock is held, or wanted, per chunk.
    """

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.chunk_s: list[float] = []
        self._released: float | None = None

    def progress(self, fraction: float) -> None:
        self.ctx.progress(fraction)

    def on_cancel(self, fn: Any) -> None:
        self.ctx.on_cancel(fn)

    def pause(self, seconds: float) -> None:
        self.ctx.pause(seconds)  # the worker's: a stop ends the gap between two chunks

    def checkpoint(self) -> None:
        if self._released is not None:
            self.chunk_s.append(time.monotonic() - self._released)
        self.ctx.checkpoint()
        self._released = time.monotonic()


def compact_in_thread(path: str, scenario: Scenario) -> tuple[threading.Thread, Any, dict[str, Any]]:
    """Run the daemon's compactor on ``path`` (the worker's context, a process budget) in a thread.

    Returns:
        The thread (not started), the job context (to stop it), and the dict it fills.
    """
    from smoosh.compactors import SqliteCompactor
    from smoosh.daemon.run.job_context import JobContext
    from smoosh.io_budget import IoBudget

    budget = IoBudget(scenario.rate)
    if scenario.gap_factor is not None:
        budget.set_chunk_gap_factor(scenario.gap_factor)
    settings = SimpleNamespace(page_size=None, auto_vacuum=None, incremental_chunk_pages=scenario.chunk_pages,
                               busy_timeout_s=1.0, max_lock_hold_s=scenario.max_lock_hold_s)
    compactor = SqliteCompactor(settings, io_budget=budget)
    ctx = JobContext(budget)
    chunks = ChunkTimer(ctx)
    out: dict[str, Any] = {"chunk_s": chunks.chunk_s}

    def body() -> None:
        out["start"] = time.monotonic()
        try:
            compactor.compact(path, chunks)
            out["result"] = "ok"
        except Exception as exc:  # the benchmark reports it
            out["result"] = f"{type(exc).__name__}: {exc}"
        out["end"] = time.monotonic()
        out["progress"] = ctx.fraction
        out["charged_bytes"] = budget.charged_bytes

    return threading.Thread(target=body, name="compaction"), ctx, out


def run_scenario(scenario: Scenario, work: str, baseline_template: str) -> Result:
    db = os.path.join(work, "app.db")
    for suffix in ("", "-wal", "-shm", "-journal"):
        try:
            os.remove(db + suffix)
        except FileNotFoundError:
            pass
    shutil.copyfile(scenario.template or baseline_template, db)
    os.sync()
    writer = subprocess.Popen(
        [sys.executable, "-m", "bench._app_writer", db, str(WRITER_RUN_S), str(WRITER_RATE), str(WRITER_BUSY_TIMEOUT_S)],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True,
    )
    assert writer.stdout is not None
    assert writer.stdout.readline().strip() == "ready"
    writer_start = time.monotonic()
    compaction: dict[str, Any] = {}
    if scenario.template is not None:
        time.sleep(LEAD_S)
        thread, ctx, compaction = compact_in_thread(db, scenario)
        thread.start()
        thread.join(max(0.0, writer_start + WRITER_RUN_S - time.monotonic()))
        if thread.is_alive():
            ctx.stop("the writer's run is over")  # as a worker stops a compaction
            thread.join()
    out, _ = writer.communicate(timeout=WRITER_RUN_S + 120)
    data = json.loads(out.strip().splitlines()[-1])
    if compaction:
        compaction["offset_s"] = compaction["start"] - writer_start
        compaction["duration_s"] = compaction["end"] - compaction["start"]
        compaction["within_run"] = compaction["end"] - writer_start <= WRITER_RUN_S
    return Result([tuple(c) for c in data["commits"]], [tuple(e) for e in data["errors"]], compaction)


def chunk_note(chunk_s: list[float]) -> str:
    """``; N chunks, each 12.3 ms median, 45.6 ms max`` for an incremental run (empty for a VACUUM)."""
    if not chunk_s:
        return ""
    return f"; {len(chunk_s)} chunks, each {ms(chunk_s, 0.5):.1f} ms median, {ms(chunk_s, 1.0):.1f} ms max"


def ms(values: list[float], q: float) -> float:
    return percentile(values, q) * 1000.0 if values else float("nan")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__ or "", argv)
    rows = ROWS // 10 if args.quick else ROWS
    work = tempfile.mkdtemp(prefix="smoosh-bench-writer-")
    try:
        full = os.path.join(work, "full.template.db")
        incremental = os.path.join(work, "incremental.template.db")
        size = make_bloated_db(full, rows=rows, row_bytes=ROW_BYTES, journal_mode="wal")
        make_bloated_db(incremental, rows=rows, row_bytes=ROW_BYTES, auto_vacuum="incremental", journal_mode="wal")
        scenarios = [
            Scenario("baseline (no compaction)", None),
            Scenario(f"incremental, defaults (backlog_full's pace: gap {GAP_FACTOR_BRISK:g}x the chunk)", incremental,
                     gap_factor=GAP_FACTOR_BRISK),
            Scenario(f"incremental, {SMALL_CHUNK_PAGES}-page chunks, max_io_rate {PACED_RATE >> 20}MiB", incremental,
                     rate=float(PACED_RATE), chunk_pages=SMALL_CHUNK_PAGES),
            Scenario(f"incremental, a small backlog's pace (gap {GAP_FACTOR_GENTLE:g}x the chunk)", incremental,
                     gap_factor=GAP_FACTOR_GENTLE, small_backlog=True),
            Scenario(f"full VACUUM, max_lock_hold {DEFAULT_MAX_LOCK_HOLD_S:g}s (the default: above this writer's "
                     f"{WRITER_BUSY_TIMEOUT_S * 1000:.0f} ms)", full, full=True, budgeted=False),
            Scenario(f"full VACUUM, max_lock_hold {LOCK_HOLD_BELOW_WRITER_S * 1000:.0f}ms (below the writer's busy "
                     "timeout, as the docs advise)", full, full=True, max_lock_hold_s=LOCK_HOLD_BELOW_WRITER_S),
        ]
        results: dict[str, list[Result]] = {s.name: [] for s in scenarios}
        for _ in range(args.runs):
            for scenario in scenarios:
                results[scenario.name].append(run_scenario(scenario, os.path.join(work), full))
                print(f"  {scenario.name}: done", flush=True)
        metrics = build_metrics(results, scenarios)
        notes = [
            f"database {size / 1e6:.0f} MB ({rows:,} rows of {ROW_BYTES} bytes, oldest 60% deleted), WAL, copied fresh "
            f"for every scenario (warm page cache); the writer commits {WRITER_RATE:.0f}/s for {WRITER_RUN_S:.0f} s "
            f"with a busy timeout of {WRITER_BUSY_TIMEOUT_S * 1000:.0f} ms; the compaction starts {LEAD_S:g} s into "
            "its run; latencies are of the commits that started while the compaction ran, failed ones with the time "
            "they waited (baseline: the whole run).",
        ]
        for scenario in scenarios[1:]:
            for i, result in enumerate(results[scenario.name]):
                c = result.compaction
                notes.append(
                    f"{scenario.name}, run {i + 1}: compaction {c.get('result')} after {c.get('duration_s', 0):.2f} s, "
                    f"{c.get('progress', 0) * 100:.0f}% done (started {c.get('offset_s', 0):.2f} s into the writer's "
                    f"run; {'finished within' if c.get('within_run') else 'NOT finished within'} it); "
                    f"{len(result.window())} commits during it, {result.errors_in_window()} errors"
                    + (f" ({result.errors[0][2]})" if result.errors else "")
                    + chunk_note(c.get("chunk_s") or [])
                )
        report("writer", "Application writer latency during a compaction", metrics, args, notes)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def build_metrics(results: dict[str, list[Result]], scenarios: list[Scenario]) -> list[Metric]:
    base = results[scenarios[0].name]
    base_p99 = [ms(r.window(), 0.99) for r in base]
    metrics = [
        Metric("baseline p50 commit latency", "ms", [ms(r.window(), 0.5) for r in base], higher_is_better=False),
        Metric("baseline p99 commit latency", "ms", base_p99, higher_is_better=False),
        Metric("baseline max commit latency", "ms", [ms(r.window(), 1.0) for r in base], higher_is_better=False),
        Metric("baseline errors", "", [float(len(r.errors)) for r in base], higher_is_better=False, budget=0,
               budget_text="0"),
    ]
    base_p99_median = sorted(base_p99)[len(base_p99) // 2]
    p99_budget = base_p99_median + INCREMENTAL_P99_BUDGET_S * 1000
    small_budget = base_p99_median * SMALL_BACKLOG_P99_RATIO
    for scenario in scenarios[1:]:
        runs = results[scenario.name]
        full, judged = scenario.full, scenario.budgeted
        if scenario.small_backlog:
            budget, budget_text = small_budget, f"<= 1.1x baseline p99 ({small_budget:.3g} ms)"
        elif judged and not full:
            budget, budget_text = p99_budget, f"<= baseline p99 + 25 ms ({p99_budget:.1f} ms)"
        else:
            budget, budget_text = None, ""
        metrics += [
            Metric(f"{scenario.name}: p50 commit latency", "ms", [ms(r.window(), 0.5) for r in runs],
                   higher_is_better=False),
            Metric(f"{scenario.name}: p99 commit latency", "ms", [ms(r.window(), 0.99) for r in runs],
                   higher_is_better=False, budget=budget, budget_text=budget_text),
            Metric(f"{scenario.name}: max commit latency", "ms", [ms(r.window(), 1.0) for r in runs],
                   higher_is_better=False, budget=WRITER_BUSY_TIMEOUT_S * 1000 if judged and full else None,
                   budget_text=f"<= the writer's busy timeout ({WRITER_BUSY_TIMEOUT_S * 1000:.0f} ms)"
                   if judged and full else ""),
            Metric(f"{scenario.name}: writer errors", "", [float(r.errors_in_window()) for r in runs],
                   higher_is_better=False, budget=0 if judged else None, budget_text="0" if judged else ""),
            Metric(f"{scenario.name}: compaction duration", "s", [r.compaction.get("duration_s", 0.0) for r in runs],
                   higher_is_better=False),
        ]
    return metrics


if __name__ == "__main__":
    sys.exit(main())
