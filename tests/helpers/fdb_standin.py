"""A stand-in for the FoundationDB binding and a cluster, behaving as the real client does.

The ``fdb:`` store (``smoosh/store/fdb.py``) runs the store contract and the job-layer suites
over it on every ``make test`` (the ``fdb-standin`` variants), so the adapter's own logic is
exercised without a cluster, and so are the places where a real client differs from the
embedded stores. It offers what the adapter uses of the binding (``open``,
``create_transaction``, reads returning futures, writes, conflict ranges, watches,
versionstamps, ``commit``, ``on_error``, ``reset``, ``cancel``, the ``timeout`` and
``max_retry_delay`` options, ``FDBError``, ``KeySelector``, ``StreamingMode``); anything else
is an ``AttributeError``, so an adapter that starts using more of the binding fails here first.

The data, conflicts, versionstamps and watches are those of the project's ``memory:`` store;
the client's behaviour around them is modelled here from libfdb_c 7.3 and the 7.1 binding
(as found on a 7.3.79 cluster, issue 28), independently of what the embedded stores do:

* **Deferred errors** (``ThreadSafeTransaction``): every void call (``set``, ``clear``,
  ``clear_range``, atomic ops, the versionstamped sets, the C++ side of
  ``add_read_conflict_range``) runs later on the network thread; an error it throws is kept
  as the transaction's *deferred error* (the first one: once one is kept, later void calls
  are skipped) and thrown by the next ``get``, ``get_key``, ``get_range`` (snapshot too),
  ``watch`` and ``commit``. ``reset`` and a successful ``on_error`` clear it. The checks are
  ``ReadYourWritesTransaction``'s: 2004 for a key at or after ``\\xff``, 2102 for a key over
  10,000 bytes (but ``clear`` of such a key does nothing), 2103 for a value over 100,000
  bytes, 2005 for ``clear_range(b, a)``, 2000 for a versionstamp operand without room for
  the stamp. ``add_read_conflict_range(b, a)`` raises 2005 at the call (the C API builds the
  range before anything is deferred).
* **Bypass mode** (libfdb_c without an external client runs native transactions): native
  ``onError`` retries FoundationDB's retryable set *without* 1039 ``cluster_version_changed``,
  which only the multi-version client's transactions handle; ``on_error(1039)`` raises 1039.
* **Cancelled after a failed ``on_error``** (API >= 610: the failed ``onError`` sends
  ``transaction_cancelled`` to the reset promise): every later read, ``watch``, ``commit`` and
  ``on_error`` raises 1025 until ``reset``. ``cancel()`` does the same.
* **The ``timeout`` option**: once it has passed since the transaction was created or reset
  (``on_error`` does not restart it), reads, ``commit`` and ``on_error`` raise 1031. ``reset``
  forgets the options, as the real ``reset`` does.
* **Futures**: a read never raises at the call, its future does (``.value``, ``.wait()``,
  iterating a range); a watch's error comes from its ``wait``.
* **``on_error`` backs off** before a retry: exponential from 10 ms up to ``max_retry_delay``,
  jittered, slept with the cluster's ``sleep``.
* **``FDBError``**: ``description`` is ``bytes`` (the binding hands back the C library's
  ``char*``) and ``str()`` ends in the code, as the 7.1 binding's does.
* **The network** (issue 50): a read's future and a commit's settle only once the cluster has
  answered. :attr:`Cluster.latency_s` is each round trip's time (a transaction's first read or
  commit also waits for its read version, one round trip more, as ``getReadVersion`` does), so a
  test or a benchmark can show what overlapping transactions buys on a real cluster; the
  futures of several transactions wait at once, as the client's network thread lets them.
  :meth:`Cluster.stop_answering` models a cluster that is down: a client is not refused, its
  futures just never settle, until :meth:`Cluster.answer_again`, or until the transaction's
  ``timeout`` option has passed (then 1031, as the client gives up by itself). ``fdb.open``
  and ``create_transaction`` never wait (the client connects lazily). A command that blocks
  on a silent cluster blocks here too.
"""

from __future__ import annotations

import random
import struct
import threading
import time
import types
from typing import Any, Callable, Iterator

