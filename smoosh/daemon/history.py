"""Per-key compaction history, crash counting and exponential backoff (CouchDB's replication scheduler).

Each key keeps its last ``max_history`` events, newest first. A run of crashes, each closer than
``health_threshold_s`` to the event before it, counts as consecutive; a key with n consecutive
crashes waits ``backoff_base_s * 2 ** min(n - 1, 10)`` seconds before it is retried. The table has
no clock, no I/O and no threads; it is shared by the intake's threads (a key queued), the
server's loop (runs starting and ending) and readers of ``/jobs``, so every method takes its
lock: the table is the owner of its records, its methods the one way in.

A database that is busy (its application holds the lock a compaction needs) is retried
after ``BUSY_RETRY_S``, not backed off. Busy results in a row are counted too: past
``busy_retries`` of them the key is ``starved`` (a state, not a result: DESIGN §11), so a
database never idle enough to compact is not retried silently forever. Any other end of a
run (a success, a crash, a drop) ends the row.

A record that matters after a restart (a key crashing or busy, waiting for its retry time)
is written to the store by the server with :func:`encode_record` and read back with
:func:`decode_record` (DESIGN §5.6: crash memory lives in the store); the busy count goes
with it.

Two clocks (DESIGN §12): every time in a record is wall time (a person reads it in ``/jobs``,
and only wall time survives a restart), but the wait for a retry counts down on the monotonic
clock: ``retry_mono`` is the retry's moment there, and every "is it due yet?" reads it, so a
wall clock stepped back a day delays no retry by a day, and one stepped forward brings none
forward. A caller that passes no monotonic time has one clock for both.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgpack

#: Default number of events kept per key.
DEFAULT_MAX_HISTORY = 20
#: Default seconds between a crash and the event before it under which crashes count as consecutive.
DEFAULT_HEALTH_THRESHOLD_S = 120.0
#: Default base of the exponential backoff, in seconds.
DEFAULT_BACKOFF_BASE_S = 30.0
#: Cap of the backoff exponent: the longest wait is base * 2**10 (about 8.5 h at 30 s).
MAX_BACKOFF_EXPONENT = 10
#: Seconds a database that was busy (locked by its application) waits before it is tried again.
BUSY_RETRY_S = 60.0
#: Finished keys remembered for /jobs after their last event (the oldest are dropped first).
MAX_FINISHED_KEYS = 1000
#: Default busy results in a row past which a key is starved (0: never).
DEFAULT_BUSY_RETRIES = 10

ADDED = "added"
STARTED = "started"
STOPPED = "stopped"
CRASHED = "crashed"
FINISHED = "finished"
BUSY = "busy"
#: It could not make progress (a reader pins the WAL, the file is read-only): backed off like
#: a crash, and counted with crashes, but shown as what it is.
BLOCKED = "blocked"
#: Another file was renamed over the database while it was compacted: this run is over (the
#: new file is examined afresh when its events arrive), not a crash.
REPLACED = "replaced"
#: It never started: its priority was re-checked to 0, it was refused, or another channel had it.
DROPPED = "dropped"
#: The reason of a run dropped because its re-check found nothing left to reclaim (the
#: scheduler's words). Such a drop is a look, not an end of the key's work: a database smoosh
#: compacted whose later run finds it compact still reads ``finished``, with its compaction's
#: result, and the drop stays in its history.
NOTHING_TO_DO_REASON = "its priority is now 0 (compacted or gone)"

#: The state of a key busy more than ``busy_retries`` times in a row, waiting for its retry.
STARVED = "starved"
#: The state of a key waiting in its channel (queued, or waiting out a busy database's retry).
PENDING = "pending"
#: Events that end a row of busy results: the run ended some other way, or never started.
_ENDS_BUSY_ROW = frozenset({FINISHED, REPLACED, CRASHED, BLOCKED, DROPPED})
#: Every state a key's record can be in, as ``GET /jobs`` shows it (and filters on: ``?state=``).
RECORD_STATES = (PENDING, "running", "crashing", STARVED, "finished", "dropped")
#: The events that end a run (or say it never ran), newest first in a history: the last one
#: says what the key's last result was and what any wait it is in is for.
_END_EVENTS = frozenset({CRASHED, BLOCKED, BUSY, FINISHED, REPLACED, DROPPED, STOPPED})
#: A run's end event in DESIGN §11's result vocabulary (``finished`` is ``ok`` or ``gone``).
_RESULT_OF = {CRASHED: "failed", BLOCKED: "blocked", BUSY: "busy", REPLACED: "replaced", STOPPED: "interrupted"}
#: The reason the outcome recorder gives a database that was gone (a ``finished`` event).
GONE_REASON = "database gone"
#: How a ``blocked`` event's reason begins when a reader pinned the database's WAL (the SQLite
#: compactor's words, :func:`smoosh.compactors.sqlite_wal.pinned_reason`, after ``blocked: ``).
WAL_PINNED_REASON = "blocked: a reader holds the WAL"


class Event(NamedTuple):
    """One history entry: what happened to a key, when (unix seconds), and why."""

    event: str
    at: float
    reason: str | None = None

    def to_json(self) -> dict[str, object]:
        """The entry as /jobs shows it."""
        return {"event": self.event, "at": self.at, "reason": self.reason}


@dataclass
class KeyRecord:
    """What the server knows about one key's compactions."""

    key: str
    channel: str | None = None
    state: str = "pending"
    progress: float = 0.0
    error_count: int = 0
    last_error: str | None = None
    last_updated: float = 0.0
    retry_at: float | None = None
    events: deque[Event] = field(default_factory=deque)
    #: Busy results in a row (reset by any other end of a run).
    busy_count: int = 0
    #: When the busy count passed ``busy_retries`` (unix seconds); None while not starved.
    starved_since: float | None = None
    #: ``retry_at`` on the monotonic clock: what the wait counts down to. Never stored (it
    #: means nothing after a restart) nor shown; None exactly when ``retry_at`` is None.
    retry_mono: float | None = None
    #: When a reader was first found pinning the database's WAL, in this row of blocks (wall
    #: time; stored, so ``smoosh_wal_pinned_seconds`` survives a restart); None while not pinned.
    pinned_since: float | None = None
    #: ``pinned_since`` on the monotonic clock (the age a scrape shows); never stored.
    pinned_mono: float | None = None

    @property
    def last_end(self) -> str | None:
        """The newest event that ended a run of the key (or said it never ran): what its wait, if
        any, is for (``crashed``: a crash backoff; ``blocked``; ``busy``); None before any."""
        return next((e.event for e in self.events if e.event in _END_EVENTS), None)

    @property
    def result(self) -> str | None:
        """The key's last result in DESIGN §11's vocabulary (``ok``, ``failed``, ``busy``, ``gone``,
        ``interrupted``, ``replaced``, ``blocked``); None before its first run ended."""
        end = next((e for e in self.events if e.event in _END_EVENTS and not _only_looked(e)), None)
        if end is None or end.event == DROPPED:
            return None
        if end.event == FINISHED:
            return "gone" if end.reason == GONE_REASON else "ok"
        return _RESULT_OF.get(end.event)

    def to_json(self) -> dict[str, object]:
        """The record in the shape of ``GET /jobs``."""
        return {
            "key": self.key,
            "channel": self.channel,
            "state": self.state,
            "result": self.result,
            "progress": self.progress,
            "error_count": self.error_count,
            "last_error": self.last_error,
            "last_updated": self.last_updated,
            "retry_at": self.retry_at,
            "busy_count": self.busy_count,
            "starved_since": self.starved_since,
            "history": [e.to_json() for e in self.events],
        }


