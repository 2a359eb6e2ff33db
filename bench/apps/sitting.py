"""A sitting: the application beside smoosh, every (application, journal mode), modes alternated.

Usage: python -m bench.apps [--quick] [--apps django,sqlalchemy] [--journal delete,wal]
       [--modes none,compact,watch,compacted] [--pairs N] [--duration-s S] [--cpu-load N]
       [--write-results] ...   (make bench-apps APPS_ARGS="...")

For each (application, journal mode): the template fleet is built (or taken from the cache),
then ``--pairs`` rounds of the modes run back to back, each round in the opposite order of the
one before (``none compact``, ``compact none``, ...), each run on a fresh copy of the fleet.
After every run every tenant is checked (``PRAGMA integrity_check``; every row against the
template and the application's ledger): a damaged database or a row lost, changed or come
back stops the sitting at once, exit 1, the run's files kept.

Output: a line per run as it ends; a Markdown table per (application, journal mode) at the
end (printed; with ``--write-results`` also written to bench/RESULTS.md's ``apps`` section);
the whole sitting as JSON in ``--results`` (every run's figures, its errors with their times,
smoosh's run windows, the checks).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from bench._harness import REPO_ROOT, machine_info, write_section  # noqa: E402
from bench.apps.fleet import MIN_DEAD_RATIO, build_template  # noqa: E402
from bench.apps.runs import DEFAULT_MODES, HARNESS_KEYS, MODES, RunSpec, run_one, uses_smoosh  # noqa: E402
from bench.apps.summary import APP_NAMES, MODE_NAMES, group_table, run_figures, verdict_table  # noqa: E402
from bench.apps.windows import DEFAULT_MARGIN_S  # noqa: E402
from smoosh.sqlite_defaults import DEFAULT_MAX_LOCK_HOLD_S  # noqa: E402

#: The RESULTS.md section ``--write-results`` rewrites.
RESULTS_SECTION = "apps"
APPS = ("django", "sqlalchemy")
JOURNAL_MODES = ("delete", "wal")
#: Defaults of the workload and the fleet (issue 46).
DEFAULT_TENANTS = 20
DEFAULT_MIN_MB = 20.0
DEFAULT_MAX_MB = 80.0
DEFAULT_THREADS = 4
DEFAULT_RATE = 220.0
DEFAULT_DURATION_S = 120.0
QUICK_DURATION_S = 30.0
DEFAULT_PAIRS = 3
#: How long before smoosh's channels open the application starts (seconds): the lead is
#: smoosh's ``wait_secs`` less this.
OPEN_INTO_RUN_S = 5.0


def _smoosh_defaults() -> tuple[list[str], float]:
    """smoosh's default channels (database and cleanup) and its ``wait_secs``, from its own defaults."""
    from smoosh.config.defaults import DEFAULT_CLEANUP_CHANNELS, DEFAULT_DB_CHANNELS, DEFAULT_WAIT_S

    return [*DEFAULT_DB_CHANNELS, *DEFAULT_CLEANUP_CHANNELS], float(DEFAULT_WAIT_S)


