"""A plain reference model of PriorityQueue: highest priority first, oldest first among equals."""

from __future__ import annotations

from typing import Hashable


class QueueModel:
    """What PriorityQueue must do, written the slow and obvious way (a dict of (priority, age))."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.entries: dict[Hashable, tuple[float, int]] = {}
        self.evicted = 0

    def push(self, key: Hashable, priority: float, age: int) -> Hashable | None:
        """The key evicted by this push, or None; ``age`` orders first pushes (lower = older)."""
        if key in self.entries:
            if self.entries[key][0] != priority:
                self.entries[key] = (priority, self.entries[key][1])
            return None
        self.entries[key] = (priority, age)
        if len(self.entries) <= self.capacity:
            return None
        lowest = min(self.entries, key=lambda k: (self.entries[k][0], -self.entries[k][1]))
        del self.entries[lowest]
        self.evicted += 1
        return lowest

    def pop(self) -> tuple[Hashable, float] | None:
        if not self.entries:
            return None
        top = max(self.entries, key=lambda k: (self.entries[k][0], -self.entries[k][1]))
        return top, self.entries.pop(top)[0]

    def remove(self, key: Hashable) -> bool:
        return self.entries.pop(key, None) is not None

    def items(self) -> list[tuple[Hashable, float]]:
        ordered = sorted(self.entries.items(), key=lambda kv: (-kv[1][0], kv[1][1]))
        return [(k, v[0]) for k, v in ordered]

    def __len__(self) -> int:
        return len(self.entries)
