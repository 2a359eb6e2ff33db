"""What the CLI prints: the status table, per-key jobs, the cluster view and systemd's one-line summary."""

from __future__ import annotations

import datetime
from typing import Any

__all__ = ["format_status", "format_io_budget", "store_line", "format_jobs", "format_no_jobs", "format_page", "format_cluster",
           "format_explain", "status_summary", "fmt_bytes", "fmt_age", "fleet_summary", "cluster_line"]


def status_summary(status: dict[str, Any]) -> str:
    """One line for systemd's STATUS=: ``"3 active, 1 starting, 12 waiting, 2 channel(s) suspended"``.

    Keys waiting out a backoff (``"1 deferred"``) and a job store that is not ok (``"job store
    full since 2026-11-24 09:12:40"``) are said only when there are some.

    Parameters:
        status: the ``/status`` body.

    Returns:
        The line.
    """
    channels = status.get("channels", {}).values()
    active = sum(int(c.get("active", 0)) for c in channels)
    starting = sum(int(c.get("starting", 0)) for c in channels)
    waiting = sum(int((c.get("waiting") or {}).get("size", 0)) for c in channels)
    parts = [f"{active} active", f"{starting} starting", f"{waiting} waiting"]
    deferred = sum(int(c.get("deferred", 0)) for c in channels)
    if deferred:
        parts.append(f"{deferred} deferred")
    store = store_line(status.get("store"), short=True)
    if store is not None:
        parts.append(store)
    suspended = sum(1 for c in channels if c.get("suspended"))
    if suspended:
        parts.append(f"{suspended} channel(s) suspended")
    starved = sum(int(c.get("starved", 0)) for c in channels)
    if starved:
        parts.append(f"{starved} starved")
    held = sum(1 for c in channels if c.get("held"))
    if held:
        parts.append(f"{held} channel(s) held by the cluster")
    cluster = status.get("cluster")
    if isinstance(cluster, dict) and cluster.get("waiting_since") is not None:
        parts.append("waiting for a slot of cluster_max_jobs")
    if status.get("dry_run"):
        parts.append("dry run")
    if status.get("config_error"):
        parts.append("config edit rejected")
    return ", ".join(parts)



