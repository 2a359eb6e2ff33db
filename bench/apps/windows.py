"""When smoosh compacted which tenant, from its JSON log, and which application operations fell inside.

smoosh writes one line per finished run (DESIGN §11: the ``compacted`` line at
``compaction_log_level``, and a line for every other result); with ``log_format = json``
each carries ``key``, ``channel``, ``result``, ``duration_s``, ``size_before_bytes``,
``size_after_bytes`` and ``reclaimed_bytes`` beside ``time``, the moment the line was written
(wall clock, milliseconds). A run's window is taken as ``[time - duration_s - margin, time]``:

* ``time`` is when the outcome was recorded, a little after the compaction's real end (the
  outcome travels from the compacting thread to the daemon's loop), so the window's end is
  never early;
* ``duration_s`` is measured by the run itself on the monotonic clock, from its start to its
  outcome; the start is therefore late by the same delivery delay, which ``margin`` (default
  :data:`DEFAULT_MARGIN_S`) covers.

smoosh's ``GET /jobs`` also keeps each key's recent history with wall-clock times, among them
a ``started`` event per run (recorded as the run's start reaches the daemon's loop, so late by
the same kind of delay): :func:`widen_with_history` moves a window's start back to that event
when it is earlier, so the window is the union of what the two sources say.

An application operation is *inside* a window of its own tenant when the two intervals meet:
the operation's ``[start, start + latency]`` (wall clock, taken by the application) and the
window. A ``cleanup:`` run (a WAL checkpoint of the tenant) is a window of that tenant too.
Stdlib only.
"""

from __future__ import annotations

import calendar
import json
import os
import time
from dataclasses import dataclass, replace
from typing import Any, Iterable, Sequence

__all__ = ["DEFAULT_MARGIN_S", "Window", "parse_time", "windows_from_log", "widen_with_history", "inside",
           "index_windows"]

#: Seconds a window is widened before its computed start (the outcome's delivery delay).
DEFAULT_MARGIN_S = 0.25
#: A ``started`` event in /jobs belongs to a window when it is at most this long before the
#: window's start as the log gives it (seconds): a run's own start, not an earlier run's.
HISTORY_LEAD_S = 5.0
#: The prefix of a cleanup key (smoosh.compactors.sqlite.CLEANUP_PREFIX; not imported: stdlib only).
CLEANUP_PREFIX = "cleanup:"


@dataclass(frozen=True)
class Window:
    """One run of smoosh on one database, as its log line tells it (wall-clock seconds)."""

    path: str  # the database (a cleanup key's database)
    start: float
    end: float
    result: str
    channel: str
    size_before_bytes: int
    size_after_bytes: int
    reclaimed_bytes: int
    cleanup: bool = False  # a ``cleanup:`` run (the WAL's checkpoint), not a compaction
    margin_s: float = 0.0  # how far ``start`` was moved back from the log's own start

    @property
    def duration_s(self) -> float:
        return self.end - self.start


def parse_time(text: str) -> float:
    """``2026-11-28T04:38:58.123Z`` (smoosh's JSON ``time``) as Unix seconds."""
    base, _, frac = text.rstrip("Z").partition(".")
    seconds = calendar.timegm(time.strptime(base, "%Y-%m-%dT%H:%M:%S"))
    return seconds + (int(frac) / 10 ** len(frac) if frac else 0.0)


def windows_from_log(lines: Iterable[str], margin_s: float = DEFAULT_MARGIN_S) -> list[Window]:
    """Every finished run in smoosh's JSON log ``lines`` (other lines, JSON or not, are skipped).

    Parameters:
        lines: the log's lines.
        margin_s: widens each window before its start (see the module docstring).

    Returns:
        The windows, in the log's order.
    """
    out = []
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not isinstance(rec, dict) or "duration_s" not in rec or "key" not in rec or "result" not in rec:
            continue
        key = str(rec["key"])
        path = key[len(CLEANUP_PREFIX):] if key.startswith(CLEANUP_PREFIX) else key
        end = parse_time(str(rec["time"]))
        out.append(Window(
            path=os.path.realpath(path), start=end - float(rec["duration_s"]) - margin_s, end=end,
            result=str(rec["result"]), channel=str(rec.get("channel", "")),
            size_before_bytes=int(rec.get("size_before_bytes") or 0),
            size_after_bytes=int(rec.get("size_after_bytes") or 0),
            reclaimed_bytes=int(rec.get("reclaimed_bytes") or 0),
            cleanup=key.startswith(CLEANUP_PREFIX), margin_s=margin_s,
        ))
    return out


def widen_with_history(windows: Sequence[Window], jobs: Sequence[dict[str, Any]],
                       lead_s: float = HISTORY_LEAD_S) -> tuple[list[Window], list[float]]:
    """Each window's start moved back to its run's ``started`` event in ``/jobs`` when that is earlier.

    Parameters:
        windows: from :func:`windows_from_log` (already widened by the margin).
        jobs: ``GET /jobs``'s ``jobs`` rows (``key``, ``history``: ``[{"event", "at"}, ...]``).
        lead_s: how far before a window's start its ``started`` event may be.

    Returns:
        The windows, and for each one matched to a ``started`` event, by how many seconds the
        log's start (without the margin) came after it (negative: before it).
    """
    started: dict[tuple[str, bool], list[float]] = {}
    for row in jobs:
        key = str(row.get("key", ""))
        path = os.path.realpath(key[len(CLEANUP_PREFIX):] if key.startswith(CLEANUP_PREFIX) else key)
        tag = (path, key.startswith(CLEANUP_PREFIX))
        for ev in row.get("history") or []:
            if ev.get("event") == "started":
                started.setdefault(tag, []).append(float(ev["at"]))
    out, gaps = [], []
    for w in windows:
        candidates = [t for t in started.get((w.path, w.cleanup), []) if w.start - lead_s <= t <= w.end]
        if not candidates:
            out.append(w)
            continue
        t = max(candidates)  # the run's own start: the latest one before its end
        gaps.append(round(w.start + w.margin_s - t, 4))
        out.append(replace(w, start=min(w.start, t)))
    return out, gaps


def index_windows(windows: Sequence[Window], paths: Sequence[str]) -> list[list[Window]]:
    """The windows per tenant index (``paths[i]``, canonical); windows of other files are left out."""
    where = {p: i for i, p in enumerate(paths)}
    out: list[list[Window]] = [[] for _ in paths]
    for w in windows:
        i = where.get(w.path)
        if i is not None:
            out[i].append(w)
    return out


def inside(start: float, latency_s: float, windows: Sequence[Window]) -> Window | None:
    """The first of ``windows`` (one tenant's) that the operation ``[start, start + latency_s]`` meets."""
    end = start + latency_s
    for w in windows:
        if start <= w.end and end >= w.start:
            return w
    return None
