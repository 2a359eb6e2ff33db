"""Forgetting a decommissioned node: ``smoosh forget NODE --store URL`` takes it out of the fleet.

A node whose host is gone for good stays in the fleet view as ``stopped`` or ``stale`` forever,
its jobs and records with it (and a stale one keeps the node-stale alert firing). Forgetting
it clears everything the store holds of it, in the key spaces each of smoosh's parts keeps:

* its status record (:mod:`smoosh.daemon.record.status`);
* its jobs, of the type ``smoosh:NODE``, and the type's timeout, so no daemon's activity
  monitor watches the type any more (the job layer);
* its crash records and its keys' last results (``("crash", NODE, ...)``,
  :mod:`smoosh.daemon.run.startup`; ``("history", NODE, ...)``, :mod:`smoosh.daemon.results`);
* its holds on running work, rotation requests and pace (:mod:`smoosh.daemon.control.control`);
* the cluster holds that name it (the ones of every node stay) (:mod:`smoosh.daemon.control.cluster_holds`);
* its part of the fleet-wide cap (:mod:`smoosh.daemon.control.cluster_cap`).

Only a node that is not live is forgotten (:class:`NodeLive` otherwise): a node that stopped
cleanly, or whose record has gone stale. A stale node may only be cut off from the store; if
its daemon comes back it writes its record again and is part of the fleet once more (its jobs
gone: a running compaction's next heartbeat finds its job removed and stops).

Jobs go in batches of :data:`JOBS_PER_TRANSACTION` (a node may have left many); the rest in
one transaction at the end, its status record included, so a node is either still listed or
forgotten whole.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from smoosh.daemon.control.cluster_cap import ClusterCap
from smoosh.daemon.control.cluster_holds import ClusterHolds
from smoosh.daemon.record.status import LIVE, forget_node_status, node_state, read_node_record
from smoosh.errors import SmooshError
from smoosh.jobs import Jobs, NotFound
from smoosh.store import Store, Transaction, tuples

__all__ = ["forget_node", "Forgotten", "NodeLive", "NodeUnknown", "NODE_KEY_SPACES", "JOBS_PER_TRANSACTION"]

#: Jobs removed per transaction (well under FoundationDB's 10 MB and 5 s per transaction).
JOBS_PER_TRANSACTION = 200
#: The first element of the keys a node owns in each of the daemon's own key spaces (each
#: followed by the node's name): crash records, last results, holds, rotation requests, pace.
NODE_KEY_SPACES = ("crash", "history", "control", "rotate", "pace")


class NodeLive(SmooshError):
    """Raised when the node to forget is live: its record was rewritten moments ago.

    Attributes:
        node: the node.
        age_s: seconds since its last record.
    """

    def __init__(self, node: str, age_s: float, host: str | None, pid: int | None) -> None:
        who = f" (host {host}, pid {pid})" if host else ""
        super().__init__(f"node {node!r} is live: its daemon{who} wrote its status record {max(0.0, age_s):.0f} s ago; "
                         "stop it first (a clean stop shows it stopped at once), then forget it")
        self.node = node
        self.age_s = age_s


class NodeUnknown(SmooshError):
    """Raised when no record of the node to forget is in the store (a typo, or forgotten already)."""

    def __init__(self, node: str) -> None:
        super().__init__(f"no node named {node!r} has a status record in this store: nothing to forget "
                         "(`smoosh status --store URL` lists the nodes)")
        self.node = node


@dataclass(frozen=True)
class Forgotten:
    """What forgetting a node cleared.

    Attributes:
        node: the node.
        state: its state in the fleet view before (``stopped`` or ``stale``).
        jobs: its jobs removed.
        holds: the cluster holds naming it, cleared.
    """

    node: str
    state: str
    jobs: int
    holds: int

    def to_json(self) -> dict[str, Any]:
        """``{"node", "state", "jobs", "holds"}``."""
        return {"node": self.node, "state": self.state, "jobs": self.jobs, "holds": self.holds}


def forget_node(store: Store, node: str, now: float, *, timeout_s: float | None = None) -> Forgotten:
    """Clear everything ``store`` holds of ``node`` (see the module docstring).

    Parameters:
        store: the store the nodes share.
        node: the node to forget.
        now: wall-clock seconds (its record's age).
        timeout_s: each transaction gives up after this long (None: the store's default).

    Returns:
        What was cleared.

    Raises:
        NodeLive: the node is live.
        NodeUnknown: the store has no record of it.
        SmooshError: the store failed.
    """
    opts: dict[str, Any] = {} if timeout_s is None else {"timeout_s": timeout_s}

    record = store.transact(lambda tr: read_node_record(tr.snapshot, node), **opts)
    if record is None:
        raise NodeUnknown(node)
    state = node_state(record, now)
    if state == LIVE:
        process = record.get("process")
        process = process if isinstance(process, dict) else {}
        raise NodeLive(node, now - float(record.get("updated_at") or 0), process.get("host"), process.get("pid"))

    job_type = f"smoosh:{node}"
    jobs = Jobs(store, monitors=False)
    removed = 0
    try:
        ids = [job_id for _t, job_id, _s, _d in jobs.list_jobs(job_type)]
        for start in range(0, len(ids), JOBS_PER_TRANSACTION):
            batch = ids[start:start + JOBS_PER_TRANSACTION]
            removed += store.transact(functools.partial(_remove_jobs, jobs, job_type, batch), **opts)
        holds = ClusterHolds(store)

        def rest(tr: Transaction) -> int:
            if node_state(read_node_record(tr, node) or {"stopped": True}, now) == LIVE:
                raise NodeLive(node, 0.0, None, None)  # it came back meanwhile: keep it
            jobs.drop_type(job_type, tx=tr)  # its timeout, and what its removed jobs left (watch keys)
            for space in NODE_KEY_SPACES:
                tr.clear_range(*tuples.range((space, node)))
                tr.clear(tuples.pack((space, node)))  # the pace is a key of its own, not a range
            cleared = sum(1 for hold in holds.read(tr) if hold.node == node)
            if cleared:
                holds.release(node, None, tx=tr)  # every hold naming it; those of every node stay
            ClusterCap().forget(tr, node)
            forget_node_status(tr, node)
            return cleared

        cleared = store.transact(rest, **opts)
    finally:
        jobs.close()
    return Forgotten(node, state, removed, cleared)


def _remove_jobs(jobs: Jobs, job_type: str, ids: list[str], tr: Transaction) -> int:
    """Remove the jobs ``ids`` of ``job_type`` in ``tr``; how many there were."""
    removed = 0
    for job_id in ids:
        try:
            jobs.remove(job_type, job_id, tx=tr)
            removed += 1
        except NotFound:
            pass  # gone meanwhile (removed by its worker, or by a forget running beside this one)
    return removed
