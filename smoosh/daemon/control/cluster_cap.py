"""The fleet-wide cap (``cluster_max_jobs``): compactions running on all the nodes of a store together.

Nodes that share a storage backend (a SAN, one cloud volume type's throughput) need one limit
across them, not one each (issue 50). Each run a node starts takes a *slot* in the store, in
the very transaction that adds its job (the claim), and gives it back in the transaction that
ends its job; the claim reads every slot with a conflict read, so two claims that both see
room cannot both commit: the store serialises them, and the cap never overshoots, whatever
the number of nodes racing for the last slot.

Layout (a key space of its own beside the job layer's, versioned)::

    ("cap", 1, "slot", node, token) = msgpack {"at": unix seconds}   a run's slot: present = held
    ("cap", 1, "lease", node)       = tuple (expires_at,)            the node's slots count until then
    ("cap", 1, "want", node)        = tuple (since, at)              the node was refused a slot
    ("cap", 1, "freed")             = 8-byte little-endian counter   bumped as slots are given back

* **Slots are idempotent.** A slot is one key per run (its token), set by the claim and cleared
  by whatever ends the run (a finish, a removal, a take-over, a clean stop): a transaction
  retried after a "may have committed" error sets or clears it again, and a run ended twice
  gives it back once. Nothing counts; the slots present are the count.
* **A dead node's slots stop counting.** A node's slots count while its lease lasts: each claim
  and each status record (every few seconds) renew it for :data:`LEASE_S`. A node killed
  with runs in flight holds nothing once its lease expires, and its next start gives back
  what it left (:meth:`ClusterCap.reconcile`), as does ``smoosh forget``. A claim sets the
  slot and the lease in one commit: a claim that sees the slot (a conflict read) sees the
  lease that makes it count.
* **Fair between nodes.** A refused claim leaves a *want* (when it was refused). While
  another node wants a slot and holds fewer than its share (the cap over the nodes holding
  or wanting slots, rounded up), a node that holds its share already is refused too, even
  with slots free: as runs end, the slots go to the nodes below their share, and no node is
  starved while another holds every slot. With nobody else waiting, one node may use them
  all. Wants are read with a snapshot read (a fairness decision on a moment-old view is
  fine; only the count must be exact) and forgotten after :data:`WANT_TTL_S`: a node that
  still waits refreshes its want each time it asks.
* **Waiting is event-driven.** A refused node's daemon holds its channels' starts
  (:class:`CapGate`) until a slot is given back anywhere (a watch on ``freed``, armed by the
  refusing transaction itself), or :data:`RETRY_S` at the latest, which also keeps its want
  fresh.

The cap is each node's ``cluster_max_jobs``: nodes given different values each enforce their
own (``smoosh status --store`` shows each node's). A node with none set takes no slots.

Owner: the store (every method runs inside the caller's transaction); :class:`CapGate` belongs
to the server's loop thread.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import msgpack

from smoosh.daemon.control.control import STATUS_INTERVAL_S
from smoosh.store import tuples
from smoosh.store.base import ReadView, Transaction, Watch

__all__ = ["ClusterCap", "CapGate", "NodeCap", "NodeSlots", "Refusal", "LEASE_S", "WANT_TTL_S", "RETRY_S", "SLOT_FIELD"]

#: Version of this key space's layout (the second element of every key).
LAYOUT_VERSION = 1
#: Seconds a node's slots count after its last claim or status record: three status intervals,
#: the same silence that makes a node stale in the fleet view.
LEASE_S = 3 * STATUS_INTERVAL_S
#: Seconds a refusal keeps a node among those waiting for a slot (it asks again every
#: :data:`RETRY_S` at the latest while it waits, which renews it).
WANT_TTL_S = 3.0
#: Longest a refused node waits before it asks again with no slot given back meanwhile.
RETRY_S = 1.0
#: The field of a job's data that says its run holds a slot (so whatever ends the job gives it back).
SLOT_FIELD = "cap_slot"
#: Largest slot record decoded, in bytes.
MAX_RECORD_BYTES = 1024

_ONE = struct.pack("<q", 1)


@dataclass(frozen=True)
class Refusal:
    """A claim the cap refused, and why.

    Attributes:
        limit: the cap in force.
        running: slots held across the live nodes.
        mine: slots this node holds.
        share: this node's fair share while others wait (None when the cap itself is full).
        waiting: the nodes that wait below their share (when fairness refused it).
    """

    limit: int
    running: int
    mine: int
    share: int | None = None
    waiting: tuple[str, ...] = ()

    def to_data(self) -> dict[str, Any]:
        """The refusal as plain data: what a claim's transaction returns (the job layer replays
        a transaction's result after a "may have committed" error, and replays only plain data)."""
        return {"refused": {"limit": self.limit, "running": self.running, "mine": self.mine, "share": self.share,
                            "waiting": list(self.waiting)}}

    @classmethod
    def from_data(cls, value: object) -> Refusal | None:
        """The refusal :meth:`to_data` made, or None for any other value (a claim that was not refused)."""
        if not isinstance(value, dict) or not isinstance(value.get("refused"), dict):
            return None
        r = value["refused"]
        return cls(int(r["limit"]), int(r["running"]), int(r["mine"]), r.get("share"), tuple(r.get("waiting") or ()))

    def reason(self) -> str:
        """The refusal in an operator's words (a dropped run's reason, the log)."""
        if self.share is None:
            return (f"the store's nodes run {self.running} compactions, cluster_max_jobs = {self.limit}: "
                    "it waits for one of them to end")
        return (f"this node runs {self.mine}, its share of cluster_max_jobs = {self.limit}, while node(s) "
                f"{', '.join(self.waiting)} wait for a slot: it waits for its turn")