def _csv(choices: tuple[str, ...]) -> Any:
    def parse(text: str) -> list[str]:
        items = [x.strip() for x in text.split(",") if x.strip()]
        bad = [x for x in items if x not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"{text!r}: each of {', '.join(choices)}")
        return items
    return parse


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    channels, wait_s = _smoosh_defaults()
    ap = argparse.ArgumentParser(prog="python -m bench.apps", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--apps", type=_csv(APPS), default=list(APPS), help="default: django,sqlalchemy")
    ap.add_argument("--journal", type=_csv(JOURNAL_MODES), default=list(JOURNAL_MODES), help="default: delete,wal")
    ap.add_argument("--modes", type=_csv(MODES), default=list(DEFAULT_MODES),
                    help="the modes of each round, in the first round's order (default: none,compact,watch,compacted; "
                         "compact-b and watch-b run --smoosh-b)")
    ap.add_argument("--pairs", type=int, default=None, help=f"rounds of the modes (default {DEFAULT_PAIRS}; --quick 1)")
    ap.add_argument("--duration-s", type=float, default=None,
                    help=f"the application's run (default {DEFAULT_DURATION_S:g}; --quick {QUICK_DURATION_S:g})")
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_DURATION_S:g} s runs, one round: for iteration")
    ap.add_argument("--lead-s", type=float, default=max(0.0, wait_s - OPEN_INTO_RUN_S),
                    help="seconds from smoosh's launch to the application's start, in every mode (default: smoosh's "
                         f"wait_secs less {OPEN_INTO_RUN_S:g}: its channels open that far into the run)")
    ap.add_argument("--tenants", type=int, default=DEFAULT_TENANTS)
    ap.add_argument("--min-mb", type=float, default=DEFAULT_MIN_MB)
    ap.add_argument("--max-mb", type=float, default=DEFAULT_MAX_MB)
    ap.add_argument("--seed", type=int, default=1, help="draws the fleet's sizes and rows, and the workload's choices")
    ap.add_argument("--threads", type=int, default=DEFAULT_THREADS)
    ap.add_argument("--rate", type=float, default=DEFAULT_RATE, help="operations per second, all threads together")
    ap.add_argument("--margin-s", type=float, default=DEFAULT_MARGIN_S,
                    help="widens each smoosh run's window before its start (bench/apps/windows.py)")
    ap.add_argument("--cpu-load", type=int, default=0, help="busy-loop processes running beside the whole sitting")
    ap.add_argument("--smoosh", default=os.path.join(REPO_ROOT, ".venv", "bin", "smoosh"),
                    help="the smoosh executable (another checkout's, to compare trees)")
    ap.add_argument("--smoosh-b", default=None,
                    help="a second smoosh executable (another checkout's .venv/bin/smoosh) for modes compact-b and "
                         "watch-b: before and after in one sitting")
    ap.add_argument("--config-b", action="append", default=[], metavar="'KEY = VALUE'",
                    help="a [smoosh] key set in modes compact-b and watch-b (repeatable); without --smoosh-b, "
                         "smoosh B is --smoosh with these keys")
    ap.add_argument("--apps-python", default=os.path.join(REPO_ROOT, ".venv-apps", "bin", "python"))
    ap.add_argument("--templates", default=os.path.join(REPO_ROOT, "var", "bench-apps", "templates"))
    ap.add_argument("--work", default=os.path.join(REPO_ROOT, "var", "bench-apps", "runs"))
    ap.add_argument("--results", default=os.path.join(REPO_ROOT, "bench", "apps", "results"))
    ap.add_argument("--keep", action="store_true", help="keep every run's files (a failed run's are always kept)")
    ap.add_argument("--write-results", action="store_true",
                    help=f"rewrite bench/RESULTS.md's '{RESULTS_SECTION}' section with the tables")
    ap.add_argument("--tables-from", metavar="JSON", nargs="+",
                    help="run nothing: print the tables of one or more sittings' JSON, a block each in the "
                         "order given (and write them with --write-results)")
    args = ap.parse_args(argv)
    args.pairs = args.pairs if args.pairs is not None else (1 if args.quick else DEFAULT_PAIRS)
    args.duration_s = args.duration_s if args.duration_s is not None else (
        QUICK_DURATION_S if args.quick else DEFAULT_DURATION_S)
    args.channels, args.wait_s = channels, wait_s
    for line in args.config_b:
        key, eq, value = line.partition("=")
        if not eq or not key.strip() or not value.strip() or key.strip() in HARNESS_KEYS:
            ap.error(f"--config-b {line!r}: 'KEY = VALUE' of a [smoosh] key other than the harness's own")
    if args.config_b and not args.smoosh_b:
        args.smoosh_b = args.smoosh
    if any(m.endswith("-b") for m in args.modes) and not args.smoosh_b and not args.tables_from:
        ap.error("modes compact-b and watch-b need --smoosh-b or --config-b")
    return args


def tree_of(command: str | None) -> str:
    """``PATH (commit abc1234, +local changes)`` of a checkout's ``.venv/bin/smoosh`` (its editable install)."""
    if not command:
        return "-"
    tree = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(command))))
    try:
        head = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "-C", tree, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return command
    if not head:
        return command
    return f"{command} (commit {head}{', with local changes' if dirty else ''})"


def schedule(modes: list[str], pairs: int) -> list[str]:
    """The modes of ``pairs`` rounds, each round in the opposite order of the one before."""
    out: list[str] = []
    for r in range(pairs):
        out += modes if r % 2 == 0 else list(reversed(modes))
    return out


