"""The store seam: a transactional ordered key-value store with FoundationDB's semantics.

The job layer is written once against these classes. Every store (``memory:``,
``sqlite:PATH``, ``fdb:``) provides a :class:`Store` whose transactions behave as
FoundationDB's do: reads come from one snapshot, writes are buffered and visible to the
transaction's own later reads, commit fails with 1020 when a key the transaction read (not
as a snapshot read) was written by another transaction that committed after its read
version, and the retry loop in :meth:`Store.transact` runs the body again for FoundationDB's
retryable error set.
"""

from __future__ import annotations

import abc
import logging
import random
import time
from dataclasses import dataclass
from typing import Callable, Iterable, TypeVar

from smoosh.store.errors import (
    DATABASE_LOCKED,
    TRANSACTION_TIMED_OUT,
    StoreError,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

#: FoundationDB's default number of retries before the loop gives up (fabric2 uses 100).
DEFAULT_RETRY_LIMIT = 100
#: Total time (seconds) the retry loop may spend before raising 1031 transaction_timed_out.
DEFAULT_TIMEOUT_S = 60.0
#: First backoff delay (seconds) after a retryable error; doubled on each retry.
INITIAL_BACKOFF_S = 0.01
#: Ceiling (seconds) of the retry backoff, FoundationDB's ``max_retry_delay`` default.
MAX_BACKOFF_S = 1.0

#: FoundationDB's limits; the embedded stores enforce them so code that works here works there.
#: Maximum bytes of "affected data" in one transaction (2101 beyond it).
TRANSACTION_SIZE_LIMIT_BYTES = 10_000_000
#: Maximum key length in bytes (2102 beyond it).
KEY_SIZE_LIMIT_BYTES = 10_000
#: Maximum value length in bytes (2103 beyond it).
VALUE_SIZE_LIMIT_BYTES = 100_000
#: Age (seconds) after which a transaction's reads and commit fail with 1007.
TRANSACTION_MAX_AGE_S = 5.0
#: Maximum outstanding watches per store handle (1032 beyond it).
MAX_WATCHES = 10_000


@dataclass(frozen=True)
class KeySelector:
    """A FoundationDB key selector: the last key ``< key`` (``<=`` if ``or_equal``), moved ``offset`` keys.

    Resolving a selector off the start of the keyspace gives ``b""``; off the end, ``b"\\xff"``.
    """

    key: bytes
    or_equal: bool
    offset: int

    @classmethod
    def last_less_than(cls, key: bytes) -> KeySelector:
        """The greatest key strictly less than ``key``."""
        return cls(key, False, 0)

    @classmethod
    def last_less_or_equal(cls, key: bytes) -> KeySelector:
        """The greatest key less than or equal to ``key``."""
        return cls(key, True, 0)

    @classmethod
    def first_greater_than(cls, key: bytes) -> KeySelector:
        """The least key strictly greater than ``key``."""
        return cls(key, True, 1)

    @classmethod
    def first_greater_or_equal(cls, key: bytes) -> KeySelector:
        """The least key greater than or equal to ``key``."""
        return cls(key, False, 1)

    def __add__(self, offset: int) -> KeySelector:
        return KeySelector(self.key, self.or_equal, self.offset + offset)

    def __sub__(self, offset: int) -> KeySelector:
        return KeySelector(self.key, self.or_equal, self.offset - offset)


class Watch(abc.ABC):
    """A watch on one key: ready once the key's value differs from what the transaction saw.

    A watch starts tracking other transactions' changes only when the transaction that created
    it commits. Errors (the creating transaction's commit error, 1025 if it never committed,
    1101 after :meth:`cancel`) are raised by :meth:`wait`.
    """

    @abc.abstractmethod
    def wait(self, timeout: float | None = None) -> bool:
        """Block until the watch fires or ``timeout`` seconds pass.

        Returns:
            True if the watched key changed, False on timeout.

        Raises:
            StoreError: the watch failed or was cancelled (1101).
        """

    @abc.abstractmethod
    def is_ready(self) -> bool:
        """Whether the watch has fired (or failed) without blocking."""

    @abc.abstractmethod
    def cancel(self) -> None:
        """Stop watching; later :meth:`wait` calls raise 1101 operation_cancelled."""


class ReadView(abc.ABC):
    """The read calls a transaction offers; ``tr.snapshot`` offers the same without conflicts."""

    @abc.abstractmethod
    def get(self, key: bytes) -> bytes | None:
        """The value of ``key`` as this transaction sees it, or None if absent."""

    @abc.abstractmethod
    def get_key(self, selector: KeySelector) -> bytes:
        """Resolve ``selector`` to a key (``b""`` / ``b"\\xff"`` off either end)."""

    @abc.abstractmethod
    def get_range(
        self,
        begin: bytes | KeySelector,
        end: bytes | KeySelector,
        limit: int = 0,
        reverse: bool = False,
    ) -> list[tuple[bytes, bytes]]:
        """Key-value pairs with ``resolve(begin) <= key < resolve(end)``, in key order.

        Plain byte keys mean ``first_greater_or_equal``. ``limit`` 0 means no limit; with
        ``reverse`` the pairs come highest key first and ``limit`` counts from the end.
        """

    def get_range_startswith(
        self, prefix: bytes, limit: int = 0, reverse: bool = False
    ) -> list[tuple[bytes, bytes]]:
        """Every pair whose key starts with ``prefix``."""
        return self.get_range(prefix, strinc(prefix), limit=limit, reverse=reverse)


class Transaction(ReadView):
    """One FoundationDB-style transaction. Not thread-safe: one thread uses it at a time."""

    #: The same reads, adding no read conflict ranges.
    snapshot: ReadView

    @abc.abstractmethod
    def set(self, key: bytes, value: bytes) -> None:
        """Write ``key`` = ``value`` (2102 / 2103 beyond the size limits)."""

    @abc.abstractmethod
    def clear(self, key: bytes) -> None:
        """Delete ``key`` (no error if absent)."""

    @abc.abstractmethod
    def clear_range(self, begin: bytes, end: bytes) -> None:
        """Delete every key in ``[begin, end)``."""

    def clear_range_startswith(self, prefix: bytes) -> None:
        """Delete every key that starts with ``prefix``."""
        self.clear_range(prefix, strinc(prefix))

    @abc.abstractmethod
    def add(self, key: bytes, param: bytes) -> None:
        """Atomic little-endian add of ``param`` to the value (width ``len(param)``, wraps).

        Adds a write conflict, never a read conflict.
        """

    @abc.abstractmethod
    def set_versionstamped_key(self, key: bytes, value: bytes) -> None:
        """Set a key whose 10 bytes at the offset in its 4-byte little-endian trailer become the commit's stamp."""

    @abc.abstractmethod
    def set_versionstamped_value(self, key: bytes, value: bytes) -> None:
        """Set ``key`` to a value whose 10 bytes at the trailer's offset become the commit's stamp."""

    @abc.abstractmethod
    def add_read_conflict_key(self, key: bytes) -> None:
        """Make the commit fail (1020) if another transaction writes ``key`` after this one's read version."""

    @abc.abstractmethod
    def add_read_conflict_range(self, begin: bytes, end: bytes) -> None:
        """As :meth:`add_read_conflict_key`, for every key in ``[begin, end)``."""

    @abc.abstractmethod
    def watch(self, key: bytes) -> Watch:
        """A watch on ``key``, active once this transaction commits."""

    @abc.abstractmethod
    def commit(self) -> None:
        """Commit the buffered writes; raises StoreError (1020 on conflict, 1007 if too old, ...)."""

    @abc.abstractmethod
    def reset(self) -> None:
        """Discard reads, writes and watches (uncommitted watches fail with 1025) and start afresh."""

    @abc.abstractmethod
    def cancel(self) -> None:
        """Abandon the transaction; uncommitted watches fail with 1025."""

    @abc.abstractmethod
    def get_versionstamp(self) -> bytes:
        """The 10-byte versionstamp of this transaction's commit; call after a committed write.

        Raises:
            StoreError: 2000 client_invalid_operation before commit or for a read-only commit.
        """

    @property
    @abc.abstractmethod
    def has_writes(self) -> bool:
        """Whether the transaction holds any mutation (a read-only transaction commits nothing)."""


class Store(abc.ABC):
    """A handle on one store. Thread-safe: any number of threads may run transactions at once."""

    #: The URL the store was opened with, e.g. ``sqlite:var/smoosh/jobs.db``.
    url: str

    @abc.abstractmethod
    def create_transaction(self) -> Transaction:
        """A new transaction at the store's current read version."""

    def close(self) -> None:
        """Release the store's resources (threads, connections). Idempotent."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def transact(
        self,
        fn: Callable[[Transaction], T],
        *,
        retry_limit: int = DEFAULT_RETRY_LIMIT,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> T:
        """Run ``fn(tr)`` in a transaction and commit it, retrying as FoundationDB's loop does.

        The body may run more than once: it must not have side effects outside the
        transaction that break when repeated.

        Parameters:
            fn: the body; its return value is returned after a successful commit.
            retry_limit: how many retries before the last retryable error is raised.
            timeout_s: total seconds before 1031 transaction_timed_out.

        Raises:
            StoreError: a non-retryable error, the retry limit, or the timeout.
        """
        deadline = time.monotonic() + timeout_s
        backoff_s = INITIAL_BACKOFF_S
        retries = 0
        warned_locked = False
        tr = self.create_transaction()
        while True:
            try:
                result = fn(tr)
                tr.commit()
                return result
            except StoreError as e:
                if not e.retryable or retries >= retry_limit:
                    tr.cancel()
                    raise
                if time.monotonic() >= deadline:
                    tr.cancel()
                    raise StoreError(TRANSACTION_TIMED_OUT) from e
                retries += 1
                if e.code == DATABASE_LOCKED and not warned_locked:
                    # Another process has held the store's write lock for a whole busy
                    # timeout: worth an operator's attention once, not once per retry.
                    warned_locked = True
                    log.warning("%s; retrying for up to %.0f s more", e, max(0.0, deadline - time.monotonic()))
                else:
                    log.debug("retrying transaction after %s (retry %d)", e, retries)
                # Full jitter keeps a crowd of conflicting workers from retrying in lockstep.
                time.sleep(min(backoff_s, max(0.0, deadline - time.monotonic())) * random.random())
                backoff_s = min(backoff_s * 2, MAX_BACKOFF_S)
                tr.reset()
            except BaseException:
                tr.cancel()
                raise


def strinc(key: bytes) -> bytes:
    """The first key that does not start with ``key`` (FoundationDB's ``strinc``).

    Raises:
        ValueError: ``key`` is empty or all ``0xff`` bytes.
    """
    stripped = key.rstrip(b"\xff")
    if not stripped:
        raise ValueError("key must contain at least one byte other than 0xFF")
    return stripped[:-1] + bytes([stripped[-1] + 1])


def wait_any(watches: Iterable[Watch], timeout: float | None = None) -> bool:
    """Block until any of ``watches`` is ready or ``timeout`` passes; True if one is ready.

    A portable fallback (polls every 10 ms); stores may provide something better.
    """
    watches = list(watches)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        if any(w.is_ready() for w in watches):
            return True
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
