"""The upstream "batching" suite: cases 18, 20, 27-33 again, while every other batch of the
activity monitor fails with 2101 (transaction too large) and every other batch of the
notifier with 1007 (too old) or 1031 (timed out), with batch increment 1 and factor ~0 so
the batches collapse to one row. Everything must still work."""

from __future__ import annotations

import itertools
import threading
from typing import Any, Callable, Iterator

import pytest

from jobs_testlib import load_cases

from smoosh.jobs import BatchPolicy, Jobs
from smoosh.jobs.monitor import ActivityMonitor
from smoosh.jobs.notifier import Notifier
from smoosh.store.errors import TRANSACTION_TIMED_OUT, TRANSACTION_TOO_LARGE, TRANSACTION_TOO_OLD, StoreError
from helpers.daemon import HANG_S

api_cases = load_cases("test_api")
monitor_cases = load_cases("test_monitor")
subscription_cases = load_cases("test_subscriptions")

#: couch_jobs' batching-suite settings: grow by 1, shrink to (almost) nothing.
FAILING_BATCH = BatchPolicy(initial=1000, increment=1, factor=0.0001)


def every_other_call_fails(original: Callable[..., Any], codes: list[int]) -> Callable[..., Any]:
    calls = itertools.count()
    codes_cycle = itertools.cycle(codes)
    lock = threading.Lock()

    def patched(*args: Any, **kwargs: Any) -> Any:
        with lock:
            n = next(calls)
            code = next(codes_cycle) if n % 2 == 0 else None
        if code is not None:
            raise StoreError(code)
        return original(*args, **kwargs)

    return patched


@pytest.fixture(autouse=True)
def failing_batches(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(
        ActivityMonitor, "_reenqueue_batch", every_other_call_fails(ActivityMonitor._reenqueue_batch, [TRANSACTION_TOO_LARGE])
    )
    monkeypatch.setattr(
        Notifier, "_read_batch", every_other_call_fails(Notifier._read_batch, [TRANSACTION_TOO_OLD, TRANSACTION_TIMED_OUT])
    )
    yield


@pytest.fixture
def make_jobs(make_jobs: Callable[..., Jobs]) -> Callable[..., Jobs]:
    """Layers with couch_jobs' batching-suite batch settings (overrides conftest's factory)."""

    def make(**kwargs: Any) -> Jobs:
        kwargs.setdefault("batch", FAILING_BATCH)
        return make_jobs(**kwargs)

    return make


def test_accept_blocking(jobs: Jobs) -> None:
    api_cases.test_accept_blocks_until_a_job_is_added(jobs)


def test_resubmit_enqueues_job(jobs: Jobs) -> None:
    api_cases.test_resubmit_while_running_requeues_on_finish(jobs)


def test_accept_max_schedtime(jobs: Jobs) -> None:
    api_cases.test_accept_takes_only_jobs_up_to_max_sched_time(jobs)


def test_accept_no_schedule(jobs: Jobs) -> None:
    api_cases.test_accept_no_schedule_takes_every_random_id_job(jobs)


def test_subscribe(jobs: Jobs) -> None:
    subscription_cases.test_subscribe_follows_a_job_from_pending_to_finished(jobs)


def test_remove_when_subscribed_and_pending(jobs: Jobs) -> None:
    subscription_cases.test_removing_pending_job_emits_not_found_once(jobs)


def test_remove_when_subscribed_and_running(jobs: Jobs) -> None:
    subscription_cases.test_removing_running_job_emits_not_found_once(jobs)


def test_subscribe_wait_multiple(jobs: Jobs) -> None:
    subscription_cases.test_wait_any_over_several_subscriptions(jobs)


def test_enqueue_inactive(make_jobs: Callable[..., Jobs]) -> None:
    monitor_cases.test_inactive_job_is_requeued_by_background_monitor(make_jobs)


def test_enqueue_inactive_stepped_many_jobs(make_jobs: Callable[..., Jobs]) -> None:
    """Many silent jobs, stepped: batches collapse to 1 and grow by 1, and every job requeues."""
    from helpers.clocks import FakeClock
    from jobs_testlib import T1

    clock = FakeClock(1_000_000.0)
    jobs = make_jobs(clock=clock, monitors=False)
    jobs.set_type_timeout(T1, 10)
    for i in range(15):
        jobs.add(T1, f"j{i:02}", {})
        jobs.accept(T1)
    monitor = monitor_cases.make_monitor(jobs, clock, batch=FAILING_BATCH)
    monitor_cases.step_through(monitor, clock, 2)
    assert jobs.pending_count(T1) == 15
    assert monitor.batch_size < 10


def test_notifier_delivers_to_many_subscribers(jobs: Jobs) -> None:
    """Many subscriptions, read one row per batch at first: every subscriber hears its job."""
    from jobs_testlib import T1

    subs = []
    for i in range(12):
        jobs.add(T1, f"j{i:02}", {})
        subs.append(jobs.subscribe(T1, f"j{i:02}"))
    for _ in range(12):
        jobs.accept(T1)
    for sub in subs:
        assert sub.wait(timeout=HANG_S) == (T1, sub.id, "running", {})
