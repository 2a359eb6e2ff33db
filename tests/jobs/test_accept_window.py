"""The accept window (QuiCK's way): a few pending keys to pick from while acceptors do not
conflict, wider only while they do, never past couch_jobs' 1024."""

from __future__ import annotations

import random
from typing import Any

from smoosh.jobs import Jobs
from smoosh.jobs.pending import MIN_PICK_WINDOW, PICK_RANGE_LIMIT, PickWindow
from smoosh.store.faulty import FaultyStore
from smoosh.store.memory import MemoryStore

T = "t"


def test_window_doubles_on_conflict_up_to_1024_and_narrows_by_one_after_success() -> None:
    w = PickWindow()
    assert w.size == MIN_PICK_WINDOW
    for _ in range(20):
        w.widen()
    assert w.size == PICK_RANGE_LIMIT
    w.narrow()
    assert w.size == PICK_RANGE_LIMIT - 1
    for _ in range(5000):
        w.narrow()
    assert w.size == MIN_PICK_WINDOW


def test_uncontended_accept_picks_among_the_first_keys_of_a_long_queue(jobs: Jobs) -> None:
    if isinstance(jobs.store, FaultyStore):
        jobs.store.enabled = False  # an injected 1020 is a conflict too: it would widen the window
    # Given 200 pending jobs (key order = id order, all scheduled at 0)
    jobs.set_type_timeout(T, 30)
    jobs.transact(lambda tr: [jobs.add(T, f"j{i:03d}", {}, tx=tr) for i in range(200)])
    # When one worker accepts twenty of them
    taken = [jobs.accept(T, timeout=0)[0].id for _ in range(20)]
    # Then each came from the head of the queue: the window is a few keys, not 1024
    assert all(int(job_id[1:]) < 20 + MIN_PICK_WINDOW for job_id in taken)
    assert jobs.pick_window(T).size == MIN_PICK_WINDOW


def test_a_conflicting_accept_widens_the_window_and_clean_ones_narrow_it(tmp_path: Any) -> None:
    store = FaultyStore(MemoryStore(), seed=0, rate=0.0, max_retry_delay_s=0.001)
    jobs = Jobs(store, monitors=False, rng=random.Random(1))
    jobs.set_type_timeout(T, 30)
    jobs.transact(lambda tr: [jobs.add(T, f"j{i:03d}", {}, tx=tr) for i in range(100)])
    store.inject(1020, after_commit=False, times=2)  # two conflicts in a row
    jobs.accept(T, timeout=0)
    assert jobs.pick_window(T).size == 4 * MIN_PICK_WINDOW
    jobs.accept(T, timeout=0)
    assert jobs.pick_window(T).size == 4 * MIN_PICK_WINDOW - 1
    assert jobs.pending_count(T) == 98
    jobs.close()
    store.close()
