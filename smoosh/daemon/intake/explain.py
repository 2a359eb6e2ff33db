"""``smoosh explain KEY`` / ``GET /explain?key=...``: why a key is, or is not, queued, channel by channel.

Read only: nothing is enqueued, queued, forgotten or recorded (an exact measurement an
enqueue would take is taken, and remembered by the compactor as such). The rules are not restated
here: validation is the intake's, priorities are the router's, and every sentence comes from
:mod:`smoosh.daemon.intake.verdicts`, so ``explain`` and ``POST /enqueue?wait=1`` use the same words
(a rejected key is explained with the reason ``?wait=1`` would give it).

The answer (JSON as served; infinite priorities are the string ``"infinity"``)::

    {"key", "state", "channel", "reason", "result" (its last run's, DESIGN §11's words) | null,
     "sizes": {"file_bytes", "active_bytes", "changes", "exact"} | null,
     "disk_pressure": bool (its file system is past disk_pressure: queued worst-first by reclaimable bytes),
     "ignored", "forced", "stale_until": unix seconds | null,
     "crashes": {"consecutive", "error_count", "last_error", "retry_at"} | null,
     "busy": {"count", "starved_since"} | null,
     "max_jobs": {"busy", "limit"},
     "channels": {NAME: {"state", "place", "priority", "queued_priority", "position", "reason",
                         "thresholds": {...}, "window", "in_window", "next_open",
                         "suspended", "held", "paused_until", "not_before", "holds": [...]}}}

``state`` (of the key, and per channel) is one of :data:`KEY_STATES`; a channel that does not
hold the key is ``not_queued`` there. Each channel's record is built by one function,
:func:`channel_record`, whose ``state`` comes from :func:`key_state`: a new state is added there.

Ownership: runs on the caller's thread (an HTTP handler); it reads the channels through their
readers (``locate``, ``status``), the history through its lock, and the staleness table and
measurements through single dict reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Mapping

from smoosh.clocks import Clocks
from smoosh.config import ChannelConfig, Config
from smoosh.daemon.history import BLOCKED, BUSY, CRASHED, STARVED, HistoryTable, KeyRecord, consecutive_crashes
from smoosh.daemon.intake.measurement import signature
from smoosh.daemon.intake.router import CLEANUP_PREFIX, db_path
from smoosh.daemon.intake.verdicts import (
    NOT_QUEUED, QUEUED, REJECTED, below_reason, channel_phrase, file_problem, not_measured_reason, stale_reason,
    utc_text,
)
from smoosh.errors import InvalidKey
from smoosh.priority import quantize

__all__ = ["explain", "Sources", "KEY_STATES", "key_state", "channel_record"]

RUNNING = "running"
CRASHING = "crashing"
#: The states ``explain`` gives a key, overall and per channel (DESIGN §11's key states, plus
#: ``not_queued`` and ``rejected`` from the ``?wait=1`` results).
KEY_STATES = (QUEUED, RUNNING, CRASHING, STARVED, NOT_QUEUED, REJECTED)


@dataclass(frozen=True)
class Sources:
    """What ``explain`` reads, each through its owner's way in.

    Attributes:
        intake: canonical keys, validation, the router, the staleness table, measurements, forces.
        history: per-key history (crashes, backoff).
        channels: the channel registry now (a whole one).
        config: the config in force.
        holds: ``holds(channel_name, forced)``: what keeps that channel from starting its next
            key (``forced``: a forced key, which the start-up pause does not hold back).
        slots: ``(busy, limit)`` of ``max_jobs``.
        clocks: the daemon's clocks: the answer tells wall time; a channel keeps its times
            (a not-before time, the end of its pause) on the monotonic clock.
    """

    intake: Any
    history: HistoryTable
    channels: Mapping[str, Any]
    config: Config
    holds: Callable[[str, bool], list[str]]
    slots: tuple[int, int]
    clocks: Clocks
    #: Whether a key's file system is under disk pressure (queued worst-first by reclaimable bytes).
    pressure: Callable[[str], bool] = lambda path: False


def explain(src: Sources, key: object) -> dict[str, Any]:
    """Why ``key`` is or is not queued, per channel; see the module docstring for the shape.

    Parameters:
        src: what to read.
        key: the key as the operator wrote it (an absolute path, or ``cleanup:PATH``).

    Returns:
        The explanation (``state`` ``rejected`` with ``?wait=1``'s reason for a key smoosh
        refuses: not absolute, outside roots, no such file, a directory, not a SQLite file).
    """
    intake = src.intake
    busy, limit = src.slots
    answer: dict[str, Any] = {
        "key": key if isinstance(key, str) else repr(key), "state": REJECTED, "channel": None, "reason": None,
        "result": None, "sizes": None, "ignored": False, "forced": False, "stale_until": None, "crashes": None, "busy": None,
        "max_jobs": {"busy": busy, "limit": limit}, "disk_pressure": False, "channels": {},
    }
    try:
        canonical = intake.canonical_key(key)
        answer["key"] = canonical
        intake.validate(canonical)
        compactor = intake.router.compactor_for(canonical)
        if not canonical.startswith(CLEANUP_PREFIX):
            problem = file_problem(canonical, compactor)
            if problem is not None:
                raise InvalidKey(canonical, problem)
    except InvalidKey as e:
        answer["reason"] = e.reason
        return answer
    cfg, now = src.config, src.clocks.wall()
    router = intake.router
    left_s = intake.access.fresh_for_s(canonical)
    rec = src.history.snapshot(canonical)
    names = _names(cfg, canonical)

    def qualifies(sizes: Any) -> bool:
        return any(ch is not None and ch.matches(canonical) and router.priority(ch, canonical, sizes, compactor)
                   for ch in (cfg.channels.get(name) for name in names))

    sizes, exact = _sizes(intake, canonical, compactor, qualifies)
    answer.update(
        ignored=router.is_ignored(canonical, cfg),
        forced=intake.is_forced(canonical),
        stale_until=now + left_s if left_s > 0 else None,
        result=rec.result if rec is not None else None,
        crashes=_crashes(rec, src.history.health_threshold_s),
        busy=None if rec is None or not rec.busy_count else {"count": rec.busy_count,
                                                             "starved_since": rec.starved_since},
        disk_pressure=src.pressure(db_path(canonical)),
        sizes=None if sizes is None else {"file_bytes": sizes.file_bytes, "active_bytes": sizes.active_bytes,
                                          "changes": sizes.changes, "exact": exact},
    )

    def priority_of(ch: ChannelConfig) -> float:
        if canonical.startswith(CLEANUP_PREFIX):
            return float(compactor.cleanup_priority(canonical))
        return quantize(router.priority(ch, canonical, sizes, compactor)) if sizes is not None else 0.0

    for name in names:
        ch_cfg = cfg.channels.get(name)
        channel = src.channels.get(name)
        if ch_cfg is None or channel is None:
            continue
        priority = priority_of(ch_cfg) if ch_cfg.matches(canonical) else 0.0
        answer["channels"][name] = channel_record(
            name, ch_cfg, channel, canonical, sizes, priority, compactor, rec, src.holds, now,
            to_wall=src.clocks.wall_at,
        )
    _summarise(answer, canonical, names, cfg, sizes, priority_of, compactor, left_s, now, router,
               rec.last_end if rec is not None else None)
    return answer


def key_state(place: str | None, rec: KeyRecord | None) -> str:
    """The state of a key in one channel, from where the channel holds it and its history.

    Parameters:
        place: what ``Channel.locate`` says (``queue``, ``benched``, ``deferred``,
            ``starting``, ``active``), or None when the channel does not hold the key.
        rec: the key's history record, or None.

    Returns:
        One of :data:`KEY_STATES` (never ``rejected``).
    """
    if place is None:
        return NOT_QUEUED
    if place in ("starting", "active"):
        return RUNNING
    if place == "deferred" and rec is not None and (rec.state == CRASHING or rec.last_end == CRASHED):
        return CRASHING  # waiting out a crash backoff (a blocked key's or a busy one's wait is queued)
    if rec is not None and rec.state == STARVED:
        return STARVED  # busy more than busy_retries times in a row, waiting for its next try
    return QUEUED  # waiting: in the queue, set aside by rotation, or after a busy database


def channel_record(
    name: str, ch: ChannelConfig, channel: Any, key: str, sizes: Any, priority: float, compactor: Any,
    rec: KeyRecord | None, holds: Callable[[str, bool], list[str]], now: float,
    to_wall: Callable[[float], float] = float,
) -> dict[str, Any]:
    """One channel's part of the answer: where it holds the key, what it gives it, what holds it back.

    ``now`` is wall time; ``to_wall`` turns a time the channel keeps (on the clock it is ticked
    with) into wall time, as the wall clock stands now.
    """
    found = channel.locate(key)
    place = found.get("place") if found is not None else None
    forced = bool(found and found.get("forced"))
    status = channel.status()
    window = ch.window
    in_window = bool(status.get("in_window", True))
    next_open = None
    if window is not None and not in_window:
        next_open = window.next_open(datetime.fromtimestamp(now, timezone.utc)).timestamp()
    return {
        "state": key_state(place, rec),
        "place": place,
        "priority": priority,
        "queued_priority": found.get("priority") if found is not None else None,
        "position": found.get("position") if found is not None else None,
        "forced": forced,
        "reason": channel_phrase(ch, key, sizes, priority, compactor),
        "thresholds": thresholds(ch),
        "window": str(window) if window is not None else "always",
        "in_window": in_window,
        "next_open": next_open,
        "suspended": bool(status.get("suspended")),
        "held": status.get("held"),
        "paused_until": _wall_or_none(channel.paused_until, to_wall),
        "not_before": _wall_or_none(found.get("not_before") if found is not None else None, to_wall),
        "holds": holds(name, forced),
    }


# -- the parts --------------------------------------------------------------------------------------


def thresholds(ch: ChannelConfig) -> dict[str, Any]:
    """The thresholds that decide ``ch``'s priority, and only those.

    An upgrade channel gives 1 to a database whose format differs from the targets, else 0,
    whatever its size (``smoosh.priority``): its sizes and priority bounds do not apply, and
    showing them said they did.

    Parameters:
        ch: the channel's config.

    Returns:
        ``{"priority", "min_priority", "max_priority", "min_size", "max_size", "min_changes",
        "match"}``; for an upgrade channel ``{"priority", "min_changes", "match"}``.
    """
    if ch.priority == "upgrade":
        return {"priority": ch.priority, "min_changes": ch.min_changes, "match": list(ch.match)}
    return {
        "priority": ch.priority, "min_priority": ch.min_priority, "max_priority": ch.max_priority,
        "min_size": ch.min_size_bytes, "max_size": ch.max_size_bytes, "min_changes": ch.min_changes,
        "match": list(ch.match),
    }


def _wall_or_none(at: float | None, to_wall: Callable[[float], float]) -> float | None:
    return None if at is None else to_wall(at)


def _names(cfg: Config, key: str) -> tuple[str, ...]:
    """The channels of the key's kind, in the operator's order."""
    return cfg.cleanup_channels if key.startswith(CLEANUP_PREFIX) else cfg.db_channels


def _sizes(intake: Any, key: str, compactor: Any, qualifies: Callable[[Any], bool]) -> tuple[Any, bool]:
    """The database's sizes and whether they are exact, measured as an enqueue would measure them.

    The measurement the key was queued with while its file is unchanged; else the cheap
    estimate; else, when the estimate qualifies for no channel and the compactor says an
    exact measurement is due, the exact one (an enqueue would take it, and the estimate, a
    lower bound on what a compaction reclaims, could say "below threshold" where the truth
    does not). The compactor remembers that measurement as it would for an enqueue.
    """
    carried = intake.measurements.get(key)
    if carried is not None and carried.signature is not None and carried.signature == signature(db_path(key)):
        return carried.sizes, bool(carried.exact)
    sizes = compactor.sizes(key)
    if sizes is None or key.startswith(CLEANUP_PREFIX) or qualifies(sizes):
        return sizes, False
    if compactor.exact_size_due(key):
        exact = compactor.sizes(key, exact=True)
        if exact is not None:
            return exact, True
    return sizes, False


def _crashes(rec: KeyRecord | None, health_threshold_s: float) -> dict[str, Any] | None:
    if rec is None or (not rec.error_count and rec.retry_at is None):
        return None
    return {
        "consecutive": consecutive_crashes(list(rec.events), health_threshold_s),
        "error_count": rec.error_count,
        "last_error": rec.last_error,
        "retry_at": rec.retry_at,
    }


def _summarise(
    answer: dict[str, Any], key: str, names: tuple[str, ...], cfg: Config, sizes: Any,
    priority_of: Callable[[ChannelConfig], float], compactor: Any, left_s: float, now: float, router: Any,
    last_end: str | None = None,
) -> None:
    """The key's overall state, its channel and one sentence (``?wait=1``'s words where they meet).

    ``last_end``: the history's newest end of a run (:attr:`KeyRecord.last_end`), which says
    what a deferred key waits for: a crash backoff, a block's backoff, a busy database's retry.
    """
    channels = answer["channels"]
    held = next(((n, c) for n, c in channels.items() if c["place"] is not None), None)
    if held is not None:
        name, record = held
        for other in channels.values():
            if other["place"] is None and other["reason"] is None:
                other["reason"] = f"channel {name} has it"  # one key, one owner
        answer["channel"] = name
        answer["state"] = record["state"]
        answer["reason"] = _where(name, record, answer.get("crashes"), last_end)
        return
    answer["state"] = NOT_QUEUED
    if answer["ignored"]:
        answer["reason"] = "ignored ([smoosh.ignore])"
    elif left_s > 0:
        answer["reason"] = stale_reason(left_s, now)
    elif sizes is None and not key.startswith(CLEANUP_PREFIX):
        answer["reason"] = not_measured_reason(key)
    elif (sizes is not None and router.freshly_compacted(key, sizes.file_bytes, cfg, forget_expired=False)
          and not any(c["priority"] and cfg.channels[n].priority == "upgrade" for n, c in channels.items()
                      if n in cfg.channels)):
        # (an upgrade channel still takes a database compacted lately: its target is not in the file)
        answer["reason"] = "compacted less than exact_size_interval ago and not grown since"
    else:
        taker = next((n for n, c in channels.items() if c["priority"]), None)
        if taker is not None:
            answer["reason"] = (f"not queued, though channel {taker} would take it at priority "
                                f"{_priority_text(channels[taker]['priority'])}: nothing enqueued it since it changed")
        else:
            answer["reason"] = below_reason(key, names, cfg, sizes, priority_of, compactor)


def _where(name: str, record: dict[str, Any], crashes: dict[str, Any] | None, last_end: str | None = None) -> str:
    """The sentence for a key a channel holds (``last_end``: what a deferred key waits for, see :func:`_summarise`)."""
    state, place = record["state"], record["place"]
    if state == RUNNING:
        return f"running in channel {name}" + (" (its job waits for a worker)" if place == "starting" else "")
    if (state == CRASHING or (place == "deferred" and last_end == CRASHED)) and crashes is not None:
        until = record.get("not_before") or crashes.get("retry_at")
        when = f" until {utc_text(until)}" if until else ""
        return (f"crashing: waits out its crash backoff in channel {name}{when} ({crashes['consecutive']} "
                f"consecutive crash(es); last error: {crashes['last_error']})")
    if state == STARVED:
        until = record.get("not_before")
        when = f", next try at {utc_text(until)}" if until else ""
        return (f"starved in channel {name}: its database was busy more than busy_retries times in a row"
                f"{when}")
    if place == "deferred":
        until = record.get("not_before")
        when = f" until {utc_text(until)}" if until else ""
        if last_end == BLOCKED and crashes is not None:
            return (f"queued in channel {name}, blocked: waits out its backoff{when} (last error: "
                    f"{crashes['last_error']})")
        if last_end == BUSY:
            return f"queued in channel {name}, waiting{when} (the database was busy)"
        return f"queued in channel {name}, waiting{when}"
    if place == "benched":
        return f"queued in channel {name}, set aside by rotation until another key of the channel starts"
    words = f"queued in channel {name} at priority {_priority_text(record['queued_priority'])}"
    if record.get("position"):
        words += f", position {record['position']}"
    if record.get("forced"):
        words += ", forced"
    holds = record.get("holds") or []
    return words + ("; held back: " + "; ".join(holds) if holds else "")


def _priority_text(value: Any) -> str:
    if value == float("inf"):
        return "infinity"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
