"""Holds on running work, shared through the store: the server sets them, workers obey them.

When a channel leaves its strict window or an operator suspends it, the server calls
:func:`set_hold`; every worker of that node (in any process sharing the store) reads it
with :func:`read_signals` from its heartbeat thread: a held incremental compaction waits at
its next chunk boundary, holding no database lock; a held full VACUUM is interrupted
and finished as "interrupted". A hold is one key, ``pack(("control", node, channel))``:
present = held.

Rotation (DESIGN §5.6) asks one run of one job to stop: ``pack(("rotate", node, key))``
holds the run id the worker published in the job's data. The worker stops the run only if
the id is its own (a request left behind by a dead run never stops the next one) and only
at a chunk boundary of a suspendable compaction.
"""

from __future__ import annotations

from smoosh.store import tuples
from smoosh.store.base import Store, Transaction

__all__ = [
    "set_hold", "held_channels", "hold_key",
    "request_rotation", "rotation_requests", "clear_rotation", "read_signals",
]

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


def held_channels(store: Store, node: str) -> set[str]:
    """Names of the channels of ``node`` that are held now (for status and restarts)."""
    begin, end = tuples.range(("control", node))

    def body(tr: Transaction) -> set[str]:
        return {tuples.unpack(k)[2] for k, _ in tr.snapshot.get_range(begin, end)}

    return set(store.transact(body))


def rotate_key(node: str, key: str) -> bytes:
    """The store key holding the run id of ``key``'s job that rotation asks to stop."""
    return tuples.pack(("rotate", node, key))


def request_rotation(store: Store, node: str, key: str, run_id: str) -> None:
    """Ask the worker running ``key``'s job as ``run_id`` to stop at its next chunk boundary."""
    rkey = rotate_key(node, key)
    store.transact(lambda tr: tr.set(rkey, run_id.encode("utf-8")))


def clear_rotation(store: Store, node: str, key: str) -> None:
    """Forget a rotation request (idempotent)."""
    rkey = rotate_key(node, key)
    store.transact(lambda tr: tr.clear(rkey))


def rotation_requests(store: Store, node: str) -> dict[str, str]:
    """Every rotation request of ``node``: ``{key: run_id}``."""
    begin, end = tuples.range(("rotate", node))

    def body(tr: Transaction) -> dict[str, str]:
        return {
            tuples.unpack(k)[2]: v.decode("utf-8", "replace") for k, v in tr.snapshot.get_range(begin, end)
        }

    return dict(store.transact(body))


def read_signals(store: Store, node: str, channel: str | None, key: str) -> tuple[bool, str | None]:
    """``(held, rotation run id or None)`` for one running job, read in one transaction.

    The worker's heartbeat polls this every second, so it is one snapshot transaction with
    two point reads rather than two transactions.
    """
    hkey = None if channel is None else hold_key(node, channel)
    rkey = rotate_key(node, key)

    def body(tr: Transaction) -> tuple[bool, str | None]:
        held = hkey is not None and tr.snapshot.get(hkey) is not None
        run = tr.snapshot.get(rkey)
        return held, None if run is None else bytes(run).decode("utf-8", "replace")

    held, run = store.transact(body)
    return bool(held), run
