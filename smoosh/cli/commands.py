"""The CLI's commands that talk to a running daemon: status, enqueue, explain, control, and demo.
Every one that prints takes ``--json``: the same content, machine-readable."""

from __future__ import annotations

import argparse
import sys
import time
import urllib.parse
from typing import Any

from smoosh import jsonutil
from smoosh.cli.client import CliError, absolute_key, daemon_target, http_request
from smoosh.cli.messages import print_error
from smoosh.cli.format import format_explain, format_jobs, format_no_jobs, format_page, format_priority, format_status

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
    if args.jobs or args.state or args.limit is not None or args.offset:
        states = ",".join(args.state or [])
        query = {k: v for k, v in (("state", states), ("limit", args.limit), ("offset", args.offset)) if v}
        try:
            body = http_request("GET", f"{url}/jobs" + (f"?{urllib.parse.urlencode(query)}" if query else ""))
        except CliError as e:
            parser = getattr(args, "parser", None)
            if e.status != 400 or parser is None:
                raise
            # The daemon judges the states (it knows them); a query it refuses is this command's
            # usage error, exit 2, as jobs list's --state is (argparse's words, returned, not raised).
            parser.print_usage(sys.stderr)
            print(f"{parser.prog}: error: " + (f"argument --state: {e.detail}" if states else e.detail),
                  file=sys.stderr)
            return 2
        if args.json:
            print_json(body)
            return 0
        jobs = body.get("jobs", [])
        print(format_jobs(jobs) if jobs else format_no_jobs(body, [s for s in states.split(",") if s]))
        page = format_page(body)
        if page is not None and jobs:
            print(page)
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


def print_json(value: Any) -> None:
    """Print ``value`` as indented JSON (``--json``; never ``Infinity``)."""
    print(jsonutil.dumps(value, indent=2))


def cmd_enqueue(args: argparse.Namespace) -> int:
    """``smoosh enqueue [--force] KEY...``: one line per key saying what became of it; exit 1 if any was rejected.

    Relative paths resolve against this command's working directory. The daemon answers once
    every key is routed (``POST /enqueue?wait=1``, at most 10 s; a key still being examined
    then is "not queued: still examining"). ``--force`` compacts the keys now, past
    staleness, thresholds, crash backoff and the start-up pause (DESIGN §11).
    """
    keys = [absolute_key(k) for k in args.keys]
    target = daemon_target(args)
    payload: dict[str, Any] = {"keys": keys}
    if args.force:
        payload["force"] = True
    body = http_request("POST", f"{target.url}/enqueue?wait=1", payload, token=target.token)
    results = body.get("results", [])
    if args.json:
        print_json(body)
    else:
        for result in results:
            print(format_result(result))
    return 1 if any(result.get("outcome") == "rejected" for result in results) else 0


def cmd_explain(args: argparse.Namespace) -> int:
    """``smoosh explain KEY``: why the daemon has, or has not, queued the key, channel by channel.

    Exits 1 for a key the daemon rejects (outside the roots, no such file, not SQLite), as
    ``smoosh enqueue`` does: a script asking about a mistyped path hears of it.
    """
    target = daemon_target(args)
    key = urllib.parse.quote(absolute_key(args.key), safe="/:")
    answer = http_request("GET", f"{target.url}/explain?key={key}")
    if args.json:
        print_json(answer)
    else:
        print(format_explain(answer))
    return 1 if isinstance(answer, dict) and answer.get("state") == "rejected" else 0


def format_result(result: dict[str, Any]) -> str:
    """One line for one key of ``POST /enqueue?wait=1``: ``queued KEY in CHANNEL at priority P``
    (a forced key: ``... at priority inf (forced)``, and what holds it back), ``not queued KEY:
    REASON`` or ``rejected KEY: REASON``."""
    key, outcome = result.get("key"), result.get("outcome")
    if outcome == "queued":
        note = f" ({result['reason']})" if result.get("reason") else ""
        return f"queued {key} in {result.get('channel')} at priority {format_priority(result.get('priority'))}{note}"
    words = "not queued" if outcome == "not_queued" else str(outcome)
    return f"{words} {key}: {result.get('reason')}"


def cmd_control(args: argparse.Namespace) -> int:
    """``smoosh suspend|resume|flush [CHANNEL]``; with ``--store``, a cluster hold instead."""
    if getattr(args, "store", None):
        from smoosh.cli.cluster import cmd_cluster_control

        return cmd_cluster_control(args)
    if getattr(args, "node", None):
        print_error("--node needs --store (a node's hold lives in the store the daemons share)")
        return 2
    payload = {"channel": args.channel} if args.channel else {}
    target = daemon_target(args)
    body = http_request("POST", f"{target.url}/{args.action}", payload, token=target.token)
    if args.json:
        print_json(body)
        return 0
    which = f"channel {args.channel}" if args.channel else "all channels"
    dropped = body.get("dropped") if isinstance(body, dict) else None
    print(f"{args.action}: {which}" + (f" ({dropped} waiting key(s) dropped)" if dropped is not None else ""))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """``smoosh demo``: bloated SQLite files in a temp dir, compacted by an in-process daemon."""
    from smoosh.cli.demo import run_demo

    return run_demo()
