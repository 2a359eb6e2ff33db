"""Subscriptions (upstream cases 29-32) and the quirks of the original we fix."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from jobs_testlib import J1, J2, T1

from smoosh.jobs import Jobs, NotFound
from helpers.daemon import HANG_S, wait_for

#: Generous wait for an event that must come (the notifier is a thread).
EVENT_WAIT_S = HANG_S  # a ceiling on a hang, never a measure of speed
#: Short wait for an event that must not come.
NO_EVENT_WAIT_S = 0.15


# 29. subscribe
def test_subscribe_follows_a_job_from_pending_to_finished(jobs: Jobs) -> None:
    jobs.add(T1, J1, {"z": 1})
    with pytest.raises(NotFound):
        jobs.subscribe("xyz", J1)
    with pytest.raises(NotFound):
        jobs.subscribe(T1, "j5")

    first = jobs.subscribe(T1, J1)
    assert (first.state, first.data) == ("pending", {"z": 1})
    second = jobs.subscribe(T1, J1)  # subscribing twice is fine; each gets its own events
    assert (second.state, second.data) == ("pending", {"z": 1})
    first.close()
    second.close()

    sub = jobs.subscribe(T1, J1)
    job, _ = jobs.accept(T1)
    assert sub.wait(timeout=EVENT_WAIT_S) == (T1, J1, "running", {"z": 1})
    assert sub.state == "running"

    # A running subscriber hears every update, even without a state change.
    jobs.update(job, {"z": 2})
    assert sub.wait(timeout=EVENT_WAIT_S) == (T1, J1, "running", {"z": 2})

    jobs.finish(job, {"z": 3})
    assert sub.wait("finished", timeout=EVENT_WAIT_S) == (T1, J1, "finished", {"z": 3})
    assert sub.wait(timeout=NO_EVENT_WAIT_S) is None  # finished ends the subscription

    done = jobs.subscribe(T1, J1)
    assert (done.state, done.data) == ("finished", {"z": 3})
    assert done.wait(timeout=NO_EVENT_WAIT_S) is None

    jobs.remove(T1, J1)
    with pytest.raises(NotFound):
        jobs.subscribe(T1, J1)


# 30. remove_when_subscribed_and_pending
def test_removing_pending_job_emits_not_found_once(jobs: Jobs) -> None:
    jobs.add(T1, J1, {"z": 1})
    sub = jobs.subscribe(T1, J1)
    jobs.remove(T1, J1)
    assert sub.wait(timeout=EVENT_WAIT_S) == (T1, J1, "not_found", None)
    assert sub.wait(timeout=NO_EVENT_WAIT_S) is None


# 31. remove_when_subscribed_and_running
def test_removing_running_job_emits_not_found_once(jobs: Jobs) -> None:
    jobs.add(T1, J1, {"z": 2})
    jobs.accept(T1)
    sub = jobs.subscribe(T1, J1)
    assert sub.state == "running"
    jobs.remove(T1, J1)
    assert sub.wait(timeout=EVENT_WAIT_S) == (T1, J1, "not_found", None)
    assert sub.wait(timeout=NO_EVENT_WAIT_S) is None


# 32. subscribe_wait_multiple
def test_wait_any_over_several_subscriptions(jobs: Jobs) -> None:
    jobs.add(T1, J1, {})
    jobs.add(T1, J2, {})
    s1 = jobs.subscribe(T1, J1)
    s2 = jobs.subscribe(T1, J2)
    subs = [s1, s2]

    job_a, _ = jobs.accept(T1)
    assert jobs.wait_any(subs, timeout=EVENT_WAIT_S)[2] == "running"
    assert jobs.wait_any(subs, timeout=NO_EVENT_WAIT_S) is None

    job_b, _ = jobs.accept(T1)
    assert jobs.wait_any(subs, timeout=EVENT_WAIT_S)[2] == "running"
    assert jobs.wait_any(subs, timeout=NO_EVENT_WAIT_S) is None

    jobs.update(job_a, {"q": 5})
    jobs.update(job_b, {"r": 6})
    seen = {jobs.wait_any(subs, timeout=EVENT_WAIT_S)[1] for _ in range(2)}
    assert seen == {J1, J2}

    jobs.finish(job_a)
    event = jobs.wait_any(subs, "finished", timeout=EVENT_WAIT_S)
    assert event is not None and (event[1], event[2], event[3]) == (job_a.id, "finished", {"q": 5})
    assert jobs.wait_any(subs, "finished", timeout=NO_EVENT_WAIT_S) is None

    # Finish the other job, but unsubscribe first: nothing may arrive.
    s1.close()
    s2.close()
    jobs.finish(job_b)
    assert jobs.wait_any(subs, "finished", timeout=NO_EVENT_WAIT_S) is None


# Quirk fix: unsubscribe really discards queued events (upstream's flush never matched).
def test_close_discards_queued_and_later_events(jobs: Jobs) -> None:
    jobs.add(T1, J1, {})
    sub = jobs.subscribe(T1, J1)
    job, _ = jobs.accept(T1)
    # Let the running event arrive in the queue, unread.
    probe = jobs.subscribe(T1, J1)
    jobs.update(job)
    assert probe.wait(timeout=EVENT_WAIT_S) is not None
    # Each subscription hears the store on its own: the probe's event says nothing of when the
    # other's is queued.
    wait_for(lambda: sub._events, EVENT_WAIT_S, what="the running event queued, unread")
    sub.close()
    assert sub.closed
    jobs.finish(job)
    assert probe.wait("finished", timeout=EVENT_WAIT_S) is not None
    assert sub.wait(timeout=NO_EVENT_WAIT_S) is None
    assert not sub._events


# Quirk fix: waiting on several subscriptions for one state keeps the state filter.
def test_wait_any_with_state_skips_other_states(jobs: Jobs) -> None:
    jobs.add(T1, J1, {})
    jobs.add(T1, J2, {})
    subs = [jobs.subscribe(T1, J1), jobs.subscribe(T1, J2)]
    job_a, _ = jobs.accept(T1)
    job_b, _ = jobs.accept(T1)
    jobs.update(job_a)
    jobs.finish(job_b)
    event = jobs.wait_any(subs, "finished", timeout=EVENT_WAIT_S)
    assert event is not None and (event[1], event[2]) == (job_b.id, "finished")
    # Only running events remain for job_a; with the filter they are never returned.
    assert jobs.wait_any(subs, "finished", timeout=NO_EVENT_WAIT_S) is None


def test_subscriber_hears_requeue_of_inactive_job_as_pending(make_jobs: Callable[..., Jobs]) -> None:
    jobs = make_jobs(monitors=False)
    jobs.set_type_timeout(T1, 30)
    jobs.add(T1, J1, {"y": 1})
    job, _ = jobs.accept(T1)
    sub = jobs.subscribe(T1, J1)
    jobs.resubmit(job)  # flagged: finish puts it back to pending
    jobs.finish(job)
    assert sub.wait(timeout=EVENT_WAIT_S) == (T1, J1, "pending", {"y": 1})


def test_event_between_subscribe_read_and_registration_is_not_missed(jobs: Jobs, monkeypatch: pytest.MonkeyPatch) -> None:
    """subscribe reads the job, then registers; a change in between still produces an event."""
    from smoosh.jobs.notifier import Notifier

    jobs.add(T1, J1, {})
    original = Notifier.register

    def register_late(self: Notifier, sub: Any, state: str, seq: Any) -> None:
        jobs.accept(T1)  # the job starts running after subscribe read it as pending
        original(self, sub, state, seq)

    monkeypatch.setattr(Notifier, "register", register_late)
    sub = jobs.subscribe(T1, J1)
    assert sub.state == "pending"
    assert sub.wait(timeout=EVENT_WAIT_S) == (T1, J1, "running", {})


def test_subscriptions_of_a_closed_layer_return_none(make_jobs: Callable[..., Jobs]) -> None:
    jobs = make_jobs()
    jobs.set_type_timeout(T1, 30)
    jobs.add(T1, J1, {})
    sub = jobs.subscribe(T1, J1)
    jobs.close()
    assert sub.wait(timeout=EVENT_WAIT_S) is None


def test_dropped_subscription_is_forgotten_by_the_notifier(jobs: Jobs) -> None:
    import gc

    jobs.add(T1, J1, {})
    sub = jobs.subscribe(T1, J1)
    notifier = jobs.supervisor.notifiers[T1][1].role
    assert notifier.subscription_count() == 1
    del sub
    gc.collect()
    notifier.notify_subscribers()
    assert notifier.subscription_count() == 0


def test_a_run_finished_and_removed_at_once_is_heard_as_not_found(jobs: Jobs) -> None:
    job = jobs.add_claimed(T1, J1, {"z": 1})
    sub = jobs.subscribe(T1, J1)
    assert sub.state == "running"
    jobs.finish_and_remove(job)
    assert sub.wait(timeout=EVENT_WAIT_S) == (T1, J1, "not_found", None)
    assert sub.wait(timeout=NO_EVENT_WAIT_S) is None