def _only_looked(event: Event) -> bool:
    """Whether ``event`` is a run dropped because its re-check found nothing to reclaim."""
    return event.event == DROPPED and event.reason == NOTHING_TO_DO_REASON


def consecutive_crashes(events: list[Event], health_threshold_s: float) -> int:
    """Count the crashes at the head of ``events`` (newest first), as the replication scheduler does.

    A crash counts when the event before it is less than ``health_threshold_s`` older; the run
    ends at the first crash that came after a longer healthy stretch, or at a stop that
    followed a start (the key was stopped on purpose, not crashing).
    """
    count = 0
    i = 0
    while i < len(events):
        current = events[i]
        if current.event in (CRASHED, BLOCKED) and i + 1 < len(events):
            if current.at - events[i + 1].at > health_threshold_s:
                return count
            count += 1
        elif current.event == STOPPED and i + 1 < len(events) and events[i + 1].event == STARTED:
            return count
        i += 1
    return count


def backoff_s(crash_count: int, base_s: float = DEFAULT_BACKOFF_BASE_S) -> float:
    """Seconds to wait after ``crash_count`` consecutive crashes (0 for none)."""
    if crash_count <= 0:
        return 0.0
    return base_s * (1 << min(crash_count - 1, MAX_BACKOFF_EXPONENT))


