"""The memory store beyond the contract: multi-version reads and pruning of old history."""

from __future__ import annotations

import pytest

from smoosh.store import open_store
from smoosh.store.errors import StoreError
from smoosh.store.memory import MemoryStore
from helpers.clocks import FakeClock


def test_open_store_memory_url_gives_an_empty_store():
    with open_store("memory:") as s:
        assert s.url == "memory:"
        assert s.create_transaction().get_range(b"", b"\xff") == []


def test_old_reader_keeps_its_versions_across_many_commits():
    s = MemoryStore()
    s.transact(lambda tr: tr.set(b"a", b"0"))
    tr = s.create_transaction()
    assert tr.get(b"a") == b"0"
    for i in range(1, 20):
        s.transact(lambda t, i=i: [t.set(b"a", b"%d" % i), t.clear(b"b%d" % (i - 1)), t.set(b"b%d" % i, b"")])
    assert tr.get(b"a") == b"0"
    assert tr.get_range(b"b", b"c") == []
    assert s.create_transaction().get_range(b"b", b"c") == [(b"b19", b"")]


def test_reader_older_than_the_pruned_history_fails_with_1007():
    clock = FakeClock(0.0)
    s = MemoryStore(max_age_s=None, clock=clock)  # no age limit: only the pruning can stop it
    s.transact(lambda tr: tr.set(b"a", b"0"))
    tr = s.create_transaction()
    assert tr.get(b"a") == b"0"
    tr.set(b"x", b"")
    s.transact(lambda t: t.set(b"a", b"1"))
    clock.now += s.retention_s + 1
    s.transact(lambda t: t.set(b"a", b"2"))  # prunes the history the old reader needs
    with pytest.raises(StoreError) as e:
        tr.get(b"a")
    assert e.value.code == 1007
    with pytest.raises(StoreError) as e:
        tr.commit()
    assert e.value.code == 1007
    assert s.create_transaction().get(b"a") == b"2"


def test_pruning_drops_deleted_keys_but_keeps_live_ones():
    clock = FakeClock(0.0)
    s = MemoryStore(clock=clock)
    s.transact(lambda tr: [tr.set(b"a", b"1"), tr.set(b"b", b"1")])
    s.transact(lambda tr: tr.clear(b"a"))
    clock.now += s.retention_s + 1
    s.transact(lambda tr: tr.set(b"c", b"1"))
    clock.now += s.retention_s + 1
    s.transact(lambda tr: tr.set(b"d", b"1"))
    assert b"a" not in s._data
    assert s.create_transaction().get_range(b"", b"\xff") == [(b"b", b"1"), (b"c", b"1"), (b"d", b"1")]


def test_hot_key_history_is_trimmed_to_the_retention_and_readers_inside_it_still_read():
    # A key written by every commit (a job type's watch key) must not keep every version it
    # ever had, and trimming must keep the version each still-readable snapshot needs.
    from smoosh.store.memory import HISTORY_TRIM_INTERVAL_S

    clock = FakeClock(0.0)
    s = MemoryStore(max_age_s=None, clock=clock)  # no age limit: only the pruning stops readers
    step_s = 0.05
    readers = []
    for i in range(int(3 * s.retention_s / step_s)):
        s.transact(lambda tr, i=i: tr.set(b"hot", b"%d" % i))
        if i % 10 == 0:
            tr = s.create_transaction()
            assert tr.get(b"other") is None  # takes the read version now
            readers.append((i, clock.now, tr))
        clock.now += step_s
    kept = len(s._data[b"hot"])
    assert s.retention_s / step_s - 2 <= kept <= (s.retention_s + HISTORY_TRIM_INTERVAL_S) / step_s + 2
    recent = old = 0
    for i, started, tr in readers:
        age_s = clock.now - started
        if age_s < s.retention_s - 2 * step_s:
            assert tr.get(b"hot") == b"%d" % i
            recent += 1
        elif age_s > s.retention_s + 2 * step_s:
            with pytest.raises(StoreError) as e:
                tr.get(b"hot")
            assert e.value.code == 1007
            old += 1
    assert recent and old
