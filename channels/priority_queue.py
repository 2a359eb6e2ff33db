"""A capacity-bounded, keyed max-priority queue: one entry per key, ties first-in first-out.

Pure: no clock, no I/O, no locks (the owning channel serialises access).

Entries live twice: in a ``SortedList`` of plain tuples ``(priority, sequence, key)``
ordered ascending, and in a dict ``key -> that same tuple``. The sequence counts down from
0 as keys arrive and is unique, so tuple comparison always stops before it reaches the key:
keys are never compared (they need not be orderable) and equal priorities order by age.
Ascending order puts

* the highest priority, **oldest** among equals, at the end: ``pop()`` takes ``[-1]``;
* the lowest priority, **newest** among equals, at the front: eviction takes ``[0]``.

So ties are fair both ways: the entry that waited longest is served first and evicted last
(CouchDB serves the newest among equals, which can starve old keys). Plain tuples and a
shared tuple per entry keep memory and time down: both containers hold one object per key.
"""

from __future__ import annotations

from typing import Hashable, Iterator

from sortedcontainers import SortedList

__all__ = ["PriorityQueue", "DEFAULT_CAPACITY"]

#: Entries a queue holds before it evicts its lowest-priority entry (CouchDB's default).
DEFAULT_CAPACITY = 9999

#: ``info()`` of an empty queue: what CouchDB's status reports, so dashboards keep working.
_EMPTY_INFO = {"size": 0, "min": 0, "max": 0}


def _check_priority(priority: object) -> None:
    # bool is an int subclass but never a meaningful priority; NaN would break the ordering
    # invariant of the SortedList (NaN compares false with everything) and corrupt it.
    if priority.__class__ is float:
        if priority != priority:
            raise ValueError("priority must not be NaN")
        return
    if priority.__class__ is int:
        return
    if isinstance(priority, bool) or not isinstance(priority, (int, float)):
        raise TypeError(f"priority must be an int or a float, not {type(priority).__name__}")
    if priority != priority:
        raise ValueError("priority must not be NaN")


def _check_capacity(capacity: object) -> int:
    if isinstance(capacity, bool) or not isinstance(capacity, int):
        raise TypeError(f"capacity must be an int, not {type(capacity).__name__}")
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    return capacity


