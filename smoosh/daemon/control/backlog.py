"""The backlog controller: how many compactions run at once follows the backlog, and backs off on harm.

ScyllaDB and Redpanda derive their compaction shares from the backlog; a constant ``max_jobs``
runs as many compactions for 3 bytes waiting as for 300 GB, and keeps on when the application
is hurting. So the node's slots (the global gate every start passes) are set here, between
``min_jobs`` and ``max_jobs``, every status interval:

* **the backlog** (the reclaimable bytes of the keys waiting in every channel, from their last
  measurements, and what the running compactions have still to give back) asks for
  ``min_jobs`` plus a share of the rest proportional to it, all of them at ``backlog_full``
  and above; with nothing waiting it leaves every slot open (they run nothing), so a burst
  that arrives between two looks is not held to ``min_jobs`` until the next;
* **harm** (compactions that gave up on a busy database since the last look: the application
  was holding its lock, and smoosh's VACUUM made it wait or would have; and incremental chunks
  that found the application holding the write lock when they wanted it) halves the slots at
  once, down to ``min_jobs``; each quiet interval after gives one back (additive increase,
  multiplicative decrease, as TCP does with its window).

The slots are ``min(backlog's, harm's)``.

The same two inputs set the **pace** of incremental compaction on a database the application
has open: after each short chunk the write lock stays free for ``chunk_gap_factor`` times as
long as the chunk held it (see :mod:`smoosh.compactors.sqlite_incremental`). A small backlog
has no hurry and leaves the application the lock :data:`GAP_FACTOR_GENTLE` times as long; a
full one :data:`GAP_FACTOR_BRISK` times (geometric between them, so each doubling of the
backlog shortens the gap by the same step); harm doubles the gap at once and each quiet
interval halves it back (the same AIMD as the slots, on the pace).

Its inputs and outputs are gauges (``smoosh_backlog_bytes``, ``smoosh_controller_slots``,
``smoosh_controller_busy``, ``smoosh_controller_lock_waits``,
``smoosh_controller_chunk_gap_ratio``) and part of ``/status``. A change of the slots is logged
at INFO, naming why (at DEBUG while nothing waits).

Owner: the server's loop (:meth:`BacklogController.step`, from the housekeeping); readers read
the last :class:`Decision`, replaced whole.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

__all__ = ["BacklogController", "Decision", "GAP_FACTOR_BRISK", "GAP_FACTOR_GENTLE", "GAP_FACTOR_MAX"]

#: The gap after an incremental chunk on a shared database, as a multiple of the chunk's lock
#: hold, with almost nothing waiting: there is no hurry, and a chunk every few seconds meets
#: far fewer than 1% of a busy application's commits, so its p99 stays its own (the aim:
#: within 10% of its p99 without smoosh). The compactor caps one gap at a few seconds.
GAP_FACTOR_GENTLE = 512.0
#: The same at ``backlog_full`` and above: the pace a daemon had before it had a controller
#: (``smoosh worker`` keeps it), whose cost to a writer ``bench/writer.py`` measures.
GAP_FACTOR_BRISK = 4.0
#: The longest gap harm can stretch it to (the compactor also caps one gap).
GAP_FACTOR_MAX = 1024.0

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Decision:
    """One step of the controller: what it saw and what it set."""

    #: Reclaimable bytes waiting in the channels.
    backlog_bytes: int
    #: Busy results (harm) since the step before.
    busy: int
    #: The slots the backlog asks for.
    for_backlog: int
    #: The slots harm allows.
    for_harm: int
    #: The slots in force: ``min(for_backlog, for_harm)``.
    slots: int
    #: The pace of shared incremental chunks: the lock stays free this many times as long as a
    #: chunk held it.
    chunk_gap_factor: float = GAP_FACTOR_BRISK
    #: Lock waits (harm: a chunk found the application holding the write lock) since the step before.
    lock_waits: int = 0


class BacklogController:
    """Sets the node's slots from the backlog and from harm (see the module docstring).

    Parameters:
        min_jobs: the fewest slots (at least 1 while anything waits).
        max_jobs: the most slots.
        backlog_full_bytes: the backlog at which every slot runs.
    """

    def __init__(self, *, min_jobs: int, max_jobs: int, backlog_full_bytes: int) -> None:
        self.max_jobs = self._harm_cap = max(1, max_jobs)
        self._busy_seen: int | None = None
        self._waits_seen: int | None = None
        # Harm's stretch of the pace: 1 when quiet, doubled by each interval with harm.
        self._harm_stretch = 1.0
        self.configure(min_jobs=min_jobs, max_jobs=max_jobs, backlog_full_bytes=backlog_full_bytes)
        # Every slot until the first look: a daemon that starts on a fleet drains it as before,
        # and a small backlog brings the slots down at the first status interval.
        self.last = Decision(0, 0, self.max_jobs, self.max_jobs, self.max_jobs, GAP_FACTOR_BRISK)

    def configure(self, *, min_jobs: int, max_jobs: int, backlog_full_bytes: int) -> None:
        """Apply new bounds (live reload); the next :meth:`step` uses them.

        A harm cap at the old maximum (no harm seen lately) moves to the new one; a lowered one stays.
        """
        unharmed = self._harm_cap >= self.max_jobs
        self.max_jobs = max(1, max_jobs)
        self.min_jobs = max(1, min(min_jobs, self.max_jobs))
        self.backlog_full_bytes = max(1, backlog_full_bytes)
        self._harm_cap = self.max_jobs if unharmed else min(max(self._harm_cap, self.min_jobs), self.max_jobs)

    def step(self, backlog_bytes: int, busy_total: int, lock_waits_total: int = 0) -> Decision:
        """Look once: ``backlog_bytes`` waiting now; ``busy_total`` busy results and ``lock_waits_total`` lock waits since start.

        Returns:
            The decision; its ``slots`` is what the node's gate should allow.
        """
        busy = 0 if self._busy_seen is None else max(0, busy_total - self._busy_seen)
        self._busy_seen = busy_total
        waits = 0 if self._waits_seen is None else max(0, lock_waits_total - self._waits_seen)
        self._waits_seen = lock_waits_total
        if busy or waits:
            self._harm_cap = max(self.min_jobs, self._harm_cap // 2)
            self._harm_stretch = min(GAP_FACTOR_MAX / GAP_FACTOR_BRISK, self._harm_stretch * 2)
        else:
            if self._harm_cap < self.max_jobs:
                self._harm_cap += 1
            self._harm_stretch = max(1.0, self._harm_stretch / 2)
        share = min(1.0, max(0, backlog_bytes) / self.backlog_full_bytes)
        if backlog_bytes > 0:
            for_backlog = min(self.max_jobs, self.min_jobs + math.ceil(share * (self.max_jobs - self.min_jobs)))
        else:
            # Nothing waits: the slots run nothing either way, and a burst arriving before the
            # next look (a fleet found at start, a batch after a quiet hour) must not be held to
            # min_jobs until then; the look after it sizes them to what then waits.
            for_backlog = self.max_jobs
        slots = max(self.min_jobs, min(for_backlog, self._harm_cap))
        gap = GAP_FACTOR_GENTLE * (GAP_FACTOR_BRISK / GAP_FACTOR_GENTLE) ** share
        gap = min(GAP_FACTOR_MAX, gap * self._harm_stretch)
        decision = Decision(int(backlog_bytes), busy, for_backlog, self._harm_cap, slots, round(gap, 2), waits)
        if slots != self.last.slots:
            if slots < self.last.slots and busy:
                why = f"{busy} compaction(s) gave up on a busy database: backing off"
            elif slots < self.last.slots and waits:
                why = f"{waits} chunk(s) found the application holding the write lock: backing off"
            else:
                why = f"backlog of {backlog_bytes} reclaimable bytes"
            # Said at INFO when it matters: harm, or work waiting; with nothing waiting the slots
            # run nothing either way (a start's first look brings them down so, every time).
            level = logging.INFO if busy or waits or backlog_bytes > 0 else logging.DEBUG
            log.log(level, "Compactions at once: %d -> %d (%s).", self.last.slots, slots, why)
        self.last = decision
        return decision
