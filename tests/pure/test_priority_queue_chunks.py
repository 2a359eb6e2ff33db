"""PriorityQueue's chunked layout: order, ties and ages hold across chunk splits and merges.

The queue keeps its entries in chunks of ``_LOAD // 2`` to ``2 * _LOAD`` entries; with the
production load a queue needs thousands of entries before a run of equal priorities spans
chunks. These tests shrink the load so that every split, merge and run boundary is crossed
many times, and check the layout's invariants after each operation.
"""

from __future__ import annotations

import gc
import math
import random
import tracemalloc

import pytest

import channels.priority_queue as pq
from channels.priority_queue import PriorityQueue
from helpers.queue_model import QueueModel


def check_layout(q: PriorityQueue) -> None:
    chunks = q._chunks
    assert all(chunks), "no chunk may be empty"
    assert all(len(chunk) <= 2 * pq._LOAD for chunk in chunks)
    assert len(q._lasts) == len(q._lastp) == len(chunks)
    for chunk, last, lastp in zip(chunks, q._lasts, q._lastp):
        assert chunk[-1] is last and last.priority == lastp
    flat = [entry for chunk in chunks for entry in chunk]
    assert len(flat) == len(q)
    order = [(entry.priority, float(entry)) for entry in flat]
    assert order == sorted(order) and len(set(order)) == len(order)
    assert all(q._entries[entry.key] is entry for entry in flat)


@pytest.fixture(params=[1, 2, 3, 8])
def small_load(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(pq, "_LOAD", request.param)
    return request.param


@pytest.mark.parametrize("priorities", ["few", "one", "many"])
def test_random_operations_across_chunks_match_a_reference_model(small_load: int, priorities: str) -> None:
    rnd = random.Random(small_load * 31 + len(priorities))
    choices = {"few": [0.5, 1, 2, 2.0, 3.25, math.inf, -math.inf, 10**20, 10**20 + 1], "one": [7]}
    q = PriorityQueue(capacity=60)
    model = QueueModel(capacity=60)
    for step in range(4000):
        op = rnd.random()
        key = f"k{rnd.randrange(100)}"
        if op < 0.6:
            priority = rnd.choice(choices[priorities]) if priorities in choices else rnd.random()
            assert q.push(key, priority) == model.push(key, priority, step)
        elif op < 0.8:
            assert q.pop() == model.pop()
        elif op < 0.95:
            assert q.remove(key) == model.remove(key)
        else:
            kept = [k for k, _ in model.items()]
            capacity = rnd.choice([5, 20, 60])
            assert q.set_capacity(capacity) == kept[capacity:][::-1]
            for gone in kept[capacity:]:
                model.remove(gone)
            model.capacity = capacity
        check_layout(q)
    assert q.items() == model.items()
    assert list(q) == [k for k, _ in model.items()]


def test_a_long_run_of_ties_keeps_ages_when_keys_move_in_and_out(small_load: int) -> None:
    q = PriorityQueue(capacity=1000)
    keys = [f"k{i:03d}" for i in range(200)]
    for key in keys:
        q.push(key, 1)
    # Every third key leaves the run and comes back: each must land at its old place.
    for key in keys[::3]:
        q.push(key, 5)
        check_layout(q)
    for key in keys[::3]:
        q.push(key, 1.0)
        check_layout(q)
    assert [key for key, _ in q.items()] == keys
    assert q.set_capacity(10) == keys[10:][::-1]  # newest first among equals
    check_layout(q)
    assert [key for key, _ in q.items()] == keys[:10]


def test_clear_then_reuse(small_load: int) -> None:
    q = PriorityQueue(capacity=100)
    for i in range(50):
        q.push(i, i % 4)
    q.clear()
    check_layout(q)
    assert q.pop() is None and q.peek() is None and q.info() == {"size": 0, "min": 0, "max": 0}
    q.push("a", 2)
    q.push("b", 2)
    check_layout(q)
    assert q.items() == [("a", 2), ("b", 2)]


def test_memory_per_entry_stays_under_the_budget() -> None:
    # DESIGN budget: 1,000,000 entries in <= 120 MB (keys not counted); ~103 B/entry at this
    # size (the dict is emptier here than at 1M, where the total is ~95 B/entry).
    n = 100_000
    keys = [f"/srv/dbs/tenant-{i:08d}.sqlite" for i in range(n)]
    priorities = [float(i % 1000) for i in range(n)]
    gc.collect()
    tracemalloc.start()
    try:
        q = PriorityQueue(capacity=n)
        for key, priority in zip(keys, priorities):
            q.push(key, priority)
        gc.collect()
        used, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(q) == n
    assert used / n <= 120


def test_a_page_of_ranks_is_that_slice_of_items_across_chunks(small_load: int) -> None:
    # Given a queue spread over many chunks, with runs of ties
    rng = random.Random(small_load)
    q = PriorityQueue(capacity=500)
    for i in range(200):
        q.push(f"k{i}", rng.choice([1, 2, 2, 3, 5.5, math.inf]))
    everything = q.items()
    # Then every page, at every depth, is the matching slice of items() (highest first)
    for start in range(0, 205, 7):
        for size in (0, 1, 3, 50, 400):
            assert q.ranked(start, start + size) == everything[start:start + size], (start, size)
    assert PriorityQueue().ranked(0, 10) == []
