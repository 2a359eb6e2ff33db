"""The status table: built for ``GET /status``, written per node to the store, read cluster-wide.

Channels publish snapshots; :func:`build_status` reads them (never waiting on a channel) with
the intake's measurements for the reclaimable-bytes estimate. Every node also writes its
record to the store every ~5 s, so ``smoosh status --store URL`` lists every node of a
FoundationDB cluster (or of one shared SQLite store) without contacting any daemon
(DESIGN §5.7).
"""

from __future__ import annotations

import time
from typing import Any

import msgpack

from smoosh.jsonutil import jsonable
from smoosh.store import Store, Transaction, tuples

#: Seconds between two status records written by one node.
STATUS_INTERVAL_S = 5.0
#: A record older than this many seconds marks its node stale.
STALE_AFTER_S = 15.0
#: Largest record decoded, in bytes (a record is a few hundred bytes per channel).
MAX_RECORD_BYTES = 100_000

_PREFIX = ("status",)


def _key(node: str) -> bytes:
    return tuples.pack(_PREFIX + (node,))


def build_status(server: Any) -> dict[str, Any]:
    """The status table of a running :class:`~smoosh.daemon.server.Server`; never blocks on a channel.

    A channel busy past a moment shows its last estimate instead of making the reader wait.
    """
    channels: dict[str, Any] = {}
    total = 0
    estimates: dict[str, tuple[int, list[list[Any]]]] = server._last_estimates
    config = server.config
    starved = server._history.starved()
    for name, channel in list(server.channels().items()):
        entry = dict(channel.status())
        snapshot = channel.try_snapshot()
        if snapshot is None:
            reclaimable, would_run = estimates.get(name, (0, []))
        else:
            keys, waiting = snapshot
            reclaimable = server.intake.reclaimable(keys)
            would_run = [[k, p] for k, p in waiting[:100]]
            estimates[name] = (reclaimable, would_run)
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
        "channels": channels,
        "reclaimable_bytes": total,
        "dry_run": server.dry_run,
        "config_error": server._config_error,
        "restart_required": list(server._restart_required),
        "scan": housekeeping.scan_status() if housekeeping is not None else {},
        "io_budget": io_budget_status(server),
        "disk": disk_status(server),
    }


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


def put_node_status(tr: Transaction, node: str, status: dict[str, Any], now: float) -> None:
    """:func:`write_node_status` inside the caller's transaction (write-only: it never conflicts)."""
    channels = {
        name: {k: v for k, v in entry.items() if k != "would_run"}
        for name, entry in status.get("channels", {}).items()
    }
    record = {
        "updated_at": now,
        "channels": jsonable(channels),
        "reclaimable_bytes": status.get("reclaimable_bytes", 0),
    }
    tr.set(_key(node), msgpack.packb(record, use_bin_type=True))


def read_node_statuses(store: Store, now: float | None = None) -> dict[str, dict[str, Any]]:
    """Every node's record, each with ``stale`` set when older than 15 s."""
    now = time.time() if now is None else now
    begin, end = tuples.range(_PREFIX)
    rows = store.transact(lambda tr: tr.snapshot.get_range(begin, end))
    nodes: dict[str, dict[str, Any]] = {}
    for key, value in rows:
        node = tuples.unpack(key)[-1]
        if len(value) > MAX_RECORD_BYTES:
            continue  # not a record smoosh wrote: refuse to decode it
        try:
            # Limits as well as the size check above: a small record can still claim a
            # billion-element array in its header, and the store may be shared.
            record = msgpack.unpackb(value, raw=False,
                                     max_str_len=MAX_RECORD_BYTES, max_bin_len=MAX_RECORD_BYTES,
                                     max_array_len=MAX_RECORD_BYTES, max_map_len=MAX_RECORD_BYTES, max_ext_len=0)
        except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
            continue
        if not isinstance(record, dict):
            continue
        record["stale"] = now - float(record.get("updated_at", 0)) > STALE_AFTER_S
        nodes[str(node)] = record
    return nodes


def jobs_table(
    history: Any, worker: Any, *, states: frozenset[str] | None = None, limit: int | None = None, offset: int = 0,
) -> tuple[list[dict[str, Any]], int]:
    """Per-key state, progress, error count, last error and history (``GET /jobs``), most recent first.

    Parameters:
        history: the server's history table.
        worker: its in-process worker (or None), asked for the progress of what it runs now.
        states: only records in these states (None: all).
        limit: at most this many rows (None: all).
        offset: rows of the matching list to skip first (paging).

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
        rows.append(row)
    return rows, len(matching)