def _cpu_load(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def _say(text: str) -> None:
    print(text, flush=True)


def _run_line(f: dict[str, Any]) -> str:
    lat = f["latency_ms"]["all"]
    text = (f"  #{f['number']} {f['mode']}: {f['ops']} ops ({f['ops_per_s']}/s), {f['errors']} errors, "
            f"p50 {lat['p50']} ms, p99 {lat['p99']} ms, max {lat['max']} ms")
    if uses_smoosh(f["mode"]):
        c = f["compactions"]
        text += (f"; smoosh: {c['ok']} compactions ok {c['results']}, {f['errors_inside_compaction']} errors inside "
                 f"(by chance {f['errors_inside_by_chance']}), slowest inside "
                 f"{(f['slowest_inside_compaction'] or {}).get('latency_ms', '-')} ms, reclaimed "
                 f"{f['reclaimed']['smoosh_log_bytes'] / 1e6:.0f} MB, CPU {f['smoosh_cpu_s']} s")
    ch = f["checks"]
    text += f"; {ch['tenants']} tenants, {ch['damaged']} damaged, {ch['lost']} rows lost of {ch['rows_checked']:,}"
    return text


def tables_from(paths: list[str], args: argparse.Namespace) -> int:
    """Print (and with ``--write-results`` write) the tables of the sittings saved in ``paths``, one
    block per sitting in the order given."""
    blocks, saved = [], []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            sitting = json.load(f)
        saved.append(argparse.Namespace(**{**vars(args), **sitting["args"]}))
        blocks.append(sitting_block(sitting, saved[-1]))
    text = section_text(blocks, saved[0])
    print(text, flush=True)
    if args.write_results:
        write_section(RESULTS_SECTION, text)
        _say(f"(bench/RESULTS.md's '{RESULTS_SECTION}' section rewritten)")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.tables_from:
        return tables_from(args.tables_from, args)
    for path, what in ((args.apps_python, "the applications' environment: `make apps-env`"),
                       (args.smoosh, "smoosh: `make install`")):
        if not os.path.exists(path):
            print(f"{path} is missing ({what})", file=sys.stderr)
            return 2
    started = datetime.datetime.now(datetime.timezone.utc)
    stamp = started.strftime("%Y%m%d-%H%M%S")
    order = schedule(args.modes, args.pairs)
    groups = [(a, j) for a in args.apps for j in args.journal]
    per_run_s = args.duration_s + args.lead_s + 25
    _say(f"bench.apps: {len(groups)} (application, journal mode) x {len(order)} runs of {args.duration_s:g} s "
         f"(order {' '.join(order)}); about {len(groups) * len(order) * per_run_s / 60:.0f} minutes plus the templates")
    _say(f"  fleet: {args.tenants} tenants of {args.min_mb:g}-{args.max_mb:g} MB, file/live > {MIN_DEAD_RATIO:g}; "
         f"workload: {args.threads} threads, {args.rate:g} operations/s; lead {args.lead_s:g} s from smoosh's launch "
         f"(its wait_secs is {args.wait_s:g} s by default: the channels open "
         f"{args.wait_s - args.lead_s:g} s into the application's run); cpu load: {args.cpu_load} process(es)")
    _say("  smoosh config keys set (everything else smoosh's defaults): watch, state_dir, store, http, log_format = "
         "json; mode watch also concurrency = 0 in " + ", ".join(f"[smoosh.{c}]" for c in args.channels))
    load = _cpu_load(args.cpu_load)
    command = ("python -m bench.apps " + " ".join(argv if argv is not None else sys.argv[1:])).strip()
    sitting: dict[str, Any] = {
        "started": started.isoformat(), "machine": machine_info(), "command": command, "args": {
            k: v for k, v in vars(args).items() if k not in ("channels",)}, "order": order,
        "smoosh": {"command": args.smoosh, "tree": tree_of(args.smoosh), "channels": args.channels,
                   "wait_secs": args.wait_s, "b": {"command": args.smoosh_b, "tree": tree_of(args.smoosh_b),
                                              "config": args.config_b}},
        "groups": [], "runs": [],
    }
    os.makedirs(args.results, exist_ok=True)
    out_path = os.path.join(args.results, f"apps-{stamp}.json")
    failed: list[str] = []
    number = 0
    try:
        for app, journal in groups:
            template = build_template(args.templates, app, journal, args.seed, args.tenants, args.min_mb,
                                      args.max_mb, args.apps_python, REPO_ROOT, log=_say)
            group = {"app": app, "journal_mode": journal, "template": template.directory,
                     "file_bytes": template.file_bytes, "dead_bytes": template.dead_bytes,
                     "compacted_bytes": sum(t.file_bytes for t in template.compacted),
                     "min_ratio": round(min(t.ratio for t in template.tenants), 2)}
            sitting["groups"].append(group)
            _say(f"{APP_NAMES[app]}, journal {journal}: fleet {template.file_bytes / 1e6:,.0f} MB, "
                 f"{template.dead_bytes / 1e6:,.0f} MB of it dead (file/live >= {group['min_ratio']})")
            for mode in order:
                number += 1
                spec = RunSpec(app=app, journal_mode=journal, mode=mode, number=number, duration_s=args.duration_s,
                               lead_s=args.lead_s, threads=args.threads, rate_per_s=args.rate, seed=args.seed,
                               margin_s=args.margin_s)
                _say(f"  #{number} {mode} ({MODE_NAMES[mode]}): starting")
                t0 = time.monotonic()
                outcome = run_one(spec, template, work=args.work, smoosh_command=args.smoosh,
                                  smoosh_b_command=args.smoosh_b, config_b=args.config_b,
                                  apps_python=args.apps_python, repo_root=REPO_ROOT,
                                  channels=args.channels, keep=args.keep, say=_say)
                f = run_figures(outcome)
                f["config_keys"] = outcome.config_keys
                f["wall_s"] = round(time.monotonic() - t0, 1)
                sitting["runs"].append(f)
                _say(_run_line(f))
                if outcome.violations:
                    failed += [f"#{number}: {v}" for v in outcome.violations]
                    _say(f"FAILED #{number}: {len(outcome.violations)} violation(s); files kept in {outcome.kept}")
                    for v in outcome.violations[:20]:
                        _say(f"  {v}")
                    raise SystemExit(1)
    finally:
        for p in load:
            p.kill()
            p.wait()
        sitting["ended"] = datetime.datetime.now(datetime.timezone.utc).isoformat()
        sitting["failed"] = failed
        with open(out_path, "w", encoding="utf-8") as fh:
            json.dump(sitting, fh, indent=1)
        _say(f"the sitting's JSON: {os.path.relpath(out_path)}")
    text = section_text([sitting_block(sitting, args)], args)
    print(text, flush=True)
    if args.write_results:
        write_section(RESULTS_SECTION, text)
        _say(f"(bench/RESULTS.md's '{RESULTS_SECTION}' section rewritten)")
    return 0


def sitting_block(sitting: dict[str, Any], args: argparse.Namespace) -> str:
    """One sitting's Markdown: where and how it ran (its machine, command, smoosh tree, CPU load and
    run length), then per (application, journal mode) its runs' table and issue 46's verdicts."""
    machine, smoosh = sitting["machine"], sitting.get("smoosh", {})
    versions = {k: v for r in sitting["runs"] for k, v in r["versions"].items()}
    where = (f"{machine['date']}; {machine['nproc']} CPU ({machine['cpu']}), {machine['ram']} RAM; Python "
             f"{machine['python']}, SQLite {machine['sqlite']} (stdlib), {machine['apsw_sqlite']} (apsw, user databases)")
    body = [
        f"Measured {where}; `{sitting.get('command', 'python -m bench.apps')}`; "
        + ", ".join(f"{k} {v}" for k, v in sorted(versions.items()))
        + f"; {args.duration_s:g} s runs; smoosh: {smoosh.get('tree') or smoosh.get('command')}"
        + (f"; smoosh B: {smoosh['b']['tree']}" if (smoosh.get("b") or {}).get("command") else "")
        + (f" with {', '.join(f'`{c}`' for c in smoosh['b']['config'])}" if (smoosh.get("b") or {}).get("config") else "")
        + f"; CPU load beside it: {args.cpu_load} busy process(es)"
        + (f"; **failed**: {'; '.join(sitting['failed'])}" if sitting.get("failed") else "") + ".",
        "",
    ]
    for g in sitting["groups"]:
        runs = [r for r in sitting["runs"] if r["app"] == g["app"] and r["journal_mode"] == g["journal_mode"]]
        if runs:
            body += [group_table(runs, args.modes, g["dead_bytes"]), "",
                     verdict_table(runs, g["dead_bytes"], DEFAULT_MAX_LOCK_HOLD_S), ""]
    return "\n".join(body).rstrip() + "\n"


def section_text(blocks: list[str], args: argparse.Namespace) -> str:
    """The section's Markdown: a heading, how the sittings were measured (the fleet and workload of
    ``args``), then each sitting's block (:func:`sitting_block`)."""
    body = [
        "### The application beside smoosh: Django and SQLAlchemy at their defaults (issue 46)", "",
        f"{args.tenants} tenants of {args.min_mb:g}-{args.max_mb:g} MB (a scattered 70% of the rows deleted: file/live "
        f"> {MIN_DEAD_RATIO:g}), each run on a fresh copy; {args.threads} application threads, {args.rate:g} "
        f"operations/s; smoosh launched {args.lead_s:g} s before the application "
        f"(its default wait_secs of {args.wait_s:g} s opens its channels "
        f"{args.wait_s - args.lead_s:g} s into the run), with its default config but for watch, state_dir, store, "
        "http and log_format (json); 'watching only' sets every channel's concurrency to 0. Runs alternate in rounds, "
        "each round in the opposite order; a cell lists a mode's runs in the sitting's order. Latencies include "
        "failed operations; an error is inside smoosh's run on its tenant when they overlap (the run's window from "
        f"its log line, widened {args.margin_s:g} s before its start); '(by chance)' is what errors at random times "
        "would put there. Under each table, the runs against issue 46's conditions: 'within noise' is read as the "
        "mean of a mode's runs no higher than the highest run of the mode it is compared with.",
        "",
    ]
    for block in blocks:
        body += [block, ""]
    return "\n".join(body).rstrip() + "\n"


if __name__ == "__main__":
    sys.exit(main())
