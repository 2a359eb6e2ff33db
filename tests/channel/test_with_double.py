"""Unit tests against a scripted job layer: event order within one tick, and the calls used."""

from __future__ import annotations

import collections
import logging
from typing import Any

from channel_testlib import JOB_TYPE, T0, FakeClock, Recorder, Settings

from channels import Channel


class NotFound(Exception):
    """Not smoosh's NotFound: the channel recognises any error of that name."""


class ScriptedSub:
    def __init__(self, job_id: str, state: str, data: dict[str, Any]) -> None:
        self.id = job_id
        self.state = state
        self.data = data
        self.events: collections.deque[tuple[Any, str, str, Any]] = collections.deque()
        self.closed = False

    def wait(self, state: str | None = None, timeout: float | None = None) -> Any:
        assert timeout == 0, "a channel must never block on a subscription"
        if self.closed or not self.events:
            return None
        event = self.events.popleft()
        self.state, self.data = event[2], event[3]
        return event

    def close(self) -> None:
        self.closed = True


class ScriptedJobs:
    """Holds job states in a dict; the test emits events by hand."""

    def __init__(self) -> None:
        self.jobs: dict[str, tuple[str, dict[str, Any]]] = {}
        self.subs: dict[str, ScriptedSub] = {}
        self.calls: list[str] = []

    def add(self, job_type: Any, job_id: str, data: dict[str, Any]) -> None:
        self.calls.append("add")
        self.jobs[job_id] = ("pending", data)

    def remove(self, job_type: Any, job_id: str) -> None:
        self.calls.append("remove")
        if self.jobs.pop(job_id, None) is None:
            raise NotFound(job_id)

    def get_job_state(self, job_type: Any, job_id: str) -> str:
        self.calls.append("get_job_state")
        if job_id not in self.jobs:
            raise NotFound(job_id)
        return self.jobs[job_id][0]

    def get_job_data(self, job_type: Any, job_id: str) -> dict[str, Any]:
        self.calls.append("get_job_data")
        return self.jobs[job_id][1]

    def subscribe(self, job_type: Any, job_id: str) -> ScriptedSub:
        self.calls.append("subscribe")
        state, data = self.jobs[job_id]
        sub = ScriptedSub(job_id, state, data)
        self.subs[job_id] = sub
        return sub

    def emit(self, job_id: str, state: str, data: dict[str, Any] | None = None) -> None:
        self.subs[job_id].events.append((JOB_TYPE, job_id, state, data))


def _channel(jobs: ScriptedJobs, rec: Recorder, **kwargs: Any) -> Channel:
    return Channel(
        "ratio_dbs", Settings(**kwargs), jobs=jobs, job_type=JOB_TYPE, priority_of=lambda key: 4.0,
        on_job_done=rec.on_job_done, release_slot=rec.release_slot, wait_s=0, clock=FakeClock(),
    )


def test_running_and_finished_in_one_tick_are_both_applied(caplog: Any) -> None:
    jobs, rec = ScriptedJobs(), Recorder()
    channel = _channel(jobs, rec)
    channel.enqueue("/db/a", 4.0)
    channel.enqueue("/db/b", 3.0)
    channel.tick(T0)
    data = jobs.jobs["/db/a"][1]
    jobs.emit("/db/a", "running", data)
    jobs.emit("/db/a", "finished", {**data, "result": "ok"})
    # The row is already gone when the channel removes it: NotFound is ignored quietly.
    jobs.jobs.pop("/db/a")
    with caplog.at_level(logging.WARNING):
        channel.tick(T0 + 1)
    assert rec.results() == {"/db/a": "ok"}
    assert jobs.subs["/db/a"].closed
    assert "/db/b" in jobs.jobs  # the freed slot was used in the same tick
    assert caplog.records == []
    channel.close(checkpoint=False)


def test_channel_uses_only_the_pinned_job_calls() -> None:
    jobs, rec = ScriptedJobs(), Recorder()
    channel = _channel(jobs, rec)
    channel.enqueue("/db/a", 4.0)
    channel.tick(T0)
    jobs.emit("/db/a", "running", jobs.jobs["/db/a"][1])
    jobs.emit("/db/a", "finished", {**jobs.jobs["/db/a"][1], "result": "failed", "error": "boom"})
    channel.tick(T0 + 1)
    assert jobs.calls == ["get_job_state", "add", "subscribe", "remove"]
    assert jobs.jobs == {}
    assert rec.done == [("ratio_dbs", "/db/a", {
        "channel": "ratio_dbs", "key": "/db/a", "priority": 4.0, "progress": 0.0,
        "result": "failed", "error": "boom",
    })]
    channel.close(checkpoint=False)


def test_events_of_a_job_running_and_pending_again_keep_its_slot() -> None:
    jobs, rec = ScriptedJobs(), Recorder()
    channel = _channel(jobs, rec, concurrency=1)
    channel.enqueue("/db/a", 4.0)
    channel.enqueue("/db/b", 3.0)
    channel.tick(T0)
    data = jobs.jobs["/db/a"][1]
    for state in ["running", "running", "pending", "running", "pending"]:
        jobs.emit("/db/a", state, data)
        channel.tick(T0 + 1)
        expected = (1, 0) if state == "running" else (0, 1)
        assert (channel.status()["active"], channel.status()["starting"]) == expected
    assert "/db/b" not in jobs.jobs
    assert rec.released == []
    channel.close(checkpoint=False)
