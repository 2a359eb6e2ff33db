"""Starting work: the initial pause, ordering, concurrency, slots, dropped and failed starts.

The priority re-check and the job itself belong to the scheduler now (tests/server/test_scheduler.py);
here the channel hears their result as a ``dropped`` event.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest
from channel_testlib import NAME, T0, Journal, MakeChannel, RecordingHost, Settings


def messages(caplog: Any, level: int = logging.DEBUG) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= level and r.name == f"channels.channel.{NAME}"]


def test_new_channel_is_paused_until_wait_s_has_passed(make_channel: MakeChannel) -> None:
    h = make_channel(wait_s=30)
    assert h.channel.enqueue("/db/a", 5.0)
    assert h.tick() == T0 + 30  # the owner is told when the pause ends
    assert h.status()["paused"] is True
    assert h.started() == []

    h.tick(29.9)
    assert h.status()["paused"] is True
    assert h.started() == []

    h.tick(0.1)
    assert h.status()["paused"] is False
    assert h.started() == ["/db/a"]
    assert h.in_flight() == (1, 0)


def test_submit_names_channel_key_and_queued_priority(make_channel: MakeChannel) -> None:
    # What the job's data holds (re-checked priority, run token) is the scheduler's part:
    # tests/server/test_scheduler.py::test_job_data_names_channel_key_priority_progress_and_run.
    h = make_channel()
    h.channel.enqueue("/db/a", 7.5)
    h.tick()
    assert h.scheduler.submits == [(NAME, "/db/a", 7.5)]
    assert h.channel.in_flight() == {"/db/a": h.scheduler.tokens["/db/a"]}


def test_highest_priority_starts_first(make_channel: MakeChannel) -> None:
    h = make_channel()
    for key, priority in [("/db/low", 2.0), ("/db/inf", math.inf), ("/db/mid", 4.0)]:
        h.channel.enqueue(key, priority)
    h.tick()
    assert h.started() == ["/db/inf"]
    assert h.channel.waiting() == [("/db/mid", 4.0), ("/db/low", 2.0)]


def test_equal_priorities_start_oldest_first(make_channel: MakeChannel) -> None:
    h = make_channel()
    for key in ["/db/a", "/db/b", "/db/c"]:
        h.channel.enqueue(key, 3.0)
    for _ in range(3):
        h.tick()
        key = h.started()[-1]
        h.running(key)
        h.end(key)
    assert h.started() == ["/db/a", "/db/b", "/db/c"]


def test_concurrency_bounds_starting_plus_active(make_channel: MakeChannel) -> None:
    h = make_channel(settings=Settings(concurrency=2))
    for i in range(4):
        h.channel.enqueue(f"/db/{i}", 10.0 - i)
    h.tick()
    assert h.started() == ["/db/0", "/db/1"]
    h.running("/db/0")
    assert h.in_flight() == (1, 1)
    h.tick()
    assert h.started() == ["/db/0", "/db/1"]
    assert h.status()["waiting"]["size"] == 2
    h.assert_slots_match_runs()


def test_concurrency_zero_queues_but_never_starts(make_channel: MakeChannel) -> None:
    h = make_channel(settings=Settings(concurrency=0))
    h.channel.enqueue("/db/a", 5.0)
    for _ in range(3):
        h.tick(60)
    assert h.started() == []
    assert h.host.calls("acquire_slot") == []
    assert h.status()["waiting"]["size"] == 1


def test_raised_concurrency_applies_at_the_next_start(make_channel: MakeChannel) -> None:
    h = make_channel(settings=Settings(concurrency=1))
    for i in range(3):
        h.channel.enqueue(f"/db/{i}", 5.0)
    h.tick()
    assert len(h.started()) == 1
    h.channel.update_settings(Settings(concurrency=3), h.now)
    assert h.status()["concurrency"] == 3
    assert len(h.started()) == 1  # nothing starts outside a tick
    h.tick()
    assert len(h.started()) == 3
    h.assert_slots_match_runs()


def test_a_host_that_raises_the_concurrency_lets_that_many_run_but_never_a_zero(make_channel: MakeChannel) -> None:
    # smoosh raises it under disk pressure to the backlog controller's slots (concurrency_raised).
    h = make_channel(settings=Settings(concurrency=1))
    raised = {"to": 0}
    h.host.concurrency_raised = lambda channel: raised["to"]  # type: ignore[attr-defined]
    for i in range(4):
        h.channel.enqueue(f"/db/{i}", 5.0)
    h.tick()
    assert len(h.started()) == 1  # nothing raised: its own concurrency
    raised["to"] = 3
    h.channel.check_window(h.now)  # the host has it look again as the answer changes
    assert h.status()["concurrency"] == 3
    h.tick()
    assert len(h.started()) == 3
    raised["to"] = 0  # the raise ends: the runs go on, nothing more starts until one ends
    h.channel.check_window(h.now)
    assert h.status()["concurrency"] == 1
    h.tick()
    assert len(h.started()) == 3
    h.assert_slots_match_runs()
    # A channel of concurrency 0 starts nothing, raised or not.
    z = make_channel(settings=Settings(concurrency=0))
    z.host.concurrency_raised = lambda channel: 4  # type: ignore[attr-defined]
    z.channel.enqueue("/db/z", 5.0)
    z.tick()
    assert z.started() == [] and z.status()["concurrency"] == 0


def test_bad_capacity_in_new_settings_changes_nothing(make_channel: MakeChannel) -> None:
    h = make_channel(settings=Settings(capacity=5, concurrency=0))
    h.channel.enqueue("/db/a", 5.0)
    with pytest.raises((ValueError, TypeError)):
        h.channel.update_settings(Settings(capacity=0, concurrency=4), h.now)
    assert h.status()["concurrency"] == 0
    assert h.channel.waiting() == [("/db/a", 5.0)]


def test_key_whose_priority_is_now_zero_is_dropped(make_channel: MakeChannel, caplog: Any) -> None:
    # Given the scheduler's re-check found /db/done compacted (tests/server covers the re-check)
    h = make_channel()
    h.channel.enqueue("/db/done", 9.0)
    h.channel.enqueue("/db/next", 1.0)
    h.tick()
    assert h.host.slots == 1
    # When it reports the run dropped
    with caplog.at_level(logging.INFO, logger=f"channels.channel.{NAME}"):
        h.drop("/db/done", "its priority is now 0 (compacted or gone)", priority=0)
    # Then the key leaves the channel, its slot is given back, nothing is reported as an outcome
    assert h.channel.keys() == {"/db/next"}
    assert h.host.slots == 0
    assert h.host.outcomes == []
    assert messages(caplog, logging.INFO) == [
        "Channel ratio_dbs: dropped '/db/done': its priority is now 0 (compacted or gone)."
    ]
    # And the next key starts at the next tick
    h.tick()
    assert h.started() == ["/db/done", "/db/next"]
    assert h.host.calls("acquire_slot") == [("acquire_slot",), ("acquire_slot",)]
    assert h.host.calls("release_slot") == [("release_slot",)]


def test_dropped_without_a_reason_says_it_could_not_start(make_channel: MakeChannel, caplog: Any) -> None:
    h = make_channel()
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    with caplog.at_level(logging.INFO, logger=f"channels.channel.{NAME}"):
        h.drop("/db/a")
    assert messages(caplog, logging.INFO) == ["Channel ratio_dbs: dropped '/db/a': it could not start."]
    assert h.host.slots == 0 and h.channel.keys() == set()


def test_key_running_in_another_channel_is_dropped(make_channel: MakeChannel, caplog: Any) -> None:
    # The scheduler found another channel's job running for the key (one key, one job).
    h = make_channel()
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    with caplog.at_level(logging.INFO, logger=f"channels.channel.{NAME}"):
        h.drop("/db/a", "it is already being compacted by channel 'slack_dbs'")
    assert h.channel.keys() == set()
    assert h.host.slots == 0
    assert messages(caplog, logging.INFO) == [
        "Channel ratio_dbs: dropped '/db/a': it is already being compacted by channel 'slack_dbs'."
    ]
    assert "Traceback" not in caplog.text


def test_error_while_starting_drops_the_key_and_frees_the_slot(make_channel: MakeChannel, caplog: Any) -> None:
    h = make_channel(settings=Settings(concurrency=1))
    h.scheduler.fail.add("/db/bad")
    h.channel.enqueue("/db/bad", 9.0)
    h.channel.enqueue("/db/good", 1.0)
    with caplog.at_level(logging.WARNING, logger=f"channels.channel.{NAME}"):
        h.tick()
    # The freed slot went to the next key in the same tick.
    assert h.started() == ["/db/good"]
    assert h.channel.keys() == {"/db/good"}
    assert h.host.calls("release_slot") == [("release_slot",)]
    h.assert_slots_match_runs()
    assert messages(caplog, logging.WARNING) == ["Channel ratio_dbs: could not start '/db/bad'; dropped."]
    assert "RuntimeError: store unavailable" in caplog.text
    # The channel goes on.
    h.running("/db/good")
    assert h.in_flight() == (0, 1)


def test_refused_global_slot_keeps_the_key_waiting(make_channel: MakeChannel) -> None:
    h = make_channel()
    h.host.grant = False
    h.channel.enqueue("/db/a", 5.0)
    # The channel asks, is refused, and stays in line: no withdraw, and no timer (the host
    # wakes it when a slot frees).
    assert h.tick() is None
    assert h.journal[-1] == ("acquire_slot",)
    assert h.tick(1) is None
    assert h.journal[-1] == ("acquire_slot",)
    assert h.host.calls("withdraw") == []
    assert h.started() == []
    assert h.channel.waiting() == [("/db/a", 5.0)]
    # A slot frees elsewhere: the host grants and wakes the channel, whose next tick starts it.
    h.host.grant = True
    h.tick(1)
    assert h.started() == ["/db/a"]
    h.assert_slots_match_runs()


class SharedSlots(RecordingHost):
    """One host for several channels: ``limit`` global slots, a line of refused channels,
    and a release that wakes whoever is in line (as smoosh's server does)."""

    def __init__(self, limit: int) -> None:
        super().__init__(Journal())
        self.limit = limit
        self.line: list[str] = []
        self.woken: list[str] = []

    def acquire_slot(self, channel: str, *, force: bool = False, forced: bool = False) -> bool:
        if force or self.slots < self.limit:
            self.slots += 1
            if channel in self.line:
                self.line.remove(channel)
            return True
        if channel not in self.line:
            self.line.append(channel)
        return False

    def release_slot(self, channel: str) -> None:
        self.slots -= 1
        self.woken.extend(self.line)

    def withdraw(self, channel: str) -> None:
        if channel in self.line:
            self.line.remove(channel)

    def wake(self, channel: str) -> None:
        self.woken.append(channel)


def test_refused_channel_stays_in_line_and_starts_when_woken_after_a_release(make_channel: MakeChannel) -> None:
    # Given one global slot, taken by channel "big"
    host = SharedSlots(limit=1)
    big = make_channel("big", host=host)
    small = make_channel("small", host=host)
    big.channel.enqueue("/db/big", 9.0)
    big.tick()
    assert big.started() == ["/db/big"]
    # When "small" is refused, it stays in line across ticks (no timer: it waits to be woken)
    small.channel.enqueue("/db/small", 1.0)
    assert small.tick() is None
    assert small.tick(1) is None
    assert host.line == ["small"] and small.started() == []
    # Then the release of big's slot wakes it, and its next tick starts its key
    host.woken.clear()
    big.running("/db/big")
    big.end("/db/big")
    assert "small" in host.woken
    small.tick(1)
    assert small.started() == ["/db/small"]
    assert host.line == [] and host.slots == 1


def test_channel_that_cannot_start_withdraws_from_the_slot_line(make_channel: MakeChannel) -> None:
    h = make_channel(settings=Settings(concurrency=1))
    h.channel.enqueue("/db/a", 5.0)
    h.channel.enqueue("/db/b", 4.0)
    h.tick()
    # Full: it leaves the line, so it never holds a slot back from other channels.
    assert h.journal.names()[-3:] == ["acquire_slot", "submit", "withdraw"]
    h.channel.suspend()
    del h.journal[:]
    h.tick()
    assert h.journal.names() == ["withdraw"]
    h.channel.resume()
    h.channel.flush()
    h.running("/db/a")
    h.end("/db/a")
    del h.journal[:]
    h.tick()  # nothing left to start
    assert h.journal.names() == ["withdraw"]


def test_dry_run_ranks_but_never_starts(make_channel: MakeChannel) -> None:
    h = make_channel(dry_run=True)
    h.channel.enqueue("/db/a", 2.0)
    h.channel.enqueue("/db/b", 8.0)
    for _ in range(3):
        h.tick(60)
    assert h.started() == []
    assert h.host.calls("acquire_slot") == []
    assert h.channel.waiting() == [("/db/b", 8.0), ("/db/a", 2.0)]


def test_enqueue_ignores_a_key_already_starting_or_active(make_channel: MakeChannel) -> None:
    h = make_channel(settings=Settings(concurrency=2))
    h.channel.enqueue("/db/a", 5.0)
    h.channel.enqueue("/db/b", 4.0)
    h.tick()
    h.running("/db/a")  # /db/a becomes active, /db/b stays starting
    assert h.in_flight() == (1, 1)
    assert h.channel.enqueue("/db/a", 9.0) is False
    assert h.channel.enqueue("/db/b", 9.0) is False
    assert h.channel.waiting() == []


def test_enqueue_moves_a_waiting_key_and_counts_evictions(make_channel: MakeChannel) -> None:
    h = make_channel(settings=Settings(capacity=2, concurrency=0))
    assert h.channel.enqueue("/db/a", 1.0)
    assert h.channel.enqueue("/db/b", 2.0)
    assert h.channel.enqueue("/db/a", 3.0)  # re-prioritised, not added twice
    assert h.channel.waiting() == [("/db/a", 3.0), ("/db/b", 2.0)]
    assert h.channel.enqueue("/db/c", 0.5) is False  # lowest of a full queue: evicted at once
    assert h.channel.enqueue("/db/d", 5.0) is True  # evicts /db/b
    assert h.channel.waiting() == [("/db/d", 5.0), ("/db/a", 3.0)]
    assert h.status()["evicted"] == 2


def test_enqueue_wakes_the_owner(make_channel: MakeChannel) -> None:
    h = make_channel()
    h.tick()
    del h.journal[:]
    h.channel.enqueue("/db/a", 5.0)
    assert h.journal == [("wake",)]


def test_capacity_shrink_truncates_the_queue_at_once(make_channel: MakeChannel) -> None:
    h = make_channel(settings=Settings(capacity=10, concurrency=0))
    for i in range(5):
        h.channel.enqueue(f"/db/{i}", float(i))
    h.channel.update_settings(Settings(capacity=2, concurrency=0), h.now)
    assert h.channel.waiting() == [("/db/4", 4.0), ("/db/3", 3.0)]
    assert h.status()["evicted"] == 3
    assert h.status()["waiting"] == {"size": 2, "min": 3.0, "max": 4.0}


@pytest.mark.parametrize("priority", [float("nan"), "high", None, True])
def test_enqueue_refuses_a_priority_that_is_not_a_number(make_channel: MakeChannel, priority: Any) -> None:
    h = make_channel()
    with pytest.raises((TypeError, ValueError)):
        h.channel.enqueue("/db/a", priority)
    assert h.channel.keys() == set()
    assert h.status()["waiting"]["size"] == 0
