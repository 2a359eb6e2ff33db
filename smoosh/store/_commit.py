"""What passes between the shared transaction and an embedded store beneath it.

A store opens a :class:`Snapshot` for each transaction (the committed state at its read
version) and, at commit, receives a :class:`CommitRequest`: the read conflict ranges to check
against later commits, the mutations to apply in issue order, and the
:class:`PendingWatch` es to arm. Until it ends, the transaction keeps what it holds of the
store (its snapshot, its watches not armed yet) in a :class:`Held`, which it gives back at
commit, reset or cancel, or from its finalizer when it is dropped. The transaction itself is
:mod:`smoosh.store._txn`; the stores are :mod:`smoosh.store.memory` and
:mod:`smoosh.store.sqlite`.
"""

from __future__ import annotations

import abc
import itertools
from dataclasses import dataclass
from typing import Iterator

from smoosh.store.errors import TRANSACTION_CANCELLED
from smoosh.store._mutations import ConflictSet, Mutation
from smoosh.store._watches import StoreWatch, WatchRegistry


class Snapshot(abc.ABC):
    """The committed state at one read version, as a store exposes it to one transaction."""

    #: The store's commit version this snapshot shows.
    read_version: int
    #: Whether an abandoned transaction must give this snapshot back (an SQLite read
    #: transaction pins the WAL); a snapshot that holds nothing says False.
    needs_release: bool = True

    @abc.abstractmethod
    def get(self, key: bytes) -> bytes | None:
        """The committed value of ``key`` at the read version."""

    @abc.abstractmethod
    def scan(self, begin: bytes, end: bytes, reverse: bool, first_chunk: int = 0) -> Iterator[tuple[bytes, bytes]]:
        """Committed pairs in ``[begin, end)`` in key order (reversed if asked), fetched lazily.

        ``first_chunk`` (0: the store's usual chunk) is how many pairs the caller expects to
        need: a limited read of a few keys at the head of a long range (an accept's pick)
        then fetches a few, not a whole chunk, so its cost does not grow with the range.
        """

    def read_range(self, begin: bytes, end: bytes, reverse: bool, limit: int) -> list[tuple[bytes, bytes]]:
        """The first ``limit`` (0: every) pairs of :meth:`scan`, as a list."""
        if not limit:
            return list(self.scan(begin, end, reverse))
        return list(itertools.islice(self.scan(begin, end, reverse, limit), limit))

    @abc.abstractmethod
    def close(self) -> None:
        """Release the snapshot; idempotent."""

    def abandon(self) -> None:
        """Release the snapshot from a garbage-collection finalizer.

        A finalizer runs wherever the collector happens to run, possibly while this thread
        holds one of the store's locks: this must take none of them.
        """
        self.close()


@dataclass
class PendingWatch:
    """A watch waiting for its transaction's commit, with what its baseline will be."""

    watch: StoreWatch
    key: bytes
    #: The value the transaction saw at its read version (used when it did not write the key).
    seen: bytes | None
    #: The transaction wrote the key: the baseline is the committed value after its commit.
    use_committed: bool = False


class CommitRequest:
    """What a store needs to commit one transaction.

    Attributes:
        read_version: the version its reads saw (None: it read nothing).
        reads: its read conflict ranges, checked against commits newer than ``read_version``.
        mutations: its writes, in issue order.
        watches: its watches, armed at the commit.
    """

    __slots__ = ("read_version", "reads", "mutations", "watches")

    def __init__(
        self, read_version: int | None, reads: ConflictSet, mutations: list[Mutation], watches: list[PendingWatch] | None = None
    ) -> None:
        self.read_version = read_version
        self.reads = reads
        self.mutations = mutations
        self.watches: list[PendingWatch] = [] if watches is None else watches


class Held:
    """What a transaction holds of its store until it ends: its snapshot and its unarmed watches.

    Referenced by the transaction's finalizer, never the reverse, so an abandoned
    transaction can still give them back.
    """

    __slots__ = ("snapshot", "watches", "registry")

    def __init__(self, registry: WatchRegistry) -> None:
        self.snapshot: Snapshot | None = None
        self.watches: list[PendingWatch] = []
        self.registry = registry

    def release(self, watch_error: int | None = TRANSACTION_CANCELLED) -> None:
        """Give the snapshot back and, unless ``watch_error`` is None, fail the unarmed watches with it."""
        snap, self.snapshot = self.snapshot, None
        if snap is not None:
            snap.close()
        if watch_error is not None:
            self.registry.fail([p.watch for p in self.watches], watch_error)
        self.watches.clear()

    def abandon(self) -> None:
        """The finalizer of a transaction dropped without commit or cancel."""
        snap, self.snapshot = self.snapshot, None
        if snap is not None:
            snap.abandon()
        # Only unarmed watches are listed here; settling them takes the registry's RLock,
        # which is safe even if this thread is inside the registry already.
        self.registry.fail([p.watch for p in self.watches], TRANSACTION_CANCELLED)
        self.watches.clear()