def format_status(body: dict[str, Any]) -> str:
    """A readable status table: channel, active, starting, waiting, min, max, deferred, window, paused.

    Under it, a line per compaction in flight (its age, progress and time since its last
    progress) and, when compactions had to wait for an application's transaction, how often.

    WAITING (with its MIN and MAX priority) counts the keys that could start; DEFERRED the keys
    waiting out a crash backoff or a busy database's retry, which cannot start before their
    time. PAUSED says ``suspended`` (this daemon's own suspension), ``held`` (a cluster hold in
    the store) or both; a line under the table names each cluster hold's scope, who and when.
    A job store that is not ok is said in a line of its own (no compaction starts meanwhile).
    """
    header = ("CHANNEL", "ACTIVE", "STARTING", "WAITING", "MIN", "MAX", "DEFERRED", "WINDOW", "PAUSED", "RECLAIMABLE")
    rows = [header]
    for name, ch in body.get("channels", {}).items():
        waiting = ch.get("waiting", {})
        paused = "suspended" if ch.get("suspended") else ("yes" if ch.get("paused") else "no")
        if ch.get("held"):
            paused = "held" if paused in ("yes", "no") else f"{paused}, held"
        if not ch.get("in_window", True):
            paused = f"{paused}, outside window" if paused != "no" else "outside window"
        rows.append((
            name, str(ch.get("active", 0)), str(ch.get("starting", 0)), str(waiting.get("size", 0)),
            format_priority(waiting.get("min", 0)), format_priority(waiting.get("max", 0)), str(ch.get("deferred", 0)),
            str(ch.get("window", "always")), paused, fmt_bytes(ch.get("reclaimable_bytes", 0)),
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    budget = body.get("io_budget")
    if isinstance(budget, dict):
        lines.append(format_io_budget(budget))
    lines.append(f"node {body.get('node')}: {fmt_bytes(body.get('reclaimable_bytes', 0))} reclaimable"
                 + (" (dry run)" if body.get("dry_run") else ""))
    starved = [f"{name} {ch['starved']}" for name, ch in body.get("channels", {}).items() if ch.get("starved")]
    if starved:
        lines.append(f"starved (busy more than busy_retries times in a row; see smoosh status --jobs): "
                     f"{', '.join(starved)}")
    for name, ch in body.get("channels", {}).items():
        for run in ch.get("runs") or []:
            lines.append(_run_line(name, run))
    application = _application_line(body.get("application"))
    if application is not None:
        lines.append(application)
    for name, ch in body.get("channels", {}).items():
        held = ch.get("held")
        if isinstance(held, dict):
            lines.append(f"{name} held by the cluster: {_held_scope(held)}, by {held.get('by')} since "
                         f"{_fmt_time(held.get('at'))}")
    if body.get("dry_run"):
        for name, ch in body.get("channels", {}).items():
            for position, (key, priority) in enumerate(ch.get("would_run") or [], 1):
                lines.append(f"would run in {name} #{position}: {key} (priority {format_priority(priority)})")
    cluster = cluster_line(body.get("cluster"))
    if cluster is not None:
        lines.append(cluster)
    store = store_line(body.get("store"))
    if store is not None:
        lines.append(store)
    if body.get("config_error"):
        lines.append(f"config error (previous config in force): {body['config_error']}")
    if body.get("restart_required"):
        lines.append(f"restart required for: {', '.join(body['restart_required'])}")
    return "\n".join(lines)


def _run_line(channel: str, run: dict[str, Any]) -> str:
    """A compaction in flight: ``running in ratio_dbs: /srv/t1.db, 2 min 5 s, 40%, last progress 3 s ago``."""
    state = run.get("state", "running")
    parts = [f"{fmt_age(float(run.get('age_s') or 0))}"]
    if state == "running":
        parts.append(f"{float(run.get('progress') or 0):.0%}")
        parts.append(f"last progress {fmt_age(float(run.get('since_progress_s') or 0))} ago")
    return f"{state} in {channel}: {run.get('key')}, {', '.join(parts)}"


def _application_line(seen: Any) -> str | None:
    """What the compactions saw of the applications, when they had to wait for one (else None)."""
    if not isinstance(seen, dict) or not seen.get("waits"):
        return None
    line = (f"applications in a transaction: waited {seen['waits']} time(s), "
            f"{float(seen.get('wait_seconds') or 0):.1f} s in all, for a moment with none open")
    if seen.get("gave_up"):
        line += f"; found none {seen['gave_up']} time(s) (busy, retried later)"
    return line


def cluster_line(cluster: Any) -> str | None:
    """This node's part of the fleet-wide cap in words, or None (no ``cluster_max_jobs`` set, and none held).

    Parameters:
        cluster: the ``cluster`` field of ``/status``: ``{"max_jobs", "slots", "waiting_since", ...}``.
    """
    if not isinstance(cluster, dict) or (cluster.get("max_jobs") is None and not cluster.get("slots")):
        return None
    line = f"cluster_max_jobs = {cluster.get('max_jobs')}: this node's runs hold {cluster.get('slots', 0)} slot(s)"
    if cluster.get("waiting_since") is not None:
        line += f"; its starts wait for a slot since {_fmt_time(cluster['waiting_since'])}"
    return line


def store_line(store: Any, *, short: bool = False) -> str | None:
    """The job store's state in words when it is not ok, or None (ok, or a daemon that does not say).

    Parameters:
        store: the ``store`` field of ``/status``: ``{"state", "since", "error"}``.
        short: the STATUS= form (``job store full since 2026-11-24 09:12:40``), without the error.

    Returns:
        ``job store full since 2026-11-24 09:12:40: database or disk is full; no compaction
        starts until it is back`` (or the short form), or None.
    """
    if not isinstance(store, dict) or store.get("state") in (None, "ok"):
        return None
    since = store.get("since")
    when = f" since {_fmt_time(since)}" if isinstance(since, (int, float)) else ""
    if short:
        return f"job store {store['state']}{when}"
    error = f": {store['error']}" if store.get("error") else ""
    return f"job store {store['state']}{when}{error}; no compaction starts until it is back"


def _held_scope(held: dict[str, Any]) -> str:
    """A cluster hold's scope in words (as :meth:`smoosh.daemon.control.cluster_holds.Hold.scope`)."""
    channels = "every channel" if held.get("channel") is None else f"channel {held['channel']}"
    return f"{channels} of {'every node' if held.get('node') is None else 'node ' + str(held['node'])}"


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
        busy = job.get("busy_count") or 0
        state = job.get("state")
        if state == "pending" and job.get("result") == "blocked":
            state = "pending (blocked)"  # waiting out a block's backoff: a result, not a crash
        out.append(f"{job.get('key')}  [{job.get('channel')}] {state} {progress * 100:.0f}%"
                   f"  errors={job.get('error_count', 0)}" + (f"  busy={busy} in a row" if busy else ""))
        if job.get("last_error"):
            out.append(f"    last error: {job['last_error']}")
        for event in job.get("history", [])[:5]:
            reason = f" ({event.get('reason')})" if event.get("reason") else ""
            out.append(f"    {_fmt_time(event.get('at'))}  {event.get('event')}{reason}")
    return "\n".join(out)


def format_no_jobs(body: dict[str, Any], states: list[str]) -> str:
    """What an empty page of ``/jobs`` means: nothing yet, nothing in these states, or past the last key.

    Parameters:
        body: the ``/jobs`` answer (its ``total`` and ``offset``).
        states: the states asked for (empty: all).
    """
    which = f" in state {', '.join(states)}" if len(states) == 1 else (
        f" in states {', '.join(states)}" if states else "")
    total, offset = body.get("total"), int(body.get("offset") or 0)
    if isinstance(total, int) and total > 0:
        return f"no keys{which} past --offset {offset}: {total} in all"
    return f"no keys{which}" if states else "no compactions yet"


def format_page(body: dict[str, Any]) -> str | None:
    """The line under a page of ``/jobs`` that is not the whole table, or None."""
    jobs, total, offset = body.get("jobs", []), body.get("total"), int(body.get("offset") or 0)
    if not isinstance(total, int) or (offset == 0 and len(jobs) >= total):
        return None
    shown = f"{offset + 1}-{offset + len(jobs)}" if jobs else "none"
    more = f"; more with --offset {body['next_offset']}" if body.get("next_offset") is not None else ""
    return f"showing {shown} of {total}{more}"


def format_explain(answer: dict[str, Any]) -> str:
    """``smoosh explain``: the key's state and reason, then one block per channel of its kind."""
    lines = [str(answer.get("key")), f"  state:      {answer.get('state')}"
             + (f" in {answer['channel']}" if answer.get("channel") else ""),
             f"  reason:     {answer.get('reason')}"]
    if answer.get("state") == "rejected":
        return "\n".join(lines)
    sizes = answer.get("sizes")
    if sizes:
        lines.append(f"  sizes:      file {sizes['file_bytes']} bytes, live {sizes['active_bytes']} bytes"
                     f" ({'exact' if sizes.get('exact') else 'estimate'})"
                     + (f", {sizes['changes']} changes" if sizes.get("changes") is not None else ""))
    stale = answer.get("stale_until")
    lines.append(f"  stale:      {'until ' + _utc(stale) if stale else 'no'}")
    lines.append(f"  ignored:    {'yes ([smoosh.ignore])' if answer.get('ignored') else 'no'}")
    if answer.get("forced"):
        lines.append("  forced:     yes (until its run ends)")
    if answer.get("disk_pressure"):
        lines.append("  disk:       under pressure (past disk_pressure): queued worst-first by the bytes it would reclaim")
    crashes = answer.get("crashes")
    if crashes:
        retry = f", retry at {_utc(crashes['retry_at'])}" if crashes.get("retry_at") else ""
        lines.append(f"  crashes:    {crashes['consecutive']} consecutive, {crashes['error_count']} in all{retry};"
                     f" last error: {crashes.get('last_error')}")
    else:
        lines.append("  crashes:    none")
    busy = answer.get("busy")
    if busy:
        starved = f", starved since {_utc(busy['starved_since'])}" if busy.get("starved_since") else ""
        lines.append(f"  busy:       {busy['count']} time(s) in a row{starved}")
    slots = answer.get("max_jobs") or {}
    lines.append(f"  max_jobs:   {slots.get('busy')} of {slots.get('limit')} busy")
    for name, ch in (answer.get("channels") or {}).items():
        lines.append("")
        lines.append(f"  {name}: {_channel_head(ch)}")
        why = f" ({ch['reason']})" if ch.get("reason") else ""
        lines.append(f"    gives it:   priority {format_priority(ch.get('priority'))}{why}")
        t = ch.get("thresholds") or {}
        match = f", match {','.join(t['match'])}" if t.get("match") else ""
        if t.get("priority") == "upgrade":
            # Its priority is 1 or 0 whatever the size: no size or priority bound applies.
            lines.append(f"    thresholds: upgrade (priority 1 while the file's page_size or auto_vacuum differs from "
                         f"[smoosh.sqlite], else 0, whatever its size), min_changes {t.get('min_changes')}{match}")
        else:
            lines.append(f"    thresholds: {t.get('priority')}, min_priority {format_priority(t.get('min_priority'))},"
                         f" max_priority {format_priority(t.get('max_priority'))}, min_size {t.get('min_size')} bytes,"
                         f" max_size {format_priority(t.get('max_size'))}, min_changes {t.get('min_changes')}{match}")
        window = ch.get("window")
        if window != "always":
            state = "open" if ch.get("in_window") else f"closed, opens {_utc(ch.get('next_open'))}"
            lines.append(f"    window:     {window}, {state}")
        if ch.get("suspended"):
            lines.append("    suspended:  yes")
        for hold in ch.get("holds") or []:
            lines.append(f"    held back:  {hold}")
    return "\n".join(lines)


def _channel_head(ch: dict[str, Any]) -> str:
    state, place = ch.get("state"), ch.get("place")
    if place in ("queue", "benched", "deferred"):
        words = f"{state} at priority {format_priority(ch.get('queued_priority'))}"
        if ch.get("position"):
            words += f", position {ch['position']}"
        if ch.get("forced"):
            words += ", forced"
        if ch.get("not_before"):
            words += f", not before {_utc(ch['not_before'])}"
        return words
    if place == "starting":
        return f"{state} (its job waits for a worker)"
    return str(state)


def _utc(at: Any) -> str:
    """A unix time as ``2026-11-24T19:20:00Z`` (the daemon's reasons use the same form), or ``?``."""
    if not isinstance(at, (int, float)):
        return "?"
    return datetime.datetime.fromtimestamp(at, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_cluster(nodes: dict[str, Any]) -> str:
    """Every node's status record: its state (stale ones with the age of their last record, stopped
    ones with when they stopped), who runs it (host, PID, version, config digest, its part of the
    fleet-wide cap), then its table; a summary of the fleet first."""
    if not nodes:
        return "no node has written a status record to this store"
    parts = fleet_summary(nodes)
    for node, record in sorted(nodes.items()):
        state = ""
        if record.get("state") == "stopped":
            at = record.get("stopped_at")
            state = f" (stopped {_fmt_time(at)})" if isinstance(at, (int, float)) else " (stopped)"
        elif record.get("stale"):
            age_s = record.get("age_s")
            state = f" (stale: last record {fmt_age(age_s)} old)" if isinstance(age_s, (int, float)) else " (stale)"
        parts.append(f"== {node}{state}, updated {_fmt_time(record.get('updated_at'))}")
        who = _who(record)
        if who:
            parts.append(who)
        parts.append(format_status({"node": node, "channels": record.get("channels", {}),
                                    "reclaimable_bytes": record.get("reclaimable_bytes", 0)}))
    return "\n".join(parts)


def fleet_summary(nodes: dict[str, Any]) -> list[str]:
    """The fleet in a few lines: how many nodes in each state; the versions and configs when they
    differ between nodes; the fleet-wide cap, when one is set (the values when nodes disagree),
    its slots held and the nodes waiting for one."""
    states = {state: sum(1 for r in nodes.values() if r.get("state") == state) for state in ("live", "stale", "stopped")}
    lines = [f"{len(nodes)} node(s): " + ", ".join(f"{n} {state}" for state, n in states.items())]
    for field, what in (("version", "versions"), ("config_digest", "configs")):
        seen: dict[str, int] = {}
        for record in nodes.values():
            value = record.get(field)
            if isinstance(value, str):
                seen[value] = seen.get(value, 0) + 1
        if len(seen) > 1:
            listed = ", ".join(f"{value} on {n}" for value, n in sorted(seen.items(), key=lambda kv: (-kv[1], kv[0])))
            lines.append(f"mixed {what}: {listed}")
    caps = {r.get("cluster_max_jobs") for r in nodes.values() if r.get("state") != "stopped"}
    caps.discard(None)
    if caps:
        held = sum(int((r.get("cluster_slots") or {}).get("slots") or 0) for r in nodes.values()
                   if (r.get("cluster_slots") or {}).get("counted"))
        waiting = sorted(n for n, r in nodes.items() if (r.get("cluster_slots") or {}).get("wanting_since") is not None)
        cap = str(caps.pop()) if len(caps) == 1 else "mixed (" + ", ".join(str(c) for c in sorted(caps)) + ")"
        line = f"cluster_max_jobs = {cap}: {held} slot(s) held"
        if waiting:
            line += f"; waiting for a slot: {', '.join(waiting)}"
        lines.append(line)
    return lines


def _who(record: dict[str, Any]) -> str:
    """Who serves a node, as its record says: host, PID, version, config digest, its cluster slots."""
    words = []
    process = record.get("process")
    if isinstance(process, dict) and process.get("host"):
        words.append(f"host {process['host']}, pid {process.get('pid')}")
    if record.get("version"):
        words.append(f"smoosh {record['version']}")
    if record.get("config_digest"):
        words.append(f"config {record['config_digest']}")
    slots = record.get("cluster_slots") or {}
    if record.get("cluster_max_jobs") is not None or slots.get("slots"):
        held = f"{slots.get('slots', 0)} slot(s) of cluster_max_jobs = {record.get('cluster_max_jobs')}"
        if slots.get("slots") and not slots.get("counted"):
            held += " (not counted: its lease ran out)"
        words.append(held)
        if slots.get("wanting_since") is not None:
            words.append(f"waiting for one since {_fmt_time(slots['wanting_since'])}")
    return "; ".join(words)


def _fmt_time(at: Any) -> str:
    """A unix time as local ``YYYY-MM-DD HH:MM:SS`` (what an operator reads), or ``?``."""
    if not isinstance(at, (int, float)):
        return "?"
    return datetime.datetime.fromtimestamp(at).strftime("%Y-%m-%d %H:%M:%S")


def fmt_age(seconds: float) -> str:
    """An age as an operator reads it: ``42 s``, ``5 min 12 s``, ``3 h 4 min``, ``2 d 3 h``."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    if whole < 86400:
        return f"{whole // 3600} h {whole % 3600 // 60} min"
    return f"{whole // 86400} d {whole % 86400 // 3600} h"


def format_priority(value: Any) -> str:
    """A priority as the table shows it: ``inf``, ``2.5``, ``16``."""
    if value == "infinity" or value == float("inf"):
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
