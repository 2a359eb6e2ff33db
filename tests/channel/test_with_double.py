"""The channel against its two ports, call by call: event order around one tick, and the exact calls made.

Both doubles write into one journal, so the order of calls across the scheduler and the host
is pinned too.
"""

from __future__ import annotations

import logging
from typing import Any

from channel_testlib import FIRST_TOKEN, NAME, T0, MakeChannel, Settings

from channels import Outcome


def test_running_and_ended_before_one_tick_are_both_applied(make_channel: MakeChannel, caplog: Any) -> None:
    # Given two keys and room for one
    h = make_channel(settings=Settings(concurrency=1))
    h.channel.enqueue("/db/a", 4.0)
    h.channel.enqueue("/db/b", 3.0)
    h.tick(0)
    # When the owner delivers a run's running and ended events back to back, before any tick
    with caplog.at_level(logging.WARNING):
        h.running("/db/a")
        h.end("/db/a", "ok")
        h.tick(1)
    # Then both were applied: the outcome reported, the slot freed and used in that tick
    assert h.host.results() == {"/db/a": "ok"}
    assert h.started() == ["/db/a", "/db/b"]
    h.assert_slots_match_runs()
    assert caplog.records == []


def test_channel_makes_only_the_pinned_scheduler_and_host_calls(make_channel: MakeChannel) -> None:
    h = make_channel()
    h.channel.enqueue("/db/a", 4.0)
    h.tick()
    h.running("/db/a")
    h.end("/db/a", "failed", error="boom")
    assert h.journal == [
        ("wake",),  # enqueue
        ("on_hold", False),  # the first tick reports the real hold state
        ("acquire_slot",),
        ("submit", "/db/a", 4.0),
        ("withdraw",),  # full now: out of the slot line
        # running: no tick asked (nothing it could start changed)
        ("release_slot",),  # ended
        ("on_outcome", "/db/a", "failed"),
        ("wake",),
    ]
    assert h.scheduler.submits == [(NAME, "/db/a", 4.0)]
    assert h.host.outcomes == [(NAME, "/db/a", Outcome("failed", "boom"), T0)]


def test_events_of_a_job_running_and_pending_again_keep_its_slot(make_channel: MakeChannel) -> None:
    h = make_channel(settings=Settings(concurrency=1))
    h.channel.enqueue("/db/a", 4.0)
    h.channel.enqueue("/db/b", 3.0)
    h.tick()
    assert h.scheduler.tokens["/db/a"] == FIRST_TOKEN
    wakes = len(h.host.calls("wake"))
    for kind in ["running", "running", "pending", "running", "pending"]:
        h.send("/db/a", kind)
        h.tick(1)
        expected = (0, 1) if kind == "running" else (1, 0)
        assert h.in_flight() == expected
    assert h.started() == ["/db/a"]
    # A run moving between starting and active frees no place: no tick is asked for it
    assert len(h.host.calls("wake")) == wakes
    assert h.host.calls("release_slot") == []
    assert h.host.slots == 1


def test_dropped_then_started_again_gets_a_new_token(make_channel: MakeChannel) -> None:
    h = make_channel()
    h.channel.enqueue("/db/a", 4.0)
    h.tick()
    h.drop("/db/a", "its job could not be added: store unavailable")
    h.channel.enqueue("/db/a", 4.0)
    h.tick()
    assert h.started() == ["/db/a", "/db/a"]
    assert h.channel.in_flight() == {"/db/a": FIRST_TOKEN + 1}
    h.send("/db/a", "running", run=FIRST_TOKEN)  # the dropped run's late event
    assert h.in_flight() == (1, 0)
