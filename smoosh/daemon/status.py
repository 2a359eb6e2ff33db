"""Cluster-wide status: every node writes its status record to the store; anyone can read them all.

``smoosh status --store URL`` lists every node of a FoundationDB cluster (or of one shared
SQLite store) without contacting any daemon (DESIGN §5.7).
"""

from __future__ import annotations

import math
import time
from typing import Any

import msgpack

from smoosh.store import Store, open_store, tuples

#: Seconds between two status records written by one node.
STATUS_INTERVAL_S = 5.0
#: A record older than this many seconds marks its node stale.
STALE_AFTER_S = 15.0
#: Largest record decoded, in bytes (a record is a few hundred bytes per channel).
MAX_RECORD_BYTES = 100_000

_PREFIX = ("status",)


def _key(node: str) -> bytes:
    return tuples.pack(_PREFIX + (node,))


def _encode_float(value: Any) -> Any:
    # msgpack carries inf, but the record is read by tools that print JSON: keep it explicit.
    if isinstance(value, float) and math.isinf(value):
        return "infinity" if value > 0 else "-infinity"
    if isinstance(value, dict):
        return {k: _encode_float(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_encode_float(v) for v in value]
    return value


def write_node_status(store: Store, node: str, status: dict[str, Any], now: float) -> None:
    """Write ``node``'s status record (channels and reclaimable bytes) with its timestamp."""
    channels = {
        name: {k: v for k, v in entry.items() if k != "would_run"}
        for name, entry in status.get("channels", {}).items()
    }
    record = {
        "updated_at": now,
        "channels": _encode_float(channels),
        "reclaimable_bytes": status.get("reclaimable_bytes", 0),
    }
    value = msgpack.packb(record, use_bin_type=True)
    store.transact(lambda tr: tr.set(_key(node), value))


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


def read_cluster_status(store_url: str) -> dict[str, dict[str, Any]]:
    """Open ``store_url`` and return :func:`read_node_statuses`."""
    with open_store(store_url) as store:
        return read_node_statuses(store)
