"""The published status, key listings, ``next_due``, and a channel stepped by its owner's loop.

A channel has no thread of its own: its owner (the server's :class:`~smoosh.loop.Loop`) ticks
it when it is due or woken. The loop tests step a real ``Loop`` by hand with ``run_once(now)``.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from channel_testlib import (
    NAME,
    T0,
    Journal,
    MakeChannel,
    RecordingHost,
    Settings,
    SwitchWindow,
    a_lock_that_must_not_be_taken,
)

from channels import Channel, Outcome, RunEvent
from smoosh.loop import Loop


def test_status_reflects_an_enqueue_without_a_tick(make_channel: MakeChannel) -> None:
    h = make_channel(settings=Settings(concurrency=3))
    assert h.status() == {
        "active": 0, "starting": 0, "waiting": {"size": 0, "min": 0, "max": 0}, "deferred": 0,
        "paused": True, "suspended": False, "held": None, "in_window": True, "holding": False,
        "evicted": 0, "concurrency": 3, "checkpoint_errors": 0,
    }
    h.channel.enqueue("/db/a", 2.0)
    h.channel.enqueue("/db/b", 7.0)
    assert h.status()["waiting"] == {"size": 2, "min": 2.0, "max": 7.0}


def test_status_changes_at_once_on_operator_actions_and_job_start(make_channel: MakeChannel) -> None:
    h = make_channel()
    h.channel.enqueue("/db/a", 2.0)
    h.channel.suspend()
    assert h.status()["suspended"] is True and h.status()["holding"] is True
    h.channel.resume()
    assert h.status()["suspended"] is False and h.status()["paused"] is False
    h.tick()
    assert h.status()["starting"] == 1 and h.status()["waiting"]["size"] == 0
    h.running("/db/a")
    assert (h.status()["starting"], h.status()["active"]) == (0, 1)
    h.channel.enqueue("/db/b", 1.0)
    h.channel.flush()
    assert h.status()["waiting"]["size"] == 0 and h.status()["active"] == 1


def test_status_does_not_wait_for_the_channel_lock(make_channel: MakeChannel) -> None:
    # Stronger than "does not wait": it never takes the lock at all.
    h = make_channel()
    h.channel.enqueue("/db/a", 2.0)
    lock = h.channel._lock
    h.channel._lock = a_lock_that_must_not_be_taken()  # as if another thread were deep inside
    try:
        status = h.channel.status()
        repr(h.channel)
    finally:
        h.channel._lock = lock
    assert status["waiting"]["size"] == 1


def test_status_snapshot_cannot_be_changed_by_its_reader(make_channel: MakeChannel) -> None:
    h = make_channel()
    snapshot = h.status()
    snapshot["active"] = 99
    snapshot["waiting"]["size"] = 99
    assert h.status()["active"] == 0 and h.status()["waiting"]["size"] == 0


def test_status_is_republished_on_every_change_and_only_then(make_channel: MakeChannel) -> None:
    # The snapshot is rebuilt when something changes (no timer republishes it).
    h = make_channel()
    before = h.channel._status
    h.tick()  # unpausing is a change
    after_unpause = h.channel._status
    assert after_unpause is not before and after_unpause["paused"] is False
    h.tick(3600)
    assert h.channel._status is after_unpause  # nothing changed
    h.channel.enqueue("/db/a", 1.0)
    assert h.channel._status is not after_unpause


def test_keys_lists_waiting_starting_and_active(make_channel: MakeChannel) -> None:
    h = make_channel(settings=Settings(concurrency=2))
    for key, priority in [("/db/a", 3.0), ("/db/b", 2.0), ("/db/c", 1.0)]:
        h.channel.enqueue(key, priority)
    h.tick()
    h.running("/db/a")
    assert h.channel.keys() == {"/db/a", "/db/b", "/db/c"}
    assert h.channel.waiting() == [("/db/c", 1.0)]
    assert h.channel.try_snapshot() == ({"/db/a", "/db/b", "/db/c"}, [("/db/c", 1.0)])
    tokens = h.scheduler.tokens
    assert h.channel.in_flight() == {"/db/a": tokens["/db/a"], "/db/b": tokens["/db/b"]}


def test_try_snapshot_gives_up_on_a_busy_channel(make_channel: MakeChannel) -> None:
    h = make_channel()
    with h.channel._lock:
        assert h.channel.try_snapshot(timeout_s=0) is None


# -- next_due: when the owner must tick the channel again -----------------------------------------


def test_next_due_is_none_when_nothing_is_due(make_channel: MakeChannel) -> None:
    h = make_channel(settings=Settings(concurrency=1))
    assert h.tick() is None
    h.channel.enqueue("/db/a", 5.0)
    h.channel.enqueue("/db/b", 5.0)
    assert h.tick() is None  # full: the run's events wake it
    assert h.channel.next_due() is None


def test_next_due_is_the_end_of_the_initial_pause(make_channel: MakeChannel) -> None:
    h = make_channel(wait_s=30)
    assert h.channel.next_due() == T0 + 30
    assert h.tick(10) == T0 + 30


def test_next_due_includes_the_routine_window_check(make_channel: MakeChannel) -> None:
    h = make_channel(settings=Settings(window=SwitchWindow(open_=True)))
    assert h.tick() == T0 + 60
    assert h.tick(60) == T0 + 120


def test_next_due_is_the_earliest_of_pause_window_and_deferred_key(make_channel: MakeChannel) -> None:
    h = make_channel(settings=Settings(window=SwitchWindow(open_=True)), wait_s=10)
    h.channel.enqueue("/db/a", 5.0)
    h.channel.defer("/db/a", 5.0, T0 + 5)
    assert h.tick() == T0 + 5  # deferred key < pause end < window check
    assert h.tick(5) == T0 + 10
    # Unpaused at T0+10, it starts /db/a, checking the window first: the next routine check
    # is a minute after that one.
    assert h.tick(5) == T0 + 70
    assert h.started() == ["/db/a"]


def test_a_failing_phase_is_logged_and_the_iteration_goes_on(make_channel: MakeChannel, caplog: Any) -> None:
    h = make_channel()

    def broken(now: float) -> None:
        raise RuntimeError("deferred keys exploded")

    h.channel._undefer = broken  # type: ignore[method-assign]
    h.channel.enqueue("/db/a", 5.0)
    with caplog.at_level(logging.ERROR, logger=f"channels.channel.{NAME}"):
        assert h.tick() is None
    assert [r.getMessage() for r in caplog.records] == ["Channel ratio_dbs: waking deferred keys failed; going on."]
    assert "RuntimeError: deferred keys exploded" in caplog.text
    assert h.started() == ["/db/a"]


def test_closed_channel_refuses_enqueues_and_ignores_ticks(make_channel: MakeChannel) -> None:
    h = make_channel()
    assert h.channel.close() == []
    assert h.channel.enqueue("/db/a", 5.0) is False
    assert h.tick(60) is None
    assert h.started() == []
    assert h.channel.close() == []  # idempotent


def test_events_after_close_are_ignored(make_channel: MakeChannel) -> None:
    h = make_channel()
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    assert h.channel.close() == ["/db/a"]
    h.end("/db/a", "interrupted")
    h.end("/db/a", "failed")
    assert h.host.outcomes == [] and h.channel.keys() == set()
    assert h.host.slots == 0


# -- stepped by a real owner loop ------------------------------------------------------------------


class LoopHost(RecordingHost):
    """A recording host whose ``wake`` wakes the channel's task on a real :class:`Loop`."""

    def __init__(self, loop: Loop) -> None:
        super().__init__(Journal())
        self.loop = loop
        self.channel: Channel | None = None

    def wake(self, channel: str) -> None:
        super().wake(channel)
        if self.channel is not None:
            self.loop.wake(self.channel)


