"""``smoosh jobs [--store URL] list [--type T] [--state S] [--limit N] [--json] | show TYPE ID``: the job layer's rows.

Every row ``list`` prints opens with ``show`` given its TYPE and ID as printed (issue 45):
a finished row kept by its node included.

The lead wires :func:`add_jobs_parser` into ``smoosh/cli.py``; the parser's ``func`` default
is :func:`jobs_command`, which returns the exit code (0 ok, 1 operational error).

The store holds what is pending and running. A smoosh node removes a job's row once the job
has finished (DESIGN §5.5), and keeps instead each key's last results beside it
(``smoosh.daemon.results``, bounded per key and in total): ``jobs list`` shows those as the
finished jobs, one row a key with the time its last compaction ended, and says what it keeps.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import math
import sys
from typing import Any, TextIO

from smoosh.cli.argtypes import positive_int
from smoosh.cli.messages import print_error
from smoosh.cli.store_deadline import add_deadline_option, answer_within, deadline_of
from smoosh.daemon.results import Result, read_all
from smoosh.errors import SmooshError
from smoosh.jobs.errors import NotFound
from smoosh.jobs.layer import JobInfo, Jobs

#: Column titles of ``jobs list``.
LIST_HEADER = ("TYPE", "ID", "STATE", "SCHEDULED")
#: The states of a job-layer row (DESIGN §5.5), what ``jobs list --state`` takes.
JOB_LAYER_STATES = ("pending", "running", "finished")
#: What ``jobs list`` adds when it shows no finished job although it was asked for them.
FINISHED_NOT_KEPT = ("no finished compaction is kept in this store: a smoosh node removes a job once it has "
                     "finished and keeps each key's last results instead, none yet; `smoosh status --jobs` shows "
                     "each key's history on its node")
#: What ``jobs list`` adds under finished rows: what they are.
FINISHED_KEPT = ("finished: each key's last compaction, as its node keeps it (the time it ended; --json has its "
                 "last results); `smoosh status --jobs` shows each key's history on its node")


def add_jobs_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``jobs list`` and ``jobs show`` on an argparse subparsers object.

    Parameters:
        subparsers: the result of ``parser.add_subparsers()``.

    Returns:
        The ``jobs`` parser (its ``func`` default is :func:`jobs_command`).
    """
    parser = subparsers.add_parser("jobs", help="list or show jobs in the store", description="List or show jobs in the store.")
    parser.add_argument("--store", metavar="URL", help="store URL (default: the config's store)")
    add_deadline_option(parser)
    commands = parser.add_subparsers(dest="jobs_command", metavar="{list,show}")
    commands.required = True
    list_parser = commands.add_parser("list", help="list jobs: type, id, state, scheduled time")
    list_parser.add_argument("--type", dest="job_type", metavar="T", help="only jobs of this type")
    list_parser.add_argument("--state", choices=JOB_LAYER_STATES, action="append",
                             help="only jobs in this state (repeatable)")
    list_parser.add_argument("--limit", metavar="N", type=positive_int, help="at most N jobs")
    list_parser.add_argument("--json", action="store_true",
                             help='print {"jobs": [{"type", "id", "state", "scheduled_time", "resubmit", "data"}]}')
    show_parser = commands.add_parser("show", help="show one job's state and data as JSON")
    show_parser.add_argument("job_type", metavar="TYPE", help="the job's type, e.g. smoosh:NODE")
    show_parser.add_argument("job_id", metavar="ID", help="the job's id (for smoosh: the database's path)")
    show_parser.add_argument("--json", action="store_true", help="accepted for symmetry: show always prints JSON")
    for sub in (list_parser, show_parser):
        # The store's options after the subcommand too (`jobs list --config PATH`), as a user
        # types them; absent there, they leave what `jobs` itself was given (SUPPRESS).
        sub.add_argument("--store", metavar="URL", default=argparse.SUPPRESS, help="as before the subcommand")
        add_deadline_option(sub, inherited=True)
        sub.add_argument("--config", metavar="PATH", default=argparse.SUPPRESS, help="as before the subcommand")
    parser.set_defaults(func=jobs_command)
    return parser


