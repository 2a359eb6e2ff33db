"""Following runs: the run events a channel hears, what it does with each outcome, adopted runs.

The scheduler turns job states into these events (tests/server/test_scheduler.py); here the
test plays the scheduler and delivers them by hand.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from channel_testlib import NAME, T0, MakeChannel, Settings, interrupt_the_head

from channels import Outcome, RunEvent
from persist import read_checkpoint


def test_accepted_job_moves_from_starting_to_active(make_channel: MakeChannel) -> None:
    h = make_channel()
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    assert h.in_flight() == (1, 0)
    h.running("/db/a")
    assert h.in_flight() == (0, 1)
    assert h.channel.keys() == {"/db/a"}
    h.assert_slots_match_runs()


def test_finished_job_frees_its_slot_and_reports_its_outcome(make_channel: MakeChannel) -> None:
    h = make_channel()
    h.channel.enqueue("/db/a", 5.0)
    h.channel.enqueue("/db/b", 1.0)
    h.tick()
    h.running("/db/a")
    h.now += 42
    h.end("/db/a", "ok", size_before_bytes=8192, size_after_bytes=4096, duration_s=1.5, progress=1.0)
    (channel, key, outcome, when), = h.host.outcomes
    assert (channel, key, when) == (NAME, "/db/a", T0 + 42)
    assert outcome == Outcome("ok", None, 8192, 4096, 1.5, 1.0)
    assert outcome.reclaimed_bytes == 4096
    assert h.host.slots == 0
    assert h.host.journal[-3:] == [("release_slot",), ("on_outcome", "/db/a", "ok"), ("wake",)]
    # The owner was woken: its next tick gives the freed slot to the next key.
    h.tick()
    assert h.started() == ["/db/a", "/db/b"]
    assert h.in_flight() == (1, 0)


def test_failed_busy_and_gone_results_go_to_the_server(make_channel: MakeChannel) -> None:
    h = make_channel(settings=Settings(concurrency=3))
    for key in ["/db/f", "/db/b", "/db/g"]:
        h.channel.enqueue(key, 5.0)
    h.tick()
    for key in ["/db/f", "/db/b", "/db/g"]:
        h.running(key)
    results = {"/db/f": "failed", "/db/b": "busy", "/db/g": "gone"}
    for key in ["/db/g", "/db/f", "/db/b"]:  # runs end in any order
        h.end(key, results[key], error="boom")
    assert h.host.results() == results
    assert all(outcome.error == "boom" for *_, outcome, _ in h.host.outcomes)
    assert h.channel.keys() == set()
    assert h.host.calls("release_slot") == [("release_slot",)] * 3
    assert h.host.slots == 0


def test_ended_event_without_an_outcome_counts_as_failed(make_channel: MakeChannel) -> None:
    h = make_channel()
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    h.send("/db/a", "ended")
    assert [outcome for _, _, outcome, _ in h.host.outcomes] == [Outcome("failed", "no outcome")]
    assert h.host.slots == 0


def test_interrupted_job_is_requeued_at_its_priority_not_reported(make_channel: MakeChannel) -> None:
    h = make_channel(settings=Settings(concurrency=1))
    interrupt_the_head(h, {"/db/a": 6.0, "/db/b": 2.0})
    assert h.host.outcomes == []
    assert h.host.slots == 0
    assert h.channel.waiting() == [("/db/a", 6.0), ("/db/b", 2.0)]
    # Re-queued at 6.0 it outranks /db/b, so it is the one that starts again.
    h.tick()
    assert h.started() == ["/db/a", "/db/a"]
    assert h.channel.waiting() == [("/db/b", 2.0)]


def test_interrupted_by_a_stopping_worker_is_requeued_at_infinity(make_channel: MakeChannel, caplog: Any) -> None:
    h = make_channel(settings=Settings(concurrency=1))
    with caplog.at_level(logging.INFO, logger=f"channels.channel.{NAME}"):
        interrupt_the_head(h, {"/db/a": 2.0, "/db/b": 9.0}, stopping=True)
    # /db/b (9.0) ran; it goes back on top of everything, so a restart follows it first.
    assert h.started() == ["/db/b"]
    assert h.channel.waiting() == [("/db/b", math.inf), ("/db/a", 2.0)]
    assert h.host.outcomes == []
    assert "Channel ratio_dbs: compaction of '/db/b' was interrupted; queued again at priority inf." in [
        r.getMessage() for r in caplog.records
    ]


def test_removed_job_counts_as_failed(make_channel: MakeChannel) -> None:
    # The scheduler reports a vanished job as failed "job removed" (tests/server covers how).
    h = make_channel()
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    h.end("/db/a", "failed", error="job removed")
    assert [(key, o.result, o.error) for _, key, o, _ in h.host.outcomes] == [("/db/a", "failed", "job removed")]
    assert h.host.slots == 0
    assert h.in_flight() == (0, 0)


def test_job_pending_again_after_running_counts_as_starting(make_channel: MakeChannel) -> None:
    h = make_channel()
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    h.running("/db/a")
    # Its worker went away: the job waits for a worker again. It keeps its slot.
    h.pending("/db/a")
    assert h.in_flight() == (1, 0)
    assert h.host.outcomes == []
    assert h.host.slots == 1
    h.running("/db/a")
    h.end("/db/a")
    assert h.host.results() == {"/db/a": "ok"}
    assert h.host.calls("release_slot") == [("release_slot",)]


def test_pending_again_is_logged_once(make_channel: MakeChannel, caplog: Any) -> None:
    h = make_channel()
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    h.running("/db/a")
    with caplog.at_level(logging.INFO, logger=f"channels.channel.{NAME}"):
        h.pending("/db/a")
        h.pending("/db/a")  # a duplicate from the second source
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO] == [
        "Channel ratio_dbs: the job of '/db/a' waits for a worker again."
    ]


def test_job_finished_before_it_was_followed_is_handled(make_channel: MakeChannel) -> None:
    # A run so fast that its end is the first thing heard: no running event ever comes.
    h = make_channel()
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    h.end("/db/a")
    assert h.host.results() == {"/db/a": "ok"}
    assert h.host.slots == 0
    assert h.channel.keys() == set()


def test_running_heard_after_the_end_is_ignored(make_channel: MakeChannel) -> None:
    h = make_channel()
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    h.end("/db/a")
    h.running("/db/a")  # the slower of the two sources
    assert h.in_flight() == (0, 0)
    assert h.host.slots == 0


def test_duplicate_events_from_both_sources_are_applied_once(make_channel: MakeChannel) -> None:
    # The worker's direct report and the job subscription both speak for one run.
    h = make_channel()
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    h.running("/db/a")
    h.running("/db/a")
    assert h.in_flight() == (0, 1)
    h.end("/db/a", "ok")
    h.end("/db/a", "ok")
    h.drop("/db/a", "late")
    assert h.host.results() == {"/db/a": "ok"} and len(h.host.outcomes) == 1
    assert h.host.calls("release_slot") == [("release_slot",)]


def test_events_of_an_old_run_are_ignored(make_channel: MakeChannel, caplog: Any) -> None:
    h = make_channel()
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    old = h.scheduler.tokens["/db/a"]
    h.end("/db/a", "interrupted")
    h.tick()  # started again, with a new token
    new = h.scheduler.tokens["/db/a"]
    assert new != old
    with caplog.at_level(logging.DEBUG, logger=f"channels.channel.{NAME}"):
        h.send("/db/a", "running", run=old)
        h.send("/db/a", "ended", run=old, outcome=Outcome("failed", "late"))
        h.channel.on_run_event(RunEvent("/db/never", 1, "ended", outcome=Outcome("ok")), h.now)
    assert h.in_flight() == (1, 0)
    assert h.host.outcomes == []
    assert h.host.slots == 1
    assert [r.getMessage() for r in caplog.records] == [
        "Channel ratio_dbs: ignored running event of an old run of '/db/a'.",
        "Channel ratio_dbs: ignored ended event of an old run of '/db/a'.",
        "Channel ratio_dbs: ignored ended event of an old run of '/db/never'.",
    ]


def test_failing_on_outcome_is_logged_and_the_channel_goes_on(make_channel: MakeChannel, caplog: Any) -> None:
    h = make_channel()
    h.host.fail_on_outcome = 1
    h.channel.enqueue("/db/a", 5.0)
    h.channel.enqueue("/db/b", 4.0)
    h.tick()
    h.running("/db/a")
    with caplog.at_level(logging.ERROR, logger=f"channels.channel.{NAME}"):
        h.end("/db/a")
    assert [r.getMessage() for r in caplog.records] == [
        "Channel ratio_dbs: recording the outcome of '/db/a' failed."
    ]
    assert "RuntimeError: server busy" in caplog.text
    assert h.host.slots == 0  # the slot was given back before the host was asked
    h.tick()
    assert h.started() == ["/db/a", "/db/b"]


def test_progress_updates_keep_the_job_active(make_channel: MakeChannel) -> None:
    # Each progress update of a running job arrives as another running event.
    h = make_channel()
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    for _ in range(4):
        h.running("/db/a")
        h.tick(1)
        assert h.in_flight() == (0, 1)
    assert h.host.outcomes == []
    assert h.host.slots == 1


def test_rotated_job_makes_way_for_the_next_key_then_returns(make_channel: MakeChannel) -> None:
    # A rotated-out key re-queued at 6.0 would outrank /db/b and take back the slot rotation
    # freed; it is set aside until /db/b has started, then queued again at its priority.
    h = make_channel(settings=Settings(concurrency=1))
    interrupt_the_head(h, {"/db/a": 6.0, "/db/b": 2.0}, rotated=True)
    assert h.host.outcomes == []
    assert h.host.slots == 0
    assert h.channel.waiting() == [("/db/b", 2.0), ("/db/a", 6.0)]  # the queue, then the bench
    h.tick()
    assert h.started() == ["/db/a", "/db/b"]
    assert h.channel.waiting() == [("/db/a", 6.0)]
    assert h.status()["waiting"] == {"size": 1, "min": 6.0, "max": 6.0}
    h.running("/db/b")
    h.end("/db/b")
    h.tick()
    assert h.started() == ["/db/a", "/db/b", "/db/a"]


def test_rotated_job_alone_in_its_channel_is_queued_again_at_once(make_channel: MakeChannel) -> None:
    h = make_channel(settings=Settings(concurrency=1))
    interrupt_the_head(h, {"/db/a": 6.0}, rotated=True)
    # Nothing else waits here: it takes the next free slot like any queued key.
    assert h.channel.waiting() == [("/db/a", 6.0)]
    h.tick()
    assert h.started() == ["/db/a", "/db/a"]


def test_benched_key_is_checkpointed_and_flushed_like_a_waiting_one(make_channel: MakeChannel, tmp_path: Path) -> None:
    h = make_channel(settings=Settings(concurrency=1), state_dir=tmp_path, checkpoint_interval_s=60)
    # No global slot once /db/a runs: /db/b cannot start, so /db/a stays set aside.
    interrupt_the_head(h, {"/db/a": 6.0, "/db/b": 2.0}, rotated=True, deny_slots_after_start=True)
    h.tick()
    assert h.started() == ["/db/a"]
    assert h.channel.waiting() == [("/db/b", 2.0), ("/db/a", 6.0)]
    assert h.channel.keys() == {"/db/a", "/db/b"}
    assert h.channel.enqueue("/db/a", 7.0) is True  # re-prioritised where it is
    assert h.channel.waiting() == [("/db/b", 2.0), ("/db/a", 7.0)]
    assert h.status()["waiting"] == {"size": 2, "min": 2.0, "max": 7.0}
    # Checkpointed: the queue first, then the bench.
    h.tick(60)
    assert h.channel.join_checkpoint(5)
    assert list(read_checkpoint(tmp_path / f"{NAME}.smooshq").items()) == [("/db/b", 2.0), ("/db/a", 7.0)]
    # Flushed: gone from the channel and from the file.
    h.channel.flush()
    assert h.channel.waiting() == [] and h.channel.keys() == set()
    assert h.status()["waiting"] == {"size": 0, "min": 0, "max": 0}
    assert not (tmp_path / f"{NAME}.smooshq").exists()


def test_close_checkpoints_a_benched_key(make_channel: MakeChannel, tmp_path: Path) -> None:
    h = make_channel(settings=Settings(concurrency=1), state_dir=tmp_path)
    interrupt_the_head(h, {"/db/a": 6.0, "/db/b": 2.0}, rotated=True, deny_slots_after_start=True)
    assert h.channel.close() == []
    assert list(read_checkpoint(tmp_path / f"{NAME}.smooshq").items()) == [("/db/b", 2.0), ("/db/a", 6.0)]


# -- not-before: a crash's backoff, a busy database's wait -------------------------------------


def defer_after_a_crash(h: Any, key: str = "/db/a", not_before: float = T0 + 300) -> None:
    h.host.not_before[key] = not_before
    h.channel.enqueue(key, 5.0)
    h.tick()
    h.running(key)
    h.end(key, "failed", error="crashed")


def test_not_before_from_the_host_defers_the_key_without_a_slot(make_channel: MakeChannel, caplog: Any) -> None:
    h = make_channel()
    defer_after_a_crash(h)
    # Reported, kept, held aside: no slot, shown deferred and not as waiting to start.
    assert h.host.results() == {"/db/a": "failed"}
    assert h.host.slots == 0
    assert h.channel.waiting() == [("/db/a", 5.0)]
    assert h.channel.keys() == {"/db/a"}
    assert h.status()["deferred"] == 1
    assert h.status()["waiting"] == {"size": 0, "min": 0, "max": 0}
    # Free slots do not start it early.
    assert h.tick(299) == T0 + 300
    assert h.started() == ["/db/a"]
    assert h.host.calls("acquire_slot") == [("acquire_slot",)]
    # Its time comes: back in the queue and started in the same tick.
    with caplog.at_level(logging.INFO, logger=f"channels.channel.{NAME}"):
        h.tick(1)
    assert h.started() == ["/db/a", "/db/a"]
    assert h.status()["deferred"] == 0
    assert "Channel ratio_dbs: '/db/a' may start again after its wait." in [r.getMessage() for r in caplog.records]


def test_deferred_key_does_not_hold_back_the_others(make_channel: MakeChannel) -> None:
    h = make_channel()
    h.channel.enqueue("/db/b", 1.0)
    defer_after_a_crash(h, "/db/a")
    h.tick()
    assert h.started() == ["/db/a", "/db/b"]


def test_enqueue_of_a_deferred_key_reprioritises_it_and_keeps_its_wait(make_channel: MakeChannel) -> None:
    h = make_channel()
    defer_after_a_crash(h)
    assert h.channel.enqueue("/db/a", 8.0) is True
    assert h.channel.waiting() == [("/db/a", 8.0)]
    h.tick(10)
    assert h.started() == ["/db/a"]
    assert h.status()["deferred"] == 1


def test_defer_keeps_a_restored_backoff(make_channel: MakeChannel) -> None:
    h = make_channel()
    h.channel.enqueue("/db/a", 5.0)
    h.channel.defer("/db/a", 5.0, T0 + 60)
    assert h.tick() == T0 + 60
    assert h.started() == []
    h.tick(60)
    assert h.started() == ["/db/a"]


def test_deferred_key_is_checkpointed_and_flushed_like_a_waiting_one(make_channel: MakeChannel, tmp_path: Path) -> None:
    h = make_channel(state_dir=tmp_path)
    defer_after_a_crash(h)
    h.channel.enqueue("/db/b", 2.0)
    h.channel.close()
    # The queue first, then the deferred key, at its priority (its wait is the history's).
    assert list(read_checkpoint(tmp_path / f"{NAME}.smooshq").items()) == [("/db/b", 2.0), ("/db/a", 5.0)]
    h2 = make_channel(state_dir=tmp_path, settings=Settings(concurrency=0))
    h2.channel.defer("/db/a", 5.0, T0 + 300)
    h2.channel.flush()
    assert h2.channel.waiting() == [] and h2.status()["deferred"] == 0
    assert not (tmp_path / f"{NAME}.smooshq").exists()


# -- adopted runs (found in flight at start-up) --------------------------------------------------


def test_adopted_run_counts_as_starting_with_a_forced_slot(make_channel: MakeChannel) -> None:
    h = make_channel(settings=Settings(concurrency=1))
    h.host.grant = False  # the node is full: an adopted run takes its slot anyway
    h.scheduler.adoptable["/db/a"] = 77
    h.channel.enqueue("/db/a", math.inf)  # restored from the checkpoint
    assert h.channel.adopt("/db/a") is True
    assert h.journal[-2:] == [("adopt", "/db/a"), ("acquire_slot", True)]
    assert h.in_flight() == (1, 0)
    assert h.channel.waiting() == []
    assert h.channel.in_flight() == {"/db/a": 77}
    h.assert_slots_match_runs()
    assert h.channel.adopt("/db/a") is True  # already followed: no second adoption
    assert h.journal.names().count("adopt") == 1
    h.send("/db/a", "running", run=77)
    assert h.in_flight() == (0, 1)
    h.send("/db/a", "ended", run=77, outcome=Outcome("ok"))
    assert h.host.results() == {"/db/a": "ok"}
    assert h.host.slots == 0


def test_adopting_a_key_without_a_run_leaves_it_waiting(make_channel: MakeChannel) -> None:
    h = make_channel(settings=Settings(concurrency=0))
    h.channel.enqueue("/db/a", math.inf)
    assert h.channel.adopt("/db/a") is False
    assert h.channel.waiting() == [("/db/a", math.inf)]
    assert h.host.slots == 0


def test_adopted_key_not_queued_runs_at_infinity(make_channel: MakeChannel, tmp_path: Path) -> None:
    h = make_channel(state_dir=tmp_path, settings=Settings(concurrency=0))
    h.scheduler.adoptable["/db/a"] = 5
    assert h.channel.adopt("/db/a") is True
    h.send("/db/a", "ended", run=5, outcome=Outcome("interrupted"))
    assert h.channel.waiting() == [("/db/a", math.inf)]
