"""What the CLI prints: the status table, per-key jobs, the cluster view and systemd's one-line summary."""

from __future__ import annotations

import datetime
from typing import Any

__all__ = ["format_status", "format_io_budget", "format_jobs", "format_cluster", "status_summary", "fmt_bytes"]


def status_summary(status: dict[str, Any]) -> str:
    """One line for systemd's STATUS=: ``"3 active, 1 starting, 12 waiting, 2 channel(s) suspended"``."""
    channels = status.get("channels", {}).values()
    active = sum(int(c.get("active", 0)) for c in channels)
    starting = sum(int(c.get("starting", 0)) for c in channels)
    waiting = sum(int((c.get("waiting") or {}).get("size", 0)) for c in channels)
    parts = [f"{active} active", f"{starting} starting", f"{waiting} waiting"]
    suspended = sum(1 for c in channels if c.get("suspended"))
    if suspended:
        parts.append(f"{suspended} channel(s) suspended")
    if status.get("dry_run"):
        parts.append("dry run")
    if status.get("config_error"):
        parts.append("config edit rejected")
    return ", ".join(parts)



def format_status(body: dict[str, Any]) -> str:
    """A readable status table: channel, active, starting, waiting, min, max, window, paused."""
    header = ("CHANNEL", "ACTIVE", "STARTING", "WAITING", "MIN", "MAX", "WINDOW", "PAUSED", "RECLAIMABLE")
    rows = [header]
    for name, ch in body.get("channels", {}).items():
        waiting = ch.get("waiting", {})
        paused = "suspended" if ch.get("suspended") else ("yes" if ch.get("paused") else "no")
        if not ch.get("in_window", True):
            paused = f"{paused}, outside window" if paused != "no" else "outside window"
        rows.append((
            name, str(ch.get("active", 0)), str(ch.get("starting", 0)), str(waiting.get("size", 0)),
            format_priority(waiting.get("min", 0)), format_priority(waiting.get("max", 0)),
            str(ch.get("window", "always")), paused, fmt_bytes(ch.get("reclaimable_bytes", 0)),
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    budget = body.get("io_budget")
    if isinstance(budget, dict):
        lines.append(format_io_budget(budget))
    lines.append(f"node {body.get('node')}: {fmt_bytes(body.get('reclaimable_bytes', 0))} reclaimable"
                 + (" (dry run)" if body.get("dry_run") else ""))
    if body.get("dry_run"):
        for name, ch in body.get("channels", {}).items():
            for position, (key, priority) in enumerate(ch.get("would_run") or [], 1):
                lines.append(f"would run in {name} #{position}: {key} (priority {format_priority(priority)})")
    if body.get("config_error"):
        lines.append(f"config error (previous config in force): {body['config_error']}")
    if body.get("restart_required"):
        lines.append(f"restart required for: {', '.join(body['restart_required'])}")
    return "\n".join(lines)


def format_io_budget(budget: dict[str, Any]) -> str:
    """One line: ``I/O budget: 20.0 MiB/s, 1.2 GiB charged, in debt 0.4 s (1 chunk paused; waiting: ratio_dbs)``."""
    rate = budget.get("max_io_rate")
    text = "unlimited" if rate in (None, "infinity") else f"{fmt_bytes(rate)}/s"
    line = f"I/O budget: {text}, {fmt_bytes(budget.get('charged_bytes', 0))} charged"
    debt_s = budget.get("debt_s") or 0
    if debt_s:
        details = []
        if budget.get("paused"):
            details.append(f"{budget['paused']} chunk(s) paused")
        if budget.get("waiting_channels"):
            details.append("waiting: " + ", ".join(budget["waiting_channels"]))
        line += f", in debt {debt_s:g} s" + (f" ({'; '.join(details)})" if details else "")
    return line


def format_jobs(jobs: list[dict[str, Any]]) -> str:
    """Per-key lines: state, progress, errors, last error, and the recent history."""
    if not jobs:
        return "no compactions yet"
    out = []
    for job in jobs:
        progress = job.get("progress") or 0.0
        out.append(f"{job.get('key')}  [{job.get('channel')}] {job.get('state')} {progress * 100:.0f}%"
                   f"  errors={job.get('error_count', 0)}")
        if job.get("last_error"):
            out.append(f"    last error: {job['last_error']}")
        for event in job.get("history", [])[:5]:
            reason = f" ({event.get('reason')})" if event.get("reason") else ""
            out.append(f"    {_fmt_time(event.get('at'))}  {event.get('event')}{reason}")
    return "\n".join(out)


def format_cluster(nodes: dict[str, Any]) -> str:
    """Every node's status record, stale ones marked."""
    if not nodes:
        return "no node has written a status record to this store"
    parts = []
    for node, record in sorted(nodes.items()):
        stale = " (stale)" if record.get("stale") else ""
        parts.append(f"== {node}{stale}, updated {_fmt_time(record.get('updated_at'))}")
        parts.append(format_status({"node": node, "channels": record.get("channels", {}),
                                    "reclaimable_bytes": record.get("reclaimable_bytes", 0)}))
    return "\n".join(parts)


def _fmt_time(at: Any) -> str:
    """A unix time as local ``YYYY-MM-DD HH:MM:SS`` (what an operator reads), or ``?``."""
    if not isinstance(at, (int, float)):
        return "?"
    return datetime.datetime.fromtimestamp(at).strftime("%Y-%m-%d %H:%M:%S")


def format_priority(value: Any) -> str:
    """A priority as the table shows it: ``inf``, ``2.5``, ``16``."""
    if value == "infinity":
        return "inf"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def fmt_bytes(n: Any) -> str:
    n = float(n or 0)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
