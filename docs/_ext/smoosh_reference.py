"""The reference pages, generated from the code's own declarations at every build.

A reference page holds a marker line, ``<!-- smoosh-reference: NAME -->``, which the build
replaces with Markdown written from the definitions in the code (DESIGN §12: one source for each
fact in the docs):

- ``config``: every key of ``[smoosh]``, ``[smoosh.<channel>]`` and ``[smoosh.sqlite]`` from its
  declaration (``smoosh.config.keys.Key``: type, default, unit, doc string), whether it applies
  live from ``RESTART_KEYS``, and the keys the parser reads (``keys_the_parser_reads``);
- ``cli``: every command, option and argument of the ``smoosh`` argument parser, with its help;
- ``http``: every endpoint of the admin API (``smoosh.daemon.api.http.ROUTES``);
- ``metrics``: every metric with its type and labels (``smoosh.daemon.api.metrics.METRICS``);
- ``alerts``: the shipped Prometheus alerting rules (``conf/prometheus/smoosh-rules.yml``).

Something the code defines without documentation (a key the parser reads with no declaration or
an empty doc string, an option without help, a route or a metric without a doc) is a warning
naming it, and the strict build (``sphinx-build -W``, as ``make docs`` and ``make test`` run it)
fails on it. The generating functions return ``(markdown, problems)`` and import nothing of
Sphinx, so the tests call them directly.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!-- smoosh-reference: ([a-z]+) -->$", re.M)

Generated = tuple[str, list[str]]


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


# ------------------------------------------------------------------ config


def config_reference() -> Generated:
    """The configuration reference: every key of every section, from its declaration."""
    from smoosh.config.defaults import COUCHDB_ONLY_KEY_DOCS, GLOBAL_KEY_DEFS, RESTART_KEYS
    from smoosh.config.keys import keys_the_parser_reads
    from smoosh.config.sections import CHANNEL_KEY_DEFS, SQLITE_KEY_DEFS

    problems: list[str] = []
    read = keys_the_parser_reads()
    sections = (
        ("smoosh", "`[smoosh]`", GLOBAL_KEY_DEFS, "GLOBAL_KEY_DEFS in smoosh/config/defaults.py",
         "The global section: what is watched, where smoosh keeps its state, the admin API, and the limits "
         "every channel shares."),
        ("channel", "`[smoosh.<channel>]`", CHANNEL_KEY_DEFS, "CHANNEL_KEY_DEFS in smoosh/config/sections.py",
         "One section per channel named in `db_channels`, `view_channels` or `cleanup_channels`; every key "
         "is optional."),
        ("sqlite", "`[smoosh.sqlite]`", SQLITE_KEY_DEFS, "SQLITE_KEY_DEFS in smoosh/config/sections.py",
         "How the built-in SQLite compactor treats databases."),
    )
    out: list[str] = []
    for section, title, keys, table, intro in sections:
        declared = {k.name for k in keys}
        for name in sorted(read[section] - declared):
            problems.append(f"config key {name!r} of {title} is read by the parser but not declared: "
                            f"add a Key with its doc string to {table}")
        for name in sorted(declared - read[section]):
            problems.append(f"config key {name!r} of {title} is declared in {table} but the parser never reads it")
        out += [f"## {title}", "", intro, ""]
        for key in keys:
            if not key.doc.strip():
                problems.append(f"config key {key.name!r} of {title} has no doc string ({table})")
            out += _config_key(key, section == "smoosh" and key.name in RESTART_KEYS)
    out += ["## `[smoosh.ignore]`", "",
            "Databases never compacted: one entry a line, an exact path or a glob pattern, `= true` (CouchDB's "
            "form). `= false` keeps an entry listed without ignoring it. Relative entries resolve against the "
            "working directory. An entry that cannot name a database (a bare name such as CouchDB's `_users`, a "
            "shard name, a path outside every root) is warned about.", "",
            "## CouchDB keys smoosh accepts and does not use", ""]
    for name, doc in COUCHDB_ONLY_KEY_DOCS.items():
        out += [f"- `{name}`: {doc}"]
    out.append("")
    return "\n".join(out), problems


def _config_key(key: Any, restart: bool) -> list[str]:
    """A key's heading, its facts on one line (type, unit, default, live or restart), then its doc string."""
    form = key.form
    kind = f"*{form.type}; a bare number is {form.unit}*" if form.unit else f"*{form.type}*"
    shown = key.default_shown()
    default = f"default `{shown}`" if not key.default_text and shown not in ("empty", "unset") else f"default {shown}"
    facts = [kind, default, "**needs a restart**" if restart else "applies live"]
    return [f"### `{key.name}`", "", " · ".join(facts), "", key.doc.strip(), ""]


