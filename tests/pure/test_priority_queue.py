"""The capacity-bounded keyed priority queue (DESIGN §4.4, §5.3; upstream smoosh_priority_queue)."""

from __future__ import annotations

import math
import random

import pytest

from channels.priority_queue import DEFAULT_CAPACITY, PriorityQueue
from helpers.queue_model import QueueModel


def drain(q: PriorityQueue) -> list[tuple[object, float]]:
    out = []
    while (entry := q.pop()) is not None:
        out.append(entry)
    return out


# -- upstream eunit vectors (smoosh_priority_queue) ----------------------------------------


def test_new_queue_is_empty_with_zero_info() -> None:
    q = PriorityQueue()
    assert len(q) == 0
    assert q.capacity == DEFAULT_CAPACITY == 9999
    assert q.pop() is None
    assert q.peek() is None
    assert q.items() == []
    assert q.info() == {"size": 0, "min": 0, "max": 0}


def test_empty_queue_round_trips_through_items() -> None:
    q = PriorityQueue()
    rebuilt = PriorityQueue()
    for key, priority in q.items():
        rebuilt.push(key, priority)
    assert rebuilt.items() == [] and rebuilt.info() == q.info()


def test_one_element_info_pop_and_round_trip() -> None:
    q = PriorityQueue()
    q.push("k1", 1)
    assert q.info() == {"max": 1, "min": 1, "size": 1}
    rebuilt = PriorityQueue()
    for key, priority in q.items():
        rebuilt.push(key, priority)
    assert rebuilt.items() == [("k1", 1)]
    assert q.pop() == ("k1", 1)
    assert len(q) == 0 and q.info() == {"size": 0, "min": 0, "max": 0}
    rebuilt.clear()
    assert rebuilt.items() == [] and len(rebuilt) == 0


def test_multiple_elements_drain_highest_first_with_infinity_on_top() -> None:
    q = PriorityQueue()
    q.push("k1", 1)
    q.push("k2", 2.4)
    q.push("k3", math.inf)
    assert q.info() == {"size": 3, "min": 1, "max": math.inf}
    assert drain(q) == [("k3", math.inf), ("k2", 2.4), ("k1", 1)]


def test_same_priority_push_changes_nothing() -> None:
    q = PriorityQueue()
    q.push("k1", 1)
    q.push("k2", 2.4)
    before = q.items()
    assert q.push("k1", 1) is None
    assert q.push("k1", 1.0) is None  # 1 == 1.0: same priority
    assert q.items() == before


def test_same_priority_push_on_a_full_queue_evicts_nothing() -> None:
    q = PriorityQueue(capacity=2)
    q.push("a", 1)
    q.push("b", 1)
    assert q.push("a", 1) is None
    assert q.evicted == 0 and q.items() == [("a", 1), ("b", 1)]


def test_new_priority_moves_the_key() -> None:
    q = PriorityQueue()
    q.push("k1", 1)
    q.push("k2", 2.4)
    q.push("k1", math.inf)
    assert q.info() == {"size": 2, "min": 2.4, "max": math.inf}
    assert drain(q) == [("k1", math.inf), ("k2", 2.4)]


def test_capacity_one_keeps_only_the_highest() -> None:
    q = PriorityQueue(capacity=1)
    q.push("k1", 1)
    q.push("k2", 2.4)
    q.push("k3", math.inf)
    assert q.items() == [("k3", math.inf)]


def test_capacity_two_keeps_the_top_two() -> None:
    q = PriorityQueue(capacity=2)
    q.push("k1", 1)
    q.push("k2", 2.4)
    q.push("k3", math.inf)
    assert q.items() == [("k3", math.inf), ("k2", 2.4)]
    assert q.evicted == 1


def test_a_lot_of_elements_drain_in_non_increasing_order() -> None:
    rnd = random.Random(20221108)
    q = PriorityQueue(capacity=200_000)
    for i in range(100_000):
        q.push(f"key{i}", rnd.random())
    assert len(q) == 100_000
    priorities = [priority for _, priority in drain(q)]
    assert len(priorities) == 100_000
    assert all(a >= b for a, b in zip(priorities, priorities[1:]))


# -- smoosh's own rules (DESIGN §5.3), differences from CouchDB tested explicitly ---------


def test_ties_pop_oldest_first() -> None:
    # CouchDB pops the newest of equal priorities, which can starve old keys; we pop FIFO.
    q = PriorityQueue()
    for key in ("first", "second", "third"):
        q.push(key, 5.0)
    q.push("higher", 6.0)
    assert [key for key, _ in drain(q)] == ["higher", "first", "second", "third"]


def test_full_queue_evicts_lowest_priority_and_returns_it() -> None:
    q = PriorityQueue(capacity=3)
    q.push("low", 1)
    q.push("mid", 2)
    q.push("high", 3)
    assert q.push("higher", 4) == "low"
    assert "low" not in q and q.evicted == 1
    assert q.items() == [("higher", 4), ("high", 3), ("mid", 2)]


def test_full_queue_evicts_the_pushed_key_when_it_is_lowest() -> None:
    q = PriorityQueue(capacity=2)
    q.push("a", 5)
    q.push("b", 6)
    assert q.push("c", 1) == "c"
    assert "c" not in q and q.evicted == 1 and len(q) == 2


def test_full_queue_evicts_the_newest_among_equal_lowest() -> None:
    # FIFO fairness both ways: the key that waited longest is served first, evicted last.
    q = PriorityQueue(capacity=3)
    q.push("old", 1)
    q.push("mid", 1)
    q.push("top", 9)
    assert q.push("new", 1) == "new"
    assert q.push("newer", 2) == "mid"
    assert q.items() == [("top", 9), ("newer", 2), ("old", 1)]
    assert q.evicted == 2


