"""The status table: built for ``GET /status``, written per node to the store, read cluster-wide.

Channels publish snapshots; :func:`build_status` reads them (never waiting on a channel) with
the intake's measurements for the reclaimable-bytes estimate. Every node also writes its
record to the store every ~5 s, so ``smoosh status --store URL`` lists every node of a
FoundationDB cluster (or of one shared SQLite store) without contacting any daemon
(DESIGN §5.7).

The record also names the process that wrote it (:class:`~smoosh.daemon.control.node_claim.Identity`)
and says when it stopped cleanly: a daemon starting on a node name claims it here
(:func:`claim_node`), and refuses to start while another live process serves it (DESIGN §10).

A node's life, as the fleet view reads it from its record (:func:`node_state`, issue 50):

* ``live``: its record was rewritten within :data:`STALE_AFTER_S`;
* ``stale``: it was not (the heartbeat is past its deadline): the daemon was killed, is
  stopped or stalled, or cannot reach the store;
* ``stopped``: its daemon stopped cleanly and said so in its last record (:func:`mark_stopped`),
  at once, however old that record grows;
* forgotten: its records are gone (``smoosh forget NODE --store URL``,
  :mod:`smoosh.daemon.record.forget`): it is no longer part of the fleet.

The record carries the node's version of smoosh and its config's digest
(:func:`smoosh.config.digest.config_digest`), so a fleet running mixed versions or configs
shows it, and its ``cluster_max_jobs``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import msgpack

# Seconds between two status records of one node: the control layer's (below this one), since
# the pace written with each record is aged by it; named here too for the record's readers.
from smoosh.daemon.control.cluster_cap import ClusterCap
from smoosh.daemon.control.control import STATUS_INTERVAL_S, clear_pace
from smoosh.daemon.control.node_claim import Identity, NodeInUse, provably_dead
from smoosh.jsonutil import jsonable
from smoosh.store import Store, Transaction, tuples
from smoosh.store.base import ReadView

log = logging.getLogger(__name__)

#: A record older than this many seconds marks its node stale: three missed records.
STALE_AFTER_S = 3 * STATUS_INTERVAL_S
#: A channel holding more keys than this has its reclaimable bytes (and would-run list) summed
#: again at most once per status interval: summing them reads every key's measurement, and a
#: scraper asking every second must not make a fleet's queue cost the daemon that each time.
ESTIMATE_EVERY_READ_KEYS = 10_000
#: Largest record decoded, in bytes (a record is a few hundred bytes per channel).
MAX_RECORD_BYTES = 100_000

#: A node's states in the fleet view (see the module docstring), in the order they are listed.
LIVE = "live"
STALE = "stale"
STOPPED = "stopped"
NODE_STATES = (LIVE, STALE, STOPPED)

_PREFIX = ("status",)


def status_key(node: str) -> bytes:
    """The store key of ``node``'s status record."""
    return tuples.pack(_PREFIX + (node,))


def build_status(server: Any) -> dict[str, Any]:
    """The status table of a running :class:`~smoosh.daemon.server.Server`; never blocks on a channel.

    A channel busy past a moment shows its last estimate instead of making the reader wait.
    """
    channels: dict[str, Any] = {}
    total = 0
    estimates: dict[str, tuple[int, list[list[Any]]]] = server._last_estimates
    estimated_at: dict[str, float] = server._estimated_at
    now = time.monotonic()
    config = server.config
    starved = server._history.starved()
    runs = runs_by_channel(server)
    scheduler = server._scheduler
    claiming = scheduler.claiming() if scheduler is not None else {}
    for name, channel in list(server.channels().items()):
        entry = dict(channel.status())
        truthful_counts(entry, claiming.get(name, 0))
        entry.update(run_ages(runs.get(name, [])))
        large = entry["waiting"]["size"] + entry.get("deferred", 0) > ESTIMATE_EVERY_READ_KEYS
        fresh = name in estimates and now - estimated_at.get(name, 0.0) < STATUS_INTERVAL_S
        snapshot = None if (large and fresh) else channel.try_snapshot()
        if snapshot is None:
            reclaimable, would_run = estimates.get(name, (0, []))
        else:
            keys, waiting = snapshot
            reclaimable = server.intake.reclaimable(keys)
            would_run = [[k, p] for k, p in waiting[:100]]
            estimates[name] = (reclaimable, would_run)
            estimated_at[name] = now
        entry["reclaimable_bytes"] = reclaimable
        entry["starved"] = starved.get(name, 0)  # keys busy more than busy_retries times in a row
        ch_cfg = config.channels.get(name)
        window = getattr(ch_cfg, "window", None)
        entry["window"] = str(window) if window is not None else "always"
        if server.dry_run:
            entry["would_run"] = would_run
        total += reclaimable
        channels[name] = entry
    housekeeping = server._housekeeping
    return {
        "node": server.node,
        "version": server.version,
        "config_digest": server.config_digest,
        "channels": channels,
        "reclaimable_bytes": total,
        "dry_run": server.dry_run,
        "config_error": server._config_error,
        "restart_required": list(server._restart_required),
        "scan": housekeeping.scan_status() if housekeeping is not None else {},
        "io_budget": io_budget_status(server),
        "disk": disk_status(server),
        "controller": controller_status(server),
        "store": server.store_health.snapshot(),
        "application": server.application(),
        "cluster": server.cluster_status(),
        "fleet": housekeeping.fleet() if housekeeping is not None else None,
    }


