"""Transaction ids: job-layer writes give one answer whether a "may have committed" error came
before or after the commit (fabric2's technique, ``reference/jobs_fdb.md`` §1.4).

FoundationDB may report 1021 ``commit_unknown_result`` (smoosh also counts 1031 and 1039)
for a transaction that did commit. Retried blindly, an ``accept`` that committed takes a
*second* job and the first stays locked until its type timeout; a ``remove`` raises
NotFound for the job it removed. So every job-layer write transaction run by :meth:`TxIds.run`
also writes one key of its own, ``(TX_IDS, issued_at, id)``, whose value remembers the call's
result. After a may-have-committed error the retry first reads that key: present means the
earlier attempt committed, and the remembered result is returned without running the body
again (``accept`` returns the same job it took). A transaction that writes nothing writes no
id: read-only calls stay read-only.

The ids do not accumulate. Once a call has returned, its id can never be read again, so it is
cleared by the next write transaction of the same :class:`TxIds` (up to
:data:`MAX_PIGGYBACK_CLEARS` at a time, in the same commit: no extra transaction), and by
:meth:`TxIds.close`. Ids left behind by a process that died are cleared by
:func:`sweep_expired`, which every activity monitor runs on each check: it clears every id
issued more than :data:`TX_ID_TTL_S` ago, far longer than any retry loop lasts.

Results are remembered as msgpack (tuples and :class:`~smoosh.jobs.model.Job` as extension
types). A result msgpack cannot hold (only possible through :meth:`~smoosh.jobs.Jobs.transact`
with a body of the caller's) is not remembered: a replay that finds the id then raises 1021
``commit_unknown_result``, FoundationDB's own answer, rather than run the body twice.
"""

from __future__ import annotations

import collections
import logging
import random
import threading
from typing import Any, Callable, Generic, TypeVar

import msgpack

from smoosh.store.base import DEFAULT_RETRY_LIMIT, VALUE_SIZE_LIMIT_BYTES, Store, Transaction
from smoosh.store.errors import COMMIT_UNKNOWN_RESULT, StoreError
from smoosh.jobs.encoding import MAX_CONTAINER_ITEMS
from smoosh.jobs.model import Job, Keys

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds a transaction id is kept before :func:`sweep_expired` may clear it. It must
#: outlast the longest retry loop (60 s by default) plus any clock skew between processes.
TX_ID_TTL_S = 600
#: Ids of finished calls cleared by one later write transaction.
MAX_PIGGYBACK_CLEARS = 32
#: Random bytes in a transaction id.
TX_ID_BYTES = 16

_EXT_JOB = 1
_EXT_TUPLE = 2
_REMEMBERED = 1
_NOT_REMEMBERED = 0


def _default(value: Any) -> msgpack.ExtType:
    if isinstance(value, Job):
        return msgpack.ExtType(_EXT_JOB, _pack([value.type, value.id, value.lock, value.resubmitted]))
    if isinstance(value, tuple):
        return msgpack.ExtType(_EXT_TUPLE, _pack(list(value)))
    raise TypeError(f"cannot remember a {type(value).__name__}")


def _ext_hook(code: int, data: bytes) -> Any:
    items = _unpack(data)
    if code == _EXT_JOB:
        job_type, job_id, lock, resubmitted = items
        return Job(job_type, job_id, lock, resubmitted)
    if code == _EXT_TUPLE:
        return tuple(items)
    return msgpack.ExtType(code, data)


def _pack(value: Any) -> bytes:
    return msgpack.packb(value, default=_default, strict_types=True, use_bin_type=True)


def _unpack(raw: bytes) -> Any:
    # Bounded like every msgpack decode here: a tx-id value is one store value at most.
    return msgpack.unpackb(
        raw,
        ext_hook=_ext_hook,
        raw=False,
        strict_map_key=False,
        max_str_len=VALUE_SIZE_LIMIT_BYTES,
        max_bin_len=VALUE_SIZE_LIMIT_BYTES,
        max_ext_len=VALUE_SIZE_LIMIT_BYTES,
        max_array_len=MAX_CONTAINER_ITEMS,
        max_map_len=MAX_CONTAINER_ITEMS,
    )


def encode_result(value: Any) -> bytes:
    """The tx-id value for a call that returned ``value`` (a marker if it cannot be remembered)."""
    if value is None:
        return _NONE_RESULT  # add, finish and remove: most calls
    try:
        return _pack([_REMEMBERED, value])
    except (TypeError, ValueError, OverflowError):
        return _pack([_NOT_REMEMBERED, type(value).__name__])


_NONE_RESULT = _pack([_REMEMBERED, None])


def decode_result(raw: bytes) -> Any:
    """The result remembered in a tx-id value.

    Raises:
        StoreError: 1021, when the call committed but its result could not be remembered.
    """
    tag, value = _unpack(raw)
    if tag != _REMEMBERED:
        raise StoreError(
            COMMIT_UNKNOWN_RESULT, f"the transaction committed, but its result (a {value}) could not be remembered"
        )
    return value


