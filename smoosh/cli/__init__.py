"""The ``smoosh`` command (DESIGN §4.1). Exit codes: 0 ok, 1 operational error, 2 usage error."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from smoosh.cli.argtypes import daemon_url, node_name, non_negative_int, positive_int, shared_store_url
from smoosh.cli.client import CliError, Unreachable
from smoosh.cli.commands import cmd_control, cmd_demo, cmd_enqueue, cmd_explain, cmd_status
from smoosh.cli.config_cmd import cmd_config_check, cmd_config_sample
from smoosh.cli.messages import print_config_error, print_error
from smoosh.cli.pipes import quiet_pipes
from smoosh.cli.run import cmd_run, cmd_worker
from smoosh.cli.store_deadline import add_deadline_option
from smoosh import __version__
from smoosh.errors import ConfigError, SmooshError

__all__ = ["main", "build_parser", "CliError"]


#: Help of every ``--url`` option: how a command finds the daemon.
URL_HELP = "the daemon's admin API, e.g. http://127.0.0.1:5986 (default: http:// + the config's http)"


#: Help of every ``--json`` option.
JSON_HELP = "print machine-readable JSON with the same content (never Infinity: \"infinity\")"

#: The states ``status --state`` filters on, as the daemon names them (it checks them itself).
JOB_STATES_HELP = "pending, running, crashing, starved, finished, dropped"

#: The environment variables every command reads, shown under ``smoosh --help``.
ENVIRONMENT_HELP = """environment:
  SMOOSH_CONFIG     config file when --config is not given (default: conf/smoosh.ini)
  SMOOSH_TOKEN      bearer token sent with POSTs to the daemon (wins over the config's token)
  SMOOSH_LOG_LEVEL  log level of run and worker: DEBUG, INFO (default), WARNING, ERROR"""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``smoosh`` command line; returns the exit code."""
    with quiet_pipes():
        parser = build_parser()
        args, extras = parser.parse_known_args(argv)
        if extras:
            # Refused by the subcommand that was given them, so its usage is the one shown
            # (`smoosh status --bogus` prints status's, not the list of commands).
            getattr(args, "parser", parser).error(f"unrecognized arguments: {' '.join(extras)}")
        if not getattr(args, "func", None):
            parser.print_help(sys.stderr)
            return 2
        return _dispatch(args)


def _dispatch(args: argparse.Namespace) -> int:
    try:
        return int(args.func(args) or 0)
    except ConfigError as e:
        print_config_error(str(e))
        return 1
    except Unreachable as e:
        print_error(str(e))
        from smoosh.cli.moved_daemon import moved_daemon_hint

        hint = moved_daemon_hint(args)
        if hint is not None:
            print_error(hint)
        return 1
    except SmooshError as e:
        print_error(str(e))
        return 1
    except KeyboardInterrupt:
        return 1
    except BrokenPipeError:
        # Output written past the wrappers (a child's or a library's own stream): the
        # reader went away, which is its choice, not an error of this command.
        return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="smoosh", description="A compaction daemon for fleets of SQLite databases.", epilog=ENVIRONMENT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"smoosh {__version__}",
                        help="print the version and exit")
    sub = parser.add_subparsers(metavar="COMMAND")

    def with_config(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", metavar="PATH", help="config file (default: $SMOOSH_CONFIG or conf/smoosh.ini)")

    p = sub.add_parser("run", help="run the daemon with in-process workers")
    with_config(p)
    p.add_argument("--store", metavar="URL", help="job store: memory:, sqlite:PATH, fdb:[CLUSTER_FILE]")
    p.add_argument("--http", metavar="HOST:PORT", help="admin API address (\"\" to disable)")
    p.add_argument("--watch", metavar="DIR", action="append", help="directory to watch (repeatable)")
    p.add_argument("--workers", metavar="N", type=non_negative_int, help="in-process workers (default: max_jobs)")
    p.add_argument("--dry-run", action="store_true", help="route and queue, but start no compaction")
    p.add_argument("--reset-store", action="store_true",
                   help="move a corrupt SQLite job store aside (renamed .corrupt-<time>) and start with an empty one")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("worker", help="run compaction workers against a shared store")
    with_config(p)
    p.add_argument("--store", metavar="URL", type=shared_store_url,
                   help="the job store the daemon uses: sqlite:PATH or fdb:[CLUSTER_FILE] (default: the config's store)")
    p.add_argument("--concurrency", metavar="N", type=positive_int, default=1,
                   help="compactions this process runs at once (default: 1)")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("status", help="show the status table")
    with_config(p)
    where = p.add_mutually_exclusive_group()
    where.add_argument("--store", metavar="URL", help="read every node's status record from the store")
    where.add_argument("--url", metavar="URL", type=daemon_url, help=URL_HELP)
    add_deadline_option(p)
    p.add_argument("--json", action="store_true", help="print JSON as served")
    p.add_argument("--jobs", action="store_true", help="per-key state, progress and history (GET /jobs)")
    p.add_argument("--state", metavar="STATE", action="append",
                   help=f"with --jobs (implied): only keys in this state ({JOB_STATES_HELP}); repeatable")
    p.add_argument("--limit", metavar="N", type=positive_int,
                   help="with --jobs (implied): at most N keys, most recently updated first")
    p.add_argument("--offset", metavar="N", type=non_negative_int, default=0,
                   help="with --jobs (implied): skip the first N keys (the next page)")
    p.add_argument("--watch", action="store_true",
                   help="on a terminal, redraw the table and running compactions every second until Ctrl-C")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("enqueue", help="ask the daemon to consider databases for compaction")
    with_config(p)
    p.add_argument("--url", metavar="URL", type=daemon_url, help=URL_HELP)
    p.add_argument("--force", action="store_true",
                   help="compact now: skip staleness, the channels' thresholds, crash backoff and the start-up "
                        "pause (the roots, [smoosh.ignore], suspension, the window and max_jobs still hold it; "
                        "the line says which)")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.add_argument("keys", nargs="+", metavar="KEY",
                   help="a database file (relative paths resolve against this directory), or cleanup:PATH")
    p.set_defaults(func=cmd_enqueue)

    p = sub.add_parser("explain", help="say, per channel, why the daemon has or has not queued a database")
    with_config(p)
    p.add_argument("--url", metavar="URL", type=daemon_url, help=URL_HELP)
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.add_argument("key", metavar="KEY",
                   help="a database file (relative paths resolve against this directory), or cleanup:PATH")
    p.set_defaults(func=cmd_explain)

    for action, words in (
        ("suspend", "stop starting work in one channel or all, and hold running work (sticky until resume)"),
        ("resume", "undo suspend in one channel or all; queued work starts at once"),
        ("flush", "drop the waiting keys of one channel or all, and forget their staleness (running work goes on)"),
    ):
        p = sub.add_parser(action, help=words, description=words[0].upper() + words[1:] + ".")
        with_config(p)
        if action == "flush":
            p.add_argument("--url", metavar="URL", type=daemon_url, help=URL_HELP)
        else:
            _add_cluster_options(p, action)
        p.add_argument("--json", action="store_true", help=JSON_HELP)
        p.add_argument("channel", nargs="?", metavar="CHANNEL", help="one channel (default: every channel)")
        p.set_defaults(func=cmd_control, action=action)

    p = sub.add_parser("forget", help="forget a decommissioned node: its status record, jobs and records in the store",
                       description="Forget a node that will not come back: clear its status record, its jobs, its "
                                   "crash records and last results, the holds naming it and its part of the "
                                   "fleet-wide cap from the store the nodes share. A live node is refused (stop it "
                                   "first); a stale one is forgotten, and lists again if its daemon comes back.")
    p.add_argument("node", metavar="NODE", type=node_name, help="the node's name, as `smoosh status --store` lists it")
    p.add_argument("--store", metavar="URL", required=True, help="the store the nodes share")
    add_deadline_option(p)
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(func=_cmd_forget)

    p = sub.add_parser("config", help="configuration tools")
    config_sub = p.add_subparsers(metavar="ACTION")
    c = config_sub.add_parser("check", help="validate the config; exit 1 on errors")
    with_config(c)
    c.add_argument("--json", action="store_true", help=JSON_HELP)
    c.set_defaults(func=cmd_config_check)
    c = config_sub.add_parser("sample", help="print a file smoosh ships: the sample config (default), "
                              "the systemd unit, the Prometheus rules or the Grafana dashboard",
                              description="Print a file smoosh ships, e.g. smoosh config sample > /etc/smoosh/smoosh.ini")
    which = c.add_mutually_exclusive_group()
    which.add_argument("--unit", dest="sample", action="store_const", const="unit",
                       help="the systemd unit (smoosh.service)")
    which.add_argument("--rules", dest="sample", action="store_const", const="rules",
                       help="the Prometheus alerting rules (smoosh-rules.yml)")
    which.add_argument("--dashboard", dest="sample", action="store_const", const="dashboard",
                       help="the Grafana dashboard (smoosh.json)")
    c.set_defaults(func=cmd_config_sample, sample="ini")

    p = sub.add_parser("doctor", help="check this host and config: inotify limits, permissions, free space, lock, store")
    with_config(p)
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.set_defaults(func=_cmd_doctor)

    p = sub.add_parser("demo", help="compact a few bloated SQLite files in a temp dir, start to finish")
    p.set_defaults(func=cmd_demo)

    from smoosh.cli.jobs import add_jobs_parser

    add_jobs_parser(sub)
    jobs_parser = sub.choices.get("jobs")
    if jobs_parser is not None:
        with_config(jobs_parser)
    _know_their_parsers(parser)
    return parser


def _know_their_parsers(parser: argparse.ArgumentParser) -> None:
    """Every subcommand's parser sets ``args.parser`` to itself (the innermost one wins), for its usage errors."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.set_defaults(parser=sub)
                _know_their_parsers(sub)


def _cmd_forget(args: argparse.Namespace) -> int:
    from smoosh.cli.cluster import cmd_forget

    return cmd_forget(args)


def _cmd_doctor(args: argparse.Namespace) -> int:
    from smoosh.cli.doctor import cmd_doctor  # its checks import what they check only when run

    return cmd_doctor(args)


def _add_cluster_options(p: argparse.ArgumentParser, action: str) -> None:
    """``suspend``/``resume``: ``--url`` (one daemon, its own suspension) or ``--store`` (a cluster hold)."""
    where = p.add_mutually_exclusive_group()
    where.add_argument("--url", metavar="URL", type=daemon_url, help=URL_HELP)
    where.add_argument("--store", metavar="URL",
                       help=f"{action} through the store instead: a cluster hold, obeyed by every daemon sharing it "
                            "(separate from each daemon's own suspension)")
    p.add_argument("--node", metavar="NODE", type=node_name,
                   help="with --store: only this node (default: every node, including nodes that join later)")
    add_deadline_option(p)

