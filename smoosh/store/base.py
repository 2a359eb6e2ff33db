"""The store seam: a transactional ordered key-value store with FoundationDB's semantics.

The job layer is written once against these classes. Every store (``memory:``,
``sqlite:PATH``, ``fdb:``) provides a :class:`Store` whose transactions behave as
FoundationDB's do: reads come from one snapshot, writes are buffered and visible to the
transaction's own later reads, commit fails with 1020 when a key the transaction read (not
as a snapshot read) was written by another transaction that committed after its read
version, and the retry loop in :meth:`Store.transact` runs the body again for FoundationDB's
retryable error set.

The retry loop is written once, here. A store supplies two primitives for it:
:meth:`Transaction.on_error` (FoundationDB's: back off and reset for a retryable error,
raise anything else; the ``fdb:`` store hands it to the binding) and
:meth:`Transaction.set_retry_options` (the transaction's timeout and backoff ceiling).

Where errors surface is FoundationDB's rule, on every store (the client library's, as a real
cluster showed; the embedded stores follow it so code written against them meets each error
at the same line as on a cluster):

* A write (``set``, ``clear``, ``clear_range``, ``add``, the versionstamped sets) never raises
  at the call, except ``TypeError`` for a key or value that is not bytes. Its error is
  *deferred*: a key over 10,000 bytes (2102), a value over 100,000 bytes (2103), a key at or
  after ``b"\xff"`` (2004), ``clear_range(b, a)`` with ``b > a`` (2005), a versionstamp
  operand without room for the stamp (2000). The first deferred error is kept and every
  later write of the attempt is ignored; each read (``get``, ``get_key``, ``get_range``, the
  snapshot's too) and ``commit`` raises it, and a ``watch`` fails with it. ``reset`` and a
  successful ``on_error`` clear it. ``clear`` of a key over 10,000 bytes is no error at all:
  no such key can exist, so there is nothing to clear.
* ``add_read_conflict_range(b, a)`` with ``b > a`` raises 2005 at the call (the C API
  checks it before anything is deferred).
* A transaction is *cancelled* by :meth:`Transaction.cancel` and by an ``on_error`` that
  raises (FoundationDB at API version 610 and later): from then on every read, ``watch``,
  ``commit`` and ``on_error`` raises 1025 ``transaction_cancelled`` (writes are ignored), until
  ``reset``.
* ``on_error`` retries :data:`~smoosh.store.errors.ON_ERROR_RETRYABLE`: FoundationDB's
  retryable set without 1039, which a native transaction's ``onError`` raises. The retry loop
  never hands it 1039 or 1031 (:meth:`Store.transact`).
"""

from __future__ import annotations

import abc
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, TypeVar