def longest_backoff_s(base_s: float = DEFAULT_BACKOFF_BASE_S) -> float:
    """The longest wait the backoff reaches (``base_s * 2**MAX_BACKOFF_EXPONENT``)."""
    return backoff_s(MAX_BACKOFF_EXPONENT + 1, base_s)


class HistoryTable:
    """Histories of every key that is queued, running, crashing or recently finished."""

    def __init__(
        self,
        *,
        max_history: int = DEFAULT_MAX_HISTORY,
        health_threshold_s: float = DEFAULT_HEALTH_THRESHOLD_S,
        backoff_base_s: float = DEFAULT_BACKOFF_BASE_S,
        max_finished: int = MAX_FINISHED_KEYS,
        busy_retries: int = DEFAULT_BUSY_RETRIES,
    ) -> None:
        self.max_history = max_history
        self.health_threshold_s = health_threshold_s
        self.backoff_base_s = backoff_base_s
        self.max_finished = max_finished
        self.busy_retries = busy_retries
        self._lock = threading.RLock()
        self._records: dict[str, KeyRecord] = {}
        # Finished keys in the order they finished, so the oldest are dropped first in O(1).
        self._finished: OrderedDict[str, None] = OrderedDict()
        # Keys whose state is "crashing", so counting them per channel (at every scrape of
        # /metrics) reads a few records instead of every key queued on the node.
        self._crashing: set[str] = set()
        # key -> since when (monotonic) a reader pins its log: what pinned() answers for every
        # scrape, kept as records change rather than found among all of them each time.
        self._pinned: dict[str, float] = {}
        # Starved keys -> their channel: the status table counts them every few seconds, and
        # walking every record of a large queue for that would cost it milliseconds each time.
        self._starved: dict[str, str | None] = {}

    def configure(
        self, *, max_history: int, health_threshold_s: float, backoff_base_s: float, busy_retries: int | None = None,
    ) -> None:
        """Apply live config changes; existing histories are trimmed to the new length.

        A new ``busy_retries`` (None keeps the current one) decides from each key's next event on.
        """
        with self._lock:
            self._configure(max_history, health_threshold_s, backoff_base_s)
            if busy_retries is not None:
                self.busy_retries = busy_retries

    def _configure(self, max_history: int, health_threshold_s: float, backoff_base_s: float) -> None:
        self.max_history = max_history
        self.health_threshold_s = health_threshold_s
        self.backoff_base_s = backoff_base_s
        for record in self._records.values():
            while len(record.events) > max_history:
                record.events.pop()

    def get(self, key: str) -> KeyRecord | None:
        """The record of ``key``, or None."""
        with self._lock:
            return self._records.get(key)

    def record(
        self, key: str, event: str, at: float, *, channel: str | None = None, reason: str | None = None,
        retry_after_s: float | None = None, mono: float | None = None,
    ) -> KeyRecord:
        """Add an event to ``key``'s history and update its state.

        Parameters:
            at: when it happened, wall time.
            retry_after_s: for a crash or a block, the wait before the retry instead of the
                backoff the consecutive crashes give (a read-only file waits the longest).
            mono: the same moment on the monotonic clock, which the retry's wait counts on
                (None: ``at``, one clock for both).

        Returns:
            The key's record; for a crash, a block or a busy database, ``retry_at`` (and
            ``retry_mono``) are set from the wait.
        """
        with self._lock:
            return self._record(key, event, at, channel, reason, retry_after_s, mono)

    def _record(
        self, key: str, event: str, at: float, channel: str | None, reason: str | None,
        retry_after_s: float | None = None, mono: float | None = None,
    ) -> KeyRecord:
        rec = self._records.get(key)
        if rec is None:
            rec = self._records[key] = KeyRecord(key)
        if channel is not None:
            rec.channel = channel
        rec.events.appendleft(Event(event, at, reason))
        while len(rec.events) > self.max_history:
            rec.events.pop()
        rec.last_updated = at
        if event in _ENDS_BUSY_ROW:
            rec.busy_count = 0
            rec.starved_since = None
        if event == ADDED:
            if rec.state != "crashing":  # queued again while in its crash backoff: still crashing
                rec.state = self._waiting_state(rec, at)
        elif event == STARTED:
            rec.state = "running"
            rec.progress = 0.0
            rec.retry_at = rec.retry_mono = None
        elif event in (FINISHED, REPLACED):
            rec.state = "finished"
            rec.progress = 1.0
            rec.retry_at = rec.retry_mono = None
        elif event == STOPPED:
            rec.state = self._waiting_state(rec, at)
        elif event == DROPPED:
            # Nothing left to do after a compaction that finished: the key's work is still done.
            done = reason == NOTHING_TO_DO_REASON and rec.result in ("ok", "gone", "replaced")
            rec.state = "finished" if done else "dropped"
            rec.retry_at = rec.retry_mono = None
        elif event == BUSY:
            rec.busy_count += 1
            rec.state = self._waiting_state(rec, at)
            rec.retry_at = at + BUSY_RETRY_S
            rec.retry_mono = (at if mono is None else mono) + BUSY_RETRY_S
        elif event in (CRASHED, BLOCKED):
            rec.error_count += 1
            rec.last_error = reason
            if retry_after_s is None:
                crashes = consecutive_crashes(list(rec.events), self.health_threshold_s)
                # A first crash with nothing before it still earns the base backoff: without a
                # wait, a database that fails at once would be retried in a tight loop.
                retry_after_s = backoff_s(max(crashes, 1), self.backoff_base_s)
            rec.retry_at = at + retry_after_s
            rec.retry_mono = (at if mono is None else mono) + retry_after_s
            # Blocked is a result, not a crash (DESIGN §11): the key waits out the same backoff,
            # queued, and /jobs says `blocked` as its result rather than calling it crashing.
            rec.state = "crashing" if event == CRASHED else self._waiting_state(rec, at)
        if event == BLOCKED and reason is not None and reason.startswith(WAL_PINNED_REASON):
            if rec.pinned_since is None:  # pinned since the first block of the row, not the latest
                rec.pinned_since = at
                rec.pinned_mono = at if mono is None else mono
        elif event in (FINISHED, REPLACED):
            rec.pinned_since = rec.pinned_mono = None  # the log was emptied (or the file is gone)
        self._count_backoff(rec)
        if rec.starved_since is not None:
            self._starved[key] = rec.channel
        else:
            self._starved.pop(key, None)
        if rec.state in ("finished", "dropped"):
            self._finished[key] = None
            self._finished.move_to_end(key)
            while len(self._finished) > self.max_finished:
                oldest, _ = self._finished.popitem(last=False)
                del self._records[oldest]
                self._starved.pop(oldest, None)
                self._pinned.pop(oldest, None)
        else:
            self._finished.pop(key, None)
        return rec

    def _count_backoff(self, rec: KeyRecord) -> None:
        """Keep ``rec`` in the keys ``smoosh_crashing_jobs`` counts while it is crashing or blocked,
        and in :meth:`pinned`'s keys while a reader pins its log."""
        if rec.state == "crashing" or (rec.state == PENDING and rec.last_end == BLOCKED):
            self._crashing.add(rec.key)
        else:
            self._crashing.discard(rec.key)
        if rec.pinned_mono is not None:
            self._pinned[rec.key] = rec.pinned_mono
        else:
            self._pinned.pop(rec.key, None)

    def _waiting_state(self, rec: KeyRecord, at: float) -> str:
        """``starved`` past ``busy_retries`` busy results in a row (0: never), else ``pending``."""
        if self.busy_retries > 0 and rec.busy_count > self.busy_retries:
            if rec.starved_since is None:
                rec.starved_since = at
            return STARVED
        rec.starved_since = None
        return PENDING

    def starved(self) -> dict[str, int]:
        """Starved keys per channel, counted while they wait and while they are retried."""
        counts: dict[str, int] = {}
        with self._lock:
            for channel in self._starved.values():
                if channel is not None:
                    counts[channel] = counts.get(channel, 0) + 1
        return counts

    def due(self, now: float) -> list[str]:
        """Keys whose backoff or busy wait has ended at ``now`` (monotonic); their retry time is cleared."""
        with self._lock:
            keys = [k for k, r in self._records.items() if r.retry_mono is not None and r.retry_mono <= now]
            for key in keys:
                self._records[key].retry_at = self._records[key].retry_mono = None
            return keys

    def waiting_retry(self, key: str) -> bool:
        """Whether ``key`` is backing off."""
        with self._lock:
            rec = self._records.get(key)
            return rec is not None and rec.retry_at is not None

    def crashing(self, now: float) -> dict[str, int]:
        """Keys in crash backoff at ``now`` (monotonic), counted per channel (``smoosh_crashing_jobs``).

        A key counts from its crash (or block: a blocked key waits out the same backoff, shown
        ``pending`` with the result ``blocked``) until its not-before time; once that time has
        come it waits in its channel like any queued key, though ``/jobs`` shows a crashed one
        ``crashing`` until it starts again. Keys of no known channel are not counted.
        """
        counts: dict[str, int] = {}
        with self._lock:
            for key in self._crashing:
                rec = self._records[key]
                if rec.channel is not None and rec.retry_mono is not None and rec.retry_mono > now:
                    counts[rec.channel] = counts.get(rec.channel, 0) + 1
        return counts

    def pinned(self) -> dict[str, float]:
        """Keys whose WAL a reader was pinning at their last run -> since when (monotonic seconds):
        what this table remembers, across a restart too (``smoosh_wal_pinned_*``)."""
        with self._lock:
            return dict(self._pinned)

    def forget(self, key: str) -> None:
        """Drop ``key``'s record."""
        with self._lock:
            self._records.pop(key, None)
            self._finished.pop(key, None)
            self._crashing.discard(key)
            self._starved.pop(key, None)
            self._pinned.pop(key, None)

    def records(self) -> list[KeyRecord]:
        """Every record, most recently updated first."""
        with self._lock:
            return sorted(self._records.values(), key=lambda r: r.last_updated, reverse=True)

    def restore(self, record: KeyRecord, *, now: float | None = None, mono: float | None = None) -> None:
        """Put back a record read from the store (at start-up).

        Its retry time is wall time (the only time that survives a restart): the wait left,
        ``retry_at - now``, is counted on the monotonic clock from ``mono``, once, here. A
        wall clock stepped while no daemon ran cannot be told from time passing: stepped
        forward, the retry comes early by the step; stepped back, it would come late by it,
        so the wait is capped at the longest this table ever sets (no backoff is longer).

        Parameters:
            record: as :func:`decode_record` read it.
            now: wall time now (None: one clock for both, the retry time is kept as it is).
            mono: monotonic time now (None: ``now``).
        """
        if record.retry_at is None:
            record.retry_mono = None
        elif now is None:
            record.retry_mono = record.retry_at
        else:
            left_s = min(record.retry_at - now, self._longest_wait_s())
            record.retry_mono = (now if mono is None else mono) + left_s
        if record.pinned_since is None:
            record.pinned_mono = None
        elif now is None:
            record.pinned_mono = record.pinned_since
        else:
            # An age: how long ago, by the wall clock, counted back from the monotonic now (a
            # clock stepped while no daemon ran cannot be told from time passing; never ahead).
            record.pinned_mono = (now if mono is None else mono) - max(0.0, now - record.pinned_since)
        with self._lock:
            self._records[record.key] = record
            self._finished.pop(record.key, None)
            if record.state in ("finished", "dropped"):
                # A finished key's history read back from the store (its last results): kept
                # for /jobs like one that finished here, the oldest dropped first.
                self._finished[record.key] = None
                while len(self._finished) > self.max_finished:
                    oldest, _ = self._finished.popitem(last=False)
                    del self._records[oldest]
                    self._starved.pop(oldest, None)
                    self._pinned.pop(oldest, None)
            if record.state == "crashing" and record.last_end == BLOCKED:
                record.state = PENDING  # stored by an earlier smoosh, which called a blocked key crashing
            self._count_backoff(record)
            if record.starved_since is not None:
                self._starved[record.key] = record.channel
            else:
                self._starved.pop(record.key, None)

    def wall_stepped(self, now: float, mono: float) -> None:
        """The wall clock stepped: retry times shown in wall time move with it (``/jobs`` stays true).

        The waits themselves count on the monotonic clock and do not move; only the wall time
        a person reads for them is worked out again from it. Records already in the store keep
        the old time until their next write (a restart before then caps the wait: :meth:`restore`).

        Parameters:
            now: wall time now, after the step.
            mono: monotonic time now.
        """
        with self._lock:
            for rec in self._records.values():
                if rec.retry_mono is not None:
                    rec.retry_at = now + (rec.retry_mono - mono)

    def _longest_wait_s(self) -> float:
        """The longest wait for a retry the table sets: the capped backoff, or a busy database's."""
        return max(longest_backoff_s(self.backoff_base_s), BUSY_RETRY_S)

    def snapshot(self, key: str) -> KeyRecord | None:
        """A copy of ``key``'s record, safe to encode on another thread."""
        with self._lock:
            rec = self._records.get(key)
            if rec is None:
                return None
            return KeyRecord(
                rec.key, rec.channel, rec.state, rec.progress, rec.error_count, rec.last_error,
                rec.last_updated, rec.retry_at, deque(rec.events), rec.busy_count, rec.starved_since,
                rec.retry_mono, rec.pinned_since, rec.pinned_mono,
            )


