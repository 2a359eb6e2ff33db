"""Time windows, strict windows, operator suspension and resume.

The DESIGN 5.3 window arithmetic itself is tested in tests/pure/test_window.py; here, what a
channel does with its window's answer.
"""

from __future__ import annotations

import pytest
from channel_testlib import NAME, T0, Journal, MakeChannel, RecordingHost, Settings, SwitchWindow

from channels import Window


@pytest.mark.parametrize(
    ("from_", "to", "expected"),
    [
        ("02:30", "04:30", True), ("03:35", "03:50", False), ("01:20", "03:29", False),
        ("23:30", "03:52", True), ("23:30", "03:29", False),
    ],
)
def test_real_window_vectors_at_0330(make_channel: MakeChannel, from_: str, to: str, expected: bool) -> None:
    # DESIGN 5.3: at 03:30 UTC (T0) these are open / closed.
    h = make_channel(settings=Settings(window=Window.parse(from_, to)))
    assert h.status()["in_window"] is expected  # known from construction on
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    assert h.status()["in_window"] is expected
    assert h.started() == (["/db/a"] if expected else [])


def test_closed_window_queues_without_starting(make_channel: MakeChannel) -> None:
    h = make_channel(settings=Settings(window=Window.parse("04:00", "05:00")))
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    h.tick(60)
    assert h.started() == []
    assert h.host.calls("acquire_slot") == []
    assert h.status()["in_window"] is False
    assert h.status()["waiting"]["size"] == 1


def test_entering_the_window_starts_queued_work_in_the_same_tick(make_channel: MakeChannel) -> None:
    h = make_channel(settings=Settings(window=Window.parse("04:00", "05:00")))
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    due = h.tick(29 * 60 + 59)  # 03:59:59: still closed
    assert h.started() == []
    # 04:00:59 is the first window check after 04:00, and the channel asks to be ticked then.
    # No enqueue and no run event happens in between: CouchDB would wait for one; this
    # channel starts at once.
    assert due == h.now + 60
    h.tick(60)
    assert h.status()["in_window"] is True
    assert h.started() == ["/db/a"]


def test_window_is_checked_every_minute_and_before_every_start(make_channel: MakeChannel) -> None:
    window = SwitchWindow(open_=True)
    h = make_channel(settings=Settings(window=window))
    h.tick()
    checks = window.checks
    h.tick(30)
    assert window.checks == checks  # not due, and nothing to start
    h.tick(30)
    assert window.checks == checks + 1  # the minute has passed
    window.open = False
    h.channel.enqueue("/db/a", 5.0)
    h.tick(10)  # the routine check is not due, but the start attempt checks
    assert window.checks == checks + 2
    assert h.started() == []
    assert h.host.calls("acquire_slot") == []  # checked before asking for a slot
    assert h.status()["in_window"] is False
    window.open = True
    h.tick(59)  # closed: no start attempt, and the next check is a minute after the last
    assert h.started() == []
    h.tick(1)
    assert h.started() == ["/db/a"]


def test_leaving_a_strict_window_holds_running_work(make_channel: MakeChannel) -> None:
    window = SwitchWindow(open_=True)
    h = make_channel(settings=Settings(window=window, strict_window=True))
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    assert h.host.holds == [(NAME, False)]  # first report: nothing is held
    h.running("/db/a")
    window.open = False
    h.tick(60)
    assert h.host.holds[-1] == (NAME, True)
    assert h.status()["holding"] is True
    window.open = True
    h.tick(60)
    assert h.host.holds == [(NAME, False), (NAME, True), (NAME, False)]
    assert h.status()["active"] == 1
    assert h.status()["holding"] is False


def test_leaving_a_lax_window_lets_running_work_finish(make_channel: MakeChannel) -> None:
    window = SwitchWindow(open_=True)
    h = make_channel(settings=Settings(window=window, strict_window=False))
    h.channel.enqueue("/db/a", 5.0)
    h.channel.enqueue("/db/b", 4.0)
    h.tick()
    h.running("/db/a")
    window.open = False
    h.tick(60)
    assert (NAME, True) not in h.host.holds
    assert h.status()["holding"] is False
    h.end("/db/a")
    assert h.host.results() == {"/db/a": "ok"}
    h.tick(1)
    assert h.started() == ["/db/a"]  # /db/b waits for the window
    assert h.channel.waiting() == [("/db/b", 4.0)]