def jobs_command(args: argparse.Namespace, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """Run ``jobs list`` / ``jobs show``.

    Parameters:
        args: parsed arguments: ``store`` (or ``store_default``), ``jobs_command`` ("list" or
            "show"), ``job_type`` and (for show) ``job_id``.

    Returns:
        0 on success, 1 on an operational error (unopenable store, job not found).
    """
    from smoosh.store import Store, open_store  # lazily: a parser-only import stays cheap

    out = stdout or sys.stdout
    err = stderr or sys.stderr
    url = getattr(args, "store", None) or getattr(args, "store_default", None)
    if not url:
        url = _store_from_config(args, err)
    if not url:
        print_error("jobs: no store: pass --store URL or set store in the config", stream=err)
        return 1
    deadline_s = deadline_of(args)

    def opener(url: str, *, create: bool) -> Store:
        try:
            return open_store(url, create=create)  # create=False: a mistyped path is an error, not a new store
        except SmooshError as e:
            raise _CannotOpen(f"cannot open store {url}: {e}") from e

    def work(store: Store) -> tuple[int, str, str]:
        # Printed once the answer is in, all of it: a store that stops answering halfway leaves
        # no half a listing behind the error.
        buf_out, buf_err = io.StringIO(), io.StringIO()
        with Jobs(store, monitors=False) as jobs:
            kept = store.transact(lambda tr: read_all(tr.snapshot), timeout_s=deadline_s)
            if args.jobs_command == "list":
                rc = _list(jobs, getattr(args, "job_type", None), buf_out, states=getattr(args, "state", None),
                           limit=getattr(args, "limit", None), as_json=bool(getattr(args, "json", False)), kept=kept)
            else:
                rc = _show(jobs, args.job_type, args.job_id, buf_out, buf_err, kept=kept)
        return rc, buf_out.getvalue(), buf_err.getvalue()

    try:
        rc, printed, said = answer_within(url, work, deadline_s, args=args, opener=opener)
    except SmooshError as e:
        print_error(f"jobs: {e}", stream=err)
        return 1
    out.write(printed)
    err.write(said)
    return rc


class _CannotOpen(SmooshError):
    """Raised when ``jobs`` cannot open its store (said as such: the store never answered anything)."""


def _store_from_config(args: argparse.Namespace, err: TextIO) -> str | None:
    """The config's ``store`` (``--config``, ``$SMOOSH_CONFIG`` or the default file), if any."""
    try:
        from smoosh.config import load_config
    except ImportError:  # pragma: no cover - the config module is part of smoosh
        return None
    try:
        return load_config(getattr(args, "config", None)).store or None
    except SmooshError as e:
        print_error(f"jobs: {e}", stream=err)
        return None


def _list(jobs: Jobs, job_type: str | None, out: TextIO, *, states: list[str] | None = None,
          limit: int | None = None, as_json: bool = False,
          kept: dict[str, dict[str, list[Result]]] | None = None) -> int:
    """Print the jobs, then the finished compactions the nodes keep (``kept``: node -> key -> results)."""
    infos: list[JobInfo] = []
    for info in jobs.iter_jobs(job_type):
        if states and info.state not in states:
            continue
        if limit is not None and len(infos) >= limit:
            break
        infos.append(info)
    asked_for_finished = not states or "finished" in states
    finished: list[tuple[str, str, list[Result]]] = []  # (type, key, results), the latest first
    if asked_for_finished:
        for node, per_key in (kept or {}).items():
            finished.extend((f"smoosh:{node}", key, results) for key, results in per_key.items()
                            if job_type is None or job_type == f"smoosh:{node}")
        finished.sort(key=lambda row: row[2][0].at, reverse=True)
        if limit is not None:
            finished = finished[:max(0, limit - len(infos))]
    if as_json:
        rows_json = [_job_json(info) for info in infos] + [_finished_json(*row) for row in finished]
        print(json.dumps({"jobs": rows_json}, indent=2, sort_keys=True, allow_nan=False), file=out)
        return 0
    rows = [LIST_HEADER]
    for info in infos:
        rows.append((_type_text(info.type), info.id, info.state, _time_text(info.scheduled_time)))
    for type_text, key, results in finished:
        rows.append((type_text, key, "finished", _time_text(results[0].at)))
    types = [_type_text(t) for t in jobs.get_types()]
    if len(rows) == 1:
        print(_nothing_found(job_type, states, types), file=out)
    else:
        widths = [max(len(row[i]) for row in rows) for i in range(len(LIST_HEADER))]
        for row in rows:
            print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip(), file=out)
    if finished:
        print(FINISHED_KEPT, file=out)
    elif types and asked_for_finished and all(info.state != "finished" for info in infos):
        print(FINISHED_NOT_KEPT, file=out)
    return 0