#: Largest stored record decoded, in bytes (20 events of a few hundred bytes each).
MAX_RECORD_BYTES = 64 * 1024


def encode_record(rec: KeyRecord) -> bytes:
    """A record as stored: msgpack of its fields and events."""
    return msgpack.packb(
        {
            "channel": rec.channel,
            "state": rec.state,
            "error_count": rec.error_count,
            "last_error": rec.last_error,
            "last_updated": rec.last_updated,
            "retry_at": rec.retry_at,
            "busy_count": rec.busy_count,
            "starved_since": rec.starved_since,
            "pinned_since": rec.pinned_since,
            "events": [[e.event, e.at, e.reason] for e in rec.events],
        },
        use_bin_type=True,
    )


def decode_record(key: str, raw: bytes) -> KeyRecord | None:
    """A stored record back, or None when it is not one smoosh wrote (checked, never trusted)."""
    if len(raw) > MAX_RECORD_BYTES:
        return None
    try:
        data: Any = msgpack.unpackb(raw, raw=False, max_str_len=MAX_RECORD_BYTES, max_bin_len=0,
                                    max_array_len=1000, max_map_len=100, max_ext_len=0)
        events = deque(
            Event(str(e[0]), float(e[1]), None if e[2] is None else str(e[2]))
            for e in data["events"]
        )
        retry_at = data.get("retry_at")
        starved_since = data.get("starved_since")
        pinned_since = data.get("pinned_since")
        return KeyRecord(
            key=key,
            channel=None if data.get("channel") is None else str(data["channel"]),
            state=str(data.get("state") or "crashing"),
            error_count=int(data.get("error_count") or 0),
            last_error=None if data.get("last_error") is None else str(data["last_error"]),
            last_updated=float(data.get("last_updated") or 0.0),
            retry_at=None if retry_at is None else float(retry_at),
            events=events,
            busy_count=max(0, int(data.get("busy_count") or 0)),
            starved_since=None if starved_since is None else float(starved_since),
            pinned_since=None if pinned_since is None else float(pinned_since),
        )
    except (ValueError, TypeError, KeyError, IndexError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
        return None
