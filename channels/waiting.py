"""What waits in a channel: the priority queue, keys set aside by rotation, keys deferred after a crash.

Three places a waiting key can be, one object for all of them (pure: no clock, no I/O, no
lock; the owning channel serialises access):

* the queue (:class:`~channels.priority_queue.PriorityQueue`): what starts next, highest first;
* *benched* keys: rotation stopped them to make way for waiting work (DESIGN §5.6); they
  return to the queue once the channel starts something else, or at once when nothing else
  waits (re-queued at once, the stopped key would often be the head again and take back the
  slot rotation freed);
* *deferred* keys: their last run crashed or met a busy database; they wait out their
  not-before time holding no slot (DESIGN §5.6), then return to the queue.

All three are checkpointed. The status shows queued and benched keys as *waiting* (they can
start as soon as a slot allows) and deferred keys apart (they cannot start before their time:
counted as waiting, one crashing database made "work waiting and nothing running" alerts fire
beside the crash alert itself).
"""

from __future__ import annotations

import math
from typing import Any

from channels.priority_queue import PriorityQueue, _check_priority

__all__ = ["Waiting"]


class Waiting:
    """A channel's waiting keys.

    Parameters:
        capacity: the queue's capacity (benched and deferred keys do not count against it).
    """

    def __init__(self, capacity: int) -> None:
        self.queue = PriorityQueue(capacity)
        self._benched: dict[str, float] = {}
        self._deferred: dict[str, list[float]] = {}  # key -> [priority, not before]

    def __len__(self) -> int:
        return len(self.queue) + len(self._benched) + len(self._deferred)

    def __contains__(self, key: object) -> bool:
        return key in self.queue or key in self._benched or key in self._deferred

    @property
    def deferred(self) -> int:
        """Keys waiting out a not-before time."""
        return len(self._deferred)

    def push(self, key: str, priority: float) -> tuple[bool, Any]:
        """Queue ``key`` (or move it); a benched or deferred key keeps its place aside.

        Returns:
            ``(changed, evicted)``: whether anything changed, and the key the full queue
            evicted (possibly ``key`` itself), or None.

        Raises:
            TypeError, ValueError: ``priority`` is not an int or float, or is NaN.
        """
        if key in self._benched:
            _check_priority(priority)
            self._benched[key] = priority
            return True, None
        if key in self._deferred:
            _check_priority(priority)
            self._deferred[key][0] = priority
            return True, None
        if self.queue.get(key) == math.inf:
            # Taken back from a stop (or a restart): it keeps its place at the top whatever a
            # new measurement says; its start re-checks its priority anyway.
            _check_priority(priority)
            return False, None
        return True, self.queue.push(key, priority)

    def defer(self, key: str, priority: float, not_before: float) -> None:
        """Keep ``key`` aside until ``not_before``."""
        self.queue.remove(key)
        self._benched.pop(key, None)
        self._deferred[key] = [priority, not_before]

    def bench(self, key: str, priority: float) -> None:
        """Set ``key`` aside until another key of the channel starts."""
        self._benched[key] = priority

    def has_benched(self) -> bool:
        """Whether rotation set keys aside."""
        return bool(self._benched)

    def unbench(self) -> None:
        """Put the keys rotation set aside back into the queue."""
        for key, priority in self._benched.items():
            self.queue.push(key, priority)
        self._benched.clear()

    def earliest_not_before(self) -> float | None:
        """The earliest time a deferred key may start (None: none is deferred)."""
        return min((not_before for _, not_before in self._deferred.values()), default=None)

    def undefer(self, now: float) -> list[str]:
        """Queue the deferred keys whose time has come; returns them."""
        due = [key for key, (_, not_before) in self._deferred.items() if not_before <= now]
        for key in due:
            priority, _ = self._deferred.pop(key)
            self.queue.push(key, priority)
        return due

    def take(self, key: str) -> float | None:
        """Remove ``key`` from wherever it waits; its priority, or None when it was not waiting."""
        priority = self.queue.get(key)
        if priority is not None:
            self.queue.remove(key)
            return priority
        if key in self._benched:
            return self._benched.pop(key)
        if key in self._deferred:
            return self._deferred.pop(key)[0]
        return None

    def where(self, key: str) -> dict[str, Any] | None:
        """Where ``key`` waits, or None: ``{"place": "queue", "priority", "position"}`` (1: it is
        next), ``{"place": "benched", "priority"}`` or ``{"place": "deferred", "priority", "not_before"}``."""
        priority = self.queue.get(key)
        if priority is not None:
            rank = self.queue.rank(key)
            return {"place": "queue", "priority": priority, "position": None if rank is None else rank + 1}
        if key in self._benched:
            return {"place": "benched", "priority": self._benched[key]}
        if key in self._deferred:
            priority, not_before = self._deferred[key]
            return {"place": "deferred", "priority": priority, "not_before": not_before}
        return None

    def page(self, offset: int, limit: int, first: list[str] | None = None) -> list[dict[str, Any]]:
        """One page of every waiting key, in the order they would start: ``first`` (queued keys that
        start before the rest, in their order: the channel's forced keys), then the queue, highest
        first, then the keys rotation set aside, then the deferred keys, earliest first.

        Costs the queue's chunks plus the page (and a sort of the deferred keys, for a page that
        reaches them): never a copy of the whole queue.

        Parameters:
            offset: how many keys of that order to skip (>= 0).
            limit: at most this many keys.
            first: keys waiting in the queue that start before the rest (each must be in it).

        Returns:
            ``{"key", "priority", "place"}`` per key, ``place`` being ``queue``, ``benched`` or
            ``deferred`` (with ``not_before``, on the owner's clock).
        """
        first = first or []
        out: list[dict[str, Any]] = []
        end = offset + limit
        pos = offset
        # The keys that start first.
        for key in first[pos:min(end, len(first))]:
            out.append({"key": key, "priority": self.queue.get(key), "place": "queue"})
        pos = max(pos, len(first))
        # The rest of the queue: rank r among the queue minus ``first`` is the queue's rank r
        # plus the keys of ``first`` ranked at or before it.
        queued = len(self.queue) - len(first)
        if pos < end and pos - len(first) < queued:
            skip = pos - len(first)
            ranks = sorted(r for r in (self.queue.rank(k) for k in first) if r is not None)
            rank = skip
            for r in ranks:
                if r <= rank:
                    rank += 1
                else:
                    break
            firsts = set(first)
            want = min(end - pos, queued - skip)
            got = 0
            # A page of the queue, plus room for keys of ``first`` that fall inside it.
            for queued_key, priority in self.queue.ranked(rank, rank + want + len(firsts)):
                if queued_key in firsts:
                    continue
                out.append({"key": str(queued_key), "priority": priority, "place": "queue"})
                got += 1
                if got == want:
                    break
            pos += got
        pos = max(pos, len(self.queue))
        # Set aside by rotation, then deferred.
        if pos < end and self._benched:
            start = pos - len(self.queue)
            benched = list(self._benched.items())[start:start + (end - pos)]
            out.extend({"key": key, "priority": p, "place": "benched"} for key, p in benched)
            pos += len(benched)
        pos = max(pos, len(self.queue) + len(self._benched))
        if pos < end and self._deferred:
            start = pos - len(self.queue) - len(self._benched)
            deferred = sorted(self._deferred.items(), key=lambda item: item[1][1])[start:start + (end - pos)]
            out.extend({"key": key, "priority": p, "place": "deferred", "not_before": nb}
                       for key, (p, nb) in deferred)
        return out

    def clear(self) -> list[str]:
        """Drop every waiting key; returns them."""
        dropped = list(self.keys())
        self.queue.clear()
        self._benched.clear()
        self._deferred.clear()
        return dropped

    def keys(self) -> set[str]:
        """Every waiting key."""
        keys = {str(k) for k in self.queue}
        keys.update(self._benched, self._deferred)
        return keys

    def items(self) -> list[tuple[str, float]]:
        """``(key, priority)`` pairs: the queue highest first, then benched, then deferred keys."""
        items = [(str(k), p) for k, p in self.queue.items()]
        items.extend(self._benched.items())
        items.extend((key, priority) for key, (priority, _) in self._deferred.items())
        return items

    def info(self) -> dict[str, Any]:
        """``{"size", "min", "max"}`` over the keys that could start: queued and benched, not deferred
        (0, 0, 0 when none could); :attr:`deferred` counts the others."""
        info = self.queue.info()
        size, low, high = info["size"], info["min"], info["max"]
        aside = list(self._benched.values())
        if aside:
            low = min(aside) if not size else min(low, min(aside))
            high = max(aside) if not size else max(high, max(aside))
            size += len(aside)
        return {"size": size, "min": low, "max": high}
