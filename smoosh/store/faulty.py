"""``faulty:SEED[:RATE]:INNER`` — a seeded wrapper that injects FoundationDB's errors into any store.

FoundationDB proves itself by injecting faults; this store lets smoosh's retry loop and job
layer be proven the same way on a machine without a cluster. URL forms::

    faulty:42:memory:                  seed 42, the default rate, around memory:
    faulty:7:0.25:sqlite:/path/jobs.db seed 7, a quarter of write commits fail
    faulty:1:0:fdb:                    seed 1, no faults (a transparent wrapper)

``SEED`` is an integer; ``RATE`` (optional, 0 to 1, default :data:`DEFAULT_FAULT_RATE`) is the
chance that a commit with writes fails; ``INNER`` is any other store URL, opened with
:func:`~smoosh.store.open_store` and closed with this store.

What is injected, and when (each decision drawn from one ``random.Random(SEED)``):

* **Before commit** (the inner transaction is not committed): 1020 ``not_committed``, 1007
  ``transaction_too_old``, 1031 ``transaction_timed_out``, 1021 ``commit_unknown_result``.
* **After a real commit** (the inner transaction *has* committed, and the caller is told it
  may not have): 1021, 1031, 1039 ``cluster_version_changed``. Only the "may have committed"
  codes: FoundationDB never reports 1020 or 1007 for a transaction that committed.
* **On reads**: a tenth of the transactions (at ``RATE`` 1) fail at one of their first
  :data:`READ_FAULT_WINDOW` reads with 1007, 1009 ``future_version`` or 1031. Per
  transaction, not per read, as on a cluster: a transaction of a thousand reads is not
  doomed.

Half of the failing commits fail before and half after committing. Read-only commits never
fail (FoundationDB does not send them to the cluster), nor do commits of a transaction whose
write deferred an error: the client raises that before anything reaches the cluster.
:meth:`FaultyStore.inject` forces given faults on the next write commits, for tests that need
one exact fault.

Faults strike only the transactions of :meth:`~smoosh.store.base.Store.transact` (every
transaction smoosh itself runs goes through it): a transaction from a direct
:meth:`create_transaction` is passed through untouched, so a test can set up and inspect
state without tripping over its own faults. :attr:`FaultyStore.faults` counts what was
injected.
"""

from __future__ import annotations

import collections
import random
import threading
from dataclasses import dataclass, field
from typing import Callable, TypeVar

from smoosh.store.base import DEFAULT_RETRY_LIMIT, DEFAULT_TIMEOUT_S, KeySelector, ReadView, Store, Transaction, Watch
from smoosh.store.errors import (
    CLUSTER_VERSION_CHANGED,
    COMMIT_UNKNOWN_RESULT,
    FUTURE_VERSION,
    NOT_COMMITTED,
    TRANSACTION_TIMED_OUT,
    TRANSACTION_TOO_OLD,
    StoreError,
    describe,
)
from smoosh.store.retry import MAX_RETRY_DELAY_S

T = TypeVar("T")

#: Chance that a commit with writes fails, when the URL names no rate.
DEFAULT_FAULT_RATE = 0.1
#: A transaction fails on a read at this fraction of the commit rate.
READ_FAULT_SHARE = 0.1
#: A read fault strikes one of the transaction's first this-many reads.
READ_FAULT_WINDOW = 8
#: Of the failing commits, the share that fail after the inner commit really happened.
AFTER_COMMIT_SHARE = 0.5
#: Errors raised instead of committing.
BEFORE_COMMIT_CODES = (NOT_COMMITTED, TRANSACTION_TOO_OLD, TRANSACTION_TIMED_OUT, COMMIT_UNKNOWN_RESULT)
#: Errors raised after the inner commit succeeded: only those that admit "may have committed".
AFTER_COMMIT_CODES = (COMMIT_UNKNOWN_RESULT, TRANSACTION_TIMED_OUT, CLUSTER_VERSION_CHANGED)
#: Errors a read may raise.
READ_CODES = (TRANSACTION_TOO_OLD, FUTURE_VERSION, TRANSACTION_TIMED_OUT)


@dataclass
class FaultStats:
    """Faults injected so far, per code (all threads)."""

    before_commit: dict[int, int] = field(default_factory=dict)
    after_commit: dict[int, int] = field(default_factory=dict)
    reads: dict[int, int] = field(default_factory=dict)
    #: Write commits that went through without a fault.
    clean_commits: int = 0

    def total(self) -> int:
        """Every fault injected."""
        return sum(self.before_commit.values()) + sum(self.after_commit.values()) + sum(self.reads.values())


