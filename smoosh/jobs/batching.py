"""AIMD batch sizing for the background scans (couch_jobs since 2021-04).

The activity monitor and the notifier work through possibly many rows. One transaction per
row is slow; one transaction for everything trips FoundationDB's limits (2101 too large,
1007 older than 5 s, 1031 timed out). So they work in batches whose size grows by a fixed
step after each success and shrinks by a factor after each of those errors.
"""

from __future__ import annotations

from dataclasses import dataclass

from smoosh.store.errors import (
    TRANSACTION_TIMED_OUT,
    TRANSACTION_TOO_LARGE,
    TRANSACTION_TOO_OLD,
    StoreError,
)

#: First batch size (rows per transaction).
DEFAULT_INITIAL = 1000
#: Rows added to the batch size after each successful batch.
DEFAULT_INCREMENT = 100
#: Factor the batch size is multiplied by after a failed batch (the result is at least 1).
DEFAULT_FACTOR = 0.75
#: Ceiling of the batch size, so a long run of successes cannot grow it without bound.
DEFAULT_MAXIMUM = 10_000
#: Consecutive failed batches after which a scan gives up until its next run.
MAX_CONSECUTIVE_FAILURES = 50
#: Retries the store's loop makes inside one batch before the error reaches the AIMD logic.
BATCH_RETRY_LIMIT = 3

#: Errors that mean "this batch was too big or too slow": shrink and try again.
SHRINK_CODES = frozenset({TRANSACTION_TOO_LARGE, TRANSACTION_TOO_OLD, TRANSACTION_TIMED_OUT})


@dataclass(frozen=True)
class BatchPolicy:
    """How batch sizes start, grow and shrink."""

    initial: int = DEFAULT_INITIAL
    increment: int = DEFAULT_INCREMENT
    factor: float = DEFAULT_FACTOR
    maximum: int = DEFAULT_MAXIMUM

    def grow(self, size: int) -> int:
        """The size after a successful batch."""
        return min(self.maximum, size + self.increment)

    def shrink(self, size: int) -> int:
        """The size after a failed batch (at least 1)."""
        return max(1, int(size * self.factor))


def is_batch_error(error: StoreError) -> bool:
    """Whether a failed batch should shrink and run again (rather than crash the scan)."""
    return error.code in SHRINK_CODES or error.retryable
