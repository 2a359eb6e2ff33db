"""The access table: the staleness throttle on the routing hot path, stepped with an injected clock."""

from __future__ import annotations

import random
import sys
import threading

import pytest

from smoosh.daemon.watch.staleness import CLEAN_INTERVAL_S, CLEAN_JITTER_S, AccessTable


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        return self.now


def test_key_is_fresh_within_staleness_and_stale_after() -> None:
    clock = Clock()
    table = AccessTable(300.0, clock=clock)
    table.record("/db/a.sqlite")
    clock.now += 299.9
    assert table.is_fresh("/db/a.sqlite")
    clock.now += 0.1
    assert not table.is_fresh("/db/a.sqlite")


def test_unknown_key_is_not_fresh() -> None:
    table = AccessTable(300.0, clock=Clock())
    assert not table.is_fresh("/db/never-accepted.sqlite")


def test_explicit_now_overrides_the_clock() -> None:
    clock = Clock(0.0)
    table = AccessTable(10.0, clock=clock)
    table.record("k", now=100.0)
    assert table.is_fresh("k", now=105.0)
    assert not table.is_fresh("k", now=110.0)


def test_record_refreshes_an_existing_key() -> None:
    clock = Clock()
    table = AccessTable(10.0, clock=clock)
    table.record("k")
    clock.now += 8
    table.record("k")
    clock.now += 8
    assert table.is_fresh("k")


def test_full_table_does_not_record_new_keys_but_updates_existing_ones() -> None:
    clock = Clock()
    table = AccessTable(10.0, max_size=2, clock=clock)
    assert table.record("a") and table.record("b")
    assert not table.record("c")
    assert not table.is_fresh("c")
    assert len(table) == 2
    clock.now += 9
    assert table.record("a")  # existing key: updated although the table is full
    clock.now += 5
    assert table.is_fresh("a")
    assert not table.is_fresh("b")


def test_clean_drops_only_expired_entries() -> None:
    clock = Clock()
    table = AccessTable(10.0, clock=clock)
    table.record("old")
    clock.now += 6
    table.record("new")
    clock.now += 4  # "old" is exactly 10 s old: expired; "new" is 4 s old
    assert table.clean() == 1
    assert len(table) == 1
    assert table.is_fresh("new")
    assert table.clean() == 0


def test_clean_frees_room_for_new_keys_in_a_full_table() -> None:
    clock = Clock()
    table = AccessTable(10.0, max_size=1, clock=clock)
    table.record("a")
    clock.now += 10
    table.clean()
    assert table.record("b")


def test_zero_staleness_means_never_fresh() -> None:
    clock = Clock()
    table = AccessTable(0.0, clock=clock)
    assert not table.record("k")
    assert not table.is_fresh("k")
    assert len(table) == 0


def test_setting_staleness_to_zero_empties_the_table() -> None:
    table = AccessTable(10.0, clock=Clock())
    table.record("k")
    table.set_staleness(0)
    assert not table.is_fresh("k")
    assert len(table) == 0


def test_set_staleness_applies_to_existing_entries() -> None:
    clock = Clock()
    table = AccessTable(10.0, clock=clock)
    table.record("k")
    clock.now += 20
    assert not table.is_fresh("k")
    table.set_staleness(60.0)
    assert table.is_fresh("k")


def test_negative_staleness_is_rejected() -> None:
    with pytest.raises(ValueError, match="staleness"):
        AccessTable(-1.0)
    with pytest.raises(ValueError, match="staleness"):
        AccessTable(1.0).set_staleness(-5)


def test_forget_makes_a_key_examined_again() -> None:
    table = AccessTable(10.0, clock=Clock())
    table.record("k")
    table.forget("k")
    table.forget("never-there")
    assert not table.is_fresh("k")


def test_cleaner_tick_cleans_only_when_its_jittered_interval_has_passed() -> None:
    clock = Clock(0.0)
    table = AccessTable(1.0, clock=clock, rng=random.Random(7))
    table.record("k", now=0.0)
    assert table.tick(0.0) == 0  # arms the cleaner
    assert table.tick(CLEAN_INTERVAL_S - 0.01) == 0  # never earlier than the base interval
    assert len(table) == 1
    assert table.tick(CLEAN_INTERVAL_S + CLEAN_JITTER_S) == 1  # never later than base + jitter
    table.record("k2", now=6.0)
    assert table.tick(6.5) == 0  # the next pass is again at least 3 s away


def test_concurrent_records_during_clean_never_raise() -> None:
    clock = Clock(0.0)
    table = AccessTable(1.0, clock=clock)
    for i in range(20_000):
        table.record(f"old{i}", now=0.0)
    errors: list[BaseException] = []
    stop = threading.Event()

    def writer() -> None:
        i = 0
        try:
            while not stop.is_set():
                table.record(f"new{i}", now=100.0)
                table.forget(f"new{i - 50}")
                i += 1
        except BaseException as e:  # pragma: no cover - the failure being tested for
            errors.append(e)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        dropped = sum(table.clean(now=100.5) for _ in range(20))
    finally:
        stop.set()
        thread.join()
    assert errors == []
    assert dropped >= 20_000
    assert not any(k.startswith("old") for k in list(table.accepted))


def test_is_fresh_does_no_io_and_reads_only_the_clock() -> None:
    """The hot path: no audited operation (open, os.*, socket, subprocess) and one clock read."""
    clock = Clock()
    table = AccessTable(300.0, clock=clock)
    table.record("/db/a.sqlite")
    table.record("/db/b.sqlite")
    audited: list[str] = []
    watching = threading.local()

    def hook(event: str, args: object) -> None:
        if getattr(watching, "on", False):
            audited.append(event)

    sys.addaudithook(hook)  # cannot be removed: it stays inert outside this thread-local window
    calls_before = clock.calls
    watching.on = True
    try:
        results = [table.is_fresh(k) for k in ("/db/a.sqlite", "/db/b.sqlite", "/db/c.sqlite")] * 1000
        results.append(table.is_fresh("/db/a.sqlite", now=clock.now))
    finally:
        watching.on = False
    assert audited == []
    assert results[:3] == [True, True, False]
    # One clock read per known key; none for unknown keys or when `now` is given.
    assert clock.calls - calls_before == 2


def test_cleaner_thread_starts_and_stops_promptly() -> None:
    table = AccessTable(10.0)
    table.start()
    table.start()  # idempotent
    thread = table._thread
    assert thread is not None and thread.is_alive()
    table.stop(timeout_s=2.0)
    assert not thread.is_alive()
