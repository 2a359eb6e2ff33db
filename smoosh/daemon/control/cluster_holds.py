"""Cluster holds: an operator's sticky suspension kept in the store, obeyed by every daemon sharing it.

``smoosh suspend [CHANNEL] --store URL [--node NODE]`` writes a hold here and ``smoosh resume
... --store URL`` clears it (DESIGN §11, "Cluster-wide suspend"). A hold is independent of a
daemon's local suspension (``suspended.json`` in its ``state_dir``): either one stops a
channel, and each verb clears only its own. A hold without a node covers every node,
including nodes that join later; without a channel, every channel, including channels
configured later.

Layout (a key space of its own beside the job layer's, versioned so that a later layout can
live next to this one)::

    ("holds", 1, "changes")                = 8-byte little-endian counter, atomic add on every
                                             change: the one key a daemon watches
    ("holds", 1, "hold", node, channel)    = msgpack {"by": "user@host", "at": unix seconds};
                                             node / channel None = every node / every channel

The key's presence is what holds; the value only says who and when (an undecodable value
still holds). Every operation is one transaction, and gives the same answer whether a "may
have committed" error (1021, 1031) came before or after its commit: a suspend keeps a hold
that is already there (so its retry finds its own write and returns it), a resume returns
what still holds rather than what it cleared. Reads that decide a write are conflict reads:
a suspend racing a resume of the same scope is serialised by the store, FoundationDB's way.
"""

from __future__ import annotations

import datetime
import getpass
import os
import socket
import struct
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

import msgpack

from smoosh.store import tuples
from smoosh.store.base import Store, Transaction, Watch

__all__ = ["Hold", "ClusterHolds", "LAYOUT_VERSION", "covering", "operator_name"]

T = TypeVar("T")

#: Version of this key space's layout (the second element of every key).
LAYOUT_VERSION = 1
#: Largest hold record decoded, in bytes (a record is a few dozen bytes).
MAX_RECORD_BYTES = 4096

_ONE = struct.pack("<q", 1)


@dataclass(frozen=True)
class Hold:
    """One cluster hold: its scope (None = every node / every channel), who set it and when."""

    node: str | None
    channel: str | None
    by: str
    at: float

    def covers(self, node: str, channel: str) -> bool:
        """Whether this hold stops ``channel`` on ``node``."""
        return (self.node is None or self.node == node) and (self.channel is None or self.channel == channel)

    def within(self, node: str | None, channel: str | None) -> bool:
        """Whether this hold lies inside the scope ``(node, channel)`` (what a resume of it clears)."""
        return (node is None or self.node == node) and (channel is None or self.channel == channel)

    def overlaps(self, node: str | None, channel: str | None) -> bool:
        """Whether this hold stops some channel of some node inside the scope ``(node, channel)``."""
        return (self.node is None or node is None or self.node == node) and (
            self.channel is None or channel is None or self.channel == channel
        )

    def scope(self) -> str:
        """The scope in words: ``"channel ratio_dbs of every node"``, ``"every channel of node n2"``."""
        return describe_scope(self.node, self.channel)

    def describe(self) -> str:
        """One line for an operator: the scope, who set it and when (local time)."""
        when = datetime.datetime.fromtimestamp(self.at).strftime("%Y-%m-%d %H:%M:%S")
        return f"{self.scope()}, held by {self.by} since {when}"

    def to_json(self) -> dict[str, Any]:
        """``{"node", "channel", "by", "at"}`` (``/status``'s ``held``, ``status --store --json``)."""
        return {"node": self.node, "channel": self.channel, "by": self.by, "at": self.at}


def describe_scope(node: str | None, channel: str | None) -> str:
    """A scope in words (None = every node / every channel)."""
    channels = "every channel" if channel is None else f"channel {channel}"
    nodes = "every node" if node is None else f"node {node}"
    return f"{channels} of {nodes}"


def covering(holds: list[Hold], node: str, channel: str) -> Hold | None:
    """The hold that stops ``channel`` on ``node`` (the broadest, then the oldest), or None."""
    found = [h for h in holds if h.covers(node, channel)]
    if not found:
        return None
    return min(found, key=lambda h: (h.node is not None, h.channel is not None, h.at))