def on_a_loop(make_channel: MakeChannel, **kwargs: Any) -> tuple[Any, Loop]:
    loop = Loop("test-loop", clock=lambda: T0)
    host = LoopHost(loop)
    h = make_channel(host=host, **kwargs)
    host.channel = h.channel
    loop.add(h.channel, f"channel {NAME}")
    return h, loop


def test_owner_loop_starts_work_and_close_stops_it(make_channel: MakeChannel) -> None:
    h, loop = on_a_loop(make_channel, wait_s=5)
    h.channel.enqueue("/db/a", 5.0)
    assert loop.run_once(T0) == T0 + 5  # paused: the loop is told when to come back
    assert h.started() == []
    assert loop.run_once(T0 + 5) is None  # unpaused and started; nothing else is due
    assert h.started() == ["/db/a"]
    assert h.channel.close() == ["/db/a"]
    loop.remove(h.channel)
    h.channel.enqueue("/db/b", 5.0)
    loop.run_once(T0 + 6)
    assert h.started() == ["/db/a"]


def test_enqueue_wakes_the_loop_early(make_channel: MakeChannel) -> None:
    h, loop = on_a_loop(make_channel)
    assert loop.run_once(T0) is None  # nothing due: an idle loop would sleep until woken
    assert loop.run_once(T0 + 3600) is None
    assert h.started() == []
    h.channel.enqueue("/db/a", 5.0)
    loop.run_once(T0 + 3600)  # only the wake-up makes this iteration tick the channel
    assert h.started() == ["/db/a"]


