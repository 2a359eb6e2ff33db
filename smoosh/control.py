"""Holds on running work, shared through the store: the server sets them, workers obey them.

When a channel leaves its strict window or an operator suspends it, the server calls
:func:`set_hold`; every worker of that node (in any process sharing the store) reads
:func:`is_held` between chunks and from its heartbeat thread: a held incremental compaction
waits at its next chunk boundary, holding no database lock; a held full VACUUM is interrupted
and finished as "interrupted". A hold is one key, ``pack(("control", node, channel))``:
present = held.
"""

from __future__ import annotations

from typing import Any

from smoosh.store import tuples
from smoosh.store.base import ReadView, Store, Transaction

__all__ = ["set_hold", "is_held", "held_channels", "hold_key"]

#: Value stored under a hold key (the key's presence is what counts).
HOLD_VALUE = b"\x01"


def hold_key(node: str, channel: str) -> bytes:
    """The store key whose presence holds ``channel``'s running work on ``node``."""
    return tuples.pack(("control", node, channel))


def set_hold(store: Store, node: str, channel: str, hold: bool) -> None:
    """Hold (or release) the running work of one channel of one node. Idempotent.

    Parameters:
        store: the store the node's workers share.
        node: the node name (its job type is ``"smoosh:" + node``).
        channel: the channel name.
        hold: True to hold, False to release.
    """
    key = hold_key(node, channel)

    def body(tr: Transaction) -> None:
        if hold:
            tr.set(key, HOLD_VALUE)
        else:
            tr.clear(key)

    store.transact(body)


def _reader(store_or_tr: Any) -> tuple[ReadView | None, Any]:
    if hasattr(store_or_tr, "transact") and not hasattr(store_or_tr, "get"):
        return None, store_or_tr
    # A transaction: read at snapshot so a hold flip never conflicts with the caller's writes.
    return getattr(store_or_tr, "snapshot", store_or_tr), None


def is_held(store_or_tr: Store | Transaction, node: str, channel: str) -> bool:
    """Is ``channel``'s running work on ``node`` held?

    Parameters:
        store_or_tr: a store (read in a transaction of its own) or an open transaction.
        node: the node name.
        channel: the channel name.

    Returns:
        True while a hold is set.
    """
    key = hold_key(node, channel)
    view, store = _reader(store_or_tr)
    if view is not None:
        return view.get(key) is not None
    return bool(store.transact(lambda tr: tr.snapshot.get(key) is not None))


def held_channels(store: Store, node: str) -> set[str]:
    """Names of the channels of ``node`` that are held now (for status and restarts)."""
    begin, end = tuples.range(("control", node))

    def body(tr: Transaction) -> set[str]:
        return {tuples.unpack(k)[2] for k, _ in tr.snapshot.get_range(begin, end)}

    return set(store.transact(body))
