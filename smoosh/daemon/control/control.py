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

The incremental pace (the backlog controller's ``chunk_gap_factor``, which lives in the
daemon) reaches ``smoosh worker`` processes the same way: the daemon writes it under
``pack(("pace", node))`` with its status record (:func:`put_pace`, no transaction of its
own), stamped with the record's wall time (ASCII ``"factor wall_time"``), and
:func:`read_signals` reads it with the holds. A pace stamped more than
:data:`PACE_MAX_AGE_S` from the reader's wall time, either way, counts as none (the daemon
stopped, was killed, or cannot reach the store), and so does one in another format; a
daemon that stops cleanly removes its pace as it marks its record stopped (:func:`clear_pace`,
no transaction of its own either). A worker with no pace keeps its own default.
"""

from __future__ import annotations

import math

from smoosh.store import tuples
from smoosh.store.base import Store, Transaction

__all__ = [
    "set_hold", "held_channels", "hold_key",
    "request_rotation", "rotation_requests", "clear_rotation", "read_signals", "put_pace", "pace_key",
    "clear_pace", "STATUS_INTERVAL_S", "PACE_MAX_AGE_S",
]

#: Value stored under a hold key (the key's presence is what counts).
HOLD_VALUE = b"\x01"

#: Seconds between two status records written by one node, each with its pace (the status
#: record's cadence lives here, in the lowest layer that needs it: the pace's bound below).
STATUS_INTERVAL_S = 5.0
#: A pace stamped more than this many seconds from the reader's wall time counts as none. A live
#: daemon stamps one every status interval as it queues the write, which may take up to two
#: intervals to commit (its timeout): its newest pace can be three intervals old when read.
#: One interval more for a starter thread busy with other store work and for clock skew
#: between the daemon's host and a worker's; missing that many means the daemon stopped or
#: cannot reach the store.
PACE_MAX_AGE_S = 4 * STATUS_INTERVAL_S


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


def pace_key(node: str) -> bytes:
    """The store key holding ``node``'s incremental pace (the daemon's ``chunk_gap_factor``)."""
    return tuples.pack(("pace", node))


def put_pace(tr: Transaction, node: str, chunk_gap_factor: float, now: float) -> None:
    """Write ``node``'s pace inside the caller's transaction (the daemon's status write), stamped ``now`` (wall seconds)."""
    tr.set(pace_key(node), f"{float(chunk_gap_factor)!r} {float(now)!r}".encode("ascii"))


def clear_pace(tr: Transaction, node: str) -> None:
    """Remove ``node``'s pace inside the caller's transaction (the daemon's record marked stopped):
    its workers go back to their default at their next poll."""
    tr.clear(pace_key(node))


def _pace(raw: bytes | None, now: float) -> float | None:
    """A stored pace read at ``now`` (wall seconds), or None when there is none, it is not a
    positive finite number with its wall time, or that time is more than :data:`PACE_MAX_AGE_S` from ``now``."""
    if raw is None:
        return None
    try:
        # A bare float (a daemon from before the stamp) has one field: no age, so no pace.
        factor_text, written_text = bytes(raw).decode("ascii").split(" ")
        factor, written = float(factor_text), float(written_text)
    except (UnicodeDecodeError, ValueError):
        return None
    if not (math.isfinite(factor) and factor > 0 and math.isfinite(written)):
        return None
    # Stamped in the future by more than the bound: a wall clock stepped back (the worker's,
    # or the daemon's after it wrote). Its age cannot be told, and honouring it until the
    # clock catches up could keep a dead daemon's pace for as long as the step: none, and
    # the worker keeps its default. Within the bound it is clock skew between two hosts.
    return factor if abs(now - written) <= PACE_MAX_AGE_S else None


def read_signals(
    store: Store, node: str, channel: str | None, key: str, *, now: float
) -> tuple[bool, str | None, float | None]:
    """``(held, rotation run id or None, the node's pace or None)`` for one running job, read in one transaction.

    The worker's heartbeat polls this every second, so it is one snapshot transaction with
    three point reads rather than three transactions. ``now`` (wall seconds, the reader's
    clock) ages the pace: one too old or too far ahead is None, as if none was written.
    """
    hkey = None if channel is None else hold_key(node, channel)
    rkey = rotate_key(node, key)
    pkey = pace_key(node)

    def body(tr: Transaction) -> tuple[bool, str | None, float | None]:
        held = hkey is not None and tr.snapshot.get(hkey) is not None
        run = tr.snapshot.get(rkey)
        return held, None if run is None else bytes(run).decode("utf-8", "replace"), _pace(tr.snapshot.get(pkey), now)

    held, run, pace = store.transact(body)
    return bool(held), run, pace
