"""Helpers for the channel tests: an injected clock, settings, callback recorders, a harness."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

from channels import Channel

#: The job type every test channel uses.
JOB_TYPE = "smoosh:test"

#: Test start time: 2024-01-01 03:30:00 UTC (the window vectors of DESIGN 5.3 are "at 03:30").
T0 = datetime(2024, 1, 1, 3, 30, tzinfo=timezone.utc).timestamp()

#: Real seconds a test waits for an asynchronous job event before it fails.
SETTLE_TIMEOUT_S = 5.0


class FakeClock:
    """A settable wall clock; ``clock()`` returns ``now``."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


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


@dataclass
class Recorder:
    """Records every callback a channel makes."""

    done: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    holds: list[tuple[str, bool]] = field(default_factory=list)
    acquired: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    grant: bool = True

    def on_job_done(self, channel: str, key: str, data: dict[str, Any]) -> None:
        self.done.append((channel, key, data))

    def on_hold(self, channel: str, hold: bool) -> None:
        self.holds.append((channel, hold))

    def acquire_slot(self, channel: str, key: str) -> bool:
        if self.grant:
            self.acquired.append(key)
        return self.grant

    def release_slot(self, channel: str, key: str) -> None:
        self.released.append(key)

    def results(self) -> dict[str, str]:
        return {key: data.get("result") for _, key, data in self.done}


class Harness:
    """One channel under test, with its clock, job layer and callback recorder."""

    def __init__(self, channel: Channel, clock: FakeClock, jobs: Any, rec: Recorder) -> None:
        self.channel = channel
        self.clock = clock
        self.jobs = jobs
        self.rec = rec

    def tick(self, advance_s: float = 0.0) -> None:
        """Advance the clock and run one iteration."""
        self.clock.advance(advance_s)
        self.channel.tick(self.clock.now)

    def settle(self, predicate: Callable[[], bool], what: str = "condition") -> None:
        """Tick (without moving the clock) until ``predicate()`` holds.

        Job events reach subscriptions asynchronously (the job layer's notifier), so this
        waits in real time for an event, bounded by SETTLE_TIMEOUT_S; it never waits for a
        timer of the channel.
        """
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while True:
            self.channel.tick(self.clock.now)
            if predicate():
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}: status={self.channel.status()}")
            time.sleep(0.005)

    def status(self) -> dict[str, Any]:
        return self.channel.status()

    def job_ids(self) -> set[str]:
        return {job_id for _, job_id, _, _ in self.jobs.list_jobs(JOB_TYPE)}

    def job_state(self, key: str) -> str | None:
        for _, job_id, state, _ in self.jobs.list_jobs(JOB_TYPE):
            if job_id == key:
                return state
        return None

    def accept(self) -> tuple[Any, dict[str, Any]]:
        """A worker takes the next pending job."""
        return self.jobs.accept(JOB_TYPE, timeout=0)

    def finish(self, job: Any, data: dict[str, Any], result: str, **extra: Any) -> None:
        """A worker finishes ``job`` with ``result``."""
        self.jobs.finish(job, {**data, "result": result, **extra})

    def wait_active(self, count: int) -> None:
        self.settle(lambda: self.status()["active"] == count, f"active == {count}")

    def wait_done(self, count: int) -> None:
        self.settle(lambda: len(self.rec.done) == count, f"{count} job(s) reported done")

    def run_one(self, result: str = "ok") -> str:
        """A worker accepts the next job, the channel sees it run, the worker finishes it."""
        job, data = self.accept()
        self.settle(lambda: job.id in self.channel.keys() and self.status()["active"] >= 1, "job active")
        before = len(self.rec.done)
        self.finish(job, data, result)
        self.settle(lambda: job.id not in self.channel.keys() or self._requeued(job.id), "job ended")
        if result != "interrupted":
            assert len(self.rec.done) == before + 1
        return job.id

    def _requeued(self, key: str) -> bool:
        return any(k == key for k, _ in self.channel.waiting())
