"""The durable history of finished compactions: per key its last results, kept in the job store.

Like ``pg_stat_user_tables``' last-vacuum columns, per database: when each of its last
compactions ended, in which channel, with what result, how long it ran and its bytes before
and after. The history table (``history.py``) lives in memory and was lost on a restart, and a
node removes a job from the store once it has finished, so after a restart ``/jobs`` and
``smoosh jobs list`` knew of no compaction at all.

Durable history costs no extra commit (DESIGN §12): a result's row is written in the
transaction that ends its job. For a run this process's worker claimed, that is the commit
that finishes and removes it (``run/finishes.py``: the next claim's commit); for any other run,
the removal the scheduler commits when it ends. Each write is blind (no read: the rows of this
node's keys are held here), so it adds a statement, never a conflict.

Bounded per key and in total, like the crash records: at most ``max_per_key`` results a key
(``max_history``), at most ``max_keys`` keys a node (the least recently finished key's row is
cleared in the write that adds one more).

Owner: one :class:`ResultLog` per server, shared by the worker's compaction threads (a claimed
run's finish) and the server's loop (any other run's end); :meth:`ResultLog.write_for` is the
one way in, under its lock. Rows are read back at start-up (:func:`read_rows`) and by ``smoosh
jobs list`` (:func:`read_all`).
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import msgpack

from smoosh.store import Transaction, tuples
from smoosh.store.base import ReadView

__all__ = ["Result", "ResultLog", "read_rows", "read_all", "history_row_key", "DEFAULT_MAX_KEYS"]

#: Keys of a node whose results are kept, at most (the least recently finished go first).
DEFAULT_MAX_KEYS = 1000
#: Default results kept per key (``max_history``).
DEFAULT_MAX_PER_KEY = 20
#: Longest error text kept with a result (a traceback's last line, not the whole of it).
MAX_ERROR_CHARS = 500
#: Largest row decoded, in bytes.
MAX_ROW_BYTES = 100_000

_PREFIX = "history"

Write = Callable[[Transaction], None]


def history_row_key(node: str, key: str) -> bytes:
    """The store key of ``key``'s row on ``node``."""
    return tuples.pack((_PREFIX, node, key))


@dataclass(frozen=True)
class Result:
    """One finished compaction, as the store keeps it.

    Attributes:
        at: when it ended, unix seconds (wall time: it is read after a restart, by a person).
        channel: the channel that ran it.
        result: one of the result vocabulary (``ok``, ``failed``, ``busy``, ``gone``,
            ``replaced``, ``blocked``; an interrupted run is not a finished one).
        duration_s: how long it ran.
        size_before_bytes: the database's bytes (file and WAL) before it.
        size_after_bytes: its bytes after it.
        error: why it did not succeed, or None.
    """

    at: float
    channel: str | None
    result: str
    duration_s: float
    size_before_bytes: int
    size_after_bytes: int
    error: str | None = None

    @classmethod
    def of(cls, outcome: Any, channel: str | None, at: float) -> Result:
        """The result of a run that ended with ``outcome`` (a :class:`channels.ports.Outcome`).

        Parameters:
            outcome: how the run ended.
            channel: the channel that ran it.
            at: when, unix seconds.

        Returns:
            The result to keep.
        """
        return cls(at, channel, str(outcome.result), round(float(outcome.duration_s), 6),
                   int(outcome.size_before_bytes), int(outcome.size_after_bytes), outcome.error)

    def to_json(self) -> dict[str, Any]:
        """The result as ``smoosh jobs list --json`` shows it."""
        return {"at": self.at, "channel": self.channel, "result": self.result, "duration_s": self.duration_s,
                "size_before_bytes": self.size_before_bytes, "size_after_bytes": self.size_after_bytes,
                "error": self.error}

    def _packed(self) -> list[Any]:
        return [self.at, self.channel, self.result, self.duration_s, self.size_before_bytes,
                self.size_after_bytes, self.error]