@dataclass(frozen=True)
class NodeSlots:
    """One node's part of the cap, as the store holds it (the fleet view).

    Attributes:
        slots: the slots its runs hold.
        counted: whether they count now (its lease is live).
        wanting_since: since when it waits for a slot (Unix seconds), None when it does not.
    """

    slots: int = 0
    counted: bool = False
    wanting_since: float | None = None

    def to_json(self) -> dict[str, Any]:
        """``{"slots", "counted", "wanting_since"}``."""
        return {"slots": self.slots, "counted": self.counted, "wanting_since": self.wanting_since}


class ClusterCap:
    """The cap's key space in one store: slots, leases and wants (see the module docstring).

    Every method works inside the caller's transaction; none commits.

    Parameters:
        prefix: bytes put before every key (tests on a shared FoundationDB cluster use a fresh
            one; the daemons use none).
    """

    def __init__(self, prefix: bytes = b"") -> None:
        self._base = prefix + tuples.pack(("cap", LAYOUT_VERSION))
        self.freed_key = self._base + tuples.pack(("freed",))
        self._slots = self._range(("slot",))
        self._leases = self._range(("lease",))
        self._wants = self._range(("want",))

    def _range(self, t: tuple[Any, ...]) -> tuple[bytes, bytes]:
        begin, end = tuples.range(t)
        return self._base + begin, self._base + end

    def _slot_key(self, node: str, token: int) -> bytes:
        return self._base + tuples.pack(("slot", node, token))

    def _lease_key(self, node: str) -> bytes:
        return self._base + tuples.pack(("lease", node))

    def _want_key(self, node: str) -> bytes:
        return self._base + tuples.pack(("want", node))

    # -- a run's slot ------------------------------------------------------------------------------

    def take(self, tr: Transaction, node: str, token: int, limit: int, now: float) -> Refusal | None:
        """Take a slot for run ``token`` of ``node`` in ``tr`` (the transaction that claims the run).

        Parameters:
            tr: the claim's transaction.
            node: this node.
            token: the run's token.
            limit: the cap (``cluster_max_jobs``), at least 1.
            now: wall-clock seconds (leases and wants cross hosts: wall time).

        Returns:
            None when the slot is taken (set in ``tr``, with this node's lease); else the
            :class:`Refusal`, with this node's want written in ``tr`` (``tr`` must commit all
            the same; :meth:`watch_freed` in it arms the watch that ends the wait).
        """
        held = self._held(tr.get_range(*self._slots))  # the conflict read: claims are serialised on it
        leases = self._lease_times(tr.snapshot)
        wants = self._want_times(tr.snapshot)
        counts = {n: len(tokens) for n, tokens in held.items() if n == node or leases.get(n, 0.0) >= now}
        mine = counts.get(node, 0)
        running = sum(counts.values())
        own_want = wants.get(node)
        if token in held.get(node, ()):
            return None  # this attempt's twin committed already ("may have committed"): it holds
        if running >= limit:
            return self._refuse(tr, node, now, own_want, Refusal(limit, running, mine))
        wanting = {n: since for n, (since, at) in wants.items()
                   if n != node and at >= now - WANT_TTL_S and leases.get(n, 0.0) >= now}
        contenders = {n for n, c in counts.items() if c > 0} | set(wanting) | {node}
        share = math.ceil(limit / len(contenders))
        below = tuple(sorted(n for n in wanting if counts.get(n, 0) < share))
        if mine >= share and below:
            return self._refuse(tr, node, now, own_want, Refusal(limit, running, mine, share, below))
        tr.set(self._slot_key(node, token), msgpack.packb({"at": now}, use_bin_type=True))
        self.renew(tr, node, now)
        if own_want is not None:
            tr.clear(self._want_key(node))
        return None

    def _refuse(self, tr: Transaction, node: str, now: float, own_want: tuple[float, float] | None,
                refusal: Refusal) -> Refusal:
        since = own_want[0] if own_want is not None and own_want[1] >= now - WANT_TTL_S else now
        tr.set(self._want_key(node), tuples.pack((since, now)))
        self.renew(tr, node, now)  # a waiting node is a live one: its want counts while it waits
        return refusal

    def watch_freed(self, tr: Transaction) -> Watch:
        """A watch that fires as a slot is given back anywhere, armed when ``tr`` commits (the refusal's)."""
        return tr.watch(self.freed_key)

    def release(self, tr: Transaction, node: str, token: int) -> None:
        """Give back run ``token``'s slot in ``tr`` (idempotent: a slot not held changes nothing but
        the ``freed`` counter, which only wakes the nodes waiting)."""
        tr.clear(self._slot_key(node, token))
        tr.add(self.freed_key, _ONE)

    def adopt(self, tr: Transaction, node: str, token: int, now: float) -> None:
        """Hold a slot for a run found running at start-up (a ``smoosh worker``'s), without asking:
        it runs already, and counted before the restart."""
        tr.set(self._slot_key(node, token), msgpack.packb({"at": now}, use_bin_type=True))

    def renew(self, tr: Transaction, node: str, now: float) -> None:
        """Renew ``node``'s lease: its slots count for :data:`LEASE_S` from ``now`` (a blind write)."""
        tr.set(self._lease_key(node), tuples.pack((now + LEASE_S,)))

    def reconcile(self, tr: Transaction, node: str, live: Iterable[int]) -> int:
        """Give back every slot of ``node`` whose run is not in ``live`` (the runs the node follows now).

        The net under the slots: a run that ended in a way that wrote no give-back (a failed
        finish, a kill -9 before a restart, a clean stop's own runs) holds no slot past the
        next status record, or past the restart. A snapshot read of the node's own slots; a
        clear only when one is found (a clear in the slots' range makes concurrent claims retry).

        Returns:
            The slots given back.
        """
        keep = set(live)
        begin, end = self._range(("slot", node))
        gone = [key for key, _ in tr.snapshot.get_range(begin, end) if self._token_of(key) not in keep]
        for key in gone:
            tr.clear(key)
        if gone:
            tr.add(self.freed_key, _ONE)
        return len(gone)

    def forget(self, tr: Transaction, node: str) -> None:
        """Clear everything of ``node`` (``smoosh forget``): its slots, lease and want."""
        begin, end = self._range(("slot", node))
        tr.clear_range(begin, end)
        tr.clear(self._lease_key(node))
        tr.clear(self._want_key(node))
        tr.add(self.freed_key, _ONE)

    # -- readers -----------------------------------------------------------------------------------

    def read(self, view: ReadView, now: float) -> dict[str, NodeSlots]:
        """Every node's part of the cap (slots, whether they count, waiting since), as ``view`` reads it.

        Parameters:
            view: a transaction's snapshot view (no conflict).
            now: wall-clock seconds.
        """
        held = self._held(view.get_range(*self._slots))
        leases = self._lease_times(view)
        wants = self._want_times(view)
        out: dict[str, NodeSlots] = {}
        for node in sorted(set(held) | set(wants)):
            want = wants.get(node)
            out[node] = NodeSlots(
                slots=len(held.get(node, ())), counted=leases.get(node, 0.0) >= now,
                wanting_since=want[0] if want is not None and want[1] >= now - WANT_TTL_S else None,
            )
        return out

    def _held(self, rows: list[tuple[bytes, bytes]]) -> dict[str, set[int]]:
        held: dict[str, set[int]] = {}
        for key, _value in rows:
            parts = self._parts(key)
            if parts is not None and len(parts) == 3 and isinstance(parts[1], str) and isinstance(parts[2], int):
                held.setdefault(parts[1], set()).add(parts[2])
        return held

    def _token_of(self, key: bytes) -> int | None:
        parts = self._parts(key)
        return parts[2] if parts is not None and len(parts) == 3 and isinstance(parts[2], int) else None

    def _lease_times(self, view: ReadView) -> dict[str, float]:
        out = {}
        for key, value in view.get_range(*self._leases):
            parts, stored = self._parts(key), _floats(value)
            if parts is not None and len(parts) == 2 and isinstance(parts[1], str) and len(stored) == 1:
                out[parts[1]] = stored[0]
        return out

    def _want_times(self, view: ReadView) -> dict[str, tuple[float, float]]:
        out = {}
        for key, value in view.get_range(*self._wants):
            parts, stored = self._parts(key), _floats(value)
            if parts is not None and len(parts) == 2 and isinstance(parts[1], str) and len(stored) == 2:
                out[parts[1]] = (stored[0], stored[1])
        return out

    def _parts(self, key: bytes) -> tuple[Any, ...] | None:
        try:
            return tuples.unpack(key[len(self._base):])
        except ValueError:
            return None


