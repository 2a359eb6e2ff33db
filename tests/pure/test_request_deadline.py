"""A request's admission is bounded in time (issue 45): the deadline asked before each key, stepped
with an injected clock; the keys it leaves are named, never silently dropped."""

from __future__ import annotations

from helpers.clocks import FakeClock
from smoosh.daemon.intake.admission import NOT_EXAMINED, YIELD_EVERY_KEYS, RequestDeadline
from smoosh.daemon.intake.verdicts import NOT_QUEUED, QUEUED, REJECTED, STILL_EXAMINING, Verdict, Waiter, enqueue_and_wait
from smoosh.errors import InvalidKey


def test_the_deadline_admits_keys_until_its_time_is_spent_and_says_where_it_cut() -> None:
    # Given a deadline of 5 s, and keys that cost 1 s each
    clock = FakeClock()
    deadline = RequestDeadline(5.0, clock=clock, yield_=lambda: None)
    admitted = []
    for i in range(8):
        if not deadline.next_key():
            break
        admitted.append(i)
        clock.advance(1.0)
    # Then five keys are admitted, the sixth is where it cut, and it stays cut
    assert admitted == [0, 1, 2, 3, 4]
    assert deadline.cut_at == 5
    clock.set(deadline.started)  # even were time to run back
    assert not deadline.next_key() and deadline.cut_at == 5
    assert deadline.elapsed_s == 0.0


def test_the_first_key_of_a_request_is_always_admitted() -> None:
    clock = FakeClock()
    deadline = RequestDeadline(0.0, clock=clock, yield_=lambda: None)
    assert deadline.next_key()
    assert not deadline.next_key() and deadline.cut_at == 1


def test_the_admission_hands_the_gil_over_every_few_keys() -> None:
    yields = []
    deadline = RequestDeadline(5.0, clock=FakeClock(), yield_=lambda: yields.append(1))
    for _ in range(YIELD_EVERY_KEYS * 3 + 1):
        assert deadline.next_key()
    assert len(yields) == 3


def test_a_waited_request_names_every_key_its_deadline_left_and_enqueues_none_of_them() -> None:
    # Given keys that cost 2 s each to admit, a deadline of 5 s, and one key that is rejected
    clock = FakeClock()
    deadline = RequestDeadline(5.0, clock=clock, yield_=lambda: None)
    enqueued = []

    def enqueue(key: str, waiter: Waiter) -> None:
        clock.advance(2.0)
        enqueued.append(key)
        if key == "/b":
            raise InvalidKey(key, "outside roots (/srv)")
        waiter.resolve(Verdict(key, QUEUED, channel="ratio_dbs", priority=3.0))

    # When a request of five keys is admitted and waited for
    verdicts = enqueue_and_wait(enqueue, ["/a", "/b", "/c", "/d", "/e"], monotonic=clock, deadline=deadline)
    # Then the keys admitted in time have their verdicts, the rest are not examined, by name
    assert enqueued == ["/a", "/b", "/c"]
    assert verdicts == [
        Verdict("/a", QUEUED, channel="ratio_dbs", priority=3.0),
        Verdict("/b", REJECTED, reason="outside roots (/srv)"),
        Verdict("/c", QUEUED, channel="ratio_dbs", priority=3.0),
        Verdict("/d", NOT_QUEUED, reason=NOT_EXAMINED),
        Verdict("/e", NOT_QUEUED, reason=NOT_EXAMINED),
    ]
    assert deadline.cut_at == 3


def test_the_wait_for_verdicts_counts_from_the_request_not_from_the_end_of_its_admission() -> None:
    # Given an admission that took longer than the whole wait (11 s of a 10 s wait)
    clock = FakeClock()

    def enqueue(key: str, waiter: Waiter) -> None:
        clock.advance(11.0)  # examined elsewhere; its verdict never comes

    # When the verdicts are collected, Then the unanswered key is "still examining" at once
    # (were the wait counted from the admission's end, it would wait 10 s more)
    assert enqueue_and_wait(enqueue, ["/a"], 10.0, monotonic=clock) == [
        Verdict("/a", NOT_QUEUED, reason=STILL_EXAMINING)]