class ResultLog:
    """This node's results, held to write each key's row blind (see the module docstring).

    Parameters:
        node: the node name (rows are per node).
        max_per_key: results kept per key (``max_history``).
        max_keys: keys kept in all.
    """

    def __init__(self, node: str, *, max_per_key: int = DEFAULT_MAX_PER_KEY, max_keys: int = DEFAULT_MAX_KEYS) -> None:
        self._node = node
        self._max_per_key = max(1, max_per_key)
        self._max_keys = max(1, max_keys)
        self._lock = threading.Lock()
        # key -> its results, newest first; ordered by when each key last finished (oldest first).
        self._rows: OrderedDict[str, list[Result]] = OrderedDict()

    def configure(self, *, max_per_key: int) -> None:
        """A new ``max_history`` (live reload): applies from each key's next result on."""
        with self._lock:
            self._max_per_key = max(1, max_per_key)

    def restore(self, rows: dict[str, list[Result]]) -> None:
        """Hold the rows read back at start-up (:func:`read_rows`), least recently finished first."""
        with self._lock:
            for key, results in sorted(rows.items(), key=lambda item: item[1][0].at if item[1] else 0.0):
                self._rows[key] = list(results)

    def rows(self) -> dict[str, list[Result]]:
        """A copy of every key's results (newest first)."""
        with self._lock:
            return {key: list(results) for key, results in self._rows.items()}

    def recent(
        self, *, results: frozenset[str] | None = None, channel: str | None = None, offset: int = 0, limit: int = 50,
    ) -> tuple[list[tuple[str, Result, bool]], int]:
        """A page of every result held, newest first (``GET /history``).

        Bounded by what is held (``max_keys`` keys of ``max_per_key`` results), whatever the fleet.

        Parameters:
            results: only these results (None: all).
            channel: only this channel's (None: all).
            offset: results of the matching list to skip first.
            limit: at most this many.

        Returns:
            ``([(key, result, latest)], total)``: the page, ``latest`` telling whether that is the
            key's newest result, and how many results match in all.
        """
        with self._lock:
            rows = [(key, list(held)) for key, held in self._rows.items()]

        def wanted(result: Result) -> bool:
            return (results is None or result.result in results) and (channel is None or result.channel == channel)

        if results is None and channel is None:
            total = sum(len(held) for _key, held in rows)
        else:
            total = sum(1 for _key, held in rows for result in held if wanted(result))
        def ordered(key: str, held: list[Result]) -> Iterator[tuple[float, str, int, Result]]:
            return ((-result.at, key, i, result) for i, result in enumerate(held) if wanted(result))

        # Each key's results are newest first: merged lazily, a page costs the keys plus the page,
        # not a sort of every result held. (-at, key, i) orders them and never reaches a Result.
        merged = heapq.merge(*(ordered(key, held) for key, held in rows))
        page = itertools.islice(merged, offset, offset + limit)
        return [(key, result, i == 0) for _at, key, i, result in page], total

    def write_for(self, key: str, result: Result) -> Write:
        """Note ``key``'s new result; the write that stores it, to make in the transaction that ends its job.

        The row is the key's last ``max_per_key`` results; when this makes one key too many,
        the least recently finished key's row is cleared by the same write.

        Parameters:
            key: the database.
            result: how its compaction ended.

        Returns:
            ``write(tr)``: blind sets and clears, no read.
        """
        if result.error is not None and len(result.error) > MAX_ERROR_CHARS:
            result = Result(result.at, result.channel, result.result, result.duration_s, result.size_before_bytes,
                            result.size_after_bytes, result.error[:MAX_ERROR_CHARS])
        with self._lock:
            results = [result, *self._rows.pop(key, [])][:self._max_per_key]
            self._rows[key] = results
            evicted = []
            while len(self._rows) > self._max_keys:
                oldest, _ = self._rows.popitem(last=False)
                evicted.append(oldest)
        store_key = history_row_key(self._node, key)
        value = msgpack.packb({"results": [r._packed() for r in results]}, use_bin_type=True)
        cleared = [history_row_key(self._node, k) for k in evicted]

        def write(tr: Transaction) -> None:
            tr.set(store_key, value)
            for gone in cleared:
                tr.clear(gone)

        return write


def read_rows(view: ReadView, node: str) -> dict[str, list[Result]]:
    """``node``'s rows, key -> results newest first (unreadable rows are skipped: never trusted)."""
    begin, end = tuples.range((_PREFIX, node))
    out: dict[str, list[Result]] = {}
    for raw_key, value in view.get_range(begin, end):
        results = _decode(value)
        if results:
            out[str(tuples.unpack(raw_key)[-1])] = results
    return out


def read_all(view: ReadView) -> dict[str, dict[str, list[Result]]]:
    """Every node's rows: node -> key -> results newest first."""
    begin, end = tuples.range((_PREFIX,))
    out: dict[str, dict[str, list[Result]]] = {}
    for raw_key, value in view.get_range(begin, end):
        parts = tuples.unpack(raw_key)
        results = _decode(value)
        if len(parts) == 3 and results:
            out.setdefault(str(parts[1]), {})[str(parts[2])] = results
    return out


def _decode(raw: bytes) -> list[Result]:
    """A row's results, or [] when it is not one smoosh wrote."""
    if len(raw) > MAX_ROW_BYTES:
        return []
    try:
        data: Any = msgpack.unpackb(raw, raw=False, max_str_len=MAX_ROW_BYTES, max_bin_len=0, max_array_len=10_000,
                                    max_map_len=10, max_ext_len=0)
        return [_result(item) for item in data["results"]]
    except (ValueError, TypeError, KeyError, IndexError, msgpack.ExtraData, msgpack.FormatError,
            msgpack.StackError):
        return []


def _result(item: Iterable[Any]) -> Result:
    at, channel, result, duration_s, before, after, error = item
    return Result(float(at), None if channel is None else str(channel), str(result), float(duration_s), int(before),
                  int(after), None if error is None else str(error))
