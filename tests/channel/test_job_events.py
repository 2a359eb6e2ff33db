"""Following jobs: running, finished, interrupted, removed, pending again, adopted."""

from __future__ import annotations

import logging
import math
from typing import Any

from channel_testlib import JOB_TYPE, Settings

from smoosh.jobs import Jobs, NotFound


def test_accepted_job_moves_from_starting_to_active(make_channel: Any) -> None:
    h = make_channel()
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    assert (h.status()["starting"], h.status()["active"]) == (1, 0)
    h.accept()
    h.wait_active(1)
    assert h.status()["starting"] == 0
    assert h.channel.keys() == {"/db/a"}


def test_finished_job_frees_its_slot_removes_the_job_and_reports(make_channel: Any) -> None:
    h = make_channel()
    h.channel.enqueue("/db/a", 5.0)
    h.channel.enqueue("/db/b", 1.0)
    h.tick()
    job, data = h.accept()
    h.wait_active(1)
    h.finish(job, data, "ok", reclaimed_bytes=4096)
    h.wait_done(1)
    channel, key, reported = h.rec.done[0]
    assert (channel, key) == ("ratio_dbs", "/db/a")
    assert reported["result"] == "ok" and reported["reclaimed_bytes"] == 4096
    assert reported["priority"] == 5.0
    assert h.rec.released == ["/db/a"]
    # The finished job row is gone, and the freed slot went to the next key in the same tick.
    assert h.job_ids() == {"/db/b"}
    assert h.status()["starting"] == 1


def test_failed_busy_and_gone_results_go_to_the_server(make_channel: Any) -> None:
    h = make_channel(settings=Settings(concurrency=3))
    for key in ["/db/f", "/db/b", "/db/g"]:
        h.channel.enqueue(key, 5.0)
    h.tick()
    taken = [h.accept() for _ in range(3)]
    h.wait_active(3)
    results = {"/db/f": "failed", "/db/b": "busy", "/db/g": "gone"}
    for job, data in taken:  # a worker accepts pending jobs in any order
        h.finish(job, data, results[job.id], error="boom")
    h.wait_done(3)
    assert h.rec.results() == {"/db/f": "failed", "/db/b": "busy", "/db/g": "gone"}
    assert h.channel.keys() == set()
    assert sorted(h.rec.released) == ["/db/b", "/db/f", "/db/g"]


def interrupt_the_head(h: Any, queued: dict[str, float], **result: Any) -> None:
    """Queue ``queued``, let a worker run the head, and finish it as interrupted."""
    for key, priority in queued.items():
        h.channel.enqueue(key, priority)
    h.tick()
    job, data = h.accept()
    h.wait_active(1)
    if result.pop("deny_slots_after_start", False):
        h.rec.grant = False
    h.finish(job, data, "interrupted", **result)


def test_interrupted_job_is_requeued_at_its_priority_not_reported(make_channel: Any) -> None:
    h = make_channel(settings=Settings(concurrency=1), priority_of=lambda key: 6.0)
    interrupt_the_head(h, {"/db/a": 6.0, "/db/b": 2.0})
    h.settle(lambda: h.rec.released == ["/db/a"], "slot freed")
    assert h.rec.done == []
    # Re-queued at 6.0 it outranks /db/b, so it is the one that starts again (same tick).
    assert h.job_ids() == {"/db/a"} and h.job_state("/db/a") == "pending"
    assert h.status()["starting"] == 1
    assert h.channel.waiting() == [("/db/b", 2.0)]


def test_removed_job_counts_as_failed(make_channel: Any, jobs: Jobs) -> None:
    h = make_channel()
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    jobs.remove(JOB_TYPE, "/db/a")
    h.wait_done(1)
    _, key, data = h.rec.done[0]
    assert key == "/db/a"
    assert data["result"] == "failed" and data["error"] == "job removed"
    assert data["channel"] == "ratio_dbs" and data["priority"] == 5.0
    assert h.rec.released == ["/db/a"]
    assert h.status()["starting"] == 0


def test_job_pending_again_after_running_counts_as_starting(make_channel: Any, jobs: Jobs) -> None:
    h = make_channel()
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    job, data = h.accept()
    h.wait_active(1)
    # Re-adding a running job flags it; finishing then puts it back to pending (as a worker
    # that stops cleanly does), so a worker must pick it up again.
    jobs.add(JOB_TYPE, "/db/a", data)
    h.finish(job, data, "ok")
    h.settle(lambda: h.status()["starting"] == 1, "back to starting")
    assert h.status()["active"] == 0
    assert h.rec.done == []
    job, data = h.accept()
    h.wait_active(1)
    h.finish(job, data, "ok")
    h.wait_done(1)
    assert h.rec.released == ["/db/a"]


