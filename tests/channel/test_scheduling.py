"""Starting work: the initial pause, ordering, concurrency, the priority re-check, slots."""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest
from channel_testlib import JOB_TYPE, Settings

from smoosh.jobs import Jobs


def test_new_channel_is_paused_until_wait_s_has_passed(make_channel: Any) -> None:
    h = make_channel(wait_s=30)
    assert h.channel.enqueue("/db/a", 5.0)
    h.tick()
    assert h.status()["paused"] is True
    assert h.job_ids() == set()

    h.tick(29.9)
    assert h.status()["paused"] is True
    assert h.job_ids() == set()

    h.tick(0.1)
    assert h.status()["paused"] is False
    assert h.job_ids() == {"/db/a"}
    assert h.status()["starting"] == 1


def test_job_data_names_channel_key_priority_and_progress(make_channel: Any, jobs: Jobs) -> None:
    h = make_channel(priority_of=lambda key: 7.5)
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    assert jobs.get_job_data(JOB_TYPE, "/db/a") == {
        "channel": "ratio_dbs", "key": "/db/a", "priority": 7.5, "progress": 0.0,
    }
    assert jobs.get_job_state(JOB_TYPE, "/db/a") == "pending"


def test_highest_priority_starts_first(make_channel: Any) -> None:
    h = make_channel()
    for key, priority in [("/db/low", 2.0), ("/db/inf", math.inf), ("/db/mid", 4.0)]:
        h.channel.enqueue(key, priority)
    h.tick()
    assert h.job_ids() == {"/db/inf"}
    assert h.channel.waiting() == [("/db/mid", 4.0), ("/db/low", 2.0)]


def test_equal_priorities_start_oldest_first(make_channel: Any) -> None:
    h = make_channel()
    for key in ["/db/a", "/db/b", "/db/c"]:
        h.channel.enqueue(key, 3.0)
    h.tick()
    order = [h.run_one() for _ in range(3)]
    assert order == ["/db/a", "/db/b", "/db/c"]


def test_concurrency_bounds_starting_plus_active(make_channel: Any) -> None:
    h = make_channel(settings=Settings(concurrency=2))
    for i in range(4):
        h.channel.enqueue(f"/db/{i}", 10.0 - i)
    h.tick()
    assert h.job_ids() == {"/db/0", "/db/1"}
    h.accept()
    h.wait_active(1)
    assert h.status()["starting"] == 1
    h.tick()
    assert h.job_ids() == {"/db/0", "/db/1"}
    assert h.status()["waiting"]["size"] == 2


def test_concurrency_zero_queues_but_never_starts(make_channel: Any) -> None:
    h = make_channel(settings=Settings(concurrency=0))
    h.channel.enqueue("/db/a", 5.0)
    for _ in range(3):
        h.tick(60)
    assert h.job_ids() == set()
    assert h.status()["waiting"]["size"] == 1


def test_raised_concurrency_applies_at_the_next_start(make_channel: Any) -> None:
    h = make_channel(settings=Settings(concurrency=1))
    for i in range(3):
        h.channel.enqueue(f"/db/{i}", 5.0)
    h.tick()
    assert len(h.job_ids()) == 1
    h.channel.update_settings(Settings(concurrency=3))
    assert h.status()["concurrency"] == 3
    h.tick()
    assert len(h.job_ids()) == 3


def test_key_whose_priority_is_now_zero_is_dropped(make_channel: Any, caplog: Any) -> None:
    h = make_channel(priority_of=lambda key: 0 if key == "/db/done" else 3.0)
    h.channel.enqueue("/db/done", 9.0)
    h.channel.enqueue("/db/next", 1.0)
    with caplog.at_level(logging.INFO, logger="channels.channel.ratio_dbs"):
        h.tick()
    assert h.job_ids() == {"/db/next"}
    assert "/db/done" not in h.channel.keys()
    assert "ratio_dbs: dropped '/db/done': its priority is now 0" in caplog.text
    # The slot granted for the dropped key was given back.
    assert h.rec.acquired == ["/db/done", "/db/next"]
    assert h.rec.released == ["/db/done"]


def test_failing_priority_recheck_counts_as_zero(make_channel: Any, caplog: Any) -> None:
    def priority_of(key: str) -> float:
        if key == "/db/broken":
            raise OSError("cannot open")
        return 2.0

    h = make_channel(priority_of=priority_of)
    h.channel.enqueue("/db/broken", 9.0)
    h.channel.enqueue("/db/fine", 1.0)
    h.tick()
    assert h.job_ids() == {"/db/fine"}
    assert "priority re-check of '/db/broken' failed" in caplog.text