from smoosh.store.base import KeySelector as SeamSelector
from smoosh.store.base import Watch
from smoosh.store.errors import StoreError, describe
from smoosh.store.memory import MemoryStore

#: The API version the stand-in answers as selected (what the 7.1 binding speaks).
API_VERSION = 710
#: What a native transaction's ``onError`` retries (FoundationDB's retryable predicate less
#: 1039, which only ``MultiVersionTransaction::onError`` handles).
NATIVE_ON_ERROR_RETRYABLE = frozenset({1007, 1009, 1020, 1021, 1037, 1038, 1042, 1051, 1078, 1213, 1235, 1242})
#: ReadYourWritesTransaction's limits.
KEY_SIZE_LIMIT = 10_000
VALUE_SIZE_LIMIT = 100_000
#: The first key past the normal key space (writes there need ``access_system_keys``).
MAX_WRITE_KEY = b"\xff"
#: The client's first retry delay and the default ceiling, seconds.
INITIAL_BACKOFF_S = 0.01
DEFAULT_MAX_RETRY_DELAY_S = 1.0

KEY_OUTSIDE_LEGAL_RANGE = 2004
INVERTED_RANGE = 2005
CLIENT_INVALID_OPERATION = 2000
KEY_TOO_LARGE = 2102
VALUE_TOO_LARGE = 2103
TRANSACTION_CANCELLED = 1025
TRANSACTION_TIMED_OUT = 1031


class FDBError(Exception):
    """The binding's error: ``code``, a ``bytes`` description, ``str()`` ending in the code."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code

    @property
    def description(self) -> bytes:
        return describe(self.code).encode()

    def __str__(self) -> str:
        # The binding formats the bytes with %s, which prints them as b'...'.
        return "%r (%d)" % (self.description, self.code)


class KeySelector:
    """The binding's key selector (only its three fields are used)."""

    def __init__(self, key: bytes, or_equal: bool, offset: int) -> None:
        self.key = key
        self.or_equal = or_equal
        self.offset = offset


class StreamingMode:
    want_all = -2
    iterator = 0


class KeyValue:
    def __init__(self, key: bytes, value: bytes) -> None:
        self.key = key
        self.value = value


class Future:
    """A settled future: ``value`` / ``wait()`` give its value or raise its error."""

    _error: int

    def __init__(self, value: Any = None, error: int = 0) -> None:
        self._value = value
        self._error = error

    @property
    def value(self) -> Any:
        if self._error:
            raise FDBError(self._error)
        return self._value

    def wait(self) -> Any:
        return self.value

    def is_ready(self) -> bool:
        return True

    def on_ready(self, callback: Callable[[Any], None]) -> None:
        callback(self)

    def cancel(self) -> None:
        pass


class RoundTripFuture(Future):
    """A future that settles once the cluster answers its round trip (:meth:`Cluster.round_trip`),
    then runs ``work`` (the read, or the commit) unless the wait ended in an error."""

    def __init__(self, tr: Transaction, work: Callable[[], Future]) -> None:
        super().__init__()
        self._tr = tr
        self._work = work
        self._settled: Future | None = None
        self._lock = threading.Lock()

    def _settle(self) -> Future:
        with self._lock:
            if self._settled is None:
                code = self._tr._wait_for_cluster()
                self._settled = Future(error=code) if code else self._work()
            return self._settled

    @property
    def value(self) -> Any:
        return self._settle().value

    def wait(self) -> Any:
        return self.value

    def is_ready(self) -> bool:
        return self._settled is not None

    def on_ready(self, callback: Callable[[Any], None]) -> None:
        self._settle()
        callback(self)


class LazyFuture(Future):
    """A future whose value is asked for when read (the versionstamp, known after the commit)."""

    def __init__(self, get: Callable[[], Any]) -> None:
        super().__init__()
        self._get = get

    @property
    def value(self) -> Any:
        return self._get()


