"""A short series for the operators' page: per minute, what compactions gave back and how they ended.

A small ring of fixed buckets (:data:`BUCKETS` of :data:`BUCKET_S` seconds: the last hour), each
holding the bytes reclaimed in it, its compactions by result and the fleet's reclaimable bytes
last seen in it. It is fed by what the daemon already does, never by a timer of its own: the
outcome recorder's counters add each finished compaction (:meth:`Series.count`), and the
status record, built every few seconds anyway, notes the reclaimable bytes it summed
(:meth:`Series.note_reclaimable`). An idle daemon does nothing for it, read or not; a reader
(``GET /series``) costs one copy of the ring.

A bucket is found by its minute since the epoch (wall time: a person reads the chart's times),
modulo the ring's size, and remembers which minute it holds: a bucket left from an older turn of
the ring reads as empty and is reset by its next write, so nothing sweeps the ring. A wall clock
stepped back leaves the minutes after the new "now" out of a read until the ring comes round.

Owner: the server's loop thread writes (both feeds run there); the admin API's threads read. The
lock is the one way in for both; a write holds it for a few assignments.
"""

from __future__ import annotations

import threading
from typing import Any

from channels.ports import RESULTS

__all__ = ["Series", "BUCKET_S", "BUCKETS"]

#: Seconds one bucket covers.
BUCKET_S = 60
#: Buckets kept: the last hour.
BUCKETS = 60


class _Bucket:
    __slots__ = ("minute", "reclaimed_bytes", "compactions", "reclaimable_bytes")

    def __init__(self, minute: int) -> None:
        self.minute = minute
        self.reclaimed_bytes = 0
        self.compactions: dict[str, int] = {}
        self.reclaimable_bytes: int | None = None


class Series:
    """The ring (see the module docstring).

    Parameters:
        bucket_s: seconds per bucket.
        buckets: buckets kept.
    """

    def __init__(self, bucket_s: int = BUCKET_S, buckets: int = BUCKETS) -> None:
        if bucket_s < 1 or buckets < 1:
            raise ValueError(f"a series needs bucket_s >= 1 and buckets >= 1, not {bucket_s} and {buckets}")
        self.bucket_s = bucket_s
        self.size = buckets
        self._lock = threading.Lock()
        self._ring: list[_Bucket | None] = [None] * buckets

    def _bucket_locked(self, wall: float) -> _Bucket:
        minute = int(wall // self.bucket_s)
        i = minute % self.size
        bucket = self._ring[i]
        if bucket is None or bucket.minute != minute:
            bucket = self._ring[i] = _Bucket(minute)
        return bucket

    def count(self, result: str, reclaimed_bytes: int, wall: float) -> None:
        """One finished compaction at ``wall`` (Unix seconds): its result, and the bytes it gave back (0 unless ok)."""
        with self._lock:
            bucket = self._bucket_locked(wall)
            bucket.compactions[result] = bucket.compactions.get(result, 0) + 1
            bucket.reclaimed_bytes += max(0, reclaimed_bytes)

    def add_reclaimed(self, reclaimed_bytes: int, wall: float) -> None:
        """Bytes given back at ``wall`` outside a compaction's own end (a blocked run's WAL checkpointed later)."""
        with self._lock:
            self._bucket_locked(wall).reclaimed_bytes += max(0, reclaimed_bytes)

    def note_reclaimable(self, reclaimable_bytes: int, wall: float) -> None:
        """The fleet's reclaimable bytes as the status table summed them at ``wall`` (the bucket keeps the last)."""
        with self._lock:
            self._bucket_locked(wall).reclaimable_bytes = max(0, int(reclaimable_bytes))

    def read(self, wall: float) -> dict[str, Any]:
        """The ring as ``GET /series`` answers, at ``wall`` (Unix seconds).

        Returns:
            ``{"bucket_s", "now", "buckets": [{"at", "reclaimed_bytes", "compactions",
            "reclaimable_bytes"}]}``: every bucket of the last ``size`` ones, oldest first, the
            current one last; ``at`` is its start (Unix seconds); a bucket nothing was written
            to has 0 bytes, 0 compactions and ``reclaimable_bytes`` None. ``compactions`` names
            every result of the vocabulary (:data:`channels.ports.RESULTS`), 0 included.
        """
        now_minute = int(wall // self.bucket_s)
        with self._lock:
            held = {b.minute: (b.reclaimed_bytes, dict(b.compactions), b.reclaimable_bytes)
                    for b in self._ring if b is not None}
        buckets = []
        for minute in range(now_minute - self.size + 1, now_minute + 1):
            reclaimed, compactions, reclaimable = held.get(minute, (0, {}, None))
            buckets.append({"at": minute * self.bucket_s, "reclaimed_bytes": reclaimed,
                            "compactions": {result: compactions.get(result, 0) for result in RESULTS},
                            "reclaimable_bytes": reclaimable})
        return {"bucket_s": self.bucket_s, "now": wall, "buckets": buckets}