class FaultyStore(Store):
    """Wraps ``inner`` and injects errors into the transactions of :meth:`transact`.

    Parameters:
        inner: the store wrapped (closed by :meth:`close` when ``owns_inner``).
        seed: seeds every fault decision.
        rate: chance (0 to 1) that a commit with writes fails; reads fail at a tenth of it.
        after_share: of the failing commits, the share that fail after really committing.
        read_rate: chance that a read fails (None: a tenth of ``rate``).
        url: the URL it was opened with.
        owns_inner: close ``inner`` on :meth:`close`.
        max_retry_delay_s: a ceiling on the retry loop's backoff whatever the caller asks
            (tests that inject thousands of faults keep their sleeps short with it).

    Raises:
        ValueError: a rate or share outside 0 to 1.
    """

    def __init__(
        self,
        inner: Store,
        *,
        seed: int,
        rate: float = DEFAULT_FAULT_RATE,
        after_share: float = AFTER_COMMIT_SHARE,
        read_rate: float | None = None,
        url: str | None = None,
        owns_inner: bool = True,
        max_retry_delay_s: float | None = None,
    ) -> None:
        read_rate = rate * READ_FAULT_SHARE if read_rate is None else read_rate
        for name, value in (("fault rate", rate), ("after-commit share", after_share), ("read fault rate", read_rate)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} {value!r} must be between 0 and 1")
        self.inner = inner
        self.seed = seed
        self.rate = rate
        self.after_share = after_share
        self.read_rate = read_rate
        self.url = url or f"faulty:{seed}:{rate}:{inner.url}"
        self.owns_inner = owns_inner
        self.max_retry_delay_s = max_retry_delay_s
        self.faults = FaultStats()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        #: Faults forced on the next write commits, before any random draw (see :meth:`inject`).
        self._script: collections.deque[tuple[bool, int]] = collections.deque()
        self._local = threading.local()
        #: Whether faults are injected at all (tests switch it off around setup and checks).
        self.enabled = True

    # -- decisions -------------------------------------------------------------------------

    def inject(self, code: int, *, after_commit: bool, times: int = 1) -> None:
        """Make the next ``times`` write commits of :meth:`transact` fail with ``code``.

        Parameters:
            code: the error code to raise.
            after_commit: raise it after really committing (else instead of committing).
            times: how many consecutive write commits fail so.
        """
        with self._lock:
            self._script.extend([(after_commit, code)] * times)

    def _commit_fault(self) -> tuple[bool, int] | None:
        """None, or (after_commit, code)."""
        with self._lock:
            if self._script:
                after, code = self._script.popleft()
                counts = self.faults.after_commit if after else self.faults.before_commit
                counts[code] = counts.get(code, 0) + 1
                return after, code
            if not self.enabled or self._rng.random() >= self.rate:
                self.faults.clean_commits += 1
                return None
            after = self._rng.random() < self.after_share
            codes = AFTER_COMMIT_CODES if after else BEFORE_COMMIT_CODES
            code = codes[self._rng.randrange(len(codes))]
            counts = self.faults.after_commit if after else self.faults.before_commit
            counts[code] = counts.get(code, 0) + 1
            return after, code

    def _read_fault_plan(self) -> tuple[int, int] | None:
        """None, or (the read that fails, counted from 1; its code) for one transaction."""
        with self._lock:
            if not self.enabled or self._rng.random() >= self.read_rate:
                return None
            return 1 + self._rng.randrange(READ_FAULT_WINDOW), READ_CODES[self._rng.randrange(len(READ_CODES))]

    def _read_fault(self, code: int) -> None:
        with self._lock:
            self.faults.reads[code] = self.faults.reads.get(code, 0) + 1
        raise StoreError(code, f"{describe(code)} [injected on a read]")

    # -- the store -----------------------------------------------------------------------------

    def transact(
        self,
        fn: Callable[[Transaction], T],
        *,
        retry_limit: int = DEFAULT_RETRY_LIMIT,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_retry_delay_s: float = MAX_RETRY_DELAY_S,
        on_retry: Callable[[StoreError], None] | None = None,
    ) -> T:
        """:meth:`Store.transact` (the base class's loop), its transactions subject to faults."""
        if self.max_retry_delay_s is not None:
            max_retry_delay_s = min(max_retry_delay_s, self.max_retry_delay_s)
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        try:
            return super().transact(
                fn, retry_limit=retry_limit, timeout_s=timeout_s, max_retry_delay_s=max_retry_delay_s, on_retry=on_retry
            )
        finally:
            self._local.depth = depth

    def create_transaction(self) -> FaultyTransaction:
        """A transaction of the inner store; faulty when created by :meth:`transact`."""
        return FaultyTransaction(self.inner.create_transaction(), self, faulty=getattr(self._local, "depth", 0) > 0)

    def close(self) -> None:
        """Close the inner store (when owned). Idempotent as the inner store's close is."""
        if self.owns_inner:
            self.inner.close()