class _InstantWorker:
    """The real layer, with a worker so fast that a job has finished before it is followed."""

    def __init__(self, jobs: Jobs) -> None:
        self._jobs = jobs

    def add(self, job_type: Any, job_id: str, data: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        self._jobs.add(job_type, job_id, data, *args, **kwargs)
        job, data = self._jobs.accept(job_type, timeout=0)
        self._jobs.finish(job, {**data, "result": "ok"})

    def __getattr__(self, name: str) -> Any:
        return getattr(self._jobs, name)


def test_job_finished_before_it_was_followed_is_handled(make_channel: Any, jobs: Jobs) -> None:
    h = make_channel(jobs_layer=_InstantWorker(jobs))
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    # Same tick: no event will ever come, the subscription was born finished.
    assert h.rec.results() == {"/db/a": "ok"}
    assert h.rec.released == ["/db/a"]
    assert h.job_ids() == set()
    assert h.channel.keys() == set()


class _VanishingJob:
    """The real layer, where every job vanishes between add and subscribe."""

    def __init__(self, jobs: Jobs) -> None:
        self._jobs = jobs

    def subscribe(self, job_type: Any, job_id: str) -> Any:
        raise NotFound("gone", type=job_type, job_id=job_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._jobs, name)


def test_job_that_cannot_be_followed_counts_as_failed(make_channel: Any, jobs: Jobs) -> None:
    h = make_channel(jobs_layer=_VanishingJob(jobs))
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    assert h.rec.results() == {"/db/a": "failed"}
    assert h.rec.released == ["/db/a"]
    assert h.channel.keys() == set()


def test_job_already_running_after_a_restart_is_followed_not_added_again(make_channel: Any, jobs: Jobs) -> None:
    # A worker still runs the job a previous channel started (the daemon restarted).
    data = {"channel": "ratio_dbs", "key": "/db/a", "priority": math.inf, "progress": 0.3}
    jobs.add(JOB_TYPE, "/db/a", data)
    job, data = jobs.accept(JOB_TYPE, timeout=0)
    h = make_channel()
    h.channel.enqueue("/db/a", math.inf)
    h.tick()
    assert h.status()["active"] == 1
    h.finish(job, data, "ok")
    h.wait_done(1)
    # Not flagged to run again: the job finished for good and was removed.
    assert h.job_ids() == set()
    assert h.rec.results() == {"/db/a": "ok"}


def test_key_running_in_another_channel_is_dropped(make_channel: Any, jobs: Jobs, caplog: Any) -> None:
    caplog.set_level(logging.INFO)
    data = {"channel": "slack_dbs", "key": "/db/a", "priority": 3.0, "progress": 0.0}
    jobs.add(JOB_TYPE, "/db/a", data)
    jobs.accept(JOB_TYPE, timeout=0)
    h = make_channel()
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    assert h.channel.keys() == set()
    assert h.rec.released == ["/db/a"]
    assert jobs.get_job_data(JOB_TYPE, "/db/a") == data
    assert "ratio_dbs: dropped '/db/a': it is already being compacted by channel 'slack_dbs'." in caplog.text
    assert "Traceback" not in caplog.text


def test_failing_on_job_done_is_logged_and_the_channel_goes_on(make_channel: Any, caplog: Any) -> None:
    h = make_channel()

    def explode(channel: str, key: str, data: dict[str, Any]) -> None:
        raise RuntimeError("server busy")

    h.channel._on_job_done = explode
    h.channel.enqueue("/db/a", 5.0)
    h.channel.enqueue("/db/b", 4.0)
    h.tick()
    job, data = h.accept()
    h.wait_active(1)
    with caplog.at_level(logging.ERROR):
        h.finish(job, data, "ok")
        h.settle(lambda: h.job_ids() == {"/db/b"}, "next start")
    assert "on_job_done failed for '/db/a'" in caplog.text
    assert h.channel.is_alive()


def test_progress_updates_keep_the_job_active(make_channel: Any, jobs: Jobs) -> None:
    h = make_channel()
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    job, data = h.accept()
    h.wait_active(1)
    for progress in (0.25, 0.5, 0.75):
        job = jobs.update(job, {**data, "progress": progress})
    h.settle(lambda: jobs.get_job_data(JOB_TYPE, "/db/a")["progress"] == 0.75)
    h.tick()
    assert (h.status()["active"], h.status()["starting"]) == (1, 0)
    assert h.rec.done == []


def test_rotated_job_makes_way_for_the_next_key_then_returns(make_channel: Any) -> None:
    # A rotated-out key re-queued at 6.0 would outrank /db/b and take back the slot rotation
    # freed; it is set aside until /db/b has started, then queued again at its priority.
    h = make_channel(settings=Settings(concurrency=1), priority_of=lambda key: 6.0)
    interrupt_the_head(h, {"/db/a": 6.0, "/db/b": 2.0}, rotated=True)
    h.settle(lambda: h.rec.released == ["/db/a"], "slot freed")
    assert h.rec.done == []
    assert h.job_ids() == {"/db/b"} and h.job_state("/db/b") == "pending"
    assert h.channel.waiting() == [("/db/a", 6.0)]
    assert h.status()["waiting"] == {"size": 1, "min": 6.0, "max": 6.0}


def test_rotated_job_alone_in_its_channel_is_queued_again_at_once(make_channel: Any) -> None:
    h = make_channel(settings=Settings(concurrency=1), priority_of=lambda key: 6.0)
    interrupt_the_head(h, {"/db/a": 6.0}, rotated=True)
    h.settle(lambda: h.rec.released == ["/db/a"], "slot freed")
    # Nothing else waits here: it takes the next free slot like any queued key.
    assert h.job_ids() == {"/db/a"} and h.job_state("/db/a") == "pending"


def test_benched_key_is_checkpointed_and_flushed_like_a_waiting_one(make_channel: Any) -> None:
    h = make_channel(settings=Settings(concurrency=1), priority_of=lambda key: 6.0)
    # No global slot once /db/a runs: /db/b cannot start, so /db/a stays set aside.
    interrupt_the_head(h, {"/db/a": 6.0, "/db/b": 2.0}, rotated=True, deny_slots_after_start=True)
    h.settle(lambda: h.rec.released == ["/db/a"], "slot freed")
    assert h.channel.waiting() == [("/db/b", 2.0), ("/db/a", 6.0)]
    assert h.channel.keys() == {"/db/a", "/db/b"}
    assert h.channel.enqueue("/db/a", 7.0) is True  # re-prioritised where it is
    assert h.channel.waiting() == [("/db/b", 2.0), ("/db/a", 7.0)]
    h.channel.flush()
    assert h.channel.waiting() == [] and h.status()["waiting"]["size"] == 0