def test_a_paused_channel_takes_keys_without_waking_its_loop_and_still_checkpoints_them(
    make_channel: MakeChannel, tmp_path: Any
) -> None:
    # A backlog arriving key by key while the channel is paused costs its loop no tick per
    # key; the loop learns from the first change after a checkpoint that another one is due.
    h, loop = on_a_loop(make_channel, wait_s=3600, state_dir=tmp_path, checkpoint_interval_s=5)
    assert loop.run_once(T0) == T0 + 3600  # nothing to write: only the unpause is due
    wakes = h.journal.count(("wake",))
    h.channel.enqueue("/db/a", 5.0)
    assert h.journal.count(("wake",)) == wakes + 1  # the loop does not know a checkpoint is due
    assert loop.run_once(T0 + 1) == T0 + 5  # now it does
    for key in ("/db/b", "/db/c"):
        h.channel.enqueue(key, 4.0)
    assert h.journal.count(("wake",)) == wakes + 1  # paused, and the checkpoint is known due
    assert loop.run_once(T0 + 5) is not None
    assert h.channel.join_checkpoint(5)
    assert h.started() == []
    h.channel.close(checkpoint=False)
    again = make_channel(state_dir=tmp_path, settings=Settings(concurrency=0))
    assert again.channel.waiting() == [("/db/a", 5.0), ("/db/b", 4.0), ("/db/c", 4.0)]


def test_a_full_channel_takes_a_key_without_waking_its_loop_and_starts_it_when_a_run_ends(
    make_channel: MakeChannel,
) -> None:
    h, loop = on_a_loop(make_channel, settings=Settings(concurrency=1))
    h.channel.enqueue("/db/a", 5.0)
    loop.run_once(T0)
    assert h.started() == ["/db/a"]
    wakes = h.journal.count(("wake",))
    h.channel.enqueue("/db/b", 4.0)
    assert h.journal.count(("wake",)) == wakes  # nothing it could start
    h.channel.on_run_event(RunEvent("/db/a", h.scheduler.tokens["/db/a"], "ended", outcome=Outcome("ok")), T0)
    loop.run_once(T0)  # the run's event woke it
    assert h.started() == ["/db/a", "/db/b"]


def test_owner_loop_follows_runs_to_the_end(make_channel: MakeChannel) -> None:
    # The scheduler posts run events to the loop; each wakes the channel, whose tick
    # starts the next key.
    h, loop = on_a_loop(make_channel, settings=Settings(concurrency=1))
    h.channel.enqueue("/db/a", 5.0)
    h.channel.enqueue("/db/b", 4.0)
    loop.run_once(T0)
    for expected in ["/db/a", "/db/b"]:
        assert h.started()[-1] == expected
        token = h.scheduler.tokens[expected]
        for event in (RunEvent(expected, token, "running"), RunEvent(expected, token, "ended", outcome=Outcome("ok"))):
            loop.post(functools.partial(h.channel.on_run_event, event, T0 + 1))
        loop.run_once(T0 + 1)
    assert h.started() == ["/db/a", "/db/b"]
    assert h.host.results() == {"/db/a": "ok", "/db/b": "ok"}
    assert h.host.slots == 0