def truthful_counts(entry: dict[str, Any], claiming: int) -> None:
    """Count a channel's runs whose claim has not committed yet as ``starting``, not ``active``.

    A run this daemon's worker takes at its submit counts active at once in its channel (it
    waits for no worker); but until the transaction that claims it commits, nothing compacts:
    during a store outage that commit waits as long as the outage, and the table showed such a
    database as running though it only started after the store came back (issue 50).

    Parameters:
        entry: the channel's status (``active`` and ``starting`` changed in place).
        claiming: the channel's runs whose claim is in flight
            (:meth:`~smoosh.daemon.run.scheduler.JobScheduler.claiming`).
    """
    moved = min(claiming, int(entry.get("active") or 0))
    if moved:
        entry["active"] = int(entry["active"]) - moved
        entry["starting"] = int(entry.get("starting") or 0) + moved


def runs_by_channel(server: Any) -> dict[str, list[dict[str, Any]]]:
    """Every run the daemon follows now, per channel, as ``/status`` shows it (oldest first).

    Each run: ``key``; ``state`` (``starting``: its job is being added or waits for a worker;
    ``claimed``: this daemon's worker took it and starts it; ``running``); ``started_at`` (Unix
    seconds: when its channel started it, or this daemon adopted it); ``age_s``; ``progress``
    (0 to 1); ``progress_at`` (Unix seconds of its last progress, None while it has made
    none); ``since_progress_s`` (seconds since then; when it has made none, since it began
    running, or since its start while it has not).
    Runs this process's worker runs show its live progress; others the progress their job's
    data last told.
    """
    scheduler = server._scheduler
    if scheduler is None:
        return {}
    clocks = server._clocks
    now = clocks.monotonic()
    worker = server._worker
    local = {r["key"]: r for r in worker.status()} if worker is not None else {}
    out: dict[str, list[dict[str, Any]]] = {}
    for view in sorted(scheduler.table.views, key=lambda v: v.opened_at):
        progress, progress_at = view.progress, view.progress_at
        here = local.get(view.key)
        if here is not None and here.get("channel") in (None, view.channel):
            progress = float(here["progress"])
            progress_at = here.get("progress_at")
        since = progress_at if progress_at is not None else (
            view.running_since if view.running_since is not None else view.opened_at)
        out.setdefault(view.channel, []).append({
            "key": view.key,
            "state": view.state,
            "started_at": round(clocks.wall_at(view.opened_at), 3),
            "age_s": round(max(0.0, now - view.opened_at), 3),
            "progress": round(progress, 4),
            "progress_at": None if progress_at is None else round(clocks.wall_at(progress_at), 3),
            "since_progress_s": round(max(0.0, now - since), 3),
        })
    return out


