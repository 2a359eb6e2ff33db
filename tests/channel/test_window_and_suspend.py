"""Time windows, strict windows, operator suspension and resume."""

from __future__ import annotations

from typing import Any

from channel_testlib import Settings, SwitchWindow

from channels import Window

NAME = "ratio_dbs"


def test_real_window_vectors_at_0330(make_channel: Any) -> None:
    # DESIGN 5.3: at 03:30 UTC these are open / closed.
    cases = {
        ("02:30", "04:30"): True, ("03:35", "03:50"): False, ("01:20", "03:29"): False,
        ("23:30", "03:52"): True, ("23:30", "03:29"): False,
    }
    for (from_, to), expected in cases.items():
        h = make_channel(settings=Settings(window=Window.parse(from_, to)))
        h.channel.enqueue("/db/a", 5.0)
        h.tick()
        assert h.status()["in_window"] is expected, (from_, to)
        h.channel.close(checkpoint=False)


def test_closed_window_queues_without_starting(make_channel: Any) -> None:
    h = make_channel(settings=Settings(window=Window.parse("04:00", "05:00")))
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    h.tick(60)
    assert h.job_ids() == set()
    assert h.status()["in_window"] is False
    assert h.status()["waiting"]["size"] == 1


def test_entering_the_window_starts_queued_work_in_the_same_tick(make_channel: Any) -> None:
    h = make_channel(settings=Settings(window=Window.parse("04:00", "05:00")))
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    h.tick(29 * 60 + 59)  # 03:59:59: still closed
    assert h.job_ids() == set()
    # 04:00:59 is the first window check after 04:00. No enqueue and no job event happens
    # in between: CouchDB would wait for one; this channel starts at once.
    h.tick(60)
    assert h.status()["in_window"] is True
    assert h.job_ids() == {"/db/a"}


def test_window_is_checked_every_minute_and_before_every_start(make_channel: Any) -> None:
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
    assert h.job_ids() == set()
    assert h.status()["in_window"] is False
    window.open = True
    h.tick(59)  # closed: no start attempt, and the next check is a minute after the last
    assert h.job_ids() == set()
    h.tick(1)
    assert h.job_ids() == {"/db/a"}


def test_leaving_a_strict_window_holds_running_work(make_channel: Any) -> None:
    window = SwitchWindow(open_=True)
    h = make_channel(settings=Settings(window=window, strict_window=True))
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    assert h.rec.holds == [(NAME, False)]  # first report: nothing is held
    h.accept()
    h.wait_active(1)
    window.open = False
    h.tick(60)
    assert h.rec.holds[-1] == (NAME, True)
    assert h.status()["held"] is True
    window.open = True
    h.tick(60)
    assert h.rec.holds == [(NAME, False), (NAME, True), (NAME, False)]
    assert h.status()["active"] == 1


def test_leaving_a_lax_window_lets_running_work_finish(make_channel: Any) -> None:
    window = SwitchWindow(open_=True)
    h = make_channel(settings=Settings(window=window, strict_window=False))
    h.channel.enqueue("/db/a", 5.0)
    h.channel.enqueue("/db/b", 4.0)
    h.tick()
    job, data = h.accept()
    h.wait_active(1)
    window.open = False
    h.tick(60)
    assert (NAME, True) not in h.rec.holds
    h.finish(job, data, "ok")
    h.wait_done(1)
    h.tick(1)
    assert h.job_ids() == set()  # /db/b waits for the window
    assert h.channel.waiting() == [("/db/b", 4.0)]


def test_interrupted_by_a_strict_window_goes_back_to_the_queue(make_channel: Any) -> None:
    window = SwitchWindow(open_=True)
    h = make_channel(settings=Settings(window=window, strict_window=True), priority_of=lambda key: 3.0)
    h.channel.enqueue("/db/a", 3.0)
    h.tick()
    job, data = h.accept()
    h.wait_active(1)
    window.open = False
    h.tick(60)
    h.finish(job, data, "interrupted")  # a full VACUUM stopped by the hold
    h.settle(lambda: h.channel.waiting() == [("/db/a", 3.0)], "requeued")
    assert h.job_ids() == set() and h.rec.done == []
    window.open = True
    h.tick(60)
    assert h.job_ids() == {"/db/a"}


def test_window_change_by_update_settings_takes_effect_at_once(make_channel: Any) -> None:
    h = make_channel(settings=Settings(strict_window=True))
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    h.accept()
    h.wait_active(1)
    h.channel.update_settings(Settings(window=SwitchWindow(open_=False), strict_window=True))
    # No tick: the hold is already on.
    assert h.rec.holds[-1] == (NAME, True)
    assert h.status()["in_window"] is False
    h.channel.update_settings(Settings(window=SwitchWindow(open_=False), strict_window=False))
    assert h.rec.holds[-1] == (NAME, False)


def test_suspend_is_sticky_across_window_checks(make_channel: Any) -> None:
    h = make_channel(settings=Settings(window=SwitchWindow(open_=True)))
    h.channel.suspend()
    h.channel.enqueue("/db/a", 5.0)
    for _ in range(3):
        h.tick(60)
    assert h.status()["suspended"] is True
    assert h.job_ids() == set()
    assert (NAME, False) not in h.rec.holds


def test_suspend_holds_running_work_and_is_idempotent(make_channel: Any) -> None:
    h = make_channel()
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    h.accept()
    h.wait_active(1)
    h.channel.suspend()
    h.channel.suspend()
    assert h.rec.holds == [(NAME, False), (NAME, True)]
    assert h.status()["suspended"] is True and h.status()["active"] == 1
    h.channel.resume()
    h.channel.resume()
    assert h.rec.holds == [(NAME, False), (NAME, True), (NAME, False)]
    assert h.status()["suspended"] is False


def test_resume_starts_queued_work_at_once(make_channel: Any) -> None:
    h = make_channel()
    h.channel.suspend()
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    assert h.job_ids() == set()
    h.channel.resume()
    h.tick()  # same instant: no timer had to pass
    assert h.job_ids() == {"/db/a"}


def test_resume_ends_the_initial_pause(make_channel: Any) -> None:
    h = make_channel(wait_s=9999)
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    assert h.status()["paused"] is True
    h.channel.resume()
    h.tick()
    assert h.status()["paused"] is False
    assert h.job_ids() == {"/db/a"}


def test_resume_inside_a_closed_strict_window_keeps_the_hold(make_channel: Any) -> None:
    h = make_channel(settings=Settings(window=SwitchWindow(open_=False), strict_window=True))
    h.tick()
    h.channel.suspend()
    h.channel.resume()
    assert h.rec.holds == [(NAME, True)]
    assert h.status()["held"] is True


def test_failed_on_hold_is_retried_at_the_next_tick(make_channel: Any) -> None:
    h = make_channel()
    calls: list[bool] = []

    def flaky(channel: str, hold: bool) -> None:
        calls.append(hold)
        if len(calls) == 1:
            raise ConnectionError("store down")

    h.channel._on_hold = flaky
    h.channel.suspend()
    assert calls == [True]
    h.tick()
    assert calls == [True, True]
    h.tick()
    assert calls == [True, True]