def test_interrupted_by_a_strict_window_goes_back_to_the_queue(make_channel: MakeChannel) -> None:
    window = SwitchWindow(open_=True)
    h = make_channel(settings=Settings(window=window, strict_window=True))
    h.channel.enqueue("/db/a", 3.0)
    h.tick()
    h.running("/db/a")
    window.open = False
    h.tick(60)
    h.end("/db/a", "interrupted")  # a full VACUUM stopped by the hold
    assert h.channel.waiting() == [("/db/a", 3.0)]
    assert h.host.outcomes == []
    h.tick(1)
    assert h.started() == ["/db/a"]
    window.open = True
    h.tick(60)
    assert h.started() == ["/db/a", "/db/a"]


def test_window_change_by_update_settings_takes_effect_at_once(make_channel: MakeChannel) -> None:
    h = make_channel(settings=Settings(strict_window=True))
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    h.running("/db/a")
    h.channel.update_settings(Settings(window=SwitchWindow(open_=False), strict_window=True), h.now)
    # No tick: the hold is already on.
    assert h.host.holds[-1] == (NAME, True)
    assert h.status()["in_window"] is False and h.status()["holding"] is True
    h.channel.update_settings(Settings(window=SwitchWindow(open_=True), strict_window=True), h.now)
    assert h.host.holds[-1] == (NAME, False)
    assert h.status()["in_window"] is True


@pytest.mark.parametrize("strict_before", [True, False], ids=["strict-turned-off", "strict-turned-on"])
def test_strict_window_changed_by_update_settings_takes_effect_at_once(make_channel: MakeChannel, strict_before: bool) -> None:
    # Given a closed window, the host told whether running work holds
    h = make_channel(settings=Settings(window=SwitchWindow(open_=False), strict_window=strict_before))
    h.tick()
    assert h.host.holds == [(NAME, strict_before)]
    # When only strict_window changes
    h.channel.update_settings(Settings(window=SwitchWindow(open_=False), strict_window=not strict_before), h.now)
    # Then, with no tick, status and host agree on the new hold, as for a window change
    assert h.status()["holding"] is (not strict_before)
    assert h.host.holds[-1] == (NAME, not strict_before)


def test_strict_window_turned_off_by_update_settings_releases_the_hold_by_the_next_tick(make_channel: MakeChannel) -> None:
    h = make_channel(settings=Settings(window=SwitchWindow(open_=False), strict_window=True))
    h.tick()
    h.channel.update_settings(Settings(window=SwitchWindow(open_=False), strict_window=False), h.now)
    h.tick()
    assert h.host.holds == [(NAME, True), (NAME, False)]


def test_suspend_is_sticky_across_window_checks(make_channel: MakeChannel) -> None:
    h = make_channel(settings=Settings(window=SwitchWindow(open_=True)))
    h.channel.suspend()
    h.channel.enqueue("/db/a", 5.0)
    for _ in range(3):
        h.tick(60)
    assert h.status()["suspended"] is True
    assert h.started() == []
    assert h.host.holds == [(NAME, True)]


def test_suspend_holds_running_work_and_is_idempotent(make_channel: MakeChannel) -> None:
    h = make_channel()
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    h.running("/db/a")
    h.channel.suspend()
    h.channel.suspend()
    assert h.host.holds == [(NAME, False), (NAME, True)]
    assert h.status()["suspended"] is True and h.status()["active"] == 1
    h.channel.resume()
    h.channel.resume()
    assert h.host.holds == [(NAME, False), (NAME, True), (NAME, False)]
    assert h.status()["suspended"] is False


def test_suspended_channel_starts_nothing(make_channel: MakeChannel) -> None:
    h = make_channel(settings=Settings(concurrency=2))
    h.channel.enqueue("/db/a", 5.0)
    h.channel.enqueue("/db/b", 4.0)
    h.tick()
    h.channel.update_settings(Settings(concurrency=1), h.now)
    h.channel.suspend()
    h.end("/db/a")
    h.end("/db/b")
    h.channel.enqueue("/db/c", 1.0)
    h.tick(60)
    assert h.started() == ["/db/a", "/db/b"]
    assert h.host.calls("acquire_slot") == [("acquire_slot",), ("acquire_slot",)]


def test_resume_starts_queued_work_at_once(make_channel: MakeChannel) -> None:
    h = make_channel()
    h.channel.suspend()
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    assert h.started() == []
    del h.journal[:]
    h.channel.resume()
    assert ("wake",) in h.journal  # the owner ticks it now
    h.tick()  # same instant: no timer had to pass
    assert h.started() == ["/db/a"]


def test_resume_ends_the_initial_pause(make_channel: MakeChannel) -> None:
    h = make_channel(wait_s=9999)
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    assert h.status()["paused"] is True
    h.channel.resume()
    assert h.status()["paused"] is False
    h.tick()
    assert h.started() == ["/db/a"]


