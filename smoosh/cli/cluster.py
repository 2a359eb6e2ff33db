"""The CLI's cluster commands, through the store and no daemon: ``suspend|resume --store``,
``status --store`` and ``forget``.

They open the store as it is, never creating one: a mistyped ``--store sqlite:PATH`` is an error
naming the path (exit 1), not a new, empty store that no daemon reads (issue 45). They answer
within a deadline whatever the store does (:mod:`smoosh.cli.store_deadline`): a store that
does not answer is said, with since when, and the command exits 1 (issue 50).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from smoosh import jsonutil
from smoosh.cli.format import format_cluster
from smoosh.cli.messages import print_error, print_warning
from smoosh.cli.store_deadline import answer_within, deadline_of
from smoosh.config.defaults import CHANNEL_NAME_RE
from smoosh.daemon.control.cluster_cap import ClusterCap, NodeSlots
from smoosh.daemon.control.cluster_holds import ClusterHolds, Hold, describe_scope, operator_name
from smoosh.daemon.record.status import nodes_of, read_records
from smoosh.store import Store, Transaction

__all__ = ["cmd_cluster_control", "cmd_cluster_status", "cmd_forget", "format_holds", "record_age_s"]


def cmd_cluster_control(args: argparse.Namespace) -> int:
    """``smoosh suspend|resume [CHANNEL] --store URL [--node NODE]``: a cluster hold set or cleared.

    Exit 2 for a channel name no config could define; exit 1 when a resume leaves part of its
    scope held by a broader hold (printed, with the command that clears it).
    """
    channel, node = args.channel, args.node
    if channel is not None and not CHANNEL_NAME_RE.fullmatch(channel):
        print_error(f"channel name {channel!r} is not a valid channel name (letters, digits, _ and -)")
        return 2
    deadline_s = deadline_of(args)
    by, at = operator_name(), time.time()

    def suspend(store: Store) -> tuple[Hold, dict[str, Any]]:
        holds = ClusterHolds(store)

        def body(tr: Transaction) -> tuple[Hold, list[tuple[bytes, bytes]]]:
            return holds.hold(node, channel, by=by, at=at, tx=tr), read_records(tr)

        hold, rows = store.transact(body, timeout_s=deadline_s)
        return hold, nodes_of(rows, at)

    if args.action == "suspend":
        hold, nodes = answer_within(args.store, suspend, deadline_s, args=args)
        if getattr(args, "json", False):
            print(jsonutil.dumps({"ok": True, "action": "suspend", "hold": hold.to_json()}, indent=2))
        else:
            print(f"suspend: {hold.describe()}")
        _warn_if_unknown(nodes, node, channel)
        return 0
    remaining = answer_within(args.store, lambda store: store.transact(
        lambda tr: ClusterHolds(store).release(node, channel, tx=tr), timeout_s=deadline_s), deadline_s, args=args)
    if getattr(args, "json", False):
        print(jsonutil.dumps({"ok": not remaining, "action": "resume", "node": node, "channel": channel,
                              "still_held": [hold.to_json() for hold in remaining]}, indent=2))
        return 1 if remaining else 0
    print(f"resume: cluster holds on {describe_scope(node, channel)} cleared")
    for hold in remaining:
        print_error(f"still held: {hold.describe()}; `{_resume_command(hold, args.store)}` clears it")
    return 1 if remaining else 0


def cmd_cluster_status(args: argparse.Namespace) -> int:
    """``smoosh status --store URL``: the cluster holds, and every node's record, from the store.

    Each record carries its age (``age_s``) and its ``state``: ``live``, ``stale`` (older than a
    few status intervals: its node was killed, is stopped or cannot reach the store) or
    ``stopped`` (its daemon stopped cleanly), and ``cluster_slots``, its part of the fleet-wide
    cap (``{"slots", "counted", "wanting_since"}``). One transaction reads it all.
    """
    now = time.time()
    deadline_s = deadline_of(args)

    def read(store: Store) -> tuple[list[tuple[bytes, bytes]], list[Hold], dict[str, NodeSlots]]:
        holds, cap = ClusterHolds(store), ClusterCap()
        return store.transact(lambda tr: (read_records(tr), holds.read(tr), cap.read(tr.snapshot, now)),
                              timeout_s=deadline_s)

    rows, holds, slots = answer_within(args.store, read, deadline_s, args=args)
    nodes = nodes_of(rows, now)
    for name, record in nodes.items():
        record["age_s"] = record_age_s(record, now)
        record["cluster_slots"] = slots.get(name, NodeSlots()).to_json()
    if args.json:
        print(jsonutil.dumps({"nodes": nodes, "holds": [h.to_json() for h in holds]}, indent=2))
        return 0
    if holds:
        print(format_holds(holds))
    print(format_cluster(nodes))
    return 0


def cmd_forget(args: argparse.Namespace) -> int:
    """``smoosh forget NODE --store URL``: a decommissioned node taken out of the fleet (exit 1 for a
    live node, or one the store does not know)."""
    from smoosh.daemon.record.forget import forget_node

    deadline_s = deadline_of(args)
    now = time.time()
    forgotten = answer_within(args.store, lambda store: forget_node(store, args.node, now, timeout_s=deadline_s),
                              deadline_s, args=args)
    if getattr(args, "json", False):
        print(jsonutil.dumps({"ok": True, "forgotten": forgotten.to_json()}, indent=2))
        return 0
    holds = f" and {forgotten.holds} cluster hold(s) naming it" if forgotten.holds else ""
    print(f"forget: node {forgotten.node} ({forgotten.state}) forgotten: its status record, {forgotten.jobs} job(s)"
          f"{holds}, its crash records and last results")
    return 0


def record_age_s(record: dict[str, Any], now: float) -> float | None:
    """Seconds since a node wrote its status record (0 for one stamped ahead of this host's
    clock), or None for a record without a time."""
    updated_at = record.get("updated_at")
    if not isinstance(updated_at, (int, float)):
        return None
    return round(max(0.0, now - updated_at), 1)


def format_holds(holds: list[Hold]) -> str:
    """The cluster holds, one line each: scope, who and since when."""
    lines = ["cluster holds (`smoosh resume [CHANNEL] --store URL [--node NODE]` clears them):"]
    lines.extend(f"  {hold.describe()}" for hold in holds)
    return "\n".join(lines)


def _resume_command(hold: Hold, store_url: str) -> str:
    words = ["smoosh", "resume"]
    if hold.channel is not None:
        words.append(hold.channel)
    words += ["--store", store_url]
    if hold.node is not None:
        words += ["--node", hold.node]
    return " ".join(words)


def _warn_if_unknown(nodes: dict[str, Any], node: str | None, channel: str | None) -> None:
    """A hold naming what no node has reported is kept (it may join later), but said."""
    if not nodes:
        print_warning("no node has written a status record to this store (is it the store the "
                      "daemons use?); the hold waits for them")
    elif node is not None and node not in nodes:
        print_warning(f"no node named {node!r} has written a status record to this store; the hold waits for it")
    elif channel is not None and not any(
        channel in record.get("channels", {}) for name, record in nodes.items() if node in (None, name)
    ):
        print_warning(f"no node of this store reports a channel named {channel!r}; the hold waits for it")
