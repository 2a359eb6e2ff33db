"""How a run ended, recorded: history, counters, crash backoff, and the store write that goes with it.

Owner: the server's :class:`~smoosh.loop.Loop` thread. Run events are delivered there (the
scheduler posts them), and channels report outcomes from their ticks there; nothing here is
touched from another thread.

A crashing key's record (its errors and backoff) is written to the store in the same
transaction that removes its job, so a restart finds the backoff where it left it: a
crashing database is not retried at once after a restart (DESIGN §5.6).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Callable, Protocol

from channels import Channel
from channels.ports import BLOCKED, BUSY, FAILED, GONE, INTERRUPTED, OK, REPLACED, Outcome, RunEvent
from smoosh.clocks import Clocks
from smoosh.compactors.base import READ_ONLY
from smoosh.daemon.control import control
from smoosh.daemon.history import (
    BLOCKED as BLOCKED_EVENT, BUSY as BUSY_EVENT, BUSY_RETRY_S, CRASHED, DROPPED, FINISHED, REPLACED as REPLACED_EVENT,
    STARTED, STARVED, HistoryTable, encode_record, longest_backoff_s,
)
from smoosh.daemon.record.histogram import Histogram
from smoosh.daemon.record.series import Series
from smoosh.daemon.results import Result, ResultLog
from smoosh.daemon.run.startup import crash_record_key
from smoosh.store.base import Transaction

__all__ = ["Outcomes", "Counters", "log_fields"]

log = logging.getLogger(__name__)

Write = Callable[[Transaction], None]

#: The duration histogram of a channel and result before its first compaction.
EMPTY_DURATIONS = Histogram()

#: Said once when a key becomes starved: what the operator can do about a database never idle enough.
STARVED_ADVICE = (
    "its application never leaves it idle long enough to compact: give channel {channel} a window when the "
    "application is idle (from/to), or set auto_vacuum = INCREMENTAL on the database so it is compacted in "
    "short chunks beside the writer"
)

#: Said with every ``replaced`` result: what smoosh could not rule out.
REPLACED_RISK = (
    "Renaming a file over a database that is open is unsafe: an application connection that opened the new file "
    "while the compaction's journal or WAL sat beside it may have applied them to it (sqlite.org/howtocorrupt.html 2.4)."
)


@dataclass
class Counters:
    """Plain counters: cheap enough for the hot path, exported by the metrics collector.

    The ``enqueue_*`` fields are bumped by whichever thread brings a key in (HTTP, watcher,
    intake pool), the rest on the server's loop thread (:meth:`Outcomes.on_outcome` and the
    housekeeping's rotation); the metrics collector reads them at scrape time. The increments
    take no lock, to keep the hot path free of one: two threads bumping the same field at the
    same instant may lose one count. The per-compaction values are written by the loop alone,
    and each is replaced whole (an immutable tuple or :class:`Histogram`), so a scrape never
    sees half of one compaction's record.
    """

    enqueue_stale: int = 0
    enqueue_examined: int = 0
    enqueue_accepted: int = 0
    enqueue_rejected: int = 0
    #: (channel, result) -> the durations of its finished compactions (their count is
    #: ``smoosh_compactions_total``: one record, so the two metrics never disagree).
    durations: dict[tuple[str, str], Histogram] = field(default_factory=dict)
    #: channel -> (bytes before, bytes after), summed over its successful compactions.
    compacted_bytes: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: channel -> the time (clock seconds) its last successful compaction was recorded.
    last_success_s: dict[str, float] = field(default_factory=dict)
    rotations: int = 0
    #: reason -> admin API connections shed (``"full"``, ``"evicted"``; the connection loop's thread).
    http_shed: dict[str, int] = field(default_factory=lambda: {"full": 0, "evicted": 0})
    #: how -> ``POST /enqueue`` requests cut at their deadline (``"cut"``) or refused unexamined
    #: after waiting too long for a handler (``"shed"``); the admin API's handler threads.
    http_cut: dict[str, int] = field(default_factory=lambda: {"cut": 0, "shed": 0})
    #: The last hour per minute, for the operators' page (``GET /series``): fed here, with each
    #: compaction counted, and by the status record with the fleet's reclaimable bytes.
    series: Series = field(default_factory=Series)

    @property
    def compactions(self) -> dict[tuple[str, str], int]:
        """(channel, result) -> finished compactions."""
        return {key: histogram.count for key, histogram in dict(self.durations).items()}

    @property
    def reclaimed_bytes(self) -> dict[str, int]:
        """channel -> bytes given back: before minus after, so the two metrics always agree."""
        return {channel: before - after for channel, (before, after) in dict(self.compacted_bytes).items()}

    def count(self, channel: str, outcome: Outcome, now: float) -> None:
        """Count one finished compaction of ``channel`` at ``now`` (wall time; loop thread only).

        A database that grew while it was compacted (writes during the run) reclaimed nothing:
        its bytes after are counted as its bytes before, so ``before - after`` stays the
        reclaimed bytes and no counter ever goes down.
        """
        key = (channel, outcome.result)
        self.durations[key] = self.durations.get(key, EMPTY_DURATIONS).observed(outcome.duration_s)
        reclaimed = 0
        if outcome.result == OK:
            before, after = self.compacted_bytes.get(channel, (0, 0))
            size_before = max(0, outcome.size_before_bytes)
            size_after = min(size_before, max(0, outcome.size_after_bytes))
            self.compacted_bytes[channel] = (before + size_before, after + size_after)
            self.last_success_s[channel] = now
            reclaimed = size_before - size_after
        self.series.count(outcome.result, reclaimed, now)

    def count_reclaimed(self, channel: str, size_before_bytes: int, size_after_bytes: int, now: float) -> None:
        """Count bytes a compaction gave back after it ended (loop thread only): its bytes before and after.

        A compaction blocked by a reader pinning the WAL has written the compacted database
        into the WAL; when the reader leaves and the WAL is checkpointed, the file shrinks. Its
        retry then finds nothing to do (dropped, priority 0), and the bytes were counted nowhere.
        """
        before, after = self.compacted_bytes.get(channel, (0, 0))
        size_after = min(size_before_bytes, max(0, size_after_bytes))
        self.compacted_bytes[channel] = (before + size_before_bytes, after + size_after)
        self.last_success_s[channel] = now
        self.series.add_reclaimed(size_before_bytes - size_after, now)


def log_fields(channel: str, key: str, outcome: Outcome) -> dict[str, object]:
    """The structured fields of the line a run's end logs (``extra=``: JSON logs carry them, text ignores them).

    Parameters:
        channel: the channel that ran it.
        key: the database.
        outcome: how the run ended.

    Returns:
        ``key``, ``channel``, ``result``, ``duration_s``, ``size_before_bytes``,
        ``size_after_bytes``, ``reclaimed_bytes``, and ``error`` when the run did not succeed.
    """
    fields: dict[str, object] = {
        "key": key,
        "channel": channel,
        "result": outcome.result,
        "duration_s": round(outcome.duration_s, 6),
        "size_before_bytes": outcome.size_before_bytes,
        "size_after_bytes": outcome.size_after_bytes,
        "reclaimed_bytes": outcome.reclaimed_bytes,
    }
    if outcome.error is not None:
        fields["error"] = outcome.error
    return fields


class _Compacted(Protocol):
    """Who learns that a key was compacted or is gone (the router, the intake)."""

    def record_compacted(self, key: str, size_after_bytes: int, now: float) -> None: ...


class Outcomes:
    """Records every run's end (see the module docstring).

    Parameters:
        node: this daemon's node name (crash records are per node).
        history: the per-key history table.
        counters: the server's counters.
        router: told the size a key was compacted to.
        forget: the intake forgets a key's measurements once it is compacted or gone.
        log_level: the level of the "compacted" line (``compaction_log_level``), read each time.
        channel_of: the channel of that name now, or None once closed.
        claimed_run: whether ``key`` runs (or ran) on this process's worker, claimed by it.
        clocks: the daemon's clocks: history and counters are wall time (a person reads
            them), a not-before time is monotonic (the channels' clock: a wall clock set
            back must not hold a retry back for the step).
        results: the durable history: a run this process's worker did not claim has its row
            written here, with its job's removal (a claimed run's worker writes it with the
            finish).
        live_token: the token of the run that holds ``key`` now, or None: a run dropped while
            another run of its key goes on (two channels held the key) leaves the key's
            history alone, which tells of the run that goes on.
    """

    def __init__(
        self,
        *,
        node: str,
        history: HistoryTable,
        counters: Counters,
        router: _Compacted,
        forget: Callable[[str], None],
        log_level: Callable[[], int],
        channel_of: Callable[[str], Channel | None],
        claimed_run: Callable[[str], bool],
        clocks: Clocks,
        results: ResultLog | None = None,
        live_token: Callable[[str], int | None] = lambda key: None,
    ) -> None:
        self._node = node
        self._history = history
        self._counters = counters
        self._router = router
        self._forget = forget
        self._log_level = log_level
        self._channel_of = channel_of
        self._claimed_run = claimed_run
        self._clocks = clocks
        self._results = results
        self._live_token = live_token
        #: Keys with a crash record in the store: only those need one cleared.
        self.crash_records: set[str] = set()
        # key -> the store write to make with its job's removal (its crash record).
        self._pending_writes: dict[str, Write] = {}
        # key -> its bytes (file and WAL) at the start of a run a reader's pinned WAL blocked:
        # what its next run's drop compares the file with (see Counters.count_reclaimed).
        self._blocked_before: dict[str, int] = {}

    def on_outcome(self, channel: str, key: str, outcome: Outcome, now: float) -> float | None:
        """Record how a run ended at ``now`` (monotonic: the channels' clock).

        Returns:
            The monotonic time the key may start again (crash backoff, busy wait), or None.
        """
        result = outcome.result
        wall = self._clocks.wall()
        self._counters.count(channel, outcome, wall)
        self._blocked_before.pop(key, None)
        history = self._history
        not_before: float | None = None
        fields = log_fields(channel, key, outcome)
        if result == OK:
            reclaimed = outcome.reclaimed_bytes
            history.record(key, FINISHED, wall, channel=channel, reason=f"reclaimed {reclaimed} bytes")
            self._router.record_compacted(key, outcome.size_after_bytes, now)
            self._forget(key)
            # The one line a finished compaction writes (DESIGN §11), at compaction_log_level.
            log.log(self._log_level(), "compacted %r in %s in %.2f s: %d -> %d bytes, reclaimed %d bytes",
                    key, channel, outcome.duration_s, outcome.size_before_bytes, outcome.size_after_bytes, reclaimed,
                    extra=fields)
        elif result == GONE:
            history.record(key, FINISHED, wall, channel=channel, reason="database gone")
            self._forget(key)
            log.info("%r is gone; dropped", key, extra=fields)
        elif result == BUSY:
            rec = history.record(key, BUSY_EVENT, wall, channel=channel, reason=outcome.error or "database busy",
                                 mono=now)
            not_before = rec.retry_mono if rec.retry_mono is not None else now + BUSY_RETRY_S
            if rec.state == STARVED and rec.starved_since == wall:
                # Once, when it becomes starved (DESIGN §11: starved logs at WARNING); it is
                # still retried, in case the application goes quiet.
                log.warning("%r in %s was busy %d times in a row and is starved: %s; retrying in %.0f s",
                            key, channel, rec.busy_count, STARVED_ADVICE.format(channel=channel), not_before - now,
                            extra=fields)
            else:
                log.info("%r was busy; retrying in %.0f s", key, not_before - now, extra=fields)
        elif result == BLOCKED:
            not_before = self._blocked(channel, key, outcome.error or "", wall, now, fields, outcome.size_before_bytes)
        elif result == REPLACED:
            history.record(key, REPLACED_EVENT, wall, channel=channel, reason=outcome.error or "replaced")
            self._forget(key)
            log.error("compaction of %r in %s ended replaced: %s. %s", key, channel, outcome.error, REPLACED_RISK,
                      extra=fields)
        else:  # failed: a crash, with its backoff
            rec = history.record(key, CRASHED, wall, channel=channel, reason=outcome.error or result, mono=now)
            not_before = rec.retry_mono if rec.retry_mono is not None else now
            log.warning(
                "compaction of %r in %s %s (%s); retrying in %.0f s",
                key, channel, "failed" if result == FAILED else f"ended {result}", rec.last_error, not_before - now,
                extra=fields,
            )
        write = self._crash_record_write(key, keep=not_before is not None)
        if self._results is not None and not self._claimed_run(key):
            # Its history row rides on its job's removal (a claimed run's on its finish).
            write = _both(write, self._results.write_for(key, Result.of(outcome, channel, wall)))
        if write is not None:
            self._pending_writes[key] = write
        return not_before

    def _blocked(
        self, channel: str, key: str, reason: str, wall: float, now: float, fields: dict[str, object],
        size_before_bytes: int = 0,
    ) -> float:
        """Record a compaction that could not make progress; the (monotonic) time it is tried again.

        A read-only file does not become writable by itself (an operator changes the mode or
        the mount), so it waits the longest backoff at once instead of climbing to it; a reader
        pinning the WAL backs off like a crash. One WARNING line either way, no traceback.
        """
        history = self._history
        retry_after_s = longest_backoff_s(history.backoff_base_s) if reason == READ_ONLY else None
        if reason != READ_ONLY and size_before_bytes > 0:
            self._blocked_before[key] = size_before_bytes
        rec = history.record(
            key, BLOCKED_EVENT, wall, channel=channel, reason=f"blocked: {reason}", retry_after_s=retry_after_s,
            mono=now,
        )
        not_before = rec.retry_mono if rec.retry_mono is not None else now
        log.warning("compaction of %r in %s ended blocked: %s; retrying in %.0f s", key, channel, reason, not_before - now,
                    extra=fields)
        return not_before

    def deliver(self, channel_name: str, event: RunEvent) -> Write | None:
        """A run event reaches its channel; for an end, the write to make with the job's removal."""
        wall, now = self._clocks.wall(), self._clocks.monotonic()
        if event.kind == "running":
            rec = self._history.get(event.key)
            if rec is None or rec.state != "running":
                self._history.record(event.key, STARTED, wall, channel=channel_name)
        elif event.kind == "dropped" and self._live_token(event.key) in (None, event.run):
            self._history.record(event.key, DROPPED, wall, channel=channel_name, reason=event.reason)
            self._reclaimed_since_blocked(channel_name, event.key, wall, now)
        channel = self._channel_of(channel_name)
        ended = event.outcome if event.kind == "ended" else None
        # An interrupted run is not an outcome to record (no history, no backoff: the channel
        # queues the key again by itself), but it is a result: counted here, where its end
        # arrives, and only for the run the channel is following (an old run's event is ignored).
        if ended is not None and ended.result == INTERRUPTED and (
            channel is None or channel.in_flight().get(event.key) == event.run
        ):
            self._counters.count(channel_name, ended, wall)
        if channel is None:
            # Its channel was closed meanwhile: the outcome is still recorded.
            if ended is not None and ended.result != INTERRUPTED:
                self.on_outcome(channel_name, event.key, ended, now)
        else:
            channel.on_run_event(event, now)
        return self._pending_writes.pop(event.key, None) if event.kind == "ended" else None

    def _reclaimed_since_blocked(self, channel: str, key: str, wall: float, now: float) -> None:
        """A key whose last run a pinned WAL blocked was dropped: count what its file gave back since.

        Its VACUUM had written the compacted database into the WAL, which the reader kept from
        being copied back; once the reader left and the WAL was checkpointed, the file came out
        small, and the retry found nothing to do. The bytes are the compaction's: counted (in
        ``smoosh_compacted_bytes_total`` and ``smoosh_reclaimed_bytes_total``, not as a second
        compaction), said in the one line a compaction writes, and the key is ``finished``.
        """
        before = self._blocked_before.pop(key, None)
        if before is None:
            return
        after = _footprint(key)
        if after is None or after >= before:
            return
        self._counters.count_reclaimed(channel, before, after, wall)
        reclaimed = before - after
        self._history.record(key, FINISHED, wall, channel=channel,
                             reason=f"reclaimed {reclaimed} bytes once the WAL a reader pinned was checkpointed")
        self._router.record_compacted(key, after, now)
        self._forget(key)
        log.log(self._log_level(), "compacted %r in %s once the WAL a reader pinned was checkpointed: %d -> %d bytes, "
                "reclaimed %d bytes", key, channel, before, after, reclaimed,
                extra={"key": key, "channel": channel, "result": OK, "size_before_bytes": before,
                       "size_after_bytes": after, "reclaimed_bytes": reclaimed})

    def _crash_record_write(self, key: str, *, keep: bool) -> Write | None:
        """The write of ``key``'s crash record (or its removal), made with its job's removal.

        None when there is nothing to write: a success of a key that never crashed here (most
        keys), run by this process's worker (no rotation request in the store to clear).
        """
        if not keep and key not in self.crash_records and self._claimed_run(key):
            return None
        store_key = crash_record_key(self._node, key)
        rotate_key = control.rotate_key(self._node, key)
        record = self._history.snapshot(key) if keep else None
        if keep:
            self.crash_records.add(key)
        else:
            self.crash_records.discard(key)
        value = encode_record(record) if record is not None else None

        def write(tr: Transaction) -> None:
            tr.clear(rotate_key)  # a rotation request for the run that ended
            if value is None:
                tr.clear(store_key)
            else:
                tr.set(store_key, value)

        return write


def _both(first: Write | None, second: Write) -> Write:
    """One write made of two, in order (``first`` may be None)."""
    if first is None:
        return second

    def write(tr: Transaction) -> None:
        first(tr)
        second(tr)

    return write


def _footprint(path: str) -> int | None:
    """A database's bytes as a compaction measures them, the file and its WAL; None when it is gone."""
    try:
        size = os.stat(path).st_size
    except OSError:
        return None
    try:
        return size + os.stat(path + "-wal").st_size
    except OSError:
        return size
