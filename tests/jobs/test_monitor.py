"""The activity monitor: silent workers' jobs go back to pending (upstream case 33, stepped)."""

from __future__ import annotations

import random
from typing import Any, Callable

import pytest
from fdb.tuple import Versionstamp

from helpers.clocks import FakeClock
from jobs_testlib import J1, J2, T1

from smoosh.jobs import BatchPolicy, JobHalted, Jobs
from smoosh.jobs.monitor import MISSING_TIMEOUT_CHECK_S, ActivityMonitor

TIMEOUT_S = 10


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_000_000.0)


@pytest.fixture
def quiet_jobs(make_jobs: Callable[..., Jobs], clock: FakeClock) -> Jobs:
    """A layer without background monitors: the tests step their own."""
    jobs = make_jobs(clock=clock, monitors=False)
    jobs.set_type_timeout(T1, TIMEOUT_S)
    return jobs


def make_monitor(jobs: Jobs, clock: FakeClock, **kwargs: Any) -> ActivityMonitor:
    kwargs.setdefault("rng", random.Random(1))
    return ActivityMonitor(jobs.store, jobs.keys, T1, clock=clock, **kwargs)


def step_through(monitor: ActivityMonitor, clock: FakeClock, checks: int) -> None:
    """Advance the clock to each due time and tick, ``checks`` times."""
    due = monitor.tick(clock.now)
    for _ in range(checks):
        clock.now = due
        due = monitor.tick(clock.now)


def test_first_tick_schedules_within_timeout_plus_jitter(quiet_jobs: Jobs, clock: FakeClock) -> None:
    for seed in range(20):
        monitor = make_monitor(quiet_jobs, clock, rng=random.Random(seed))
        due = monitor.tick(clock.now)
        assert clock.now + TIMEOUT_S <= due <= clock.now + TIMEOUT_S + min(TIMEOUT_S / 2, 10)
        assert monitor.tick(due - 0.001) == due  # nothing happens before it is due


def test_jitter_is_capped_at_ten_seconds(quiet_jobs: Jobs, clock: FakeClock) -> None:
    quiet_jobs.set_type_timeout(T1, 100)
    dues = [make_monitor(quiet_jobs, clock, rng=random.Random(s)).tick(clock.now) - clock.now for s in range(50)]
    assert all(100 <= d <= 110 for d in dues)


def test_silent_job_goes_back_to_pending_after_baseline_and_check(quiet_jobs: Jobs, clock: FakeClock) -> None:
    jobs = quiet_jobs
    jobs.add(T1, J1, {"y": 1})
    job, _ = jobs.accept(T1)
    monitor = make_monitor(jobs, clock)
    step_through(monitor, clock, 1)  # first check only takes the baseline
    assert jobs.get_job_state(T1, J1) == "running"
    step_through(monitor, clock, 1)  # second check: the job was silent since the baseline
    info = jobs.get_job(T1, J1)
    assert (info.state, info.data) == ("pending", {"y": 1})
    assert jobs.get_active_job_ids(T1) == []
    assert monitor.reenqueued == 1
    # After the job was re-enqueued, the old worker cannot touch it any more.
    with pytest.raises(JobHalted):
        jobs.update(job)
    with pytest.raises(JobHalted):
        jobs.finish(job)


def test_job_that_heartbeats_keeps_running(quiet_jobs: Jobs, clock: FakeClock) -> None:
    jobs = quiet_jobs
    jobs.add(T1, J1, {})
    job, _ = jobs.accept(T1)
    monitor = make_monitor(jobs, clock)
    due = monitor.tick(clock.now)
    for _ in range(4):
        job = jobs.update(job)  # a heartbeat every period
        clock.now = due
        due = monitor.tick(clock.now)
    assert jobs.get_job_state(T1, J1) == "running"
    jobs.finish(job)


def test_job_stamped_in_the_baselines_own_commit_is_not_missed(quiet_jobs: Jobs, clock: FakeClock) -> None:
    """The baseline compares on the 10-byte commit stamp: entries of its own commit count as old."""
    jobs = quiet_jobs
    jobs.add(T1, J1, {})
    jobs.add(T1, J2, {})
    job_a, _ = jobs.accept(T1)
    job_b, _ = jobs.accept(T1)
    jobs.transact(lambda tr: (jobs.update(job_a, tx=tr), jobs.update(job_b, tx=tr)))
    monitor = make_monitor(jobs, clock)
    step_through(monitor, clock, 1)
    baseline = monitor.baseline
    begin, end = jobs.keys.activity_range(T1)
    stamps = [jobs.keys.unpack(k)[2] for k, _ in jobs.store.transact(lambda tr: tr.get_range(begin, end))]
    # One entry was stamped by the baseline's commit with a user version above the baseline's.
    assert any(s.tr_version == baseline.tr_version and s.user_version > baseline.user_version for s in stamps)
    step_through(monitor, clock, 1)
    assert jobs.get_job_state(T1, J1) == "pending"
    assert jobs.get_job_state(T1, J2) == "pending"


# Quirk fix: 96-bit stamps with per-transaction user versions: two jobs of one type updated in
# one transaction get distinct activity keys (upstream's second overwrote the first, and the
# first job then never timed out).
def test_two_jobs_updated_in_one_transaction_get_distinct_activity_keys(quiet_jobs: Jobs, clock: FakeClock) -> None:
    jobs = quiet_jobs
    jobs.add(T1, J1, {})
    jobs.add(T1, J2, {})
    job_a, _ = jobs.accept(T1)
    job_b, _ = jobs.accept(T1)
    jobs.transact(lambda tr: (jobs.update(job_a, tx=tr), jobs.update(job_b, tx=tr)))
    begin, end = jobs.keys.activity_range(T1)
    keys = [k for k, _ in jobs.store.transact(lambda tr: tr.get_range(begin, end))]
    assert len(keys) == 2
    stamps = [jobs.keys.unpack(k)[2] for k in keys]
    assert all(isinstance(s, Versionstamp) for s in stamps)
    assert stamps[0].tr_version == stamps[1].tr_version  # one commit ...
    assert stamps[0].user_version != stamps[1].user_version  # ... two user versions
    assert sorted(jobs.get_active_job_ids(T1)) == [J1, J2]
    # Both time out.
    monitor = make_monitor(jobs, clock)
    step_through(monitor, clock, 2)
    assert jobs.get_job_state(T1, J1) == "pending"
    assert jobs.get_job_state(T1, J2) == "pending"


