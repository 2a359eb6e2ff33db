"""``enqueue --force`` at the channel (DESIGN §11) and ``locate``, the reader ``explain`` uses."""

from __future__ import annotations

import math

from channel_testlib import MakeChannel, Settings, SwitchWindow


def test_a_forced_key_starts_during_the_start_up_pause_and_before_the_queues_head(make_channel: MakeChannel) -> None:
    # Given a channel in its start-up pause, with a high-priority key waiting
    h = make_channel(wait_s=3600)
    h.channel.enqueue("/db/head", 50.0)
    h.channel.enqueue("/db/low", 1.0)
    h.tick()
    assert h.scheduler.started() == []
    # When the low one is forced
    assert h.channel.force("/db/low") is True
    h.tick()
    # Then it starts at once, alone: the pause still holds the rest back
    assert h.scheduler.submits == [("ratio_dbs", "/db/low", math.inf)]
    assert h.channel.locate("/db/head") == {"place": "queue", "priority": 50.0, "position": 1}


def test_a_forced_key_leaves_its_crash_backoff(make_channel: MakeChannel) -> None:
    h = make_channel()
    h.channel.defer("/db/crashing", 4.0, h.now + 3600)
    assert h.channel.locate("/db/crashing") == {"place": "deferred", "priority": 4.0, "not_before": h.now + 3600}
    h.channel.force("/db/crashing")
    h.tick()
    assert h.scheduler.started() == ["/db/crashing"]


def test_suspension_the_window_and_slots_still_hold_a_forced_key(make_channel: MakeChannel) -> None:
    window = SwitchWindow(open_=False)
    h = make_channel(settings=Settings(window=window))
    h.channel.force("/db/k")
    h.tick()
    assert h.scheduler.started() == []  # outside the window
    assert h.channel.locate("/db/k") == {"place": "queue", "priority": math.inf, "position": 1, "forced": True}
    window.open = True
    h.channel.suspend()
    h.tick(61)
    assert h.scheduler.started() == []  # suspended
    h.host.grant = False
    h.channel.resume()
    h.tick()
    assert h.scheduler.started() == []  # no global slot
    h.host.grant = True
    h.tick()
    assert h.scheduler.started() == ["/db/k"]
    assert h.channel.locate("/db/k") == {"place": "starting", "priority": math.inf}


def test_a_key_running_here_cannot_be_forced_and_a_flush_forgets_forced_keys(make_channel: MakeChannel) -> None:
    h = make_channel(wait_s=3600)
    h.channel.force("/db/a")
    h.tick()
    assert h.channel.force("/db/a") is False  # starting already
    h.channel.suspend()
    h.channel.force("/db/b")
    assert h.channel.flush() == ["/db/b"]
    h.channel.enqueue("/db/b", 3.0)
    h.channel.resume()  # ends the pause too: /db/b starts as an ordinary key would
    h.end("/db/a")
    h.tick()
    assert [p for _, k, p in h.scheduler.submits if k == "/db/b"] == [3.0]


def test_locate_says_where_a_key_is_and_its_place_in_line(make_channel: MakeChannel) -> None:
    h = make_channel(wait_s=3600)
    for i, priority in enumerate([5.0, 9.0, 7.0]):
        h.channel.enqueue(f"/db/{i}", priority)
    assert [h.channel.locate(f"/db/{i}")["position"] for i in range(3)] == [3, 1, 2]  # type: ignore[index]
    assert h.channel.locate("/db/absent") is None
    assert h.channel.paused_until == h.now + 3600
    h.tick(3600)
    assert h.channel.paused_until is None


def test_the_head_pages_every_waiting_key_in_the_order_they_would_start(make_channel: MakeChannel) -> None:
    # Given a queue, a forced key from the middle of it, and a deferred key
    h = make_channel(wait_s=3600)
    for i, priority in enumerate([5.0, 9.0, 1.0, 7.0, 3.0]):
        h.channel.enqueue(f"/db/{i}", priority)
    h.channel.force("/db/2")
    h.channel.defer("/db/late", 4.0, h.now + 600)
    h.channel.defer("/db/soon", 8.0, h.now + 60)
    # Then the head lists the forced key first, the queue highest first, then the deferred, earliest first
    rows, total = h.channel.head(0, 100)
    assert total == 7
    assert [(r["position"], r["key"], r["place"]) for r in rows] == [
        (1, "/db/2", "queue"), (2, "/db/1", "queue"), (3, "/db/3", "queue"), (4, "/db/0", "queue"),
        (5, "/db/4", "queue"), (6, "/db/soon", "deferred"), (7, "/db/late", "deferred")]
    assert rows[0] == {"key": "/db/2", "priority": math.inf, "place": "queue", "position": 1, "forced": True}
    assert rows[5] == {"key": "/db/soon", "priority": 8.0, "place": "deferred", "not_before": h.now + 60, "position": 6}
    # And every page of it is that list's slice, whatever its size
    for offset in range(8):
        for limit in (1, 2, 3):
            page, page_total = h.channel.head(offset, limit)
            assert (page, page_total) == (rows[offset:offset + limit], 7), (offset, limit)