def _floats(value: bytes) -> tuple[float, ...]:
    """A tuple of numbers stored by this module; () for anything else (the store may be shared)."""
    try:
        parts = tuples.unpack(value)
    except ValueError:
        return ()
    if not all(isinstance(p, (int, float)) and not isinstance(p, bool) for p in parts):
        return ()
    return tuple(float(p) for p in parts)


class CapGate:
    """A node's starts held back while the cap refuses them, released the moment a slot is given back.

    After a refusal no channel of the node starts anything (the cap is the store's, so any of
    them would be refused too), until the watch the refusal armed fires (a slot given back
    anywhere) or :data:`RETRY_S` passes; then the channels that asked meanwhile are woken and
    ask again. A task on the server's loop, due exactly at the retry time; never a poll.

    Owner: the server's loop thread (channels ask from their ticks; refusals and the watch's
    firing are posted there). ``waiting_since`` and ``refusals`` may be read from any thread.

    Parameters:
        wake_channel: ticks a channel soon (the server's ``wake``).
        rearm: ticks this gate soon, so it sets its due time anew (``Loop.wake(gate)``).
        clock: the loop's monotonic clock.
        wall: wall-clock seconds (``waiting_since``, which a person reads).
    """

    def __init__(self, *, wake_channel: Callable[[str], None], rearm: Callable[[], None],
                 clock: Callable[[], float], wall: Callable[[], float]) -> None:
        self._wake_channel = wake_channel
        self._rearm = rearm
        self._clock = clock
        self._wall = wall
        self._closed_until: float | None = None
        self._line: tuple[str, ...] = ()
        #: Since when this node waits for a slot (Unix seconds), None while it does not.
        self.waiting_since: float | None = None
        #: Claims the cap refused since the daemon started.
        self.refusals = 0
        self._watch: Watch | None = None

    def admits(self, channel: str) -> bool:
        """Whether ``channel`` may start now; if not, it is woken once a slot may be free."""
        if self._closed_until is None:
            return True
        if channel not in self._line:
            self._line = (*self._line, channel)
        return False

    def refused(self, watch: Watch | None, post: Callable[[Callable[[], None]], None]) -> None:
        """A claim was refused (loop thread): hold the starts until a slot is given back, or :data:`RETRY_S`.

        Parameters:
            watch: the refusal's watch on the slots given back (:meth:`ClusterCap.watch_freed`).
            post: hands a callable to the loop (the watch fires on a store thread).
        """
        self.refusals += 1
        if self.waiting_since is None:
            self.waiting_since = self._wall()
        self._closed_until = self._clock() + RETRY_S
        old, self._watch = self._watch, watch
        if old is not None:
            old.cancel()
        if watch is not None:
            watch.on_settled(lambda: post(lambda: self._freed(watch)))
        self._rearm()

    def admitted(self) -> None:
        """A claim took a slot (loop thread): this node waits no more."""
        self.waiting_since = None

    def _freed(self, watch: Watch) -> None:
        if watch is self._watch:
            self._open()

    def tick(self, now: float) -> float | None:
        """Open the gate at its retry time; else be due then."""
        if self._closed_until is None:
            return None
        if now < self._closed_until:
            return self._closed_until
        self._open()
        return None

    def _open(self) -> None:
        self._closed_until = None
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.cancel()
        line, self._line = self._line, ()
        for name in line:
            self._wake_channel(name)

    def close(self) -> None:
        """Cancel the armed watch (the daemon stops)."""
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.cancel()

    def waiting(self) -> list[str]:
        """The channels waiting for a slot now, in the order they asked."""
        return list(self._line)


