"""The ``smoosh`` command (DESIGN §4.1). Exit codes: 0 ok, 1 operational error, 2 usage error."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Sequence

from smoosh import jsonutil
from smoosh.errors import ConfigError, SmooshError

log = logging.getLogger("smoosh")

#: Seconds the CLI waits for the daemon's HTTP API before giving up.
HTTP_TIMEOUT_S = 30.0
#: Seconds between two redraws of ``smoosh status --watch``.
WATCH_INTERVAL_S = 1.0
#: Seconds the main loop of ``smoosh run`` sleeps between looks at the stop flag.
MAIN_LOOP_INTERVAL_S = 0.5
#: Seconds between two STATUS= summaries sent to systemd (only sent when the text changed).
STATUS_NOTIFY_INTERVAL_S = 5.0


class CliError(SmooshError):
    """Raised for an operational failure of a CLI command (exit code 1)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``smoosh`` command line; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except ConfigError as e:
        print(f"smoosh: config error: {e}", file=sys.stderr)
        return 1
    except SmooshError as e:
        print(f"smoosh: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 1


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(prog="smoosh", description="A compaction daemon for fleets of SQLite databases.")
    sub = parser.add_subparsers(metavar="COMMAND")

    def with_config(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", metavar="PATH", help="config file (default: $SMOOSH_CONFIG or conf/smoosh.ini)")

    p = sub.add_parser("run", help="run the daemon with in-process workers")
    with_config(p)
    p.add_argument("--store", metavar="URL", help="job store: memory:, sqlite:PATH, fdb:[CLUSTER_FILE]")
    p.add_argument("--http", metavar="HOST:PORT", help="admin API address (\"\" to disable)")
    p.add_argument("--watch", metavar="DIR", action="append", help="directory to watch (repeatable)")
    p.add_argument("--workers", metavar="N", type=_non_negative_int, help="in-process workers (default: max_jobs)")
    p.add_argument("--dry-run", action="store_true", help="route and queue, but start no compaction")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("worker", help="run compaction workers against a shared store")
    with_config(p)
    p.add_argument("--store", metavar="URL")
    p.add_argument("--concurrency", metavar="N", type=_positive_int, default=1)
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("status", help="show the status table")
    with_config(p)
    where = p.add_mutually_exclusive_group()
    where.add_argument("--store", metavar="URL", help="read every node's status record from the store")
    where.add_argument("--url", metavar="URL", help="the daemon's admin API (default: http:// + config http)")
    p.add_argument("--json", action="store_true", help="print JSON as served")
    p.add_argument("--jobs", action="store_true", help="per-key state, progress and history")
    p.add_argument("--watch", action="store_true",
                   help="on a terminal, redraw the table and running compactions every second until Ctrl-C")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("enqueue", help="ask the daemon to consider databases for compaction")
    with_config(p)
    p.add_argument("--url", metavar="URL")
    p.add_argument("keys", nargs="+", metavar="KEY")
    p.set_defaults(func=cmd_enqueue)

    for action in ("suspend", "resume", "flush"):
        p = sub.add_parser(action, help=f"{action} one channel or all")
        with_config(p)
        p.add_argument("--url", metavar="URL")
        p.add_argument("channel", nargs="?", metavar="CHANNEL")
        p.set_defaults(func=cmd_control, action=action)

    p = sub.add_parser("config", help="configuration tools")
    config_sub = p.add_subparsers(metavar="ACTION")
    c = config_sub.add_parser("check", help="validate the config; exit 1 on errors")
    with_config(c)
    c.set_defaults(func=cmd_config_check)

    p = sub.add_parser("demo", help="compact a few bloated SQLite files in a temp dir, start to finish")
    p.set_defaults(func=cmd_demo)

    from smoosh.jobs.cli import add_jobs_parser

    add_jobs_parser(sub)
    jobs_parser = sub.choices.get("jobs")
    if jobs_parser is not None:
        with_config(jobs_parser)
    return parser


# ---------------------------------------------------------------------------- commands


def cmd_run(args: argparse.Namespace) -> int:
    """``smoosh run``: the daemon in the foreground until SIGTERM/SIGINT; SIGHUP re-reads the config.

    Under systemd (``Type=notify``) it reports READY=1 once serving, a STATUS= summary, WATCHDOG=1
    pings from this main loop at half ``WatchdogSec``, and STOPPING=1 when it begins to stop.
    """
    from smoosh import systemd
    from smoosh.config import load_config
    from smoosh.server import Server

    _setup_logging()
    config = load_config(args.config)
    for warning in config.warnings:
        log.warning("config: %s", warning)
    config = _override(config, store=args.store, http=args.http, watch=args.watch)
    _check_http_token(config, overridden=args.http is not None)
    server = Server(config, workers=args.workers, dry_run=args.dry_run)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, lambda *_: threading.Thread(target=_reload, args=(server,), daemon=True).start())
    server.start()
    log.info("effective config: %s", config.describe() if hasattr(config, "describe") else config.path)
    systemd.ready()
    watchdog_s = systemd.watchdog_interval_s()
    # Pings come from this loop, not a side thread: a hung loop must stop them (systemd then restarts us).
    ping_every_s = watchdog_s / 2 if watchdog_s else None
    wait_s = min(MAIN_LOOP_INTERVAL_S, ping_every_s) if ping_every_s else MAIN_LOOP_INTERVAL_S
    next_ping = next_status = 0.0
    last_status = ""
    try:
        while True:
            now = time.monotonic()
            if ping_every_s is not None and now >= next_ping:
                systemd.watchdog_ping()
                next_ping = now + ping_every_s
            if now >= next_status:
                next_status = now + STATUS_NOTIFY_INTERVAL_S
                try:
                    text = status_summary(server.status())
                except Exception:  # a summary is cosmetic: never let it end the daemon
                    log.exception("could not summarise the status for systemd")
                    text = last_status
                if text != last_status:
                    systemd.status(text)
                    last_status = text
            if stop.wait(wait_s):
                break
    finally:
        systemd.stopping()
        server.stop()
    return 0


def _reload(server: Any) -> None:
    """SIGHUP: re-read the config, telling systemd a reload is in progress until it is done."""
    from smoosh import systemd

    systemd.reloading()
    try:
        server.reload_config()
    finally:
        systemd.ready()


def _check_http_token(config: Any, *, overridden: bool) -> None:
    """An off-loopback admin API needs a token (``--http`` bypasses the config file's own check).

    Raises:
        ConfigError: naming ``http`` and ``token``.
    """
    from smoosh.http import is_loopback, parse_address

    if not config.http or config.token:
        return
    try:
        host, _port = parse_address(config.http)
    except ValueError as e:
        raise ConfigError(f"--http {config.http!r}: {e}", key="http", value=config.http) from None
    if not is_loopback(host):
        where = "--http" if overridden else f"{config.path or 'defaults'}: [smoosh] http"
        raise ConfigError(
            f"{where} = {config.http!r}: binding off loopback needs [smoosh] token",
            path=config.path, section="smoosh", key="http", value=config.http,
        )


def status_summary(status: dict[str, Any]) -> str:
    """One line for systemd's STATUS=: ``"3 active, 1 starting, 12 waiting, 2 channel(s) suspended"``."""
    channels = status.get("channels", {}).values()
    active = sum(int(c.get("active", 0)) for c in channels)
    starting = sum(int(c.get("starting", 0)) for c in channels)
    waiting = sum(int((c.get("waiting") or {}).get("size", 0)) for c in channels)
    parts = [f"{active} active", f"{starting} starting", f"{waiting} waiting"]
    suspended = sum(1 for c in channels if c.get("suspended"))
    if suspended:
        parts.append(f"{suspended} channel(s) suspended")
    if status.get("dry_run"):
        parts.append("dry run")
    if status.get("config_error"):
        parts.append("config edit rejected")
    return ", ".join(parts)


def cmd_worker(args: argparse.Namespace) -> int:
    """``smoosh worker``: workers for this node's job type, in their own process."""
    from smoosh.config import load_config
    from smoosh.worker import run_worker_process

    _setup_logging()
    config = load_config(args.config)
    return run_worker_process(config, args.store or config.store, args.concurrency)


def cmd_status(args: argparse.Namespace) -> int:
    """``smoosh status``: the daemon's status table, or every node's record from a store.

    ``--watch`` on a terminal redraws the table and the running compactions (with progress
    bars) every second until Ctrl-C; in a pipe it prints them once.
    """
    if args.store:
        from smoosh.status import read_cluster_status

        nodes = read_cluster_status(args.store)
        if args.json:
            print(jsonutil.dumps({"nodes": nodes}, indent=2))
        else:
            print(format_cluster(nodes))
        return 0
    url = _base_url(args)
    if args.watch and not args.json:
        return _watch_status(url)
    if args.jobs:
        body = _http("GET", f"{url}/jobs")
        print(jsonutil.dumps(body, indent=2) if args.json else format_jobs(body.get("jobs", [])))
        return 0
    body = _http("GET", f"{url}/status")
    print(jsonutil.dumps(body, indent=2) if args.json else format_status(body))
    return 0


def _watch_status(url: str) -> int:
    """The status table plus running compactions: redrawn every second on a terminal, once in a pipe."""
    from smoosh import terminal

    def frame(bars: bool) -> str:
        status = _http("GET", f"{url}/status")
        jobs = _http("GET", f"{url}/jobs").get("jobs", [])
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
    """``smoosh enqueue KEY...``: relative paths resolve against this command's working directory."""
    keys = [_absolute_key(k) for k in args.keys]
    body = _http("POST", f"{_base_url(args)}/enqueue", {"keys": keys})
    rejected = body.get("rejected", [])
    print(f"accepted {body.get('accepted', 0)} key(s)")
    for item in rejected:
        print(f"rejected {item.get('key')}: {item.get('reason')}", file=sys.stderr)
    return 1 if rejected else 0


def cmd_control(args: argparse.Namespace) -> int:
    """``smoosh suspend|resume|flush [CHANNEL]``."""
    payload = {"channel": args.channel} if args.channel else {}
    _http("POST", f"{_base_url(args)}/{args.action}", payload)
    target = f"channel {args.channel}" if args.channel else "all channels"
    print(f"{args.action}: {target}")
    return 0


def cmd_config_check(args: argparse.Namespace) -> int:
    """``smoosh config check``: validate, print the error or the warnings; exit 1 on an error."""
    from smoosh.config import load_config

    try:
        config = load_config(args.config)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for warning in config.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"{config.path or 'defaults'}: ok ({len(config.channels)} channel(s))")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """``smoosh demo``: bloated SQLite files in a temp dir, compacted by an in-process daemon."""
    from smoosh.demo import run_demo

    return run_demo()