class WatchFuture:
    """A watch future over the memory store's watch: errors come from ``wait``."""

    def __init__(self, watch: Watch) -> None:
        self._watch = watch

    def wait(self) -> None:
        try:
            self._watch.wait()
        except StoreError as e:
            raise FDBError(e.code) from None

    def is_ready(self) -> bool:
        return self._watch.is_ready()

    def on_ready(self, callback: Callable[[Any], None]) -> None:
        self._watch.on_settled(lambda: callback(self))

    def cancel(self) -> None:
        self._watch.cancel()


class RangeResult:
    """What ``get_range`` returns: its error is raised when it is iterated, as the binding's is
    (after its round trip: iterating it waits for the cluster)."""

    def __init__(self, future: Future) -> None:
        self._future = future

    def __iter__(self) -> Iterator[KeyValue]:
        return iter([KeyValue(k, v) for k, v in self._future.value])


def _seam(selector: bytes | KeySelector) -> bytes | SeamSelector:
    if isinstance(selector, KeySelector):
        return SeamSelector(selector.key, selector.or_equal, selector.offset)
    return selector


def _stamp_operand_error(operand: bytes) -> int:
    """RYW's check of a versionstamp operand: a 4-byte little-endian offset, the stamp inside."""
    if len(operand) < 4:
        return CLIENT_INVALID_OPERATION
    (pos,) = struct.unpack("<i", operand[-4:])
    if pos < 0 or pos + 10 > len(operand) - 4:
        return CLIENT_INVALID_OPERATION
    return 0