# ------------------------------------------------------------------ CLI


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser, str]]:
    found: list[tuple[str, argparse.ArgumentParser, str]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                found.append((name, sub, helps.get(name, "")))
    return found


def _option_rows(parser: argparse.ArgumentParser, where: str, problems: list[str]) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.option_strings:
            name = ", ".join(f"`{o}`" for o in action.option_strings)
            if action.nargs != 0 and action.metavar:
                name += f" `{action.metavar}`"
        else:
            name = f"`{action.metavar or action.dest}`"
            if action.nargs in ("+", "*"):
                name += "…"
        if not (action.help or "").strip() or action.help == argparse.SUPPRESS:
            problems.append(f"{where} {'/'.join(action.option_strings) or action.dest}: the option has no help text "
                            "(give add_argument a help=)")
            continue
        help_text = action.help % {"default": action.default, "prog": parser.prog} if "%(" in action.help else action.help
        rows.append(f"| {name} | {_cell(help_text)} |")
    if not rows:
        return []
    return ["| option or argument | what it does |", "| --- | --- |", *rows, ""]


def cli_reference(build_parser: Callable[[], argparse.ArgumentParser] | None = None) -> Generated:
    """The command-line reference: every command and option of the ``smoosh`` parser, with its help."""
    if build_parser is None:
        from smoosh.cli import build_parser
    # argparse wraps usage lines at the terminal's width: the page must not depend on it.
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        return _cli_reference(build_parser())
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns


def _cli_reference(parser: argparse.ArgumentParser) -> Generated:
    problems: list[str] = []
    out = ["## `smoosh`", "", parser.description or "", "", "```text", parser.format_usage().strip(), "```", ""]
    out += _option_rows(parser, "smoosh", problems)
    if parser.epilog:
        out += ["```text", parser.epilog.strip(), "```", ""]

    def walk(p: argparse.ArgumentParser, words: list[str]) -> None:
        for name, sub, help_text in _subcommands(p):
            command = " ".join([*words, name])
            if not help_text.strip():
                problems.append(f"{command}: the command has no help text (give add_parser a help=)")
            sentence = help_text.strip().rstrip(".")
            out.extend([f"## `{command}`", "", sentence[:1].upper() + sentence[1:] + ".", "",
                        "```text", sub.format_usage().strip(), "```", ""])
            out.extend(_option_rows(sub, command, problems))
            walk(sub, [*words, name])

    walk(parser, ["smoosh"])
    return "\n".join(out), problems


# ------------------------------------------------------------------ HTTP


def http_reference() -> Generated:
    """The admin API reference: every declared route, in order."""
    from smoosh.daemon.api.http import ROUTES, _Handler

    problems: list[str] = []
    out = ["| endpoint | what it is for |", "| --- | --- |"]
    body: list[str] = []
    for route in ROUTES:
        where = f"{route.method} {route.path}"
        if not route.summary.strip() or not route.doc.strip():
            problems.append(f"endpoint {where} has no summary or doc (its Route in smoosh/daemon/api/http.py)")
        if not callable(getattr(_Handler, route.handler, None)):
            problems.append(f"endpoint {where}: no handler method {route.handler!r}")
        anchor = f"{route.method.lower()}-{route.path.strip('/').replace('/', '-') or 'page'}"
        out.append(f"| [`{where}`](#{anchor}) | {_cell(route.summary)} |")
        body += [f"({anchor})=", f"## `{where}`", "", route.summary.strip(), "", route.doc.strip(), ""]
    return "\n".join([*out, "", *body]), problems


# ------------------------------------------------------------------ metrics


def metrics_reference() -> Generated:
    """The metrics reference: every declared metric, its type, labels and meaning."""
    from smoosh.daemon.api.metrics import METRICS

    problems: list[str] = []
    out = ["| metric | type | labels | meaning |", "| --- | --- | --- | --- |"]
    for m in METRICS:
        if not m.doc.strip():
            problems.append(f"metric {m.name} has no doc (its MetricDef in smoosh/daemon/api/metrics.py)")
        if m.kind not in ("gauge", "counter", "histogram"):
            problems.append(f"metric {m.name}: unknown kind {m.kind!r}")
        values = dict(m.label_values)
        labels = ", ".join(f"`{label}`" + (f" ({', '.join(f'`{v}`' for v in values[label])})" if label in values
                                            else "") for label in m.labels)
        name = f"`{m.name}`"
        if m.kind == "histogram":
            name += " (`_bucket`, `_sum`, `_count`)"
        out.append(f"| {name} | {m.kind} | {labels} | {_cell(m.doc)} |")
    return "\n".join(out) + "\n", problems


# ------------------------------------------------------------------ alerts


def alerts_reference(path: Path = ROOT / "conf" / "prometheus" / "smoosh-rules.yml") -> Generated:
    """The shipped alerting rules as a table: alert, what it means, expression, for, severity."""
    import yaml

    problems: list[str] = []
    data = yaml.safe_load(path.read_text())
    out = ["| alert | fires when | expression | for | severity |", "| --- | --- | --- | --- | --- |"]
    for group in data["groups"]:
        for rule in group["rules"]:
            summary = (rule.get("annotations") or {}).get("summary", "")
            if not summary:
                problems.append(f"alert {rule.get('alert')}: no summary annotation ({path.name})")
            expr = " ".join(str(rule["expr"]).split())
            out.append(f"| `{rule['alert']}` | {_cell(summary)} | `{_cell(expr)}` | {rule.get('for', '')} "
                       f"| {rule.get('labels', {}).get('severity', '')} |")
    return "\n".join(out) + "\n", problems


GENERATORS: dict[str, Callable[[], Generated]] = {
    "config": config_reference,
    "cli": cli_reference,
    "http": http_reference,
    "metrics": metrics_reference,
    "alerts": alerts_reference,
}


def expand(text: str) -> Generated:
    """``text`` with every marker replaced by its generated Markdown, and what was found missing.

    Raises:
        KeyError: a marker names no generator.
    """
    problems: list[str] = []

    def replace(match: re.Match[str]) -> str:
        markdown, found = GENERATORS[match.group(1)]()
        problems.extend(found)
        return markdown

    return MARKER.sub(replace, text), problems


# ------------------------------------------------------------------ Sphinx


def _source_read(app: Any, docname: str, source: list[str]) -> None:
    from sphinx.util import logging as sphinx_logging

    if not MARKER.search(source[0]):
        return
    try:
        source[0], problems = expand(source[0])
    except KeyError as e:
        problems = [f"no generated reference named {e}"]
    log = sphinx_logging.getLogger(__name__)
    for problem in problems:
        log.warning("undocumented: %s", problem, location=docname)


def _always_outdated(app: Any, env: Any, added: Iterable[str], changed: Iterable[str], removed: Iterable[str]) -> list[str]:
    # The generated pages follow the code, which Sphinx does not watch: read them at every build.
    return [name for name in env.found_docs if name.startswith("reference/")]


class _ListedEveryPage(logging.Filter):
    """Drops Sphinx's warning that a toctree's trailing ``*`` matched nothing.

    The sections' tables of contents list their pages in order and end with a glob that picks up
    a page nobody listed yet; while every page is listed the glob is empty, which is no fault
    (and this warning has no type that ``suppress_warnings`` could name).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not ("toctree glob pattern" in str(record.msg) and "match any documents" in record.getMessage())


def setup(app: Any) -> dict[str, Any]:
    """Register the marker expansion (Sphinx's extension entry point)."""
    logging.getLogger("sphinx.sphinx.directives.other").addFilter(_ListedEveryPage())
    app.connect("source-read", _source_read)
    app.connect("env-get-outdated", _always_outdated)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
