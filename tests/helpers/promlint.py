"""The naming rules ``promtool check metrics`` lints an exposition with, checked in Python.

promtool (Prometheus's ``util/promlint``) fails a scrape whose metric families break the
exposition format's naming conventions. Not every machine has promtool, so the suite checks
the same rules itself on a real scrape, read family by family from the text (the ``# HELP``
and ``# TYPE`` lines name each family as promtool sees it: ``smoosh_evicted_total``, not the
``smoosh_evicted`` a client library's parser would make of it):

* every family has help text;
* a counter's name ends in ``_total``; no other family's does (a gauge named ``..._total``
  reads as a counter);
* only histograms and summaries have names ending in ``_count``, ``_sum`` or ``_bucket``
  (their series' suffixes): a gauge ``smoosh_channel_count`` made promtool exit 3;
* names and label names are snake_case (no capitals), with no colon (reserved for recording rules);
* a name does not carry its type (``_counter``, ``_gauge``, ...);
* units are base units (``seconds``, not ``milliseconds`` or ``minutes``; ``bytes``, not
  ``kilobytes``; ``ratio``, not ``percent``) and spelled out (``seconds``, not ``sec``/``ms``).
"""

from __future__ import annotations

import re

__all__ = ["lint"]

#: Non-base units promlint names, and the base unit to use instead.
NON_BASE_UNITS = {
    **{unit: "seconds" for unit in ("nanoseconds", "microseconds", "milliseconds", "minutes", "hours", "days",
                                    "weeks", "years")},
    **{unit: "bytes" for unit in ("kilobytes", "megabytes", "gigabytes", "terabytes", "petabytes", "kibibytes",
                                  "mebibytes", "gibibytes", "bits")},
    **{unit: "meters" for unit in ("kilometers", "centimeters", "millimeters")},
    "percent": "ratio",
}
#: Abbreviated units promlint refuses (one word of the name).
ABBREVIATIONS = frozenset({"s", "ms", "us", "ns", "sec", "secs", "min", "mins", "hr", "hrs", "b", "kb", "mb", "gb",
                           "tb", "pb", "kib", "mib", "gib", "pct"})
#: Type names a metric name must not carry.
TYPES = ("counter", "gauge", "histogram", "summary", "untyped")
#: Suffixes of the series of a histogram or a summary.
RESERVED_SUFFIXES = ("_count", "_sum", "_bucket")
SNAKE = re.compile(r"[a-z_][a-z0-9_]*")
LABELS = re.compile(r"\{(.*)\}")


def lint(exposition: str) -> list[str]:
    """Every naming problem of the Prometheus text ``exposition``, one string each; [] when it passes.

    Parameters:
        exposition: the body of a ``GET /metrics``.

    Returns:
        ``"NAME: problem"`` strings, in the order the families appear.
    """
    families: dict[str, dict[str, str]] = {}
    label_names: dict[str, set[str]] = {}
    for line in exposition.splitlines():
        if line.startswith("# HELP "):
            name, _, text = line[len("# HELP "):].partition(" ")
            families.setdefault(name, {})["help"] = text.strip()
        elif line.startswith("# TYPE "):
            name, _, kind = line[len("# TYPE "):].partition(" ")
            families.setdefault(name, {})["type"] = kind.strip()
        elif line and not line.startswith("#"):
            sample = line.split(" ", 1)[0] if "{" not in line.split(" ", 1)[0] else line[:line.index("}") + 1]
            match = LABELS.search(sample)
            base = sample.split("{", 1)[0]
            if match:
                names = {part.split("=", 1)[0].strip() for part in re.findall(r'(\w+)="', match.group(1))}
                label_names.setdefault(base, set()).update(names)
    problems: list[str] = []
    for name, family in families.items():
        problems.extend(f"{name}: {p}" for p in _family_problems(name, family.get("type", "untyped"),
                                                                 family.get("help", "")))
    for sample, names in label_names.items():
        problems.extend(f"{sample}: label {n!r} is not snake_case" for n in sorted(names) if not SNAKE.fullmatch(n))
    return problems


def _family_problems(name: str, kind: str, help_text: str) -> list[str]:
    out = []
    if not help_text:
        out.append("no help text")
    if ":" in name:
        out.append("a colon is reserved for recording rules")
    if not SNAKE.fullmatch(name.replace(":", "_")):
        out.append("not snake_case")
    if kind == "counter" and not name.endswith("_total"):
        out.append('a counter\'s name should end in "_total"')
    if kind != "counter" and name.endswith("_total"):
        out.append(f'a {kind} should not have a "_total" suffix (it reads as a counter)')
    if kind not in ("histogram", "summary"):
        out.extend(f'non-histogram and non-summary metrics should not have a "{s}" suffix'
                   for s in RESERVED_SUFFIXES if name.endswith(s))
    words = name.split("_")
    out.extend(f"the name should not include its type {t!r}" for t in TYPES if t in words)
    out.extend(f"use base unit {NON_BASE_UNITS[w]!r} instead of {w!r}" for w in words
               if w in NON_BASE_UNITS)
    out.extend(f"abbreviated unit {w!r}: spell it out" for w in words if w in ABBREVIATIONS)
    return out