class Cluster:
    """The data every database opened on the stand-in shares (one per test).

    Parameters:
        clock: monotonic seconds, for the ``timeout`` option.
        sleep: how ``on_error`` waits out its backoff.
        rng: the backoff's jitter.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 rng: random.Random | None = None) -> None:
        self.store = MemoryStore("memory:fdb-standin")
        self.clock = clock
        self.sleep = sleep
        self.rng = rng or random.Random(0)
        #: Seconds slept by every ``on_error`` backoff, in order.
        self.backoffs: list[float] = []
        #: Seconds each round trip to the cluster takes (0: none; see the module docstring).
        self.latency_s = 0.0
        #: Set while the cluster answers; cleared by :meth:`stop_answering`.
        self._answering = threading.Event()
        self._answering.set()
        #: Round trips waiting for the cluster now (any thread), and the most at once.
        self.in_flight = 0
        self.most_in_flight = 0
        self._count_lock = threading.Lock()

    def stop_answering(self) -> None:
        """The cluster goes silent: every future waits (see the module docstring)."""
        self._answering.clear()

    def answer_again(self) -> None:
        """The cluster is back: the futures waiting settle."""
        self._answering.set()

    @property
    def answering(self) -> bool:
        """Whether the cluster answers now."""
        return self._answering.is_set()

    def round_trip(self, tr: Transaction) -> int:
        """Wait as a future of ``tr`` does for the cluster's answer: 0 once it answered, or the
        error its wait ended with (1031 once ``tr``'s timeout has passed while the cluster is silent)."""
        with self._count_lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.latency_s:
                time.sleep(self.latency_s)
            while not self._answering.is_set():
                if tr._timeout_s is None:
                    self._answering.wait()
                    continue
                remaining_s = tr._timeout_s - (self.clock() - tr._created_at)
                if remaining_s <= 0:
                    tr._cancel(TRANSACTION_TIMED_OUT)
                    return TRANSACTION_TIMED_OUT
                self._answering.wait(remaining_s)
            return 0
        finally:
            with self._count_lock:
                self.in_flight -= 1

    def close(self) -> None:
        self._answering.set()  # nothing stays blocked on a closed stand-in
        self.store.close()


class Options:
    """The transaction options the adapter sets."""

    def __init__(self, tr: Transaction) -> None:
        self._tr = tr

    def set_timeout(self, ms: int) -> None:
        # Measured from the transaction's creation (or reset), as RYW's timebomb is.
        self._tr._timeout_s = ms / 1000.0 if ms else None

    def set_max_retry_delay(self, ms: int) -> None:
        self._tr._max_retry_delay_s = ms / 1000.0


class Reads:
    """The read calls of a transaction (``snapshot``: its snapshot view)."""

    def __init__(self, tr: Transaction, snapshot: bool) -> None:
        self._tr = tr
        self._is_snapshot = snapshot

    def get(self, key: bytes) -> Future:
        return self._tr._read(lambda view: view.get(key), self._is_snapshot)

    def get_key(self, selector: KeySelector) -> Future:
        return self._tr._read(lambda view: view.get_key(_seam(selector)), self._is_snapshot)

    def get_range(self, begin: bytes | KeySelector, end: bytes | KeySelector, limit: int = 0, reverse: bool = False,
                  streaming_mode: int = StreamingMode.iterator) -> RangeResult:
        return RangeResult(self._tr._read(lambda view: view.get_range(_seam(begin), _seam(end), limit, reverse),
                                          self._is_snapshot))


class Transaction(Reads):
    """One client transaction (see the module docstring for what it models)."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(self, snapshot=False)
        self._cluster = cluster
        self._inner = cluster.store.create_transaction()
        self.snapshot = Reads(self, snapshot=True)
        self.options = Options(self)
        self._start()

    def _start(self) -> None:
        """A new transaction, or one after ``reset``: options, clock and errors start afresh."""
        self._created_at = self._cluster.clock()
        self._timeout_s: float | None = None
        self._max_retry_delay_s = DEFAULT_MAX_RETRY_DELAY_S
        self._backoff_s = INITIAL_BACKOFF_S
        self._deferred = 0
        self._cancelled = 0
        self._has_read_version = False

    def _wait_for_cluster(self) -> int:
        """A round trip to the cluster (its read version first, once per transaction); 0 or an error code."""
        if not self._has_read_version:
            code = self._cluster.round_trip(self)
            if code:
                return code
            self._has_read_version = True
        return self._cluster.round_trip(self)

    # -- the reset promise and the deferred error ---------------------------------------------
    def _cancel(self, code: int) -> None:
        if not self._cancelled:
            self._cancelled = code
            self._inner.cancel()

    def _check_timeout(self) -> None:
        if self._timeout_s is not None and self._cluster.clock() - self._created_at >= self._timeout_s:
            self._cancel(TRANSACTION_TIMED_OUT)

    def _gate(self) -> int:
        """The error a read, watch or commit meets first: the deferred one, then the reset promise's."""
        if self._deferred:
            return self._deferred
        self._check_timeout()
        return self._cancelled

    def _read(self, fn: Callable[[Any], Any], snapshot: bool) -> Future:
        code = self._gate()
        if code:
            return Future(error=code)

        def read() -> Future:
            try:
                return Future(fn(self._inner.snapshot if snapshot else self._inner))
            except StoreError as e:
                return Future(error=e.code)

        return RoundTripFuture(self, read)

    def _void(self, error: int, apply: Callable[[], None]) -> None:
        """A void call: skipped once an error is deferred, else checked and applied, its error deferred."""
        if self._deferred:
            return
        if error:
            self._deferred = error
            return
        if self._cancelled:
            return  # nothing can read or commit it any more
        try:
            apply()
        except StoreError as e:
            self._deferred = e.code

    # -- writes ---------------------------------------------------------------------------------
    def set(self, key: bytes, value: bytes) -> None:
        self._void(_write_key_error(key) or (VALUE_TOO_LARGE if len(value) > VALUE_SIZE_LIMIT else 0),
                   lambda: self._inner.set(key, value))

    def clear(self, key: bytes) -> None:
        if key < MAX_WRITE_KEY and len(key) > KEY_SIZE_LIMIT:
            return  # RYW: no key that long exists, so there is nothing to clear
        self._void(KEY_OUTSIDE_LEGAL_RANGE if key >= MAX_WRITE_KEY else 0, lambda: self._inner.clear(key))

    def clear_range(self, begin: bytes, end: bytes) -> None:
        if begin > end:
            error = INVERTED_RANGE
        elif begin > MAX_WRITE_KEY or end > MAX_WRITE_KEY:
            error = KEY_OUTSIDE_LEGAL_RANGE
        else:
            error = 0
        self._void(error, lambda: self._inner.clear_range(begin, end))

    def add(self, key: bytes, param: bytes) -> None:
        self._void(_write_key_error(key) or (VALUE_TOO_LARGE if len(param) > VALUE_SIZE_LIMIT else 0),
                   lambda: self._inner.add(key, param))

    def set_versionstamped_key(self, key: bytes, value: bytes) -> None:
        error = _write_key_error(key) or (VALUE_TOO_LARGE if len(value) > VALUE_SIZE_LIMIT else 0)
        self._void(error or _stamp_operand_error(key), lambda: self._inner.set_versionstamped_key(key, value))

    def set_versionstamped_value(self, key: bytes, value: bytes) -> None:
        error = _write_key_error(key) or (VALUE_TOO_LARGE if len(value) > VALUE_SIZE_LIMIT else 0)
        self._void(error or _stamp_operand_error(value), lambda: self._inner.set_versionstamped_value(key, value))

    def add_read_conflict_range(self, begin: bytes, end: bytes) -> None:
        if begin > end:
            raise FDBError(INVERTED_RANGE)  # fdb_transaction_add_conflict_range returns it
        self._void(KEY_OUTSIDE_LEGAL_RANGE if end > MAX_WRITE_KEY else 0,
                   lambda: self._inner.add_read_conflict_range(begin, end))

    def add_read_conflict_key(self, key: bytes) -> None:
        self.add_read_conflict_range(key, key + b"\x00")

    # -- futures --------------------------------------------------------------------------------
    def watch(self, key: bytes) -> Future | WatchFuture:
        code = self._gate() or _write_key_error(key)
        if code:
            return Future(error=code)
        try:
            return WatchFuture(self._inner.watch(key))
        except StoreError as e:
            return Future(error=e.code)

    def commit(self) -> Future:
        code = self._gate()
        if code:
            return Future(error=code)

        def commit() -> Future:
            try:
                self._inner.commit()
            except StoreError as e:
                return Future(error=e.code)
            return Future()

        if not self._inner.has_writes:
            return commit()  # a read-only transaction's commit is the client's alone: no round trip
        return RoundTripFuture(self, commit)

    def get_versionstamp(self) -> LazyFuture:
        def stamp() -> bytes:
            if self._cancelled:
                raise FDBError(self._cancelled)
            try:
                return self._inner.get_versionstamp()
            except StoreError as e:
                raise FDBError(e.code) from None

        return LazyFuture(stamp)

    def on_error(self, error: int | FDBError) -> Future:
        code = error.code if isinstance(error, FDBError) else error
        self._check_timeout()
        if self._cancelled:
            return Future(error=self._cancelled)
        if code not in NATIVE_ON_ERROR_RETRYABLE:
            self._cancel(TRANSACTION_CANCELLED)
            return Future(error=code)
        delay_s = self._backoff_s * self._cluster.rng.random()
        self._backoff_s = min(self._backoff_s * 2, self._max_retry_delay_s)
        self._cluster.backoffs.append(delay_s)
        self._cluster.sleep(delay_s)
        # resetRyow: writes, reads and the deferred error go; options and the clock stay.
        self._inner.reset()
        self._deferred = 0
        self._has_read_version = False
        return Future()

    def reset(self) -> None:
        self._inner.reset()
        self._start()

    def cancel(self) -> None:
        self._cancel(TRANSACTION_CANCELLED)


def _write_key_error(key: bytes) -> int:
    if key >= MAX_WRITE_KEY:
        return KEY_OUTSIDE_LEGAL_RANGE
    if len(key) > KEY_SIZE_LIMIT:
        return KEY_TOO_LARGE
    return 0


class Database:
    def __init__(self, cluster: Cluster) -> None:
        self._cluster = cluster

    def create_transaction(self) -> Transaction:
        return Transaction(self._cluster)


class Binding(types.ModuleType):
    """The ``fdb`` module as the adapter sees it, its API version selected, over one :class:`Cluster`."""

    FDBError = FDBError
    KeySelector = KeySelector
    StreamingMode = StreamingMode

    def __init__(self, cluster: Cluster | None = None) -> None:
        super().__init__("fdb")
        self.cluster = cluster or Cluster()

    def is_api_version_selected(self) -> bool:
        return True

    def get_api_version(self) -> int:
        return API_VERSION

    def open(self, cluster_file: str | None = None) -> Database:
        return Database(self.cluster)
