"""A histogram as a plain immutable value: what ``smoosh_compaction_duration_seconds`` is built from.

The outcome recorder (one writer, the server's loop thread) replaces a channel's and result's
:class:`Histogram` whole with :meth:`Histogram.observed`; the metrics collector reads it on the
HTTP thread. Replacing one reference is atomic, so a scrape sees every bucket, the count and
the sum of the same observations, never half of an update, and neither side takes a lock or
touches prometheus_client on the hot path.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

__all__ = ["Histogram", "DURATION_BUCKETS_S"]

#: Upper bounds (seconds) of the compaction-duration buckets: a small database's VACUUM takes
#: milliseconds, a large one's hours; roughly a factor of 3 to 5 between bounds keeps the
#: series few (12 per channel and result) while quantiles stay within a bucket's width.
DURATION_BUCKETS_S: tuple[float, ...] = (
    0.01, 0.05, 0.25, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 10800.0, math.inf,
)


@dataclass(frozen=True)
class Histogram:
    """Observations counted per bucket (not cumulative), with their sum.

    Attributes:
        bounds: upper bounds of the buckets, increasing, the last one ``inf``.
        counts: observations per bucket: ``counts[i]`` holds those in ``(bounds[i-1], bounds[i]]``.
        sum: the sum of every observation.
    """

    bounds: tuple[float, ...] = DURATION_BUCKETS_S
    counts: tuple[int, ...] = ()
    sum: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            object.__setattr__(self, "counts", (0,) * len(self.bounds))

    @property
    def count(self) -> int:
        """How many observations."""
        return sum(self.counts)

    def observed(self, value: float) -> Histogram:
        """This histogram with ``value`` added (a new value; this one is unchanged).

        A negative or NaN value (a clock stepped back, or a malformed outcome from another
        process) counts as 0: a histogram's sum must never decrease.
        """
        if not value >= 0.0:
            value = 0.0
        i = bisect.bisect_left(self.bounds, value)  # le: a value equal to a bound belongs to it
        counts = list(self.counts)
        counts[min(i, len(counts) - 1)] += 1
        return Histogram(self.bounds, tuple(counts), self.sum + value)

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, observations <= bound)`` per bucket, as Prometheus exposes them."""
        out: list[tuple[float, int]] = []
        total = 0
        for bound, n in zip(self.bounds, self.counts):
            total += n
            out.append((bound, total))
        return out
