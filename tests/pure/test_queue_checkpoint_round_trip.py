"""A queue saved and restored the way a channel does it (upstream t_persist_unpersist_enabled)."""

from __future__ import annotations

import math
from pathlib import Path

from channels.priority_queue import PriorityQueue
from persist.checkpoint import read_checkpoint, write_checkpoint


def checkpoint_of(active: list[str], starting: list[str], waiting: PriorityQueue) -> dict:
    # What a channel saves (DESIGN §5.4): running keys first at infinity, then the waiting
    # entries highest first, so a restore in file order keeps their order.
    mapping = {key: math.inf for key in active + starting}
    for key, priority in waiting.items():
        mapping.setdefault(key, priority)
    return mapping


def restore(mapping: dict, capacity: int = 9999) -> PriorityQueue:
    q = PriorityQueue(capacity=capacity)
    for key, priority in mapping.items():
        q.push(key, priority)
    return q


def test_active_starting_and_waiting_restore_in_that_order(tmp_path: Path) -> None:
    path = tmp_path / "ratio_dbs.smooshq"
    waiting = PriorityQueue()
    waiting.push("db_waiting", 1.0)
    write_checkpoint(path, checkpoint_of(["db_active"], ["db_starting"], waiting))
    first_bytes = path.read_bytes()

    q = restore(read_checkpoint(path))
    assert q.info() == {"size": 3, "min": 1.0, "max": math.inf}
    assert q.items() == [("db_active", math.inf), ("db_starting", math.inf), ("db_waiting", 1.0)]

    # A second round trip is identical, down to the bytes on disk.
    write_checkpoint(path, dict(q.items()))
    assert path.read_bytes() == first_bytes
    q2 = restore(read_checkpoint(path))
    assert q2.items() == q.items()
    assert [key for key, _ in iter(q2.pop, None)] == ["db_active", "db_starting", "db_waiting"]


def test_restore_truncates_to_the_current_capacity(tmp_path: Path) -> None:
    path = tmp_path / "ratio_dbs.smooshq"
    waiting = PriorityQueue()
    for i in range(5):
        waiting.push(f"w{i}", float(i))
    write_checkpoint(path, checkpoint_of(["a"], [], waiting))
    q = restore(read_checkpoint(path), capacity=3)
    assert q.items() == [("a", math.inf), ("w4", 4.0), ("w3", 3.0)]


def test_fifo_order_among_ties_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "slack_dbs.smooshq"
    q = PriorityQueue()
    for key in ["oldest", "middle", "newest"]:
        q.push(key, 536870913)
    write_checkpoint(path, dict(q.items()))
    assert [key for key, _ in restore(read_checkpoint(path)).items()] == [
        "oldest",
        "middle",
        "newest",
    ]


def test_active_key_also_waiting_is_saved_once_at_infinity(tmp_path: Path) -> None:
    path = tmp_path / "ratio_dbs.smooshq"
    waiting = PriorityQueue()
    waiting.push("both", 3.0)
    waiting.push("other", 2.0)
    write_checkpoint(path, checkpoint_of(["both"], [], waiting))
    assert read_checkpoint(path) == {"both": math.inf, "other": 2.0}