# ---------------------------------------------------------------------------- formatting


def format_status(body: dict[str, Any]) -> str:
    """A readable status table: channel, active, starting, waiting, min, max, window, paused."""
    header = ("CHANNEL", "ACTIVE", "STARTING", "WAITING", "MIN", "MAX", "WINDOW", "PAUSED", "RECLAIMABLE")
    rows = [header]
    for name, ch in body.get("channels", {}).items():
        waiting = ch.get("waiting", {})
        paused = "suspended" if ch.get("suspended") else ("yes" if ch.get("paused") else "no")
        if not ch.get("in_window", True):
            paused = f"{paused}, outside window" if paused != "no" else "outside window"
        rows.append((
            name, str(ch.get("active", 0)), str(ch.get("starting", 0)), str(waiting.get("size", 0)),
            _fmt_priority(waiting.get("min", 0)), _fmt_priority(waiting.get("max", 0)),
            str(ch.get("window", "always")), paused, _fmt_bytes(ch.get("reclaimable_bytes", 0)),
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    lines.append(f"node {body.get('node')}: {_fmt_bytes(body.get('reclaimable_bytes', 0))} reclaimable"
                 + (" (dry run)" if body.get("dry_run") else ""))
    if body.get("dry_run"):
        for name, ch in body.get("channels", {}).items():
            for position, (key, priority) in enumerate(ch.get("would_run") or [], 1):
                lines.append(f"would run in {name} #{position}: {key} (priority {_fmt_priority(priority)})")
    if body.get("config_error"):
        lines.append(f"config error (previous config in force): {body['config_error']}")
    if body.get("restart_required"):
        lines.append(f"restart required for: {', '.join(body['restart_required'])}")
    return "\n".join(lines)


def format_jobs(jobs: list[dict[str, Any]]) -> str:
    """Per-key lines: state, progress, errors, last error, and the recent history."""
    if not jobs:
        return "no compactions yet"
    out = []
    for job in jobs:
        progress = job.get("progress") or 0.0
        out.append(f"{job.get('key')}  [{job.get('channel')}] {job.get('state')} {progress * 100:.0f}%"
                   f"  errors={job.get('error_count', 0)}")
        if job.get("last_error"):
            out.append(f"    last error: {job['last_error']}")
        for event in job.get("history", [])[:5]:
            reason = f" ({event.get('reason')})" if event.get("reason") else ""
            out.append(f"    {_fmt_time(event.get('at'))}  {event.get('event')}{reason}")
    return "\n".join(out)


def format_cluster(nodes: dict[str, Any]) -> str:
    """Every node's status record, stale ones marked."""
    if not nodes:
        return "no node has written a status record to this store"
    parts = []
    for node, record in sorted(nodes.items()):
        stale = " (stale)" if record.get("stale") else ""
        parts.append(f"== {node}{stale}, updated {_fmt_time(record.get('updated_at'))}")
        parts.append(format_status({"node": node, "channels": record.get("channels", {}),
                                    "reclaimable_bytes": record.get("reclaimable_bytes", 0)}))
    return "\n".join(parts)


def _fmt_time(at: Any) -> str:
    """A unix time as local ``YYYY-MM-DD HH:MM:SS`` (what an operator reads), or ``?``."""
    if not isinstance(at, (int, float)):
        return "?"
    return datetime.datetime.fromtimestamp(at).strftime("%Y-%m-%d %H:%M:%S")


def _fmt_priority(value: Any) -> str:
    if value == "infinity":
        return "inf"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _fmt_bytes(n: Any) -> str:
    n = float(n or 0)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


# ---------------------------------------------------------------------------- plumbing


def _setup_logging() -> None:
    logging.basicConfig(
        level=os.environ.get("SMOOSH_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # watchdog logs every inotify event at DEBUG: far too much, even when debugging smoosh.
    logging.getLogger("watchdog").setLevel(max(logging.INFO, logging.getLogger().level))


def _override(config: Any, *, store: str | None, http: str | None, watch: list[str] | None) -> Any:
    changes: dict[str, Any] = {}
    if store:
        changes["store"] = store
    if http is not None:
        changes["http"] = http
    if watch:
        dirs = tuple(os.path.realpath(w) for w in watch)
        changes["watch"] = dirs
        # Keys must lie in roots; a directory watched from the command line is a root too.
        changes["roots"] = tuple(dict.fromkeys(tuple(config.roots) + dirs))
    return dataclasses.replace(config, **changes) if changes else config


def _base_url(args: argparse.Namespace) -> str:
    if getattr(args, "url", None):
        return args.url.rstrip("/")
    from smoosh.config import load_config

    config = load_config(getattr(args, "config", None))
    return f"http://{config.http}"


def _absolute_key(key: str) -> str:
    if key.startswith("cleanup:"):
        return "cleanup:" + os.path.abspath(key[len("cleanup:"):])
    return os.path.abspath(key)


def _http(method: str, url: str, payload: Any = None) -> Any:
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    token = os.environ.get("SMOOSH_TOKEN")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as e:
        try:
            detail = json.loads(e.read()).get("error", e.reason)
        except ValueError:
            detail = e.reason
        raise CliError(f"{method} {url}: {e.code} {detail}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise CliError(f"cannot reach smoosh at {url}: {reason}") from None


def _positive_int(text: str) -> int:
    value = _non_negative_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be 0 or more")
    return value