def _finished_json(job_type: str, key: str, results: list[Result]) -> dict[str, Any]:
    """A finished compaction a node keeps, in the shape of a job row: its last results in ``data``."""
    return {"type": job_type, "id": key, "state": "finished", "scheduled_time": results[0].at, "resubmit": False,
            "data": {"results": [r.to_json() for r in results]}}


def _nothing_found(job_type: str | None, states: list[str] | None, types: list[str]) -> str:
    """Why ``jobs list`` shows no row, as far as the store can tell."""
    if not types:
        return "no jobs found: this store has no job types (is it the store the daemons use?)"
    if job_type is not None and job_type not in types:
        return f"no jobs found of type {job_type}: no such type in this store (its types: {', '.join(types)})"
    where = f" of type {job_type}" if job_type else ""
    if states:
        where += f" in state {' or '.join(states)}"
    return f"no jobs found{where}"


def _show(jobs: Jobs, job_type: str, job_id: str, out: TextIO, err: TextIO, *,
          kept: dict[str, dict[str, list[Result]]] | None = None) -> int:
    """Print one row of ``jobs list`` as JSON, given its TYPE and ID exactly as ``list`` printed them.

    A job of the job layer (its type as ``list`` prints it: a tuple type's parts joined by
    commas), or else a finished compaction a node keeps (``list``'s finished rows: the job's
    row is gone, its last results are kept), in the shape ``list --json`` gives it.
    """
    for candidate in _types_named(jobs, job_type):
        try:
            info = jobs.get_job(candidate, job_id)
        except NotFound:
            continue
        print(json.dumps(_job_json(info), indent=2, sort_keys=True, allow_nan=False), file=out)
        return 0
    node = job_type[len("smoosh:"):] if job_type.startswith("smoosh:") else None
    results = (kept or {}).get(node, {}).get(job_id) if node is not None else None
    if results:
        print(json.dumps(_finished_json(job_type, job_id, results), indent=2, sort_keys=True, allow_nan=False),
              file=out)
        return 0
    print_error(f"job {job_type} {job_id} not found", stream=err)
    return 1


def _types_named(jobs: Jobs, text: str) -> list[Any]:
    """The job types ``list`` prints as ``text``: the string itself, and any tuple type printed so."""
    return [text] + [t for t in jobs.get_types() if isinstance(t, tuple) and _type_text(t) == text]


def _job_json(info: JobInfo) -> dict[str, Any]:
    return {
        "type": _json_safe(info.type),
        "id": info.id,
        "state": info.state,
        "scheduled_time": info.scheduled_time,
        "resubmit": info.resubmit,
        "data": _json_safe(info.data),
    }


def _json_safe(value: Any) -> Any:
    """JSON never carries Infinity or NaN: they become "infinity", "-infinity", "nan"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("infinity" if value > 0 else "-infinity")
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    return value


def _type_text(job_type: Any) -> str:
    if isinstance(job_type, tuple):
        return ",".join(str(part) for part in job_type)
    return str(job_type)


def _time_text(scheduled_time: float) -> str:
    if not scheduled_time:
        return "-"
    try:
        moment = datetime.datetime.fromtimestamp(scheduled_time, tz=datetime.timezone.utc)
    except (OverflowError, OSError, ValueError):
        return str(scheduled_time)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
