"""Helpers for the channel tests: an injected clock, settings, a scripted scheduler, a recording host.

A :class:`~channels.Channel` reaches the world only through its two ports, so these tests
drive it entirely by hand: ``tick(now)`` at a chosen time, run events delivered with
``on_run_event``, and every call it makes recorded in one ordered :class:`Journal`. No
thread, no sleep, no job layer.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from channels import Channel, Outcome, RunEvent

#: The name of every test channel.
NAME = "ratio_dbs"

#: Test start time: 2024-01-01 03:30:00 UTC (the window vectors of DESIGN 5.3 are "at 03:30").
T0 = datetime(2024, 1, 1, 3, 30, tzinfo=UTC).timestamp()

#: The first run token the scripted scheduler hands out.
FIRST_TOKEN = 100


@dataclass(frozen=True)
class Settings:
    """The four settings a channel reads (smoosh's ChannelConfig has them too)."""

    capacity: int = 9999
    concurrency: int = 1
    window: Any = None
    strict_window: bool = False


class SwitchWindow:
    """A window the test opens and closes by hand; counts how often it was asked."""

    def __init__(self, open_: bool = True) -> None:
        self.open = open_
        self.checks = 0

    def is_open(self, now: datetime) -> bool:
        assert now.tzinfo is not None
        self.checks += 1
        return self.open


class Journal(list[tuple[Any, ...]]):
    """Every call made on the doubles, in order: ``(name, *args)`` tuples."""

    def names(self) -> list[str]:
        return [call[0] for call in self]


class ScriptedScheduler:
    """A :class:`~channels.ports.Scheduler` that records submits and hands out tokens.

    Nothing runs: the test emits the run's events itself (``Harness.send``).

    Attributes:
        submits: ``(channel, key, priority)`` per submit, in order.
        tokens: the token handed out last for each key.
        fail: keys whose submit raises (as a scheduler that cannot reach its store would).
        adoptable: ``key -> token`` of runs :meth:`adopt` finds.
    """

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.submits: list[tuple[str, str, float]] = []
        self.tokens: dict[str, int] = {}
        self.fail: set[str] = set()
        self.adoptable: dict[str, int] = {}
        self._next = itertools.count(FIRST_TOKEN)

    def submit(self, channel: str, key: str, priority: float) -> int:
        self.journal.append(("submit", key, priority))
        if key in self.fail:
            raise RuntimeError("store unavailable")
        self.submits.append((channel, key, priority))
        token = next(self._next)
        self.tokens[key] = token
        return token

    def adopt(self, channel: str, key: str) -> int | None:
        self.journal.append(("adopt", key))
        token = self.adoptable.get(key)
        if token is not None:
            self.tokens[key] = token
        return token

    def running_at_once(self, key: str, token: int) -> bool:
        return False  # its runs wait for their "running" event

    def started(self) -> list[str]:
        """The keys submitted, in order."""
        return [key for _, key, _ in self.submits]


class RecordingHost:
    """A :class:`~channels.ports.Host` that records every call.

    Attributes:
        grant: whether :meth:`acquire_slot` grants a slot (a forced acquire always does).
        slots: slots the channel holds now (never below zero).
        holds: ``(channel, held)`` per ``on_hold`` call.
        outcomes: ``(channel, key, outcome, now)`` per ``on_outcome`` call.
        not_before: ``key -> time`` that ``on_outcome`` returns (absent: None).
        refused: keys :meth:`admits` refuses.
        fail_on_hold, fail_on_outcome: that many next calls raise.
    """

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.grant = True
        self.slots = 0
        self.holds: list[tuple[str, bool]] = []
        self.outcomes: list[tuple[str, str, Outcome, float]] = []
        self.not_before: dict[str, float] = {}
        self.refused: set[str] = set()
        self.fail_on_hold = 0
        self.fail_on_outcome = 0

    def acquire_slot(self, channel: str, *, force: bool = False, forced: bool = False) -> bool:
        self.journal.append(("acquire_slot", force) if force else ("acquire_slot",))
        if force or self.grant:
            self.slots += 1
            return True
        return False

    def release_slot(self, channel: str) -> None:
        self.journal.append(("release_slot",))
        assert self.slots > 0, "released a slot it did not hold"
        self.slots -= 1

    def withdraw(self, channel: str) -> None:
        self.journal.append(("withdraw",))

    def on_hold(self, channel: str, held: bool) -> None:
        self.journal.append(("on_hold", held))
        if self.fail_on_hold:
            self.fail_on_hold -= 1
            raise ConnectionError("store down")
        self.holds.append((channel, held))

    def on_outcome(self, channel: str, key: str, outcome: Outcome, now: float) -> float | None:
        self.journal.append(("on_outcome", key, outcome.result))
        if self.fail_on_outcome:
            self.fail_on_outcome -= 1
            raise RuntimeError("server busy")
        self.outcomes.append((channel, key, outcome, now))
        return self.not_before.get(key)

    def admits(self, key: str) -> bool:
        self.journal.append(("admits", key))
        return key not in self.refused

    def wake(self, channel: str) -> None:
        self.journal.append(("wake",))

    def wall_time(self) -> float | None:
        return None  # the channel is ticked in wall time

    def window_waived(self, channel: str) -> bool:
        return False

    def concurrency_raised(self, channel: str) -> int:
        return 0

    def results(self) -> dict[str, str]:
        return {key: outcome.result for _, key, outcome, _ in self.outcomes}

    def calls(self, name: str) -> list[tuple[Any, ...]]:
        return [call for call in self.journal if call[0] == name]


class Harness:
    """One channel under test, with its clock, scheduler double and host double."""

    def __init__(self, channel: Channel, scheduler: ScriptedScheduler, host: RecordingHost, journal: Journal, now: float) -> None:
        self.channel = channel
        self.scheduler = scheduler
        self.host = host
        self.journal = journal
        self.now = now

    # -- the owner's loop ------------------------------------------------------------------

    def tick(self, advance_s: float = 0.0) -> float | None:
        """Advance the clock and run one iteration; what the channel answers (its next due time)."""
        self.now += advance_s
        return self.channel.tick(self.now)

    def send(self, key: str, kind: str, *, run: int | None = None, **fields: Any) -> None:
        """Deliver a run event for ``key`` (with the token handed out last, unless ``run`` is given)."""
        token = self.scheduler.tokens[key] if run is None else run
        self.channel.on_run_event(RunEvent(key, token, kind, **fields), self.now)  # type: ignore[arg-type]

    def running(self, key: str) -> None:
        self.send(key, "running")

    def pending(self, key: str) -> None:
        self.send(key, "pending")

    def end(self, key: str, result: str = "ok", **outcome: Any) -> None:
        self.send(key, "ended", outcome=Outcome(result, **outcome))

    def drop(self, key: str, reason: str | None = None, priority: float | None = None) -> None:
        self.send(key, "dropped", reason=reason, priority=priority)

    # -- readers ---------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return self.channel.status()

    def started(self) -> list[str]:
        return self.scheduler.started()

    def in_flight(self) -> tuple[int, int]:
        """``(starting, active)`` from the published status."""
        status = self.status()
        return status["starting"], status["active"]

    def assert_slots_match_runs(self) -> None:
        """Every run the channel holds has exactly one of the host's slots."""
        starting, active = self.in_flight()
        assert self.host.slots == starting + active, (self.host.slots, self.status())


def interrupt_the_head(h: Harness, queued: dict[str, float], **outcome: Any) -> str:
    """Queue ``queued``, start the head, let it run, and end it as interrupted; the head."""
    for key, priority in queued.items():
        h.channel.enqueue(key, priority)
    h.tick()
    head = h.started()[-1]
    h.running(head)
    if outcome.pop("deny_slots_after_start", False):
        h.host.grant = False
    h.end(head, "interrupted", **outcome)
    return head


def a_lock_that_must_not_be_taken() -> Any:
    """A stand-in for the channel's lock that fails the test if anyone takes it."""

    class _Forbidden:
        def acquire(self, *args: Any, **kwargs: Any) -> bool:
            raise AssertionError("the channel's lock was taken")

        def __enter__(self) -> None:
            raise AssertionError("the channel's lock was taken")

        def __exit__(self, *exc: object) -> None:
            return None

        def release(self) -> None:
            return None

    return _Forbidden()


INF = math.inf
MakeChannel = Callable[..., Harness]
