"""The debouncer, stepped: quiet periods, bursts, and the recheck hold for keys no channel took."""

from __future__ import annotations

import threading

import pytest

from smoosh.daemon.watch.debounce import Debouncer
from smoosh.daemon.watch.watcher import Debouncer as ReexportedDebouncer

K = "/db/a.sqlite"


def test_watcher_module_reexports_the_debouncer() -> None:
    assert ReexportedDebouncer is Debouncer


def test_key_is_due_only_after_the_quiet_period() -> None:
    d = Debouncer(quiet_s=1.0, recheck_interval_s=10.0)
    d.event(K, 0.0)
    assert d.due(0.5) == []
    assert d.due(1.0) == [K]


def test_a_burst_of_events_gives_one_due_after_the_last_event() -> None:
    d = Debouncer(quiet_s=1.0, recheck_interval_s=10.0)
    for t in (0.0, 0.3, 0.6, 0.9):
        d.event(K, t)
    assert d.due(1.5) == []  # 0.6 s after the last event
    assert d.due(1.9 + 1e-9) == [K]
    assert d.due(5.0) == []  # once per burst


def test_due_keys_come_out_oldest_first() -> None:
    d = Debouncer(quiet_s=1.0)
    d.event("a", 0.0)
    d.event("b", 0.1)
    d.event("a", 0.2)  # a's burst now ends after b's
    assert d.due(2.0) == ["b", "a"]


def test_a_taken_key_is_forgotten_and_a_new_burst_is_due_again() -> None:
    d = Debouncer(quiet_s=1.0, recheck_interval_s=10.0)
    d.event(K, 0.0)
    assert d.due(1.0) == [K]
    d.result(K, True, 1.1)
    assert len(d) == 0
    d.event(K, 2.0)
    assert d.due(3.0) == [K]


def test_a_held_key_suppresses_events_then_gets_exactly_one_more_look() -> None:
    d = Debouncer(quiet_s=1.0, recheck_interval_s=10.0)
    d.event(K, 0.0)
    assert d.due(1.0) == [K]
    d.result(K, False, 1.0)  # hold until 11.0
    for t in (2.0, 3.0, 5.0, 9.5):
        d.event(K, t)
    assert d.due(10.9) == []
    assert d.due(11.0) == [K]
    assert d.due(20.0) == []  # exactly one more look, however many events were suppressed


def test_a_hold_without_events_expires_silently_and_drops_the_key() -> None:
    d = Debouncer(quiet_s=1.0, recheck_interval_s=10.0)
    d.event(K, 0.0)
    assert d.due(1.0) == [K]
    d.result(K, False, 1.0)
    assert d.counts() == {"pending": 0, "in_flight": 0, "held": 1}
    assert d.due(11.0) == []
    assert len(d) == 0


def test_the_look_after_a_hold_can_be_held_again_and_then_expires() -> None:
    d = Debouncer(quiet_s=1.0, recheck_interval_s=10.0)
    d.event(K, 0.0)
    d.due(1.0)
    d.result(K, False, 1.0)
    d.event(K, 4.0)
    assert d.due(11.0) == [K]
    d.result(K, False, 11.0)
    assert d.due(21.0) == []
    assert len(d) == 0


def test_events_while_a_key_is_examined_cause_one_more_look_if_it_was_not_taken() -> None:
    d = Debouncer(quiet_s=1.0, recheck_interval_s=10.0)
    d.event(K, 0.0)
    assert d.due(1.0) == [K]
    d.event(K, 1.2)  # the examination may have read the file before this write
    assert d.due(3.0) == []  # in flight: not handed out twice
    d.result(K, False, 1.5)
    assert d.due(11.4) == []
    assert d.due(11.5) == [K]


def test_events_while_a_key_is_examined_are_dropped_if_it_was_taken() -> None:
    d = Debouncer(quiet_s=1.0, recheck_interval_s=10.0)
    d.event(K, 0.0)
    d.due(1.0)
    d.event(K, 1.2)
    d.result(K, True, 1.5)
    assert d.due(30.0) == []
    assert len(d) == 0