def test_resume_inside_a_closed_strict_window_keeps_the_hold(make_channel: MakeChannel) -> None:
    h = make_channel(settings=Settings(window=SwitchWindow(open_=False), strict_window=True))
    h.tick()
    h.channel.suspend()
    h.channel.resume()
    assert h.host.holds == [(NAME, True)]
    assert h.status()["holding"] is True


def test_failed_on_hold_is_retried_at_the_next_tick(make_channel: MakeChannel) -> None:
    h = make_channel()
    h.host.fail_on_hold = 1
    h.channel.suspend()
    assert h.host.calls("on_hold") == [("on_hold", True)]
    assert h.host.holds == []
    h.tick()
    assert h.host.calls("on_hold") == [("on_hold", True), ("on_hold", True)]
    assert h.host.holds == [(NAME, True)]
    h.tick()
    assert h.host.calls("on_hold") == [("on_hold", True), ("on_hold", True)]


HOLD = {"node": None, "channel": NAME, "by": "ops@admin", "at": 1_700_000_000.0}


def test_an_outside_hold_and_a_suspension_are_two_holds_each_released_only_by_its_own_call(
    make_channel: MakeChannel,
) -> None:
    h = make_channel()
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    h.running("/db/a")
    h.channel.enqueue("/db/b", 4.0)
    assert h.channel.set_held(HOLD) is True
    assert h.channel.set_held(HOLD) is False  # idempotent
    assert h.status()["held"] == HOLD and h.status()["suspended"] is False
    assert h.status()["holding"] is True and h.host.holds[-1] == (NAME, True)
    h.end("/db/a")
    h.tick(60)
    assert h.started() == ["/db/a"]  # nothing new starts while held
    h.channel.suspend()
    assert h.channel.set_held(None) is True  # the outside hold released: still suspended
    h.tick(60)
    assert h.started() == ["/db/a"]
    assert h.status()["held"] is None and h.status()["holding"] is True
    h.channel.set_held(HOLD)
    h.channel.resume()  # the suspension lifted: still held from outside
    h.tick(60)
    assert h.started() == ["/db/a"]
    assert h.status()["suspended"] is False and h.status()["holding"] is True
    del h.journal[:]
    h.channel.set_held(None)
    assert ("wake",) in h.journal  # released: the owner ticks it now
    h.tick()
    assert h.started() == ["/db/a", "/db/b"]
    assert h.host.holds[-1] == (NAME, False)


class WallClockHost(RecordingHost):
    """A host that ticks its channels on a monotonic clock and answers the wall time apart (as smoosh does)."""

    def __init__(self, journal: Journal, wall_s: float) -> None:
        super().__init__(journal)
        self.wall_s = wall_s

    def wall_time(self) -> float:
        return self.wall_s


#: The monotonic time the wall-clock tests tick at: as a date, a few minutes into 1970.
MONOTONIC_S = 1_000.0


def test_the_window_is_read_on_the_hosts_wall_clock_not_on_the_time_the_channel_is_ticked_with(
    make_channel: MakeChannel,
) -> None:
    # Given a host whose wall clock says 03:30 and who ticks on monotonic seconds
    host = WallClockHost(Journal(), wall_s=T0)
    h = make_channel(settings=Settings(window=Window.parse("02:30", "04:30")), host=host, now=MONOTONIC_S)
    # Then the window is open (at 00:16 on 1 January 1970, the monotonic time read as a date, it is not)
    assert h.status()["in_window"] is True
    h.channel.enqueue("/db/a", 5.0)
    h.tick(1)
    assert h.started() == ["/db/a"]


def test_a_step_of_the_wall_clock_into_the_window_is_seen_when_the_owner_says_so_not_a_minute_later(
    make_channel: MakeChannel,
) -> None:
    # Given a channel outside its window at 03:30 (wall), a key queued, the routine check a minute away
    host = WallClockHost(Journal(), wall_s=T0)
    h = make_channel(settings=Settings(window=Window.parse("04:00", "05:00")), host=host, now=MONOTONIC_S)
    h.channel.enqueue("/db/a", 5.0)
    assert h.tick(1) == h.now + 60  # the routine window check, on the owner's clock
    # When the wall clock steps to 04:15 (monotonic time does not move) and the owner, who
    # noticed the step, has the channel look at its window
    host.wall_s = T0 + 45 * 60
    h.tick(1)
    assert h.status()["in_window"] is False  # its own schedule would look at 60 s
    h.channel.check_window(h.now)
    # Then it is in its window at once, and wakes itself to start the queued key at its next tick
    assert h.status()["in_window"] is True
    assert h.journal.names()[-1] == "wake"
    h.tick()
    assert h.started() == ["/db/a"]