class _ReadPlan:
    """The read fault planned for one attempt of a transaction (shared by its snapshot view)."""

    __slots__ = ("store", "faulty", "reads", "fail_at", "code")

    def __init__(self, store: FaultyStore, faulty: bool) -> None:
        self.store = store
        self.faulty = faulty
        self.reads = 0
        self.fail_at = 0
        self.code = 0
        self.replan()

    def replan(self) -> None:
        self.reads = 0
        plan = self.store._read_fault_plan() if self.faulty else None
        self.fail_at, self.code = plan if plan is not None else (0, 0)

    def before_read(self) -> None:
        if self.fail_at:
            self.reads += 1
            if self.reads == self.fail_at:
                self.fail_at = 0
                self.store._read_fault(self.code)


class _FaultyReadView(ReadView):
    def __init__(self, inner: ReadView, plan: _ReadPlan) -> None:
        self._inner = inner
        self._plan = plan

    def get(self, key: bytes) -> bytes | None:
        self._plan.before_read()
        return self._inner.get(key)

    def get_key(self, selector: KeySelector) -> bytes:
        self._plan.before_read()
        return self._inner.get_key(selector)

    def get_range(
        self, begin: bytes | KeySelector, end: bytes | KeySelector, limit: int = 0, reverse: bool = False
    ) -> list[tuple[bytes, bytes]]:
        self._plan.before_read()
        return self._inner.get_range(begin, end, limit=limit, reverse=reverse)


class FaultyTransaction(_FaultyReadView, Transaction):
    """An inner transaction whose reads and commit may fail as :mod:`smoosh.store.faulty` says."""

    def __init__(self, inner: Transaction, store: FaultyStore, *, faulty: bool) -> None:
        plan = _ReadPlan(store, faulty)
        super().__init__(inner, plan)
        self._tr = inner
        self._store = store
        self._faulty = faulty
        self.snapshot = _FaultyReadView(inner.snapshot, plan)

    def set(self, key: bytes, value: bytes) -> None:
        self._tr.set(key, value)

    def clear(self, key: bytes) -> None:
        self._tr.clear(key)

    def clear_range(self, begin: bytes, end: bytes) -> None:
        self._tr.clear_range(begin, end)

    def add(self, key: bytes, param: bytes) -> None:
        self._tr.add(key, param)

    def set_versionstamped_key(self, key: bytes, value: bytes) -> None:
        self._tr.set_versionstamped_key(key, value)

    def set_versionstamped_value(self, key: bytes, value: bytes) -> None:
        self._tr.set_versionstamped_value(key, value)

    def add_read_conflict_key(self, key: bytes) -> None:
        self._tr.add_read_conflict_key(key)

    def add_read_conflict_range(self, begin: bytes, end: bytes) -> None:
        self._tr.add_read_conflict_range(begin, end)

    def watch(self, key: bytes) -> Watch:
        return self._tr.watch(key)

    def commit(self) -> None:
        """Commit the inner transaction, or fail before or after doing so (see the module docstring)."""
        if not self._faulty or not self._tr.has_writes or self._tr.deferred_error is not None:
            self._tr.commit()
            return
        fault = self._store._commit_fault()
        if fault is None:
            self._tr.commit()
            return
        after, code = fault
        if not after:
            raise StoreError(code, f"{describe(code)} [injected before commit]")
        self._tr.commit()
        raise StoreError(code, f"{describe(code)} [injected after a real commit]")

    def reset(self) -> None:
        self._tr.reset()
        self._plan.replan()

    def cancel(self) -> None:
        self._tr.cancel()

    def get_versionstamp(self) -> bytes:
        return self._tr.get_versionstamp()

    @property
    def has_writes(self) -> bool:
        return self._tr.has_writes

    @property
    def deferred_error(self) -> StoreError | None:
        return self._tr.deferred_error

    def set_retry_options(self, *, timeout_s: float | None = None, max_retry_delay_s: float = MAX_RETRY_DELAY_S) -> None:
        self._tr.set_retry_options(timeout_s=timeout_s, max_retry_delay_s=max_retry_delay_s)

    def on_error(self, error: StoreError) -> None:
        """The inner store's ``on_error`` (its backoff; the binding's on ``fdb:``)."""
        self._tr.on_error(error)
        self._plan.replan()  # the next attempt draws its own read fault


def parse_url(rest: str) -> tuple[int, float, str]:
    """Split the part after ``faulty:`` into (seed, rate, inner URL).

    Raises:
        ValueError: no seed, a seed that is not an integer, a rate outside 0 to 1, or no inner URL.
    """
    seed_text, sep, tail = rest.partition(":")
    if not sep or not tail:
        raise ValueError("expected faulty:SEED[:RATE]:INNER_URL")
    try:
        seed = int(seed_text)
    except ValueError:
        raise ValueError(f"seed {seed_text!r} is not an integer") from None
    rate = DEFAULT_FAULT_RATE
    first, sep, remainder = tail.partition(":")
    try:
        maybe_rate = float(first)
    except ValueError:
        maybe_rate = None
    if maybe_rate is not None and sep and remainder:
        rate, tail = maybe_rate, remainder
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"fault rate {rate!r} must be between 0 and 1")
    if ":" not in tail:
        raise ValueError(f"inner store URL {tail!r} has no scheme")
    return seed, rate, tail
