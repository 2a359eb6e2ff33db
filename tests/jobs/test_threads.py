"""Background threads: per-type monitors follow the type registry (upstream case 6); the
supervision cases (7-16) become "a crashed background thread is logged and restarted, and
close() stops them all"."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

import pytest

from jobs_testlib import J1, T1, T2, job_threads

from smoosh.jobs import Jobs, NotFound
from smoosh.jobs.notifier import TypeMonitor
from smoosh.jobs.threads import RESTART_DELAY_S
from helpers.daemon import HANG_S

EVENT_WAIT_S = HANG_S  # a ceiling on a hang, never a measure of speed


def wait_until(predicate: Callable[[], bool], timeout_s: float = EVENT_WAIT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def raise_once(original: Callable[..., Any], error: BaseException) -> Callable[..., Any]:
    state = {"raised": False}

    def patched(*args: Any, **kwargs: Any) -> Any:
        if not state["raised"]:
            state["raised"] = True
            raise error
        return original(*args, **kwargs)

    return patched


# 6. type_timeouts_and_server
def test_type_timeouts_start_and_stop_monitors_and_notifiers(jobs: Jobs) -> None:
    sup = jobs.supervisor
    assert jobs.get_type_timeout(T1) == 2
    assert set(sup.monitors) == {T1, T2}
    assert all(r.is_alive() for r in sup.runners())

    jobs.set_type_timeout("t3", 8)
    assert set(sup.monitors) == {T1, T2, "t3"}
    jobs.add("t3", J1, {})
    jobs.subscribe("t3", J1)  # a subscription starts the type's notifier pair
    assert "t3" in sup.notifiers
    t3_runners = [sup.monitors["t3"], *sup.notifiers["t3"]]
    assert all(r.is_alive() for r in t3_runners)

    jobs.clear_type_timeout("t3")
    assert set(sup.monitors) == {T1, T2}
    assert "t3" not in sup.notifiers
    assert not any(r.is_alive() for r in t3_runners)
    assert jobs.get_type_timeout("t3") is None


def test_monitors_of_existing_types_start_with_the_layer(jobs: Jobs, make_jobs: Callable[..., Jobs]) -> None:
    other = make_jobs()
    assert set(other.supervisor.monitors) == {T1, T2}
    assert all(r.is_alive() for r in other.supervisor.runners())


def test_type_scan_follows_types_set_and_cleared_elsewhere(jobs: Jobs, make_jobs: Callable[..., Jobs]) -> None:
    elsewhere = make_jobs(monitors=False)  # stands in for another process
    elsewhere.set_type_timeout("t4", 5)
    jobs.supervisor.scan()
    assert "t4" in jobs.supervisor.monitors
    elsewhere.clear_type_timeout("t4")
    jobs.supervisor.scan()
    assert "t4" not in jobs.supervisor.monitors


# The faults below are injected into this layer's own role objects (not their classes), so
# threads of layers other tests left behind cannot take them.


def test_crashed_activity_monitor_is_logged_and_restarted(jobs: Jobs, caplog: pytest.LogCaptureFixture) -> None:
    runner = jobs.supervisor.monitors[T1]
    monitor = runner.role
    monitor.tick = raise_once(monitor.tick, RuntimeError("boom"))
    with caplog.at_level(logging.ERROR, logger="smoosh.jobs.threads"):
        jobs.set_type_timeout(T1, 2)  # re-time: the monitor steps at once, and crashes
        assert wait_until(lambda: runner.crashes == 1)
        # Restarted: after the pause it schedules its next check again.
        assert wait_until(lambda: monitor.next_check_at is not None, RESTART_DELAY_S + EVENT_WAIT_S)
    assert runner.is_alive()
    assert f"background thread {runner.name} crashed; restarting it" in caplog.messages


def test_crashed_notifier_is_restarted_and_still_delivers(jobs: Jobs, caplog: pytest.LogCaptureFixture) -> None:
    jobs.add(T1, J1, {})
    notifier = jobs.supervisor.notifier(T1)
    assert notifier is not None
    notifier._read_batch = raise_once(notifier._read_batch, RuntimeError("boom"))
    with caplog.at_level(logging.ERROR, logger="smoosh.jobs.threads"):
        sub = jobs.subscribe(T1, J1)
        jobs.accept(T1)
        assert sub.wait(timeout=EVENT_WAIT_S) == (T1, J1, "running", {})
    runner = jobs.supervisor.notifiers[T1][1]
    assert runner.crashes == 1
    assert f"background thread {runner.name} crashed; restarting it" in caplog.messages


def test_crashed_type_monitor_is_restarted_and_still_wakes_notifier(jobs: Jobs) -> None:
    jobs.add(T1, J1, {})
    sub = jobs.subscribe(T1, J1)
    runner = jobs.supervisor.notifiers[T1][0]
    type_monitor = runner.role
    assert isinstance(type_monitor, TypeMonitor)
    # Its next round (after the accept below changes the watched key) crashes.
    type_monitor._read_and_watch = raise_once(type_monitor._read_and_watch, RuntimeError("boom"))
    job, _ = jobs.accept(T1)
    # Only the type monitor can wake the notifier now: the event proves it was restarted.
    assert sub.wait(timeout=EVENT_WAIT_S)[2] == "running"
    assert wait_until(lambda: runner.crashes == 1)
    jobs.update(job)
    assert sub.wait(timeout=EVENT_WAIT_S)[2] == "running"


def test_dead_thread_is_restarted_by_the_type_scan(jobs: Jobs, caplog: pytest.LogCaptureFixture) -> None:
    runner = jobs.supervisor.monitors[T2]
    # Stand-in for a thread that died outside the step loop's reach: stop the real one and
    # leave a finished thread in its place, with the runner not asked to stop.
    runner.stop()
    runner.join()
    runner._stopping.clear()
    assert not runner.is_alive()
    with caplog.at_level(logging.ERROR, logger="smoosh.jobs.supervisor"):
        jobs.supervisor.scan()
    assert runner.is_alive()
    assert f"background thread {runner.name} died; restarting it" in caplog.messages


def test_close_stops_every_thread(make_jobs: Callable[..., Jobs]) -> None:
    before = set(job_threads())  # other tests' leftovers are not this test's business
    jobs = make_jobs()
    jobs.set_type_timeout(T1, 30)
    jobs.set_type_timeout(T2, 30)
    jobs.add(T1, J1, {})
    jobs.subscribe(T1, J1)
    outcome: list[BaseException] = []

    def blocked_accept() -> None:
        try:
            jobs.accept(T2)
        except BaseException as e:  # noqa: BLE001 - recorded for the test thread
            outcome.append(e)

    blocked = threading.Thread(target=blocked_accept, daemon=True)
    blocked.start()
    started = set(job_threads()) - before
    # Five roles (scanner, two activity monitors, type monitor, notifier) on one thread.
    assert len(started) == 1
    runners = [jobs.supervisor.scanner, *jobs.supervisor.runners()]
    assert len(runners) == 5 and all(r is not None and r.is_alive() for r in runners)
    jobs.close()
    blocked.join(5)
    assert not blocked.is_alive()
    assert isinstance(outcome[0], NotFound)
    assert not any(t.is_alive() for t in started)
    assert set(job_threads()) <= before


def test_layer_without_monitors_starts_no_threads_until_subscribed(make_jobs: Callable[..., Jobs]) -> None:
    before = set(job_threads())
    jobs = make_jobs(monitors=False)
    jobs.set_type_timeout(T1, 30)
    assert set(job_threads()) == before
    jobs.add(T1, J1, {})
    jobs.subscribe(T1, J1)
    assert len(set(job_threads()) - before) == 1  # the type monitor and the notifier, on one thread
    assert all(r.is_alive() for r in jobs.supervisor.notifiers[T1])
    jobs.close()
    assert set(job_threads()) == before


def test_type_monitor_holds_the_notifier_off_ten_passes_between_its_bounds(jobs: Jobs) -> None:
    from smoosh.jobs.notifier import HOLDOFF_PER_PASS, HOLDOFF_S, MIN_HOLDOFF_S

    jobs.add(T1, J1, {})
    jobs.subscribe(T1, J1)
    type_monitor = jobs.supervisor.notifiers[T1][0].role
    notifier = jobs.supervisor.notifiers[T1][1].role
    assert isinstance(type_monitor, TypeMonitor)
    # Wired to the type's own notifier: what its last pass took sets the hold-off.
    notifier.last_pass_s = 0.0
    assert type_monitor.holdoff() == MIN_HOLDOFF_S
    notifier.last_pass_s = 0.002
    assert type_monitor.holdoff() == pytest.approx(HOLDOFF_PER_PASS * 0.002)
    notifier.last_pass_s = 1.0
    assert type_monitor.holdoff() == HOLDOFF_S  # couch_jobs' 50 ms, at most
    # Without a notifier's cost, the fixed hold-off.
    fixed = TypeMonitor(jobs.store, jobs.keys, T2, lambda: None, holdoff_s=0.2)
    assert fixed.holdoff() == 0.2


def test_notifier_records_what_its_pass_took(jobs: Jobs) -> None:
    jobs.add(T1, J1, {})
    sub = jobs.subscribe(T1, J1)
    notifier = jobs.supervisor.notifier(T1)
    assert notifier is not None
    notifier.last_pass_s = -1.0
    jobs.accept(T1)
    assert sub.wait(timeout=EVENT_WAIT_S)[2] == "running"
    assert wait_until(lambda: notifier.last_pass_s >= 0.0)