def run_ages(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A channel's runs and their ages, as its ``/status`` entry shows them: ``runs`` (see
    :func:`runs_by_channel`), ``oldest_run_s`` (the oldest run's age) and ``since_progress_s``
    (the longest any run has gone without progress); both 0 when nothing runs."""
    return {
        "runs": runs,
        "oldest_run_s": max((r["age_s"] for r in runs), default=0.0),
        "since_progress_s": max((r["since_progress_s"] for r in runs), default=0.0),
    }


def controller_status(server: Any) -> dict[str, Any]:
    """The backlog controller as ``/status`` shows it: what it saw at its last look, the slots and the pace it set."""
    d = server.controller.last
    return {"backlog_bytes": d.backlog_bytes, "busy": d.busy, "for_backlog": d.for_backlog, "for_harm": d.for_harm,
            "slots": d.slots, "min_jobs": server.controller.min_jobs, "max_jobs": server.controller.max_jobs,
            "chunk_gap_factor": d.chunk_gap_factor, "lock_waits": d.lock_waits}


def disk_status(server: Any) -> dict[str, Any]:
    """The disk as ``/status`` shows it: ``min_free_space``, the bytes running compactions reserved,
    and each file system under the roots: how full, and whether under disk pressure since when."""
    return {
        "min_free_space": str(server.disk_room.min_free),
        "reserved_bytes": server.disk_room.reserved_bytes(),
        "disk_pressure": None if server.config.disk_pressure is None else f"{server.config.disk_pressure * 100:g}%",
        "filesystems": [{"roots": list(fs.roots), "used": round(fs.used, 4), "pressure": fs.pressure,
                         "since": fs.since} for fs in server.pressure.snapshot()],
    }


def io_budget_status(server: Any) -> dict[str, Any]:
    """The I/O budget as ``/status`` shows it: the rate in force (``"infinity"`` when unlimited),
    bytes charged since start, seconds of debt left, chunks paused on it, channels whose start waits."""
    budget = server.io_budget
    rate = budget.rate_bytes_per_s
    return {
        "max_io_rate": "infinity" if rate is None else (int(rate) if rate.is_integer() else rate),
        "charged_bytes": budget.charged_bytes,
        "debt_s": round(budget.debt_s(), 3),
        "paused": budget.waiting(),
        "waiting_channels": server._budget_gate.waiting(),
    }


def write_node_status(store: Store, node: str, status: dict[str, Any], now: float) -> None:
    """Write ``node``'s status record (channels and reclaimable bytes) with its timestamp."""
    store.transact(lambda tr: put_node_status(tr, node, status, now))


def put_node_status(
    tr: Transaction, node: str, status: dict[str, Any], now: float, *, process: Identity | None = None,
) -> None:
    """:func:`write_node_status` inside the caller's transaction (write-only: it never conflicts).

    Parameters:
        process: the daemon writing it (a daemon always names itself; tests may not).
    """
    # Without the lists (the keys waiting, the runs and their keys): the record stays small
    # whatever the keys' lengths; the runs' ages stay in it.
    channels = {
        name: {k: v for k, v in entry.items() if k not in ("would_run", "runs")}
        for name, entry in status.get("channels", {}).items()
    }
    record = {
        "updated_at": now,
        "channels": jsonable(channels),
        "reclaimable_bytes": status.get("reclaimable_bytes", 0),
        # What an operator compares across the fleet: mixed versions, mixed configs, the cap.
        "version": status.get("version"),
        "config_digest": status.get("config_digest"),
        "cluster_max_jobs": (status.get("cluster") or {}).get("max_jobs"),
    }
    if process is not None:
        record["process"] = process.to_record()
    tr.set(status_key(node), msgpack.packb(record, use_bin_type=True))


def read_node_record(view: ReadView, node: str) -> dict[str, Any] | None:
    """``node``'s status record as ``view`` reads it (a snapshot read adds no conflict); None if none or unreadable."""
    return _decode(view.get(status_key(node)))


def other_live_daemon(record: dict[str, Any] | None, ours: Identity, now: float) -> Identity | None:
    """The live daemon of another process that wrote ``record``, or None (see :func:`provably_dead`).

    A record that names no process (written by an older smoosh, or by a test) proves nothing
    either way and is taken for no live daemon.
    """
    theirs, proof = _writer(record, ours, now)
    return theirs if theirs is not None and proof is None else None


def _writer(record: dict[str, Any] | None, ours: Identity, now: float) -> tuple[Identity | None, str | None]:
    """Who wrote ``record`` (None if it names no process), and why that one is provably dead (None: it may live)."""
    theirs = Identity.from_record(record.get("process")) if record else None
    if record is None or theirs is None:
        return None, None
    age_s = now - float(record.get("updated_at") or 0)
    return theirs, provably_dead(theirs, ours, age_s=age_s, stale_after_s=STALE_AFTER_S,
                                 stopped=record.get("stopped") is True)


def claim_node(store: Store, node: str, ours: Identity, now: float, *,
               facts: dict[str, Any] | None = None) -> frozenset[str]:
    """Claim ``node`` for this daemon in its status record, unless another live process serves it.

    One transaction reads the record (a read that conflicts, so two daemons starting at once
    cannot both see it free) and writes this daemon's identity into it, keeping its channels
    until the first regular write replaces them.

    Parameters:
        store: the job store.
        node: the node name.
        ours: this daemon.
        now: wall-clock seconds (the record's ``updated_at`` is the writer's).
        facts: what this daemon's record says of it from the claim on (``version``,
            ``config_digest``, ``cluster``: ``{"max_jobs"}``, as :func:`build_status` has them).

    Returns:
        The holder names of the previous daemon of this node, provably dead (its instance id and
        :attr:`~smoosh.daemon.control.node_claim.Identity.holder`; empty when there was none,
        or when its record named no process): the running jobs it held are this daemon's to take back (:func:`smoosh.daemon.run.startup.take_over_jobs`).

    Raises:
        NodeInUse: a live daemon of another process serves ``node`` (the message names its
            host, PID, start time and last heartbeat, and says to give each daemon its own node
            name). On this machine a live process is never taken over, however late its
            heartbeat (a stopped daemon, DESIGN §10).
        SmooshError: the store failed.
    """

    facts = facts or {}

    def body(tr: Transaction) -> tuple[Identity | None, str | None, bool]:
        record = read_node_record(tr, node) or {}
        theirs, proof = _writer(record, ours, now)
        if theirs is not None and proof is None:
            age_s = now - float(record.get("updated_at") or 0)
            raise NodeInUse(node, theirs.host, theirs.pid, since=theirs.since, heartbeat_age_s=age_s,
                            late=age_s > STALE_AFTER_S)
        status = {"version": record.get("version"), "config_digest": record.get("config_digest"),
                  "cluster": {"max_jobs": record.get("cluster_max_jobs")}}
        status.update(facts)
        status.update(channels=record.get("channels") or {}, reclaimable_bytes=record.get("reclaimable_bytes", 0))
        put_node_status(tr, node, status, now, process=ours)
        return theirs, proof, record.get("stopped") is True

    theirs, proof, stopped = store.transact(body)
    if theirs is None or theirs.instance == ours.instance:
        return frozenset()
    if not stopped:
        log.info("node %r was last served by host %s, pid %d, which is gone (%s): its running jobs are taken back",
                 node, theirs.host, theirs.pid, proof)
    # A job names its holder by the instance (an older smoosh) or by the holder's full name.
    return frozenset({theirs.instance, theirs.holder})


def mark_stopped(store: Store, node: str, ours: Identity, timeout_s: float, now: float | None = None) -> None:
    """Say in ``node``'s status record that this daemon stopped cleanly (a restart anywhere need not wait),
    and take its pace out of the store (its `smoosh worker` processes go back to their default),
    and its slots of the fleet-wide cap.

    Only this daemon's own record is marked and its own pace removed: another daemon's, written
    since (one that took the node over), is left alone. In one transaction, as they were written.
    The fleet view shows the node ``stopped`` from this commit on, never ``stale``.

    Parameters:
        now: wall-clock seconds of the stop (None: now).

    Raises:
        SmooshError: the store failed within ``timeout_s``.
    """
    stopped_at = time.time() if now is None else now

    def body(tr: Transaction) -> None:
        record = read_node_record(tr, node)
        theirs = Identity.from_record(record.get("process")) if record is not None else None
        if record is None or theirs is None or theirs.instance != ours.instance:
            return
        record["stopped"] = True
        record["stopped_at"] = stopped_at
        tr.set(status_key(node), msgpack.packb(record, use_bin_type=True))
        clear_pace(tr, node)
        # Its runs are over: no slot of the fleet-wide cap stays behind, and it waits for none.
        ClusterCap().forget(tr, node)

    store.transact(body, timeout_s=timeout_s)


def node_state(record: dict[str, Any], now: float) -> str:
    """A node's state in the fleet view: :data:`STOPPED` (its daemon said so as it stopped),
    :data:`STALE` (its record is older than :data:`STALE_AFTER_S`) or :data:`LIVE`.

    Parameters:
        record: the node's status record.
        now: wall-clock seconds.
    """
    if record.get("stopped") is True:
        return STOPPED
    updated_at = record.get("updated_at")
    if not isinstance(updated_at, (int, float)) or now - updated_at > STALE_AFTER_S:
        return STALE
    return LIVE


def read_node_statuses(store: Store, now: float | None = None, *, timeout_s: float | None = None) -> dict[str, dict[str, Any]]:
    """Every node's record, each with its ``state`` (:func:`node_state`) and ``stale`` (whether that is :data:`STALE`).

    Parameters:
        store: the job store.
        now: wall-clock seconds (None: now).
        timeout_s: the read gives up after this long (None: the store's default).

    Raises:
        SmooshError: the store failed, or did not answer within ``timeout_s``.
    """
    now = time.time() if now is None else now
    rows = store.transact(read_records) if timeout_s is None else store.transact(read_records, timeout_s=timeout_s)
    return nodes_of(rows, now)


def read_records(tr: Transaction) -> list[tuple[bytes, bytes]]:
    """Every node's record as stored (a snapshot read: it adds no conflict), for :func:`nodes_of`."""
    begin, end = tuples.range(_PREFIX)
    return tr.snapshot.get_range(begin, end)


def nodes_of(rows: list[tuple[bytes, bytes]], now: float) -> dict[str, dict[str, Any]]:
    """The records :func:`read_records` read, decoded, each with its ``state`` and ``stale``."""
    nodes: dict[str, dict[str, Any]] = {}
    for key, value in rows:
        node = tuples.unpack(key)[-1]
        record = _decode(value)
        if record is None:
            continue
        state = node_state(record, now)
        record["state"] = state
        record["stale"] = state == STALE
        nodes[str(node)] = record
    return nodes


def fleet_counts(rows: list[tuple[bytes, bytes]], now: float) -> dict[str, int]:
    """How many nodes of the store are in each state (every state present, 0 included)."""
    counts = dict.fromkeys(NODE_STATES, 0)
    for record in nodes_of(rows, now).values():
        counts[record["state"]] += 1
    return counts


def forget_node_status(tr: Transaction, node: str) -> None:
    """Clear ``node``'s status record (``smoosh forget``: the node leaves the fleet view)."""
    tr.clear(status_key(node))


def _decode(value: bytes | None) -> dict[str, Any] | None:
    """A status record's bytes decoded, or None (absent, or not a record smoosh wrote)."""
    if value is None or len(value) > MAX_RECORD_BYTES:
        return None  # not a record smoosh wrote: refuse to decode it
    try:
        # Limits as well as the size check above: a small record can still claim a
        # billion-element array in its header, and the store may be shared.
        record = msgpack.unpackb(value, raw=False,
                                 max_str_len=MAX_RECORD_BYTES, max_bin_len=MAX_RECORD_BYTES,
                                 max_array_len=MAX_RECORD_BYTES, max_map_len=MAX_RECORD_BYTES, max_ext_len=0)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
        return None
    return record if isinstance(record, dict) else None


def jobs_table(
    history: Any, worker: Any, *, states: frozenset[str] | None = None, limit: int | None = None, offset: int = 0,
    held: str | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """Per-key state, progress, error count, last error and history (``GET /jobs``), most recent first.

    Parameters:
        history: the server's history table.
        worker: its in-process worker (or None), asked for the progress of what it runs now.
        states: only records in these states (None: all).
        limit: at most this many rows (None: all).
        offset: rows of the matching list to skip first (paging).
        held: why waiting keys cannot start now, whatever their own history says (the job
            store is full or unreachable); shown as the ``last_error`` of every pending key.

    Returns:
        ``(rows, total)``: the page, and how many records match in all.
    """
    progress = {}
    if worker is not None:
        progress = {r["key"]: r["progress"] for r in worker.status()}
    matching = [rec for rec in history.records() if states is None or rec.state in states]
    page = matching[offset:] if limit is None else matching[offset:offset + limit]
    rows = []
    for rec in page:
        row = rec.to_json()
        if row["state"] == "running" and rec.key in progress:
            row["progress"] = progress[rec.key]
        elif held is not None and row["state"] == "pending":
            row["last_error"] = held
        rows.append(row)
    return rows, len(matching)