def test_a_key_whose_result_never_comes_is_released() -> None:
    d = Debouncer(quiet_s=1.0, recheck_interval_s=10.0, in_flight_timeout_s=60.0)
    d.event(K, 0.0)
    assert d.due(1.0) == [K]
    d.event(K, 2.0)  # suppressed while in flight
    assert d.due(60.9) == []
    assert d.due(61.0) == []  # released ...
    assert len(d) == 0
    d.event(K, 62.0)  # ... so new events are examined again
    assert d.due(63.0) == [K]


def test_zero_recheck_interval_releases_the_key_at_the_next_due() -> None:
    d = Debouncer(quiet_s=0.0, recheck_interval_s=0.0)
    d.event(K, 0.0)
    assert d.due(0.0) == [K]
    d.result(K, False, 0.0)
    d.event(K, 0.0)
    assert d.due(0.0) == [K]


def test_idle_keys_do_not_accumulate() -> None:
    d = Debouncer(quiet_s=1.0, recheck_interval_s=10.0)
    for i in range(1000):
        d.event(f"/db/{i}", 0.0)
    due = d.due(1.0)
    assert len(due) == 1000
    for i, key in enumerate(due):
        d.result(key, i % 2 == 0, 1.0)
    assert d.due(11.0) == []
    assert len(d) == 0


def test_set_recheck_interval_applies_to_new_holds() -> None:
    d = Debouncer(quiet_s=1.0, recheck_interval_s=10.0)
    d.set_recheck_interval(2.0)
    d.event(K, 0.0)
    d.due(1.0)
    d.result(K, False, 1.0)
    d.event(K, 2.0)
    assert d.due(3.0) == [K]
    with pytest.raises(ValueError):
        d.set_recheck_interval(-1)


def test_negative_intervals_are_rejected() -> None:
    with pytest.raises(ValueError, match="quiet_s"):
        Debouncer(quiet_s=-1)
    with pytest.raises(ValueError, match="recheck_interval_s"):
        Debouncer(recheck_interval_s=-1)


def test_events_from_many_threads_each_key_due_once() -> None:
    d = Debouncer(quiet_s=1.0, recheck_interval_s=10.0)

    def produce(offset: int) -> None:
        for i in range(2000):
            d.event(f"/db/{(i + offset) % 500}", 0.0)

    threads = [threading.Thread(target=produce, args=(n * 7,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    due = d.due(1.0)
    assert sorted(due) == sorted(f"/db/{i}" for i in range(500))


def test_a_key_written_without_pause_is_due_at_the_latest_max_wait_after_its_first_event() -> None:
    d = Debouncer(quiet_s=1.0, recheck_interval_s=10.0)
    t = 0.0
    assert d.event("/db/busy.db", t) is True  # a new burst: an owner sleeping on next_due wakes
    assert d.next_due() == 1.0
    while t < 9.995:
        t = round(t + 0.005, 3)  # a commit every 5 ms: never 1 s of quiet
        assert d.event("/db/busy.db", t) is False
        assert d.due(t) == []
    assert d.next_due() == 10.0
    assert d.due(10.0) == ["/db/busy.db"]


def test_the_longest_wait_follows_recheck_interval_live() -> None:
    d = Debouncer(quiet_s=1.0, recheck_interval_s=10.0)
    d.set_recheck_interval(3.0)
    for t in (0.0, 0.5, 1.0, 1.5, 2.0, 2.5):
        d.event("/db/a.db", t)
    assert d.due(2.9) == []
    assert d.due(3.0) == ["/db/a.db"]


def test_next_due_is_none_when_nothing_waits_and_is_busy_names_keys_with_events() -> None:
    d = Debouncer(quiet_s=1.0, recheck_interval_s=10.0)
    assert d.next_due() is None
    d.event("/db/a.db", 0.0)
    assert d.is_busy("/db/a.db") and not d.is_busy("/db/b.db")
    assert d.due(1.0) == ["/db/a.db"]
    assert d.is_busy("/db/a.db")  # in flight: its examination has not answered yet
    assert d.result("/db/a.db", False, 1.0) is True  # now held: next_due moves to the hold's end
    assert not d.is_busy("/db/a.db")
    assert d.next_due() == 11.0