class _Replayed(Generic[T]):
    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class TxIds:
    """Runs job-layer transactions so that a may-have-committed retry returns the committed result.

    Parameters:
        store: the store.
        keys: the layer's key builders (ids live under its prefix).
        clock: wall-clock seconds (the ids' issue time, compared by :func:`sweep_expired`).
        rng: randomness for the ids.
    """

    def __init__(self, store: Store, keys: Keys, *, clock: Callable[[], float], rng: random.Random | None = None) -> None:
        self.store = store
        self.keys = keys
        self.clock = clock
        self._rng = rng or random.SystemRandom()
        self._lock = threading.Lock()
        #: Ids of calls that have returned: no retry can read them any more.
        self._done: collections.deque[bytes] = collections.deque()
        #: Calls answered from a remembered result (for tests and logs).
        self.replays = 0

    def run(
        self,
        fn: Callable[[Transaction], T],
        *,
        remember: Callable[[T], Any] = lambda result: result,
        recall: Callable[[Any], T] = lambda value: value,
        on_retry: Callable[[StoreError], None] | None = None,
        retry_limit: int = DEFAULT_RETRY_LIMIT,
    ) -> T:
        """Run ``fn`` through the store's retry loop, answering a replay from its tx-id.

        Parameters:
            fn: the body.
            remember: maps the body's result to what is stored (msgpack plus tuples and Jobs).
            recall: maps a stored value back to a result.
            on_retry: also called with the error before each retry.
            retry_limit: as for :meth:`~smoosh.store.base.Store.transact`.

        Returns:
            The body's result, or the remembered result of an attempt that committed.

        Raises:
            Whatever the body or the store raises; StoreError 1021 when an attempt committed a
            result that could not be remembered.
        """
        if not self.store.commit_outcome_may_be_unknown:
            # Every error of this store means "not committed": a retry can never double a call.
            return self.store.transact(fn, on_retry=on_retry, retry_limit=retry_limit)
        with self._lock:
            tx_id = self._rng.getrandbits(8 * TX_ID_BYTES).to_bytes(TX_ID_BYTES, "big")
        tx_key = self.keys.tx_id(int(self.clock()), tx_id)
        clears = self._take_done()
        maybe_committed = False
        wrote = False

        def retry_hook(error: StoreError) -> None:
            nonlocal maybe_committed
            maybe_committed = maybe_committed or error.maybe_committed
            if on_retry is not None:
                on_retry(error)

        def body(tr: Transaction) -> T | _Replayed[T]:
            nonlocal wrote
            wrote = False
            if maybe_committed:
                # An earlier attempt may have committed: its id says whether it did. (The
                # read is a conflicting one, so an attempt still landing after this read
                # version makes this one fail and look again.)
                raw = tr.get(tx_key)
                if raw is not None:
                    return _Replayed(decode_result(raw))
            result = fn(tr)
            if tr.has_writes:
                for key in clears:
                    tr.clear(key)
                tr.set(tx_key, encode_result(remember(result)))
                wrote = True
            return result

        try:
            out = self.store.transact(body, on_retry=retry_hook, retry_limit=retry_limit)
        except BaseException:
            self._give_back(clears)
            raise
        if isinstance(out, _Replayed):
            # The attempt that committed cleared ``clears`` and wrote ``tx_key``.
            with self._lock:
                self.replays += 1
                self._done.append(tx_key)
            log.debug("transaction %s had committed before its error: answered from its id", tx_id.hex())
            return recall(out.value)
        if wrote:
            with self._lock:
                self._done.append(tx_key)
        else:
            self._give_back(clears)
        return out

    def _take_done(self) -> list[bytes]:
        with self._lock:
            n = min(len(self._done), MAX_PIGGYBACK_CLEARS)
            return [self._done.popleft() for _ in range(n)]

    def _give_back(self, keys: list[bytes]) -> None:
        if keys:
            with self._lock:
                self._done.extendleft(reversed(keys))

    def pending_clears(self) -> int:
        """Ids of returned calls not cleared yet."""
        with self._lock:
            return len(self._done)

    def flush(self) -> None:
        """Clear every id of a returned call now (best effort: ``sweep_expired`` is the backstop)."""
        while True:
            keys = self._take_done()
            if not keys:
                return
            try:
                self.store.transact(lambda tr: [tr.clear(k) for k in keys])
            except StoreError as e:
                self._give_back(keys)
                log.debug("could not clear %d transaction id(s) (%s); the sweep will", len(keys), e)
                return

    def close(self) -> None:
        """Clear the ids this instance still holds (see :meth:`flush`)."""
        self.flush()


def sweep_expired(store: Store, keys: Keys, now: float, ttl_s: float = TX_ID_TTL_S) -> None:
    """Clear every transaction id issued before ``now - ttl_s`` (one blind range clear).

    Ids of calls whose process died before clearing them end here; no retry loop lasts long
    enough to read one of them again.
    """
    begin, _ = keys.tx_ids_range()
    end = keys.tx_ids_before(int(now - ttl_s))
    if begin < end:
        store.transact(lambda tr: tr.clear_range(begin, end))


def count_tx_ids(store: Store, keys: Keys) -> int:
    """Transaction ids present under the layer's prefix (tests and status)."""
    begin, end = keys.tx_ids_range()
    return len(store.transact(lambda tr: tr.snapshot.get_range(begin, end)))