class PriorityQueue:
    """A keyed max-priority queue with a capacity; the lowest entries are evicted when full.

    Priorities are ints or floats, ``math.inf`` included (NaN is refused). Keys are any
    hashable (smoosh uses str) and are never compared with each other.

    Attributes
    ----------
    evicted:
        How many entries capacity has evicted since the queue was created (``push`` and
        ``set_capacity`` both count; ``clear``, ``pop`` and ``remove`` do not).
    """

    __slots__ = ("_sorted", "_entries", "_sequence", "_capacity", "evicted")

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        """Create an empty queue.

        Parameters
        ----------
        capacity:
            The most entries the queue holds; must be an int >= 1.

        Raises
        ------
        ValueError
            ``capacity`` < 1.
        TypeError
            ``capacity`` is not an int.
        """
        self._capacity = _check_capacity(capacity)
        self._sorted: SortedList = SortedList()
        self._entries: dict[Hashable, tuple[float, float, Hashable]] = {}
        # Counts down so that ascending order puts the oldest of equal priorities last
        # (popped first) and the newest first (evicted first). Floats are exact to 2**53.
        self._sequence = 0.0
        self.evicted = 0

    # -- mutation ---------------------------------------------------------------------------

    def push(self, key: Hashable, priority: float) -> Hashable | None:
        """Insert ``key`` or change its priority; evict the lowest entry if over capacity.

        A key already waiting with an equal priority is left alone (it keeps its place and
        nothing is evicted). A key whose priority changes moves to its new place but keeps
        its age, so a key that is re-reported often is not sent to the back of its line.

        Parameters
        ----------
        key:
            The entry's key (hashable; never compared).
        priority:
            An int or float, ``math.inf`` allowed.

        Returns
        -------
        The key evicted to make room (possibly ``key`` itself, when its priority is the
        lowest in a full queue), or None when nothing was evicted.

        Raises
        ------
        TypeError
            ``priority`` is not an int or float.
        ValueError
            ``priority`` is NaN.
        """
        # Inline fast path for the two common types; everything else goes to the checker.
        cls = priority.__class__
        if (cls is not float or priority != priority) and cls is not int:
            _check_priority(priority)
        entries = self._entries
        old = entries.get(key)
        if old is not None:
            if old[0] == priority:
                return None
            self._sorted.remove(old)
            entry = (priority, old[1], key)
        else:
            # A float sequence is 24 bytes against an int's 28-32: 1M entries save ~6 MB.
            self._sequence -= 1.0
            entry = (priority, self._sequence, key)
        entries[key] = entry
        self._sorted.add(entry)
        if len(entries) > self._capacity:
            lowest = self._sorted.pop(0)
            del entries[lowest[2]]
            self.evicted += 1
            return lowest[2]
        return None

    def pop(self) -> tuple[Hashable, float] | None:
        """Remove and return the highest-priority entry (the oldest among equals).

        Returns
        -------
        ``(key, priority)``, or None when the queue is empty.
        """
        if not self._entries:
            return None
        priority, _, key = self._sorted.pop()
        del self._entries[key]
        return key, priority

    def remove(self, key: Hashable) -> bool:
        """Remove ``key`` if it is waiting.

        Returns
        -------
        True if the key was in the queue, False if it was not (not an error: the key may
        have been popped or evicted meanwhile).
        """
        entry = self._entries.pop(key, None)
        if entry is None:
            return False
        self._sorted.remove(entry)
        return True

    def clear(self) -> None:
        """Remove every entry (the ``evicted`` counter is kept)."""
        self._sorted.clear()
        self._entries.clear()

    def set_capacity(self, capacity: int) -> list[Hashable]:
        """Change the capacity, evicting the lowest entries if the queue is now over it.

        Parameters
        ----------
        capacity:
            The new capacity, an int >= 1.

        Returns
        -------
        The evicted keys, lowest first (empty when nothing was evicted).

        Raises
        ------
        ValueError, TypeError
            As for the constructor; the queue is unchanged.
        """
        self._capacity = _check_capacity(capacity)
        evicted: list[Hashable] = []
        while len(self._entries) > self._capacity:
            lowest = self._sorted.pop(0)
            del self._entries[lowest[2]]
            evicted.append(lowest[2])
        self.evicted += len(evicted)
        return evicted

    # -- queries ----------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        """The most entries the queue holds; assigning calls :meth:`set_capacity`."""
        return self._capacity

    @capacity.setter
    def capacity(self, capacity: int) -> None:
        self.set_capacity(capacity)

    def peek(self) -> tuple[Hashable, float] | None:
        """Return what :meth:`pop` would return, without removing it."""
        if not self._entries:
            return None
        priority, _, key = self._sorted[-1]
        return key, priority

    def get(self, key: Hashable, default: float | None = None) -> float | None:
        """Return the priority of ``key``, or ``default`` if it is not waiting."""
        entry = self._entries.get(key)
        return default if entry is None else entry[0]

    def items(self) -> list[tuple[Hashable, float]]:
        """Return every ``(key, priority)``, highest first (oldest first among equals).

        Pushing these pairs, in this order, into an empty queue rebuilds the same order.
        """
        return [(key, priority) for priority, _, key in reversed(self._sorted)]

    def info(self) -> dict[str, float]:
        """Return ``{"size": n, "min": lowest priority, "max": highest priority}``.

        An empty queue gives ``{"size": 0, "min": 0, "max": 0}``.
        """
        if not self._entries:
            return dict(_EMPTY_INFO)
        return {
            "size": len(self._entries),
            "min": self._sorted[0][0],
            "max": self._sorted[-1][0],
        }

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[Hashable]:
        """Iterate over the keys, highest priority first."""
        return (key for _, _, key in reversed(self._sorted))

    def __repr__(self) -> str:
        info = self.info()
        return (
            f"<PriorityQueue size={info['size']} capacity={self._capacity} "
            f"min={info['min']!r} max={info['max']!r}>"
        )