class NodeCap:
    """One node's side of the cap: the key space, the node, the limit in force and the wall clock.

    What the scheduler's claims and the worker's finishes call (any thread: each call works in
    the caller's transaction, and reads the limit afresh, so a live edit of ``cluster_max_jobs``
    applies to the next claim).

    Parameters:
        cap: the store's cap key space.
        node: this node.
        limit_of: the ``cluster_max_jobs`` in force (None: no cap; no slot is taken).
        wall: wall-clock seconds.
    """

    def __init__(self, cap: ClusterCap, node: str, *, limit_of: Callable[[], int | None],
                 wall: Callable[[], float]) -> None:
        self.cap = cap
        self.node = node
        self._limit_of = limit_of
        self._wall = wall

    @property
    def limit(self) -> int | None:
        """The ``cluster_max_jobs`` in force now."""
        return self._limit_of()

    def take(self, tr: Transaction, token: int) -> tuple[bool, Refusal | None]:
        """Take a slot for run ``token`` in the claim's ``tr`` (see :meth:`ClusterCap.take`).

        Returns:
            ``(taken, refusal)``: ``(True, None)`` when the slot is taken, ``(False, None)`` when
            no cap is set, ``(False, refusal)`` when the cap refuses it.
        """
        limit = self._limit_of()
        if limit is None:
            return False, None
        refusal = self.cap.take(tr, self.node, token, limit, self._wall())
        return refusal is None, refusal

    def release_write(self, data: Mapping[str, object]) -> Callable[[Transaction], None] | None:
        """The write that gives back the slot of the job whose data is ``data`` (None: it holds none)."""
        token = data.get("run")
        if data.get(SLOT_FIELD) is not True or not isinstance(token, int):
            return None
        cap, node = self.cap, self.node
        return lambda tr: cap.release(tr, node, token)