class _FailingAdd:
    """The real layer, except that adding ``bad_key`` fails."""

    def __init__(self, jobs: Jobs, bad_key: str) -> None:
        self._jobs = jobs
        self._bad_key = bad_key

    def add(self, job_type: Any, job_id: str, data: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        if job_id == self._bad_key:
            raise RuntimeError("store unavailable")
        self._jobs.add(job_type, job_id, data, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._jobs, name)


def test_error_while_starting_drops_the_key_and_frees_the_slot(make_channel: Any, jobs: Jobs, caplog: Any) -> None:
    h = make_channel(settings=Settings(concurrency=1), jobs_layer=_FailingAdd(jobs, "/db/bad"))
    h.channel.enqueue("/db/bad", 9.0)
    h.channel.enqueue("/db/good", 1.0)
    h.tick()
    assert h.job_ids() == {"/db/good"}
    assert "/db/bad" not in h.channel.keys()
    assert h.rec.released == ["/db/bad"]
    assert "could not start '/db/bad'; dropped" in caplog.text
    assert h.channel.is_alive()


def test_refused_global_slot_keeps_the_key_waiting(make_channel: Any) -> None:
    h = make_channel()
    h.rec.grant = False
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    h.tick(1)
    assert h.job_ids() == set()
    assert h.channel.waiting() == [("/db/a", 5.0)]
    h.rec.grant = True
    h.tick(1)
    assert h.job_ids() == {"/db/a"}


def test_dry_run_ranks_but_never_starts(make_channel: Any) -> None:
    h = make_channel(dry_run=True)
    h.channel.enqueue("/db/a", 2.0)
    h.channel.enqueue("/db/b", 8.0)
    for _ in range(3):
        h.tick(60)
    assert h.job_ids() == set()
    assert h.rec.acquired == []
    assert h.channel.waiting() == [("/db/b", 8.0), ("/db/a", 2.0)]


def test_enqueue_ignores_a_key_already_starting_or_active(make_channel: Any) -> None:
    h = make_channel(settings=Settings(concurrency=2))
    h.channel.enqueue("/db/a", 5.0)
    h.channel.enqueue("/db/b", 4.0)
    h.tick()
    h.accept()  # /db/a becomes active, /db/b stays starting
    h.wait_active(1)
    assert h.channel.enqueue("/db/a", 9.0) is False
    assert h.channel.enqueue("/db/b", 9.0) is False
    assert h.channel.waiting() == []


def test_enqueue_moves_a_waiting_key_and_counts_evictions(make_channel: Any) -> None:
    h = make_channel(settings=Settings(capacity=2, concurrency=0))
    assert h.channel.enqueue("/db/a", 1.0)
    assert h.channel.enqueue("/db/b", 2.0)
    assert h.channel.enqueue("/db/a", 3.0)  # re-prioritised, not added twice
    assert h.channel.waiting() == [("/db/a", 3.0), ("/db/b", 2.0)]
    assert h.channel.enqueue("/db/c", 0.5) is False  # lowest of a full queue: evicted at once
    assert h.channel.enqueue("/db/d", 5.0) is True  # evicts /db/b
    assert h.channel.waiting() == [("/db/d", 5.0), ("/db/a", 3.0)]
    assert h.status()["evicted"] == 2


def test_capacity_shrink_truncates_the_queue_at_once(make_channel: Any) -> None:
    h = make_channel(settings=Settings(capacity=10, concurrency=0))
    for i in range(5):
        h.channel.enqueue(f"/db/{i}", float(i))
    h.channel.update_settings(Settings(capacity=2, concurrency=0))
    assert h.channel.waiting() == [("/db/4", 4.0), ("/db/3", 3.0)]
    assert h.status()["evicted"] == 3
    assert h.status()["waiting"] == {"size": 2, "min": 3.0, "max": 4.0}


@pytest.mark.parametrize("priority", [float("nan"), "high"])
def test_enqueue_refuses_a_priority_that_is_not_a_number(make_channel: Any, priority: Any) -> None:
    h = make_channel()
    with pytest.raises((TypeError, ValueError)):
        h.channel.enqueue("/db/a", priority)
    assert h.channel.keys() == set()
