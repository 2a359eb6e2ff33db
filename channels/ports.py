"""What a channel needs from the world, as typed ports, and the two values that cross them.

A :class:`~channels.channel.Channel` decides *what* to start and *when*; it starts nothing
itself. It hands a key to a :class:`Scheduler` (smoosh's adapter over its job layer, or a
test's double) and hears back through :meth:`Channel.on_run_event` with :class:`RunEvent`
values; it asks its :class:`Host` (the daemon) for global slots, reports holds, and hands
it every :class:`Outcome`. The channel is pure of smoosh: these protocols are the whole
seam.

Results (one vocabulary everywhere: job data, ``/jobs``, metrics, logs):
``ok``, ``failed``, ``busy``, ``gone``, ``interrupted``, ``replaced``, ``blocked``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

__all__ = [
    "Outcome",
    "RunEvent",
    "RunKind",
    "Scheduler",
    "Host",
    "RESULTS",
    "OK",
    "FAILED",
    "BUSY",
    "GONE",
    "INTERRUPTED",
    "REPLACED",
    "BLOCKED",
]

OK = "ok"
FAILED = "failed"
BUSY = "busy"
GONE = "gone"
INTERRUPTED = "interrupted"
REPLACED = "replaced"
BLOCKED = "blocked"
#: Every result a compaction can end with, in the order metrics list them.
RESULTS = (OK, FAILED, BUSY, GONE, INTERRUPTED, REPLACED, BLOCKED)


@dataclass(frozen=True)
class Outcome:
    """How one compaction ended.

    Attributes:
        result: one of :data:`RESULTS`.
        error: why it did not succeed (None for ``ok``).
        size_before_bytes, size_after_bytes: the database's footprint around the run.
        duration_s: how long the compaction ran.
        progress: the last progress reported, in [0, 1].
        rotated: an ``interrupted`` run that rotation stopped to make way for waiting work.
        stopping: an ``interrupted`` run stopped because its worker or daemon is stopping:
            the channel takes the key back at the top of its queue.
    """

    result: str
    error: str | None = None
    size_before_bytes: int = 0
    size_after_bytes: int = 0
    duration_s: float = 0.0
    progress: float = 0.0
    rotated: bool = False
    stopping: bool = False

    @property
    def reclaimed_bytes(self) -> int:
        """Bytes given back (never negative)."""
        return max(0, self.size_before_bytes - self.size_after_bytes)

    def to_data(self) -> dict[str, object]:
        """The outcome as job data (msgpack-encodable), ``reclaimed_bytes`` included.

        ``rotated`` and ``stopping`` appear only when set: most outcomes are neither.
        """
        # Field by field: dataclasses.asdict deep-copies recursively, a cost paid per compaction.
        data: dict[str, object] = {
            "result": self.result, "error": self.error, "size_before_bytes": self.size_before_bytes,
            "size_after_bytes": self.size_after_bytes, "duration_s": self.duration_s, "progress": self.progress,
        }
        data["reclaimed_bytes"] = self.reclaimed_bytes
        if self.rotated:
            data["rotated"] = True
        if self.stopping:
            data["stopping"] = True
        return data

    @classmethod
    def from_data(cls, data: object, *, default_error: str = "no outcome recorded") -> Outcome:
        """Read an outcome back from job data; anything malformed is a ``failed`` outcome.

        Job data crosses processes and the store, so every field is checked, never trusted.
        """
        if not isinstance(data, dict):
            return cls(FAILED, default_error)
        result = data.get("result")
        if result not in RESULTS:
            return cls(FAILED, str(data.get("error") or default_error))

        def number(name: str) -> float:
            value = data.get(name)
            return value if isinstance(value, (int, float)) and not isinstance(value, bool) else 0

        error = data.get("error")
        return cls(
            result=result,
            error=None if error is None else str(error),
            size_before_bytes=int(number("size_before_bytes")),
            size_after_bytes=int(number("size_after_bytes")),
            duration_s=float(number("duration_s")),
            progress=float(number("progress")),
            rotated=data.get("rotated") is True,
            stopping=data.get("stopping") is True,
        )


#: What happened to a run: ``running`` (a worker took it), ``pending`` (it waits for a
#: worker again, its worker having gone), ``ended`` (``outcome`` says how), ``dropped``
#: (it never started: the priority re-check said 0, another channel runs the key, or the
#: job could not be added; ``reason`` says which).
RunKind = Literal["running", "pending", "ended", "dropped"]


@dataclass(frozen=True)
class RunEvent:
    """One step of one run, delivered to the channel that started it.

    ``run`` is the token the channel got from :meth:`Scheduler.submit`: an event for an
    older run of the same key (a late duplicate) carries another token and is ignored.
    """

    key: str
    run: int
    kind: RunKind
    outcome: Outcome | None = None
    reason: str | None = None
    priority: float | None = None  # for ``dropped``: the re-checked priority (0: done or gone)
    #: For ``ended``: the worker that ran it waits, holding nothing of the channel's, to take the
    #: channel's next key at once (a batch of small databases, smoosh's scheduler): the channel
    #: starts its next work within this event, not at its next tick, so the scheduler knows
    #: before the event returns whether that worker has a next key.
    continues: bool = False


class Scheduler(Protocol):
    """Starts the work a channel chose; reports back through ``Channel.on_run_event``."""

    def submit(self, channel: str, key: str, priority: float) -> int:
        """Start work on ``key``; returns the run's token at once (the work starts later).

        The scheduler re-checks the priority, then makes the run durable (smoosh: a job);
        every later step comes back as a :class:`RunEvent` with this token.
        """

    def adopt(self, channel: str, key: str) -> int | None:
        """Follow a run of ``key`` that already exists (found at start-up); its token, or None."""

    def running_at_once(self, key: str, token: int) -> bool:
        """Whether a worker took run ``token`` of ``key`` at its submit (it waits for none): the
        channel then counts it active at once. A scheduler whose runs always wait answers False."""


class Host(Protocol):
    """What a channel asks of the daemon that runs it."""

    def acquire_slot(self, channel: str, *, force: bool = False, forced: bool = False) -> bool:
        """Take one of the node's global slots (``max_jobs``); False: none is free for it now.

        ``force`` takes one even past the limit (a run adopted at start-up runs already);
        ``forced``: the key the channel starts next is an operator's forced one (a host may let
        it past a limit of its own below ``max_jobs``).
        """

    def release_slot(self, channel: str) -> None:
        """Give back a slot taken with :meth:`acquire_slot`."""

    def withdraw(self, channel: str) -> None:
        """The channel no longer waits for a slot (it cannot start anything now)."""

    def on_hold(self, channel: str, held: bool) -> None:
        """Running work of the channel must hold (True) or may go on (False)."""

    def on_outcome(self, channel: str, key: str, outcome: Outcome, now: float) -> float | None:
        """Record how a run of ``key`` ended (history, counters, logs).

        Returns:
            A not-before time: the channel keeps the key and starts it no earlier (a crash's
            backoff, a busy database's wait); None: the key leaves the channel.
        """

    def admits(self, key: str) -> bool:
        """Whether a key restored from a checkpoint may stay (validated like a new key)."""

    def wake(self, channel: str) -> None:
        """Tick the channel soon (it has work it may be able to start)."""

    def wall_time(self) -> float | None:
        """Unix seconds now, when the ``now`` the host ticks the channel with is not wall time
        (smoosh ticks on the monotonic clock, so that a wall clock set back stalls no wait); None
        when ``now`` is wall time. The channel reads its window, which is defined in wall time,
        and names a damaged checkpoint set aside by it."""

    def window_waived(self, channel: str) -> bool:
        """Whether the channel should run outside its window now (smoosh: disk pressure on a
        channel with ``under_pressure = ignore_window``). Asked at every window check; the host
        has the channel check at once when the answer changes (``Channel.check_window``)."""

    def concurrency_raised(self, channel: str) -> int:
        """Runs the channel may have at once whatever its own ``concurrency`` (smoosh: the backlog
        controller's slots while a file system is under disk pressure); 0 when nothing is raised.
        A ``concurrency`` of 0 is never raised. Asked before each start; the host has the
        channel look again (``check_window``) when the answer changes."""