def test_reenqueue_runs_in_growing_batches(quiet_jobs: Jobs, clock: FakeClock) -> None:
    jobs = quiet_jobs
    for i in range(12):
        jobs.add(T1, f"j{i:02}", {})
        jobs.accept(T1)
    monitor = make_monitor(jobs, clock, batch=BatchPolicy(initial=2, increment=1, factor=0.5))
    calls: list[int] = []
    original = monitor._reenqueue_batch

    def counting(tr: Any, baseline: Any, limit: int) -> int:
        calls.append(limit)
        return original(tr, baseline, limit)

    monitor._reenqueue_batch = counting  # type: ignore[method-assign]
    step_through(monitor, clock, 2)
    assert jobs.pending_count(T1) == 12
    assert calls[:3] == [2, 3, 4]  # additive increase after each full batch
    assert monitor.reenqueued == 12


def test_too_large_batch_shrinks_and_all_jobs_still_requeue(quiet_jobs: Jobs, clock: FakeClock) -> None:
    from smoosh.store.errors import TRANSACTION_TOO_LARGE, StoreError

    jobs = quiet_jobs
    for i in range(6):
        jobs.add(T1, f"j{i}", {})
        jobs.accept(T1)
    monitor = make_monitor(jobs, clock, batch=BatchPolicy(initial=8, increment=0, factor=0.5))
    original = monitor._reenqueue_batch

    def refuse_big(tr: Any, baseline: Any, limit: int) -> int:
        if limit > 2:
            raise StoreError(TRANSACTION_TOO_LARGE)
        return original(tr, baseline, limit)

    monitor._reenqueue_batch = refuse_big  # type: ignore[method-assign]
    step_through(monitor, clock, 2)
    assert monitor.batch_size == 2  # 8 -> 4 -> 2 (multiplicative decrease)
    assert jobs.pending_count(T1) == 6


def test_changed_timeout_resets_baseline(quiet_jobs: Jobs, clock: FakeClock) -> None:
    jobs = quiet_jobs
    jobs.add(T1, J1, {})
    jobs.accept(T1)
    monitor = make_monitor(jobs, clock)
    step_through(monitor, clock, 1)  # baseline taken
    jobs.set_type_timeout(T1, 20)
    step_through(monitor, clock, 1)  # this check re-enqueues; the new timeout then resets the baseline
    assert jobs.get_job_state(T1, J1) == "pending"
    jobs.accept(T1)
    step_through(monitor, clock, 1)  # first check under the new timeout: baseline only
    assert jobs.get_job_state(T1, J1) == "running"
    step_through(monitor, clock, 1)
    assert jobs.get_job_state(T1, J1) == "pending"


def test_type_without_timeout_is_rechecked_every_five_seconds(quiet_jobs: Jobs, clock: FakeClock) -> None:
    quiet_jobs.clear_type_timeout(T1)
    monitor = make_monitor(quiet_jobs, clock)
    assert monitor.tick(clock.now) == clock.now + MISSING_TIMEOUT_CHECK_S


# 33. enqueue_inactive, in real time, through the layer's own monitor thread.
def test_inactive_job_is_requeued_by_background_monitor(make_jobs: Callable[..., Jobs]) -> None:
    # Short: the monitor's period is the timeout (checked twice: a baseline, then the check).
    jobs = make_jobs(max_jitter_s=0.05)
    timeout_s = 0.5
    jobs.set_type_timeout("short", timeout_s)
    jobs.add("short", J1, {"y": 1})
    job, _ = jobs.accept("short")
    sub = jobs.subscribe("short", J1)
    assert sub.state == "running"
    event = sub.wait("pending", timeout=3 * timeout_s + 1)
    assert event == ("short", J1, "pending", {"y": 1})
    assert jobs.get_job_state("short", J1) == "pending"
    with pytest.raises(JobHalted):
        jobs.update(job)
    with pytest.raises(JobHalted):
        jobs.finish(job)


DAY_S = 86_400.0


@pytest.mark.parametrize("step_s", [-DAY_S, DAY_S], ids=["back", "forward"])
def test_a_step_of_the_wall_clock_neither_delays_nor_hastens_the_next_check(
    quiet_jobs: Jobs, clock: FakeClock, step_s: float,
) -> None:
    # Given a monitor stepped as its runner steps it (step(): on the real monotonic clock),
    # its first check scheduled a timeout (and jitter) away; the checks it makes are counted
    monitor = make_monitor(quiet_jobs, clock)
    checks: list[int] = []
    check_activity = monitor.check_activity
    monitor.check_activity = lambda: checks.append(1) or check_activity()  # type: ignore[method-assign]
    wait_s = monitor.step()
    assert TIMEOUT_S <= wait_s <= TIMEOUT_S * 1.5
    # When the wall clock steps a day
    clock.now += step_s
    # Then the check is still as far away as it was: not a day later, and not at once (an
    # early check would take a live worker that has not updated since the baseline for dead)
    again_s = monitor.step()
    assert checks == []
    assert 0 < again_s <= wait_s