from smoosh.store.errors import (
    DATABASE_LOCKED,
    ON_ERROR_RETRYABLE,
    TRANSACTION_TIMED_OUT,
    StoreError,
)
from smoosh.store.retry import MAX_RETRY_DELAY_S, Backoff, RetryStats

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Retries before the loop gives up and raises the last error (fabric2's ``retry_limit``).
DEFAULT_RETRY_LIMIT = 100
#: Total time (seconds) the retry loop may spend before raising 1031 transaction_timed_out
#: (fabric2's transaction ``timeout``).
DEFAULT_TIMEOUT_S = 60.0

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

    @abc.abstractmethod
    def on_settled(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` once the watch has fired, failed or been cancelled (at once if it has).

        ``fn`` runs on whichever thread settles the watch (a committer, a poller, the
        client library's network thread), so it must not block: hand the news on and return.
        This lets one loop follow many watches without a thread blocked on each.
        """


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
    #: Whether :meth:`set_retry_options`'s ``timeout_s`` means anything to this transaction
    #: (the embedded stores leave the deadline to the retry loop, which then need not call
    #: it for a transaction that keeps the default backoff ceiling).
    uses_timeout: bool = True

    @abc.abstractmethod
    def set(self, key: bytes, value: bytes) -> None:
        """Write ``key`` = ``value``; beyond the limits (2102, 2103, 2004) the error is deferred.

        Deferred, as every write's error is: the next read or the commit raises it (see the
        module docstring).
        """

    @abc.abstractmethod
    def clear(self, key: bytes) -> None:
        """Delete ``key`` (no error if absent, nor if longer than any key can be; 2004 deferred)."""

    @abc.abstractmethod
    def clear_range(self, begin: bytes, end: bytes) -> None:
        """Delete every key in ``[begin, end)``; 2005 deferred if ``begin > end``."""

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
        """Discard reads, writes, a deferred error and watches (uncommitted watches fail with 1025) and start afresh."""

    @abc.abstractmethod
    def cancel(self) -> None:
        """Abandon the transaction: uncommitted watches fail with 1025, and so does every later
        read, ``watch``, ``commit`` and ``on_error`` until :meth:`reset`."""

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

    @property
    def deferred_error(self) -> StoreError | None:
        """The error a write of this attempt deferred, which the next read or commit raises.

        None when there is none, or when the store does not say: the ``fdb:`` binding keeps
        it inside the client library and only raises it. A wrapper that acts before the
        commit (the fault-injecting store) asks, so that the deferred error comes first, as
        it does on a cluster.
        """
        return None

    def set_retry_options(self, *, timeout_s: float | None = None, max_retry_delay_s: float = MAX_RETRY_DELAY_S) -> None:
        """FoundationDB's ``timeout`` and ``max_retry_delay`` transaction options.

        Parameters:
            timeout_s: seconds after which the transaction's operations fail with 1031
                (None: no limit). The embedded stores leave the deadline to the retry loop.
            max_retry_delay_s: ceiling of :meth:`on_error`'s backoff.
        """
        self._max_retry_delay_s = max_retry_delay_s
        self._backoff: Backoff | None = None  # made by the first on_error

    def on_error(self, error: StoreError) -> None:
        """FoundationDB's ``on_error``: for a retryable error, back off and reset; else raise and cancel.

        Retryable means :data:`~smoosh.store.errors.ON_ERROR_RETRYABLE`, what a native
        FoundationDB transaction's ``onError`` retries: neither 1031 nor 1039 is in it (the
        retry loop retries both on a fresh transaction). The backoff grows with each call on
        the same transaction (see :class:`~smoosh.store.retry.Backoff`). An ``on_error`` that
        raises leaves the transaction cancelled, as FoundationDB's does at API version 610 and
        later: every later call raises 1025 until :meth:`reset`.

        Raises:
            StoreError: ``error`` itself when it is not retryable; 1025 on a cancelled
                transaction (each store checks that first).
        """
        if error.code not in ON_ERROR_RETRYABLE:
            self.cancel()
            raise error
        backoff = self.__dict__.get("_backoff")
        if backoff is None:
            backoff = self._backoff = Backoff(self.__dict__.get("_max_retry_delay_s", MAX_RETRY_DELAY_S))
        backoff.wait()
        self.reset()


class Store(abc.ABC):
    """A handle on one store. Thread-safe: any number of threads may run transactions at once."""

    #: The URL the store was opened with, e.g. ``sqlite:var/smoosh/jobs.db``.
    url: str
    #: Whether a commit may end in an error although it committed (FoundationDB's 1021, a
    #: timeout after the commit). Callers that must give one answer either way (the job
    #: layer's transaction ids) pay for it only where it can happen. The embedded stores
    #: commit locally: SQLite's COMMIT either commits or reports that it did not.
    commit_outcome_may_be_unknown: bool = True

    @abc.abstractmethod
    def create_transaction(self) -> Transaction:
        """A new transaction at the store's current read version."""

    def close(self) -> None:
        """Release the store's resources (threads, connections). Idempotent."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def retry_stats(self) -> RetryStats:
        """Counts of what this handle's retry loops retried (see :class:`~smoosh.store.retry.RetryStats`)."""
        stats: RetryStats | None = self.__dict__.get("_retry_stats")
        if stats is None:
            with _STATS_LOCK:
                stats = self.__dict__.setdefault("_retry_stats", RetryStats())
                assert stats is not None
        return stats

    def transact(
        self,
        fn: Callable[[Transaction], T],
        *,
        retry_limit: int = DEFAULT_RETRY_LIMIT,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_retry_delay_s: float = MAX_RETRY_DELAY_S,
        on_retry: Callable[[StoreError], None] | None = None,
    ) -> T:
        """Run ``fn(tr)`` in a transaction and commit it, retrying as FoundationDB defines it.

        After an error of :data:`~smoosh.store.errors.ON_ERROR_RETRYABLE` the transaction's
        :meth:`~Transaction.on_error` backs off (exponentially, at most ``max_retry_delay_s``)
        and resets it; after 1031 (an attempt that timed out) or 1039 (the cluster's protocol
        version changed, which a native transaction's ``on_error`` raises) the loop backs off
        the same way and starts a fresh transaction. Any other error is raised at once, with
        its code. The body may thus run more than once: it must not have side effects outside
        the transaction that break when repeated. After 1021, 1031 or 1039 an attempt may have committed although
        it reported failure: a body that is not idempotent must find out itself (the job
        layer writes a transaction id with every write, see ``smoosh.jobs.txids``), and
        ``on_retry`` tells it when.

        Parameters:
            fn: the body; its return value is returned after a successful commit.
            retry_limit: retries before the last retryable error is raised.
            timeout_s: total seconds before 1031 transaction_timed_out (also the ``fdb:``
                transaction's own timeout, so a stalled read or commit cannot outlive it).
            max_retry_delay_s: ceiling of the backoff between retries.
            on_retry: called with the error before each retry.

        Raises:
            StoreError: a non-retryable error, the last error at the retry limit, or 1031
                once ``timeout_s`` has passed.
        """
        deadline = time.monotonic() + timeout_s
        retries = 0
        warned_locked = False
        fresh_backoff: Backoff | None = None
        tr = self._loop_transaction(timeout_s, max_retry_delay_s)
        try:
            while True:
                try:
                    result = fn(tr)
                    tr.commit()
                except StoreError as e:
                    if not e.loop_retryable or retries >= retry_limit:
                        if retries and e.loop_retryable:
                            self.retry_stats.record_end(retries, gave_up=True)
                        raise
                    remaining_s = deadline - time.monotonic()
                    if remaining_s <= 0:
                        self.retry_stats.record_end(retries, gave_up=True)
                        raise StoreError(TRANSACTION_TIMED_OUT) from e
                    retries += 1
                    self.retry_stats.record_retry(e.code, e.maybe_committed)
                    if e.code == DATABASE_LOCKED and not warned_locked:
                        # Another process has held the store's write lock for a whole busy
                        # timeout: worth an operator's attention once, not once per retry.
                        warned_locked = True
                        log.warning("%s; retrying for up to %.0f s more", e, remaining_s)
                    else:
                        log.debug("retrying transaction after %s (retry %d)", e, retries)
                    if on_retry is not None:
                        on_retry(e)
                    if e.code in ON_ERROR_RETRYABLE:
                        tr.on_error(e)
                    else:
                        # 1031 and 1039: on_error would raise them and cancel the transaction
                        # (1039 on a cluster without an external client); the attempt is spent.
                        tr.cancel()
                        if fresh_backoff is None:
                            fresh_backoff = Backoff(max_retry_delay_s)
                        fresh_backoff.wait(deadline - time.monotonic())
                        tr = self._loop_transaction(deadline - time.monotonic(), max_retry_delay_s)
                    continue
                if retries:
                    self.retry_stats.record_end(retries)
                return result
        except BaseException:
            tr.cancel()
            raise

    def _loop_transaction(self, timeout_s: float, max_retry_delay_s: float) -> Transaction:
        tr = self.create_transaction()
        if tr.uses_timeout or max_retry_delay_s != MAX_RETRY_DELAY_S:
            tr.set_retry_options(timeout_s=max(timeout_s, 0.001), max_retry_delay_s=max_retry_delay_s)
        return tr


_STATS_LOCK = threading.Lock()


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