def operator_name() -> str:
    """Who sets a hold: ``user@host`` of this process."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry and no LOGNAME/USER (some containers)
        user = f"uid{os.getuid()}"
    return f"{user}@{socket.gethostname()}"


class ClusterHolds:
    """The cluster holds of one store. Thread-safe (every call is one store transaction).

    Parameters:
        store: the store the daemons share.
        prefix: bytes put before every key (tests on a shared FoundationDB cluster use a
            fresh one; the daemons use none).
    """

    def __init__(self, store: Store, prefix: bytes = b"") -> None:
        self.store = store
        self._base = prefix + tuples.pack(("holds", LAYOUT_VERSION))
        self.changes_key = self._base + tuples.pack(("changes",))
        self._begin, self._end = (self._base + k for k in tuples.range(("hold",)))

    def _key(self, node: str | None, channel: str | None) -> bytes:
        return self._base + tuples.pack(("hold", node, channel))

    def _run(self, fn: Callable[[Transaction], T], tx: Transaction | None) -> T:
        return fn(tx) if tx is not None else self.store.transact(fn)

    # -- the operator's verbs -----------------------------------------------------------------

    def hold(self, node: str | None, channel: str | None, *, by: str, at: float,
             tx: Transaction | None = None) -> Hold:
        """Hold ``channel`` (None: every channel) on ``node`` (None: every node). Idempotent.

        A hold already there over exactly this scope is kept as it is (its ``by`` and
        ``at`` too): suspending twice is one hold.

        Parameters:
            node, channel: the scope; a name must be a non-empty string.
            by: who sets it (see :func:`operator_name`).
            at: when (Unix seconds); pass a value fixed before the call, so a retried
                transaction writes the same record.
            tx: run inside the caller's transaction instead of one of its own.

        Returns:
            The hold in force over this scope after the call.

        Raises:
            ValueError: an empty name.
            StoreError: the store failed (after its retries).
        """
        _check_scope(node, channel)
        key = self._key(node, channel)
        value = msgpack.packb({"by": by, "at": float(at)}, use_bin_type=True)

        def body(tr: Transaction) -> Hold:
            existing = tr.get(key)  # a conflict read: a concurrent resume of it is serialised
            if existing is not None:
                return _decode(node, channel, existing)
            tr.set(key, value)
            tr.add(self.changes_key, _ONE)
            return Hold(node, channel, by, float(at))

        return self._run(body, tx)

    def release(self, node: str | None, channel: str | None, *, tx: Transaction | None = None) -> list[Hold]:
        """Clear every hold inside the scope ``(node, channel)`` (None: every node / channel).

        ``release(None, None)`` clears them all; ``release(None, "c")`` clears the holds of
        channel ``c`` on every node and on each node; ``release("n2", None)`` clears every
        hold naming node ``n2``. A broader hold (every channel, when one is released) stays:
        it is returned, so the operator hears what still holds.

        Returns:
            The holds left that still stop something inside the scope (the same whether or
            not a retried attempt had already committed).

        Raises:
            ValueError: an empty name.
            StoreError: the store failed (after its retries).
        """
        _check_scope(node, channel)

        def body(tr: Transaction) -> list[Hold]:
            remaining = []
            cleared = False
            for key, value in tr.get_range(self._begin, self._end):
                hold = self._decode_key(key, value)
                if hold is None:
                    continue
                if hold.within(node, channel):
                    tr.clear(key)
                    cleared = True
                elif hold.overlaps(node, channel):
                    remaining.append(hold)
            if cleared:
                tr.add(self.changes_key, _ONE)
            return remaining

        return self._run(body, tx)

    # -- readers ---------------------------------------------------------------------------------

    def read(self, tr: Transaction) -> list[Hold]:
        """Every hold, in key order (broadest first), as ``tr`` sees them; a snapshot read."""
        holds = []
        for key, value in tr.snapshot.get_range(self._begin, self._end):
            hold = self._decode_key(key, value)
            if hold is not None:
                holds.append(hold)
        return holds

    def current(self) -> list[Hold]:
        """Every hold now (one read-only transaction)."""
        return self.store.transact(self.read)

    def watch(self, tr: Transaction) -> Watch:
        """A watch that fires at the next change of any hold, armed when ``tr`` commits.

        Read the holds in the same transaction: a change committed after that read fires it.
        """
        return tr.watch(self.changes_key)

    def _decode_key(self, key: bytes, value: bytes) -> Hold | None:
        try:
            parts = tuples.unpack(key[len(self._base):])
        except ValueError:
            return None
        if len(parts) != 3 or not all(p is None or isinstance(p, str) for p in parts[1:]):
            return None  # not a key this layout writes
        return _decode(parts[1], parts[2], value)


def _check_scope(node: str | None, channel: str | None) -> None:
    for what, name in (("node", node), ("channel", channel)):
        if name is not None and (not isinstance(name, str) or not name):
            raise ValueError(f"a hold's {what} must be a non-empty name or None, not {name!r}")


def _decode(node: str | None, channel: str | None, value: bytes) -> Hold:
    """The hold stored under a key; an unreadable record still holds (presence is what counts)."""
    record: Any = None
    if len(value) <= MAX_RECORD_BYTES:
        try:
            record = msgpack.unpackb(bytes(value), raw=False, max_str_len=MAX_RECORD_BYTES, max_bin_len=0,
                                     max_array_len=16, max_map_len=16, max_ext_len=0)
        except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
            record = None
    if not isinstance(record, dict):
        return Hold(node, channel, "unknown", 0.0)
    by, at = record.get("by"), record.get("at")
    return Hold(node, channel, by if isinstance(by, str) else "unknown",
                float(at) if isinstance(at, (int, float)) and not isinstance(at, bool) else 0.0)
