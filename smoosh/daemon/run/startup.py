"""At start-up, before any worker of the node runs: one owner for every key the node left behind.

A key waits in a channel or runs as a job, never both (DESIGN §5.1). What the previous run of
the daemon left in the job store is sorted out here, before the daemon's own worker can
accept anything:

* a **pending** job (added, never accepted; or put back by a stopping worker): taken back:
  the job is removed and its key goes to the top of its channel (priority infinity), so the
  channel's pause, window and concurrency govern it;
* a **running** job whose holder is provably dead: taken back the same way. Provably: the
  previous daemon of this node held it, which the node's claim at start found dead
  (:func:`smoosh.daemon.record.status.claim_node`: it stopped, or its process is gone after
  a kill -9); or its holder ran on this host and its process is gone (or its PID is another
  process's now); or, for a holder this host cannot look up, its heartbeat expired (none
  within the type timeout): a holder alive on this host is never taken over, however late
  its heartbeat (a stopped worker, DESIGN §10); or no worker ever
  heartbeated it nor named itself in it, which only this node's previous daemon leaves
  behind (a ``smoosh worker`` writes its heartbeat and its name in the commit that accepts
  a job, and the claim just proved no other daemon serves this node);
* any other **running** job (a ``smoosh worker`` process, or another live daemon, heartbeats
  it): adopted: its channel follows it and counts it as active.

Keys found in the job store are validated like new ones. The crash records (DESIGN §5.6: a
key's crash history and not-before time live in the store) are read back too, so a key that
was crashing before the restart waits out its backoff after it, and so are the finished
compactions' last results (``smoosh.daemon.results``), so ``/jobs`` shows them after it.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from smoosh.daemon.control.node_claim import Identity, process_alive_here
from smoosh.daemon.history import (
    BLOCKED, BUSY, CRASHED, FINISHED, REPLACED, Event, HistoryTable, KeyRecord, decode_record,
)
from smoosh.daemon.results import Result, read_rows
from smoosh.jobs import Jobs, NotFound
from smoosh.store import tuples
from smoosh.store.base import Transaction

__all__ = ["Found", "take_over_jobs", "crash_record_key", "DAEMON_WORKER", "HOLDER"]

log = logging.getLogger(__name__)

#: The ``worker`` a job's data names when the daemon's own (in-process) worker runs it.
DAEMON_WORKER = "daemon"
#: The field of a job's data naming the instance (a daemon's or a worker's) that runs it.
HOLDER = "holder"


def crash_record_key(node: str, key: str) -> bytes:
    """The store key of ``key``'s crash record on ``node``."""
    return tuples.pack(("crash", node, key))


@dataclass
class Found:
    """What the node left behind, to hand to the channels once they are open."""

    take_back: dict[str, str] = field(default_factory=dict)  # key -> channel
    follow: dict[str, str] = field(default_factory=dict)  # key -> channel
    crashing: dict[str, KeyRecord] = field(default_factory=dict)  # key -> record with a retry time
    recorded: set[str] = field(default_factory=set)  # every key with a crash record in the store
    results: dict[str, list[Result]] = field(default_factory=dict)  # key -> its last results, newest first

    def apply(self, channels: Mapping[str, Any], now: float) -> None:
        """Queue the keys taken back, follow the adopted runs, defer the keys still crashing (``now``: monotonic)."""
        for key, name in self.take_back.items():
            channel = channels.get(name)
            if channel is None:
                log.info("took back %r, but its channel %s is gone; its next event queues it again", key, name)
                continue
            channel.enqueue(key, math.inf)
            log.info("took back the job of %r into channel %s", key, name)
        for key, name in self.follow.items():
            channel = channels.get(name)
            if channel is not None and channel.adopt(key):
                log.info("following %r, which a worker elsewhere is compacting for channel %s", key, name)
        for key, rec in self.crashing.items():
            channel = channels.get(rec.channel or "")
            if channel is None or rec.retry_mono is None or rec.retry_mono <= now:
                continue
            waiting = dict(channel.waiting())
            if key in waiting:
                channel.defer(key, waiting[key], rec.retry_mono)


