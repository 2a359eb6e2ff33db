"""A capacity-bounded, keyed max-priority queue: one entry per key, ties first-in first-out.

Pure: no clock, no I/O, no locks (the owning channel serialises access).

Each entry is one ``_Entry``: a ``float`` subclass whose float value is the entry's
*sequence* (its age) and whose two slots hold its priority and key. The entries live twice:
in a dict ``key -> entry``, and in a sorted sequence of entries ordered ascending by
``(priority, sequence)``, kept as a list of chunks (``_LOAD // 2`` to ``2 * _LOAD`` entries
each, like ``sortedcontainers.SortedList``) with, per chunk, its last entry and that entry's
priority.

The sequence counts down from 0 as keys arrive and is unique. A position is found in C in
two steps: ``bisect`` on priorities (caller's ints and floats; Python compares int with
float exactly) narrows to the run of equal priority, then ``bisect`` on the entries
themselves, which compare as floats, i.e. by sequence alone. So keys are never compared
(they need not be orderable) and equal priorities order by age. Ascending order puts

* the highest priority, **oldest** among equals, at the end: ``pop()`` takes the last entry;
* the lowest priority, **newest** among equals, at the front: eviction takes the first.

So ties are fair both ways: the entry that waited longest is served first and evicted last
(CouchDB serves the newest among equals, which can starve old keys). A re-prioritised entry
keeps its object, hence its sequence, hence its age.

Memory per entry (CPython 3.11, 64-bit, as ``tracemalloc`` counts it; the key and the
priority object are the caller's): the ``_Entry`` 56 B (GC header 16, float 24, two slots
16), its dict slot ~31 B at 1M str keys, its chunk reference ~8.5 B: ~95 B, 95 MB for 1M
entries. A ``(priority, sequence, key)`` tuple in a ``SortedList`` cost 64 B plus a 24 B
float sequence, ~128 B in all: the float subclass carries the sequence in its own value.
The float sequence is exact to 2**53 pushes of new keys (centuries at a million a second).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from operator import attrgetter
from typing import Hashable, Iterator

__all__ = ["PriorityQueue", "DEFAULT_CAPACITY"]

#: Entries a queue holds before it evicts its lowest-priority entry (CouchDB's default).
DEFAULT_CAPACITY = 9999

#: Target entries per chunk: a chunk is split above twice this and merged below half of it.
#: Smaller than ``SortedList``'s 1000 because bisecting inside a chunk calls a key function
#: per probe, so shorter chunks mean fewer calls (bench/queue.py chose the figure).
_LOAD = 250

#: ``info()`` of an empty queue: what CouchDB's status reports, so dashboards keep working.
_EMPTY_INFO = {"size": 0, "min": 0, "max": 0}


def _check_priority(priority: object) -> None:
    # bool is an int subclass but never a meaningful priority; NaN would break the ordering
    # invariant of the chunks (NaN compares false with everything) and corrupt them.
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


class _Entry(float):
    """One waiting key: the float value is its sequence (age); ``priority`` and ``key`` are slots.

    Entries compare as floats, by sequence only: the queue compares them only within a run of
    equal priority, where the sequence alone decides (and never reaches the key).
    """

    __slots__ = ("priority", "key")

    priority: float
    key: Hashable


_priority_of = attrgetter("priority")


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

    __slots__ = ("_chunks", "_lasts", "_lastp", "_entries", "_sequence", "_capacity", "evicted")

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
        # Invariants: every chunk is non-empty; the chunks, concatenated, are ascending by
        # (priority, sequence); _lasts[i] is chunks[i][-1] and _lastp[i] its priority (a
        # plain number, so bisecting chunks by priority compares in C without a key call).
        self._chunks: list[list[_Entry]] = []
        self._lasts: list[_Entry] = []
        self._lastp: list[float] = []
        self._entries: dict[Hashable, _Entry] = {}
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
        entry = entries.get(key)
        if entry is not None:
            if entry.priority == priority:
                return None
            # The same object moves, so its sequence (its age) moves with it.
            self._unlink(entry)
            entry.priority = priority
            self._insert(entry)
            return None
        self._sequence -= 1.0
        entry = _Entry(self._sequence)
        entry.priority = priority
        entry.key = key
        entries[key] = entry
        chunks = self._chunks
        lastp = self._lastp
        # The newest entry goes first among its equals: before the first entry whose
        # priority is >= its own, so priorities alone place it (no sequence comparison).
        i = bisect_left(lastp, priority)
        if i == len(chunks):
            if not chunks:
                chunks.append([entry])
                self._lasts.append(entry)
                lastp.append(priority)
                return None
            i -= 1
            chunk = chunks[i]
            chunk.append(entry)
            self._lasts[i] = entry
            lastp[i] = priority
        else:
            # Not the chunk's new last: that one's priority is >= ours and it is older.
            chunk = chunks[i]
            chunk.insert(bisect_left(chunk, priority, key=_priority_of), entry)
        if len(chunk) > 2 * _LOAD:
            self._split(i)
        if len(entries) > self._capacity:
            lowest = self._take(0, 0)
            del entries[lowest.key]
            self.evicted += 1
            return lowest.key
        return None

    def pop(self) -> tuple[Hashable, float] | None:
        """Remove and return the highest-priority entry (the oldest among equals).

        Returns
        -------
        ``(key, priority)``, or None when the queue is empty.
        """
        if not self._entries:
            return None
        chunk = self._chunks[-1]
        if len(chunk) > (_LOAD >> 1) + 1:
            # Fast path: the last chunk stays over half full, so only its last changes.
            entry = chunk.pop()
            last = chunk[-1]
            self._lasts[-1] = last
            self._lastp[-1] = last.priority
        else:
            entry = self._take(len(self._chunks) - 1, len(chunk) - 1)
        del self._entries[entry.key]
        return entry.key, entry.priority

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
        self._unlink(entry)
        return True

    def clear(self) -> None:
        """Remove every entry (the ``evicted`` counter is kept)."""
        self._chunks.clear()
        self._lasts.clear()
        self._lastp.clear()
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
            lowest = self._take(0, 0)
            del self._entries[lowest.key]
            evicted.append(lowest.key)
        self.evicted += len(evicted)
        return evicted

    # -- the sorted chunks ------------------------------------------------------------------

    def _locate(self, entry: _Entry) -> tuple[int, int]:
        """Return ``(chunk index, index in it)`` where ``entry`` is, or would be inserted.

        The first position holding something >= ``(entry.priority, entry)``; an entry past
        every other one gives the last chunk's length (the chunks must not be empty).
        """
        priority = entry.priority
        lastp = self._lastp
        lo = bisect_left(lastp, priority)
        hi = bisect_right(lastp, priority, lo)
        # Chunks lo..hi-1 end inside the run of ``priority``: their lasts ascend by sequence.
        i = bisect_left(self._lasts, entry, lo, hi)
        chunks = self._chunks
        if i == len(chunks):
            i -= 1
            return i, len(chunks[i])
        chunk = chunks[i]
        # Bound the run inside the chunk, so that sequences are compared only within it.
        # It starts at 0 when the previous chunk ends in it, and ends with the chunk when
        # this chunk does.
        start = 0 if i > lo else bisect_left(chunk, priority, key=_priority_of)
        end = len(chunk) if i < hi else bisect_right(chunk, priority, start, key=_priority_of)
        return i, bisect_left(chunk, entry, start, end)

    def _insert(self, entry: _Entry) -> None:
        """Put ``entry`` at its place by ``(priority, sequence)``."""
        chunks = self._chunks
        if not chunks:
            chunks.append([entry])
            self._lasts.append(entry)
            self._lastp.append(entry.priority)
            return
        i, j = self._locate(entry)
        chunk = chunks[i]
        chunk.insert(j, entry)
        if j == len(chunk) - 1:
            self._lasts[i] = entry
            self._lastp[i] = entry.priority
        if len(chunk) > 2 * _LOAD:
            self._split(i)

    def _unlink(self, entry: _Entry) -> None:
        """Take ``entry`` (which is waiting) out of the chunks; the dict is the caller's."""
        i, j = self._locate(entry)
        self._take(i, j)

    def _take(self, i: int, j: int) -> _Entry:
        """Remove and return entry ``j`` of chunk ``i``, keeping chunks over half full."""
        chunks = self._chunks
        chunk = chunks[i]
        entry = chunk.pop(j)
        if len(chunk) > _LOAD >> 1:
            last = chunk[-1]
        elif len(chunks) > 1:
            # Merge into a neighbour (the next one, for the first chunk), re-split if too big.
            if not i:
                i = 1
            prev = chunks[i - 1]
            prev.extend(chunks[i])
            del chunks[i]
            del self._lasts[i - 1]
            del self._lastp[i - 1]
            i -= 1
            last = prev[-1]
            if len(prev) > 2 * _LOAD:
                self._lasts[i] = last
                self._lastp[i] = last.priority
                self._split(i)
                return entry
        elif chunk:
            last = chunk[-1]
        else:
            del chunks[i]
            del self._lasts[i]
            del self._lastp[i]
            return entry
        self._lasts[i] = last
        self._lastp[i] = last.priority
        return entry

    def _split(self, i: int) -> None:
        """Split chunk ``i`` (over twice the load) in two halves."""
        chunk = self._chunks[i]
        self._chunks.insert(i + 1, chunk[_LOAD:])
        del chunk[_LOAD:]
        last = chunk[-1]
        self._lasts.insert(i, last)
        self._lastp.insert(i, last.priority)

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
        entry = self._lasts[-1]
        return entry.key, entry.priority

    def get(self, key: Hashable, default: float | None = None) -> float | None:
        """Return the priority of ``key``, or ``default`` if it is not waiting."""
        entry = self._entries.get(key)
        return default if entry is None else entry.priority

    def rank(self, key: Hashable) -> int | None:
        """Return how many entries :meth:`pop` returns before ``key`` (0: it is next), or None.

        Cheap: one bisect to find the entry, then the lengths of the chunks above it (a
        queue of 1,000,000 entries has about 4,000 chunks).
        """
        entry = self._entries.get(key)
        if entry is None:
            return None
        i, j = self._locate(entry)
        chunks = self._chunks
        return sum(len(chunks[k]) for k in range(i + 1, len(chunks))) + len(chunks[i]) - 1 - j

    def ranked(self, start: int, stop: int) -> list[tuple[Hashable, float]]:
        """Return the ``(key, priority)`` pairs ranked ``start`` to ``stop - 1`` (0: what :meth:`pop`
        returns next), highest first: one page of :meth:`items` without copying the rest.

        Cheap at any depth: whole chunks above ``start`` are skipped by their lengths, so a page
        deep in a queue of 100,000 entries costs the chunks' count plus the page.

        Parameters
        ----------
        start:
            The first rank wanted (>= 0).
        stop:
            One past the last rank wanted; past the end means up to the end.
        """
        out: list[tuple[Hashable, float]] = []
        if stop <= start:
            return out
        skip = max(0, start)
        want = stop - skip
        for chunk in reversed(self._chunks):
            n = len(chunk)
            if skip >= n:
                skip -= n
                continue
            # This chunk holds ranks from ``skip`` on, counted from its end (its highest entry).
            end = n - skip
            begin = max(0, end - want)
            out.extend((entry.key, entry.priority) for entry in reversed(chunk[begin:end]))
            want -= end - begin
            skip = 0
            if want <= 0:
                break
        return out

    def items(self) -> list[tuple[Hashable, float]]:
        """Return every ``(key, priority)``, highest first (oldest first among equals).

        Pushing these pairs, in this order, into an empty queue rebuilds the same order.
        """
        return [
            (entry.key, entry.priority) for chunk in reversed(self._chunks) for entry in reversed(chunk)
        ]

    def info(self) -> dict[str, float]:
        """Return ``{"size": n, "min": lowest priority, "max": highest priority}``.

        An empty queue gives ``{"size": 0, "min": 0, "max": 0}``.
        """
        if not self._entries:
            return dict(_EMPTY_INFO)
        return {
            "size": len(self._entries),
            "min": self._chunks[0][0].priority,
            "max": self._lastp[-1],
        }

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[Hashable]:
        """Iterate over the keys, highest priority first."""
        return (entry.key for chunk in reversed(self._chunks) for entry in reversed(chunk))

    def __repr__(self) -> str:
        info = self.info()
        return (
            f"<PriorityQueue size={info['size']} capacity={self._capacity} "
            f"min={info['min']!r} max={info['max']!r}>"
        )