def test_reprioritised_key_keeps_its_age_among_equals() -> None:
    q = PriorityQueue()
    q.push("old", 1)
    q.push("young", 2)
    q.push("old", 2)  # moves up, but is still older than "young"
    assert [key for key, _ in drain(q)] == ["old", "young"]


def test_keys_are_never_compared() -> None:
    class Unorderable:
        def __lt__(self, other: object) -> bool:
            raise AssertionError("keys must never be compared")

        __gt__ = __le__ = __ge__ = __lt__

    keys = [Unorderable() for _ in range(50)]
    q = PriorityQueue(capacity=40)
    for key in keys:
        q.push(key, 1.0)  # all ties: only the sequence can break them
    q.push(keys[0], 2.0)
    assert q.pop() == (keys[0], 2.0)
    assert [key for key, _ in drain(q)] == keys[1:40]


def test_remove_reports_whether_the_key_was_waiting() -> None:
    q = PriorityQueue()
    q.push("a", 1)
    q.push("b", 2)
    assert q.remove("a") is True
    assert q.remove("a") is False
    assert q.remove("never") is False
    assert q.items() == [("b", 2)] and "a" not in q


def test_lookups_do_not_change_the_queue() -> None:
    q = PriorityQueue()
    q.push("a", 1)
    q.push("b", math.inf)
    assert "a" in q and "zzz" not in q
    assert q.get("a") == 1 and q.get("zzz") is None and q.get("zzz", 0) == 0
    assert q.peek() == ("b", math.inf)
    assert list(q) == ["b", "a"]
    assert len(q) == 2 and q.items() == [("b", math.inf), ("a", 1)]


def test_ints_floats_and_infinities_order_together() -> None:
    q = PriorityQueue()
    q.push("int", 3)
    q.push("float", 2.5)
    q.push("inf", math.inf)
    q.push("neg", -math.inf)
    q.push("big", 10**18)
    assert [key for key, _ in q.items()] == ["inf", "big", "int", "float", "neg"]
    assert q.info() == {"size": 5, "min": -math.inf, "max": math.inf}


@pytest.mark.parametrize("capacity", [0, -1])
def test_capacity_below_one_is_refused(capacity: int) -> None:
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        PriorityQueue(capacity=capacity)


@pytest.mark.parametrize("capacity", [1.5, "2", True, None])
def test_capacity_must_be_an_int(capacity: object) -> None:
    with pytest.raises(TypeError, match="capacity must be an int"):
        PriorityQueue(capacity=capacity)  # type: ignore[arg-type]


def test_lowering_capacity_evicts_lowest_first() -> None:
    q = PriorityQueue(capacity=10)
    for i, priority in enumerate([5, 1, 3, 1, 4]):
        q.push(f"k{i}", priority)
    assert q.set_capacity(2) == ["k3", "k1", "k2"]  # lowest first, newest among equals first
    assert q.capacity == 2 and q.evicted == 3
    assert q.items() == [("k0", 5), ("k4", 4)]
    q.capacity = 1
    assert q.items() == [("k0", 5)] and q.evicted == 4
    assert q.set_capacity(100) == [] and q.capacity == 100


def test_invalid_new_capacity_leaves_the_queue_alone() -> None:
    q = PriorityQueue(capacity=3)
    q.push("a", 1)
    with pytest.raises(ValueError):
        q.set_capacity(0)
    assert q.capacity == 3 and q.items() == [("a", 1)]


def test_clear_empties_but_keeps_the_eviction_count() -> None:
    q = PriorityQueue(capacity=1)
    q.push("a", 1)
    q.push("b", 2)
    q.clear()
    assert len(q) == 0 and q.pop() is None and q.evicted == 1
    q.push("a", 1)
    assert q.items() == [("a", 1)]


def test_nan_priority_is_refused() -> None:
    q = PriorityQueue()
    with pytest.raises(ValueError, match="NaN"):
        q.push("a", math.nan)
    assert len(q) == 0


@pytest.mark.parametrize("priority", [None, "1", True, b"1", [1]])
def test_non_number_priority_is_refused(priority: object) -> None:
    q = PriorityQueue()
    with pytest.raises(TypeError, match="priority must be an int or a float"):
        q.push("a", priority)  # type: ignore[arg-type]
    assert len(q) == 0


def test_random_operations_match_a_reference_model() -> None:
    rnd = random.Random(7)
    q = PriorityQueue(capacity=25)
    model = QueueModel(capacity=25)
    for step in range(20_000):
        op = rnd.random()
        key = f"k{rnd.randrange(60)}"
        if op < 0.6:
            priority = rnd.choice([0.5, 1, 2, 2.0, 3.25, math.inf])
            assert q.push(key, priority) == model.push(key, priority, step)
        elif op < 0.85:
            assert q.pop() == model.pop()
        else:
            assert q.remove(key) == model.remove(key)
        assert len(q) == len(model)
    assert q.evicted == model.evicted
    assert q.items() == model.items()


def test_rank_counts_the_pops_before_a_key_across_many_chunks() -> None:
    # Given enough keys for many chunks, with ties among them
    rng = random.Random(14)
    q = PriorityQueue(capacity=100_000)
    for i in range(5000):
        q.push(f"k{i}", rng.choice([0.5, 1, 2.0, 3, math.inf]))
    # When every key is ranked, then each rank is its place in the pop order
    expected = {key: place for place, (key, _) in enumerate(q.items())}
    assert {key: q.rank(key) for key in expected} == expected
    assert q.rank("absent") is None
    assert len(q) == 5000  # ranking changes nothing
