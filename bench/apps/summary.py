"""A run's figures (errors, latencies, compactions, reclaimed bytes, CPU, checks) and the sitting's tables.

:func:`run_figures` turns a :class:`~bench.apps.runs.RunOutcome` into one JSON-ready dict;
:func:`group_table` puts the runs of one (application, journal mode) side by side, one column
per mode and each cell listing that mode's runs in the sitting's order, in the style of
``bench/RESULTS.md``.

Latencies are over every operation, a failed one with the time it waited before failing (what
its user felt). An error is *inside a compaction* when it meets a window of smoosh's run on
its own tenant (:mod:`bench.apps.windows`); ``by chance`` is how many of the run's errors
would fall inside those windows if errors came at random times and tenants: the errors times
the share of the run's tenant-seconds the windows cover.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Sequence

from bench._harness import percentile
from bench.apps.runs import RunOutcome, uses_smoosh
from bench.apps.windows import index_windows, inside

__all__ = ["run_figures", "group_table", "verdicts", "verdict_table", "JOURNAL_NAMES", "APP_NAMES", "MODE_NAMES",
           "SLOWEST_MARGIN_MS", "P99_MARGIN", "CHANCE_P", "poisson_at_least"]

JOURNAL_NAMES = {"delete": "rollback journal (SQLite's default)", "wal": "WAL"}
APP_NAMES = {"django": "Django", "sqlalchemy": "SQLAlchemy"}
MODE_NAMES = {
    "none": "without smoosh",
    "compact": "smoosh, default config",
    "watch": "smoosh watching only (concurrency 0)",
    "compacted": "without smoosh, fleet already compacted",
    "compact-b": "smoosh B, default config",
    "watch-b": "smoosh B watching only (concurrency 0)",
}
MB = 1_000_000
#: Issue 46's bound on the slowest application operation inside a compaction: smoosh's
#: ``max_lock_hold`` plus this margin (milliseconds).
SLOWEST_MARGIN_MS = 100.0
#: Issue 46's bound on the p99 with smoosh compacting: the median p99 without it, plus 10%.
P99_MARGIN = 0.10
#: Issue 46's bound on what smoosh reclaims of the fleet's dead space in a run.
MIN_RECLAIMED_SHARE = 0.80
#: Errors inside compactions are "no more than chance" while at least this likely by chance alone.
CHANCE_P = 0.05


def _ms(values: Sequence[float], q: float) -> float | None:
    return round(percentile(values, q) * 1000, 2) if values else None


def _spread_ms(values: Sequence[float]) -> dict[str, float | None]:
    """``{"p50", "p99", "max"}`` of ``values`` (seconds) in milliseconds."""
    return {"p50": _ms(values, 0.5), "p99": _ms(values, 0.99), "max": _ms(values, 1.0)}


def run_figures(o: RunOutcome) -> dict[str, Any]:
    """Everything the reports show of one run (see the module docstring for how each is counted)."""
    rec = o.record
    names: list[str] = rec["ops_names"]
    errors: list[str] = rec["errors"]
    ops = rec["ops"]  # [start, latency_s, op, tenant, error]
    start, end = float(rec["start"]), float(rec["end"])
    duration = max(1e-9, end - start)
    per_tenant = index_windows(o.windows, o.paths)
    compactions = [w for w in o.windows if not w.cleanup]
    cleanups = [w for w in o.windows if w.cleanup]
    ok = [w for w in compactions if w.result == "ok"]
    results = Counter(w.result for w in compactions)
    channels = Counter(w.channel for w in compactions)
    in_run = [w for w in compactions if w.end >= start and w.start <= end]

    lat_by_op: dict[str, list[float]] = {n: [] for n in names}
    err_by_op: dict[str, Counter[str]] = {n: Counter() for n in names}
    err_by_type: Counter[str] = Counter()
    inside_errors: list[dict[str, Any]] = []
    inside_by: Counter[str] = Counter()
    all_lat: list[float] = []
    # Split by whether the operation met a run of smoosh on its own tenant: an operation that waits
    # out a compaction's lock is what the window costs, one that does not is what smoosh costs the
    # rest of the fleet (the CPU and the disk it shares).
    lat_inside: list[float] = []
    lat_outside: list[float] = []
    slowest_inside: dict[str, Any] | None = None
    slowest_outside: dict[str, Any] | None = None
    error_list = []
    for t0, lat, op_i, tenant, err in ops:
        op = names[op_i]
        lat_by_op[op].append(lat)
        all_lat.append(lat)
        w = inside(t0, lat, per_tenant[tenant])
        entry = {"start": t0, "latency_ms": round(lat * 1000, 2), "op": op, "tenant": tenant}
        (lat_outside if w is None else lat_inside).append(lat)
        if w is not None:
            if slowest_inside is None or lat * 1000 > slowest_inside["latency_ms"]:
                slowest_inside = dict(entry, window_result=w.result, window_duration_s=round(w.duration_s, 3))
        elif slowest_outside is None or lat * 1000 > slowest_outside["latency_ms"]:
            slowest_outside = entry
        if err >= 0:
            text = errors[err]
            err_by_op[op][text] += 1
            err_by_type[text] += 1
            error_list.append(dict(entry, error=text, inside=w is not None))
            if w is not None:
                inside_errors.append(dict(entry, error=text, window_result=w.result))
                inside_by[f"{op}: {text}"] += 1
    covered = 0.0
    for tenant_windows in per_tenant:
        for w in tenant_windows:
            covered += max(0.0, min(w.end, end) - max(w.start, start))
    n_tenants = max(1, len(o.paths))
    by_chance = len(error_list) * covered / (duration * n_tenants)
    before, after = sum(o.before_bytes), sum(o.after_bytes)
    bad = [c for c in o.checks if not c.ok]
    return {
        "label": o.spec.label,
        "number": o.spec.number,
        "app": o.spec.app,
        "journal_mode": o.spec.journal_mode,
        "mode": o.spec.mode,
        "duration_s": round(duration, 2),
        "ops": len(ops),
        "ops_per_s": round(len(ops) / duration, 1),
        "skipped_slots": rec.get("skipped_slots", 0),
        "errors": len(error_list),
        "errors_by_type": dict(err_by_type.most_common()),
        "errors_by_op": {op: dict(c.most_common()) for op, c in err_by_op.items() if c},
        "errors_inside_compaction": len(inside_errors),
        "errors_inside_by_chance": round(by_chance, 2),
        "errors_inside_by_op": dict(inside_by.most_common()),
        "latency_ms": {
            "all": _spread_ms(all_lat),
            **{op: {**_spread_ms(v), "n": len(v)} for op, v in lat_by_op.items()},
        },
        "latency_inside_ms": {**_spread_ms(lat_inside), "n": len(lat_inside)},
        "latency_outside_ms": {**_spread_ms(lat_outside), "n": len(lat_outside)},
        "slowest_inside_compaction": slowest_inside,
        "slowest_outside_compaction": slowest_outside,
        "compactions": {
            "runs": len(compactions), "ok": len(ok), "results": dict(results), "channels": dict(channels),
            "during_app_run": len(in_run), "before_app_run": sum(1 for w in compactions if w.end < start),
            "window_s_max": round(max((w.duration_s for w in compactions), default=0.0), 3),
            "cleanup_runs": len(cleanups),
            # How the log's start of a run compared with its 'started' event in /jobs (seconds).
            "start_gap_s": {"matched": len(o.start_gaps_s), "min": min(o.start_gaps_s, default=None),
                            "max": max(o.start_gaps_s, default=None)},
        },
        "reclaimed": {
            "smoosh_log_bytes": sum(w.reclaimed_bytes for w in ok),
            "smoosh_metric_bytes": o.smoosh_reclaimed_metric,
            "files_before_bytes": before,
            "files_after_bytes": after,
            "files_drop_bytes": before - after,
        },
        "smoosh_cpu_s": None if o.smoosh_cpu_run_s is None else round(o.smoosh_cpu_run_s, 2),
        "smoosh_cpu_share": None if o.smoosh_cpu_run_s is None else round(o.smoosh_cpu_run_s / duration, 4),
        "smoosh_cpu_total_s": None if o.smoosh_cpu_total_s is None else round(o.smoosh_cpu_total_s, 2),
        "checks": {
            "tenants": len(o.checks),
            "damaged": sum(1 for c in o.checks if c.damaged),
            "lost": sum(len(c.lost) for c in o.checks),
            "changed": sum(len(c.changed) for c in o.checks),
            "resurrected": sum(len(c.resurrected) for c in o.checks),
            "unexpected": sum(len(c.unexpected) for c in o.checks),
            "rows_checked": sum(c.rows for c in o.checks),
            "failed": [c.summary() for c in bad],
        },
        "load_avg": [round(x, 2) for x in o.load_avg],
        "application": dict(o.application),
        "anomalies": rec.get("anomalies", []),
        "versions": rec.get("versions", {}),
        "error_list": error_list,
        "windows": [{"tenant": o.paths.index(w.path) if w.path in o.paths else None, "start": round(w.start, 3),
                     "end": round(w.end, 3), "result": w.result, "channel": w.channel,
                     "reclaimed_bytes": w.reclaimed_bytes, "cleanup": w.cleanup} for w in o.windows],
        "kept": o.kept,
    }


def _cell(values: Sequence[str]) -> str:
    return ", ".join(values) if values else "-"


def _num(x: float | None, digits: int = 0) -> str:
    if x is None:
        return "-"
    return f"{x:,.{digits}f}"


def _slowest(entry: dict[str, Any] | None) -> str:
    """``191 (read_modify_write)``; ``-`` when there was none."""
    if not entry:
        return "-"
    return f"{_num(entry['latency_ms'])} ({entry['op']})"


def _inside_ops(r: dict[str, Any]) -> str:
    """``112 (0.9%), 3.1 / 180``; ``-`` for a sitting recorded before the split was."""
    split = r.get("latency_inside_ms")
    if not split:
        return "-"
    share = split["n"] / max(1, r["ops"])
    return f"{split['n']:,} ({100 * share:.1f}%), {_num(split['p50'], 1)} / {_num(split['p99'], 0)}"


def _looks(r: dict[str, Any]) -> str:
    """``0 / 1,234``; ``-`` for a sitting recorded before the harness read them."""
    seen = r.get("application")
    if not seen or "looks_locked" not in seen:
        return "-"
    return f"{seen['looks_locked']:,.0f} / {seen.get('looks_lockless', 0):,.0f}"


def _compactions(r: dict[str, Any]) -> str:
    c = r["compactions"]
    others = [f"{k} {v}" for k, v in c["results"].items() if k != "ok"]
    if c["cleanup_runs"]:
        others.append(f"{c['cleanup_runs']} cleanup")
    return f"{c['ok']}" + (f" ({', '.join(others)})" if others else "")


def group_table(runs: Sequence[dict[str, Any]], modes: Sequence[str], dead_bytes: int) -> str:
    """The runs of one (application, journal mode) as a Markdown table: a column per mode, the runs
    of each in the sitting's order, separated by commas.

    Parameters:
        runs: :func:`run_figures` of the group's runs.
        modes: the columns, in order.
        dead_bytes: the fleet's dead space at the start (the template's file minus live bytes).
    """
    first = runs[0]
    title = f"{APP_NAMES.get(first['app'], first['app'])}, {JOURNAL_NAMES.get(first['journal_mode'], first['journal_mode'])}"
    by_mode = {m: [r for r in runs if r["mode"] == m] for m in modes}
    present = [m for m in modes if by_mode[m]]
    rows: list[tuple[str, dict[str, list[str]]]] = []

    def row(name: str, fn: Any, only: Sequence[str] | None = None) -> None:
        cells = {}
        for m in present:
            cells[m] = [fn(r) for r in by_mode[m]] if (only is None or m in only) else []
        rows.append((name, cells))

    row("runs (place in the sitting)", lambda r: f"#{r['number']}")
    row("operations per second (slots dropped behind schedule)",
        lambda r: _num(r["ops_per_s"]) + (f" ({r['skipped_slots']})" if r["skipped_slots"] else ""))
    row("**errors**", lambda r: f"**{r['errors']}**")
    types = Counter[str]()
    op_names = Counter[str]()
    for r in runs:
        types.update(r["errors_by_type"])
        for op, c in r["errors_by_op"].items():
            op_names[op] += sum(c.values())
    for text, _ in types.most_common():
        row(f"- {text}", lambda r, t=text: str(r["errors_by_type"].get(t, 0)))
    for op, _ in op_names.most_common():
        row(f"- in {op}", lambda r, o=op: str(sum(r["errors_by_op"].get(o, {}).values())))
    with_smoosh = [m for m in present if uses_smoosh(m)]
    row("errors inside a run of smoosh on that tenant (by chance)",
        lambda r: f"{r['errors_inside_compaction']} ({r['errors_inside_by_chance']:.1f})", with_smoosh)
    row("latency p50 / p99, ms",
        lambda r: f"{_num(r['latency_ms']['all']['p50'], 1)} / {_num(r['latency_ms']['all']['p99'], 0)}")
    row("slowest operation, ms", lambda r: _num(r["latency_ms"]["all"]["max"]))
    # Rows a sitting recorded before the harness measured them would show only dashes: left out.
    if any("latency_inside_ms" in r for r in runs):
        row("operations on a tenant during smoosh's run on it: count, share of all, p50 / p99 ms",
            _inside_ops, with_smoosh)
        row("p99 of the other operations, ms", lambda r: _num((r.get("latency_outside_ms") or {}).get("p99"), 1),
            with_smoosh)
    row("slowest operation on a tenant during smoosh's run on it, ms", lambda r: _slowest(r["slowest_inside_compaction"]),
        with_smoosh)
    row("slowest operation elsewhere, ms", lambda r: _slowest(r["slowest_outside_compaction"]), with_smoosh)
    row("compactions ok (other results; cleanup runs)", _compactions, with_smoosh)
    row("reclaimed, MB: smoosh's figure / the files' drop",
        lambda r: f"{r['reclaimed']['smoosh_log_bytes'] / MB:,.0f} / {r['reclaimed']['files_drop_bytes'] / MB:,.0f}",
        with_smoosh)
    row(f"share of the fleet's dead space ({dead_bytes / MB:,.0f} MB) reclaimed",
        lambda r: f"{100 * r['reclaimed']['smoosh_log_bytes'] / max(1, dead_bytes):.0f}%", with_smoosh)
    if any("looks_locked" in (r.get("application") or {}) for r in runs):
        row("smoosh's looks at a database during the run: with a SQLite lock / without", _looks, with_smoosh)
    row("smoosh's CPU during the run, % of a core",
        lambda r: "-" if r["smoosh_cpu_share"] is None else f"{100 * r['smoosh_cpu_share']:.1f}", with_smoosh)
    row("the machine's load average (1 min) at the start / end", lambda r: "/".join(
        f"{x:.1f}" for x in r.get("load_avg") or []) or "-")
    row("tenants damaged / rows lost (of rows checked)",
        lambda r: f"{r['checks']['damaged']} / {r['checks']['lost']} ({r['checks']['rows_checked']:,})")
    head = f"| {title} | " + " | ".join(MODE_NAMES.get(m, m) for m in present) + " |"
    lines = [head, "|---|" + "---|" * len(present)]
    for name, cells in rows:
        lines.append(f"| {name} | " + " | ".join(_cell(cells[m]) for m in present) + " |")
    return "\n".join(lines)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def poisson_at_least(count: int, mean: float) -> float:
    """P(X >= ``count``) for X Poisson with ``mean``: how likely chance alone gives ``count`` or more."""
    if count <= 0:
        return 1.0
    term = total = math.exp(-mean)
    for i in range(1, count):
        term *= mean / i
        total += term
    return max(0.0, 1.0 - total)


def verdicts(runs: Sequence[dict[str, Any]], dead_bytes: int, max_lock_hold_s: float) -> list[tuple[str, str, bool]]:
    """The runs of one (application, journal mode) against issue 46's "done when", a line per condition.

    Each condition is judged only when the modes it compares are in ``runs``. "Within noise" is
    read as: the mean of the mode's runs no higher than the highest run of the mode it is compared
    with (the baseline's own spread).

    Parameters:
        runs: :func:`run_figures` of the group's runs.
        dead_bytes: the fleet's dead space at the start.
        max_lock_hold_s: smoosh's ``max_lock_hold`` in the runs (its default unless set).

    Returns:
        ``(condition, what was measured, met)`` for each condition judged.
    """
    by = {m: [r for r in runs if r["mode"] == m] for m in ("none", "compact", "watch", "compacted")}
    errors = {m: [r["errors"] for r in rs] for m, rs in by.items()}
    out: list[tuple[str, str, bool]] = []
    if by["watch"] and by["none"]:
        mean, top = _mean(errors["watch"]), max(errors["none"])
        out.append(("watching only: errors where they are without smoosh (mean no higher than the highest run without)",
                    f"{mean:,.1f} against {top:,}", mean <= top))
    if by["compact"] and by["compacted"]:
        mean, top = _mean(errors["compact"]), max(errors["compacted"])
        out.append(("compacting: errors no higher than on the fleet already compacted (mean against its highest run)",
                    f"{mean:,.1f} against {top:,}", mean <= top))
    compact = by["compact"]
    if compact:
        inside_n = sum(r["errors_inside_compaction"] for r in compact)
        chance = sum(r["errors_inside_by_chance"] for r in compact)
        out.append(("no error inside a compaction of the tenant", f"{inside_n} (by chance {chance:.1f})", inside_n == 0))
        # The application's own errors fall inside some windows by chance (a Poisson count of mean
        # ``chance``), so "none" alone would fail a smoosh that changes nothing most of the time:
        # also judged is whether the count is one chance would give (P(X >= count) >= CHANCE_P).
        p_value = poisson_at_least(inside_n, chance)
        out.append((f"errors inside compactions no more than chance would put there (P >= {CHANCE_P:g})",
                    f"{inside_n} against {chance:.1f} (P = {p_value:.2g})", p_value >= CHANCE_P))
        shares = [r["reclaimed"]["smoosh_log_bytes"] / max(1, dead_bytes) for r in compact]
        out.append((f"at least {MIN_RECLAIMED_SHARE:.0%} of the fleet's dead space reclaimed in each run",
                    f"{100 * min(shares):.0f}% at the least", min(shares) >= MIN_RECLAIMED_SHARE))
        bound_ms = max_lock_hold_s * 1000 + SLOWEST_MARGIN_MS
        slowest = max(((r["slowest_inside_compaction"] or {}).get("latency_ms", 0.0) for r in compact), default=0.0)
        out.append((f"slowest operation inside a compaction at most max_lock_hold + {SLOWEST_MARGIN_MS:g} ms "
                    f"({bound_ms:,.0f} ms)", f"{slowest:,.0f} ms", slowest <= bound_ms))
    p99_with = _median([r["latency_ms"]["all"]["p99"] for r in compact]) if compact else 0.0
    if compact and by["none"]:
        p99_without = _median([r["latency_ms"]["all"]["p99"] for r in by["none"]])
        out.append((f"p99 within +{P99_MARGIN:.0%} of the runs without smoosh (medians)",
                    f"{p99_with:,.1f} ms against {p99_without:,.1f} ms", p99_with <= p99_without * (1 + P99_MARGIN)))
    if compact and by["compacted"]:
        # The application measured slower on a compacted fleet than on the bloated one (likely: an
        # insert grows the file instead of reusing a free page), and a run with smoosh spends most
        # of its time on a fleet it has compacted.
        p99_control = _median([r["latency_ms"]["all"]["p99"] for r in by["compacted"]])
        out.append((f"p99 within +{P99_MARGIN:.0%} of the fleet already compacted (medians)",
                    f"{p99_with:,.1f} ms against {p99_control:,.1f} ms", p99_with <= p99_control * (1 + P99_MARGIN)))
    damaged = sum(r["checks"]["damaged"] for r in runs)
    lost = sum(r["checks"]["lost"] for r in runs)
    out.append(("0 rows lost, 0 tenants damaged (every run)", f"{lost} lost, {damaged} damaged", lost == 0 and damaged == 0))
    return out


def verdict_table(runs: Sequence[dict[str, Any]], dead_bytes: int, max_lock_hold_s: float) -> str:
    """:func:`verdicts` as a Markdown table."""
    lines = ["| issue 46's condition | measured | verdict |", "|---|---|---|"]
    for condition, measured, met in verdicts(runs, dead_bytes, max_lock_hold_s):
        lines.append(f"| {condition} | {measured} | {'ok' if met else '**MISS**'} |")
    return "\n".join(lines)