def take_over_jobs(
    jobs: Jobs,
    job_type: str,
    history: HistoryTable,
    now: float,
    *,
    node: str,
    job_timeout_s: float,
    admits: Callable[[str], bool],
    mono: float | None = None,
    dead_holders: frozenset[str] = frozenset(),
) -> Found:
    """Sort out this node's jobs and crash records (see the module docstring).

    Parameters:
        jobs: the job layer.
        job_type: this node's job type.
        history: the history table the crash records go back into.
        now: wall-clock seconds (heartbeats and stored retry times cross processes and
            restarts; heartbeats are stamped with wall time, in other processes too).
        node: the node name.
        job_timeout_s: the type timeout: a heartbeat older than this has expired.
        admits: whether a key found in the store is still a key of this daemon.
        mono: the same moment as ``now`` on the monotonic clock, which a restored backoff's
            wait is counted on from here (None: ``now``, one clock for both).
        dead_holders: instances known dead (the previous daemon of this node, from its claim).

    Returns:
        What to apply to the channels once they are open.
    """
    found = Found()
    # The finished compactions' history first (DESIGN §12: durable history): /jobs shows each
    # key's last results after a restart; a crash record read next replaces its key's record.
    found.results = jobs.store.transact(lambda tr: read_rows(tr.snapshot, node))
    for key, results in sorted(found.results.items(), key=lambda item: item[1][0].at):
        history.restore(finished_record(key, results))  # least recently finished first: dropped first
    begin, end = tuples.range(("crash", node))
    for raw_key, value in jobs.store.transact(lambda tr: tr.snapshot.get_range(begin, end)):
        key = tuples.unpack(raw_key)[-1]
        rec = decode_record(str(key), value)
        if rec is None:
            log.warning("ignored an unreadable crash record of %r", key)
            continue
        history.restore(rec, now=now, mono=mono)
        found.recorded.add(rec.key)
        if rec.retry_mono is not None and rec.retry_mono > (now if mono is None else mono):
            found.crashing[rec.key] = rec
    for info in list(jobs.iter_jobs(job_type)):
        key, data = info.id, info.data
        named = data.get("channel")
        channel = named if isinstance(named, str) else None
        if info.state == "finished":
            _remove(jobs, job_type, key)  # its channel never saw it end; the key's next event queues it
            continue
        if not admits(key):
            _remove(jobs, job_type, key)
            continue
        if info.state == "running" and not _provably_dead(data, now, job_timeout_s, dead_holders):
            if channel is not None:
                found.follow[key] = channel
            continue
        _remove(jobs, job_type, key)
        if channel is not None:
            found.take_back[key] = channel
    return found


def finished_record(key: str, results: list[Result]) -> KeyRecord:
    """The history record of a key whose last results were read back from the store.

    Each result is the event the history would have recorded when it ended (``finished``
    with the bytes reclaimed, ``crashed`` with its error...), its state ``finished``: a key
    still waiting out a backoff has a crash record, which replaces this one.

    Parameters:
        key: the database.
        results: its last results, newest first (at least one).

    Returns:
        The record, as ``/jobs`` shows it.
    """
    events = deque(Event(*_event_of(r)) for r in results)
    latest = results[0]
    failures = [r for r in results if r.result in ("failed", "blocked")]
    return KeyRecord(
        key, channel=latest.channel, state="finished", progress=1.0, error_count=len(failures),
        last_error=failures[0].error if failures else None, last_updated=latest.at, events=events,
    )


def _event_of(result: Result) -> tuple[str, float, str | None]:
    """A result as the history's event: (event, at, reason), in the words the outcome recorder uses."""
    if result.result == "ok":
        return FINISHED, result.at, f"reclaimed {max(0, result.size_before_bytes - result.size_after_bytes)} bytes"
    if result.result == "gone":
        return FINISHED, result.at, "database gone"
    if result.result == "busy":
        return BUSY, result.at, result.error or "database busy"
    if result.result == "blocked":
        return BLOCKED, result.at, f"blocked: {result.error or ''}"
    if result.result == "replaced":
        return REPLACED, result.at, result.error or "replaced"
    return CRASHED, result.at, result.error or result.result


def _provably_dead(data: Mapping[str, Any], now: float, job_timeout_s: float, dead_holders: frozenset[str]) -> bool:
    """Whether a running job's holder is provably gone (see the module docstring); else it is followed.

    A holder on this host whose process lives (same PID, same start time) is never gone,
    however late its heartbeat: stopped is not dead (DESIGN §10; the one question asked of a
    node's daemon too, :func:`~smoosh.daemon.control.node_claim.process_alive_here`).
    """
    holder = data.get(HOLDER)
    if isinstance(holder, str) and holder in dead_holders:
        return True  # the previous daemon of this node ran it, and that one is dead
    who = Identity.from_holder(holder)
    alive = process_alive_here(who) if who is not None else None
    if alive is not None:
        return not alive  # on this host its process answers, whatever its heartbeat says
    heartbeat_at = data.get("heartbeat_at")
    if isinstance(heartbeat_at, (int, float)) and not isinstance(heartbeat_at, bool):
        return now - heartbeat_at >= job_timeout_s
    # Never heartbeated: a holder that named itself is alive (it is not the dead one); a job
    # that names none was accepted by this node's previous daemon, which the claim found dead.
    return not isinstance(holder, str)


def _remove(jobs: Jobs, job_type: str, key: str) -> None:
    def body(tr: Transaction) -> None:
        try:
            jobs.remove(job_type, key, tx=tr)
        except NotFound:
            pass

    jobs.transact(body)
