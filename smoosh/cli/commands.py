"""The CLI's commands that talk to a running daemon or check a config: status, enqueue, control, config, demo."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from smoosh import jsonutil
from smoosh.cli.client import absolute_key, daemon_target, http_request
from smoosh.cli.format import format_jobs, format_priority, format_status
from smoosh.errors import ConfigError

#: Seconds between two redraws of ``smoosh status --watch``.
WATCH_INTERVAL_S = 1.0


def cmd_status(args: argparse.Namespace) -> int:
    """``smoosh status``: the daemon's status table, or every node's record from a store.

    ``--watch`` on a terminal redraws the table and the running compactions (with progress
    bars) every second until Ctrl-C; in a pipe it prints them once.
    """
    if args.store:
        from smoosh.cli.cluster import cmd_cluster_status

        return cmd_cluster_status(args)
    url = daemon_target(args).url
    if args.watch and not args.json:
        return _watch_status(url)
    if args.jobs:
        body = http_request("GET", f"{url}/jobs")
        print(jsonutil.dumps(body, indent=2) if args.json else format_jobs(body.get("jobs", [])))
        return 0
    body = http_request("GET", f"{url}/status")
    print(jsonutil.dumps(body, indent=2) if args.json else format_status(body))
    return 0


def _watch_status(url: str) -> int:
    """The status table plus running compactions: redrawn every second on a terminal, once in a pipe."""
    from smoosh.cli import terminal

    def frame(bars: bool) -> str:
        status = http_request("GET", f"{url}/status")
        jobs = http_request("GET", f"{url}/jobs").get("jobs", [])
        return format_status(status) + "\n\n" + terminal.format_running(jobs, bars=bars)

    if not terminal.is_tty(sys.stdout):
        print(frame(bars=False))
        return 0
    screen = terminal.Screen(sys.stdout)
    try:
        while True:
            screen.draw(frame(bars=True) + f"\n\n{url}  (Ctrl-C to quit)")
            time.sleep(WATCH_INTERVAL_S)
    except KeyboardInterrupt:
        return 0


def cmd_enqueue(args: argparse.Namespace) -> int:
    """``smoosh enqueue KEY...``: one line per key saying what became of it; exit 1 if any was rejected.

    Relative paths resolve against this command's working directory. The daemon answers once
    every key is routed (``POST /enqueue?wait=1``, at most 10 s; a key still being examined
    then is "not queued: still examining").
    """
    keys = [absolute_key(k) for k in args.keys]
    target = daemon_target(args)
    body = http_request("POST", f"{target.url}/enqueue?wait=1", {"keys": keys}, token=target.token)
    rejected = 0
    for result in body.get("results", []):
        print(format_result(result))
        rejected += result.get("outcome") == "rejected"
    return 1 if rejected else 0


def format_result(result: dict[str, Any]) -> str:
    """One line for one key of ``POST /enqueue?wait=1``: ``queued KEY in CHANNEL at priority P``,
    ``not queued KEY: REASON`` or ``rejected KEY: REASON``."""
    key, outcome = result.get("key"), result.get("outcome")
    if outcome == "queued":
        return f"queued {key} in {result.get('channel')} at priority {format_priority(result.get('priority'))}"
    words = "not queued" if outcome == "not_queued" else str(outcome)
    return f"{words} {key}: {result.get('reason')}"


def cmd_control(args: argparse.Namespace) -> int:
    """``smoosh suspend|resume|flush [CHANNEL]``; with ``--store``, a cluster hold instead."""
    if getattr(args, "store", None):
        from smoosh.cli.cluster import cmd_cluster_control

        return cmd_cluster_control(args)
    if getattr(args, "node", None):
        print("smoosh: --node needs --store (a node's hold lives in the store the daemons share)", file=sys.stderr)
        return 2
    payload = {"channel": args.channel} if args.channel else {}
    target = daemon_target(args)
    http_request("POST", f"{target.url}/{args.action}", payload, token=target.token)
    which = f"channel {args.channel}" if args.channel else "all channels"
    print(f"{args.action}: {which}")
    return 0


def cmd_config_check(args: argparse.Namespace) -> int:
    """``smoosh config check``: validate, print the error or the warnings; exit 1 on an error."""
    from smoosh.config import load_config
    from smoosh.config.checks import check_directories

    try:
        config = load_config(args.config, log_warnings=False)  # printed below, once each
        check_directories(config)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for warning in config.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"{config.path or 'defaults'}: ok ({len(config.channels)} channel(s))")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """``smoosh demo``: bloated SQLite files in a temp dir, compacted by an in-process daemon."""
    from smoosh.cli.demo import run_demo

    return run_demo()
