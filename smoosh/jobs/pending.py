"""The pending queue: picking a job to accept, counting, and the watch blocked acceptors wait on."""

from __future__ import annotations

import random
import threading
import uuid
from typing import Any

from smoosh.store import tuples
from smoosh.store.base import KeySelector, Transaction, Watch
from smoosh.jobs.model import Keys
from smoosh.jobs.encoding import JobType

#: Most pending keys read to pick one at random (couch_jobs' RANGE_LIMIT).
PICK_RANGE_LIMIT = 1024
#: Pending keys read to pick one at random while acceptors do not conflict. Reading 1024
#: keys per accept made its cost grow with the backlog (bench/HISTORY.md, the job layer's
#: backlog rows); a few keys are as good a spread for one or two acceptors.
MIN_PICK_WINDOW = 8


class PickWindow:
    """How many pending keys an accept reads to pick from: QuiCK's way, per type and process.

    It starts at :data:`MIN_PICK_WINDOW` and doubles each time an accept conflicts (another
    acceptor took the same key, so acceptors need a wider spread), up to
    :data:`PICK_RANGE_LIMIT`; each accept that commits without a conflict narrows it by one
    key, so it settles at the width the number of concurrent acceptors needs.
    """

    def __init__(self, minimum: int = MIN_PICK_WINDOW, maximum: int = PICK_RANGE_LIMIT) -> None:
        self.minimum = minimum
        self.maximum = maximum
        self.size = minimum
        self._lock = threading.Lock()

    def widen(self) -> None:
        """An accept conflicted: double the window (at most ``maximum``)."""
        with self._lock:
            self.size = min(self.maximum, self.size * 2)

    def narrow(self) -> None:
        """An accept committed without conflict: one key narrower (at least ``minimum``)."""
        if self.size > self.minimum:  # settled at the minimum, the usual case: no lock needed
            with self._lock:
                if self.size > self.minimum:
                    self.size -= 1


def dequeue(
    tr: Transaction,
    keys: Keys,
    job_type: JobType,
    max_sched_time: int,
    rng: random.Random,
    window: int = PICK_RANGE_LIMIT,
    avoid: tuple[set[bytes], ...] = (),
    picked: tuple[set[bytes], ...] = (),
) -> tuple[str, int] | None | bool:
    """Take a random eligible pending key (scheduled time <= ``max_sched_time``) off the queue.

    Parameters:
        window: how many of the first eligible keys to pick among (see :class:`PickWindow`).
        avoid: sets of keys other accepts of this process are taking (or just took): none
            of those is picked, since two accepts of one key cannot both commit.
        picked: sets the key picked is added to, at once (another thread may pick next).

    Returns:
        ``(job_id, scheduled_time)`` of the key cleared, None if nothing is eligible, or
        False if every eligible key read is one to avoid (nothing was cleared).
    """
    begin, _ = keys.pending_range(job_type)
    end = keys.pending_end(job_type, max_sched_time)
    # A snapshot read: it adds no conflict range, so acceptors that picked *different* keys
    # never conflict with each other ...
    kvs = tr.snapshot.get_range(begin, end, limit=max(1, min(window, PICK_RANGE_LIMIT)))
    if not kvs:
        return None
    # Acceptors of one process see each other's picks: they need not meet at the commit.
    if avoid:
        candidates = []
        for k, _ in kvs:
            for keys_ in avoid:
                if k in keys_:
                    break
            else:
                candidates.append(k)
        if not candidates:
            return False
        key = candidates[rng.randrange(len(candidates))]
    else:
        key = kvs[rng.randrange(len(kvs))][0]
    for keys_ in picked:
        keys_.add(key)
    # ... and this explicit conflict key makes two acceptors that picked the *same* key
    # conflict: the second commit fails with 1020 and its retry picks again, so a job
    # is never handed to two workers.
    tr.add_read_conflict_key(key)
    tr.clear(key)
    scheduled_time, job_id = keys.parse_pending(job_type, key)
    return job_id, scheduled_time


def dequeue_no_schedule(tr: Transaction, keys: Keys, job_type: JobType, rng: random.Random) -> tuple[str, int] | None:
    """Take a scheduled-time-0 pending key next to a random id (couch_jobs' ``no_schedule``).

    Without reading a range first: a random UUID is placed among the ids and the key just
    before or after it (a coin flip decides which side is tried first, so neither end of the
    id space starves) is taken. Meant for types whose ids are themselves random.
    """
    prefix = keys.pending_prefix(job_type, 0)
    probe = prefix + tuples.pack((uuid.UUID(int=rng.getrandbits(128)).hex,))
    selectors = [KeySelector.first_greater_or_equal(probe), KeySelector.last_less_or_equal(probe)]
    if rng.random() < 0.5:
        selectors.reverse()
    for selector in selectors:
        key = tr.snapshot.get_key(selector)
        if key.startswith(prefix) and len(key) > len(prefix):
            tr.add_read_conflict_key(key)
            tr.clear(key)
            scheduled_time, job_id = keys.pending_key_parts(key)
            return job_id, scheduled_time
    return None


def remove(tr: Transaction, keys: Keys, job_type: JobType, scheduled_time: int, job_id: str) -> None:
    tr.clear(keys.pending(job_type, scheduled_time, job_id))


def earliest_scheduled_time(tr: Transaction, keys: Keys, job_type: JobType) -> int | None:
    """The smallest scheduled time in the queue (snapshot read), or None if it is empty."""
    begin, end = keys.pending_range(job_type)
    kvs = tr.snapshot.get_range(begin, end, limit=1)
    if not kvs:
        return None
    return keys.pending_key_parts(kvs[0][0])[0]


def watch_pending(tr: Transaction, keys: Keys, job_type: JobType) -> Watch:
    """A watch on the type's pending counter: it fires when any job of the type is enqueued."""
    return tr.watch(keys.watches_pending(job_type))


def count(tr: Transaction, keys: Keys, job_type: JobType, max_sched_time: int, limit: int) -> int:
    """Pending keys with scheduled time <= ``max_sched_time``, at most ``limit`` (snapshot read)."""
    begin, _ = keys.pending_range(job_type)
    end = keys.pending_end(job_type, max_sched_time)
    return len(tr.snapshot.get_range(begin, end, limit=limit))
