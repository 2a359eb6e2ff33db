"""Checks a PromQL expression against a real ``/metrics`` scrape (DESIGN §11: a rules file is
checked for valid PromQL structure and every metric it names exists, not only parsed as YAML).

The expression is parsed by promql-parser (a Rust port of Prometheus's own parser: balanced
brackets, operator precedence, function argument types). Then every series it selects must be
one the scrape exposes, under the name Prometheus stores (``_total``, ``_bucket``, ``_sum``,
``_count`` included, so ``rate(smoosh_compaction_duration_seconds[5m])`` is an error); every
label it matches, groups or joins on must exist on the series beneath it; and every value an
``=`` or ``=~`` matcher asks for must occur in the scrape (every smoosh series exists at 0 from
start, so a fresh daemon's scrape has them all).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import promql_parser
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Scrape", "problems", "selected_names", "TARGET_LABELS", "grafana_expr"]

#: Labels Prometheus attaches to every series of a target; they are not in the exposition.
TARGET_LABELS = frozenset({"job", "instance"})
#: Series Prometheus writes itself for every scraped target, with the target's labels only.
SYNTHETIC_SERIES = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped"})
#: Grafana's built-in and this dashboard's template variables, replaced by what they stand for.
GRAFANA_VARIABLES = {
    "$__rate_interval": "5m",
    "$__interval": "1m",
    "$__range": "1d",
    "${instance:regex}": ".*",
    "$instance": ".*",
}


@dataclass
class Scrape:
    """What one scrape exposes: each sample name's label names and each label's values."""

    labels: dict[str, set[str]] = field(default_factory=dict)
    values: dict[tuple[str, str], set[str]] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> Scrape:
        """Read the Prometheus text exposition ``text``."""
        scrape = cls()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                scrape.labels.setdefault(sample.name, set()).update(sample.labels)
                for label, value in sample.labels.items():
                    scrape.values.setdefault((sample.name, label), set()).add(value)
        return scrape

    def has(self, name: str) -> bool:
        return name in self.labels or name in SYNTHETIC_SERIES

    def labels_of(self, name: str) -> set[str]:
        return set(self.labels.get(name, ())) | TARGET_LABELS


def _selectors(expr: Any) -> list[Any]:
    found: list[Any] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            found.append(node)

    promql_parser.walk(expr, visit)
    return found


def selected_names(text: str) -> set[str]:
    """The series names the PromQL expression ``text`` selects (it must parse)."""
    return {s.name for s in _selectors(promql_parser.parse(text)) if s.name}


def problems(text: str, scrape: Scrape) -> list[str]:
    """Everything wrong with the PromQL expression ``text`` against ``scrape``; [] when it is sound."""
    try:
        expr = promql_parser.parse(text)
    except ValueError as e:
        return [f"not PromQL: {e}"]
    out: list[str] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            out.extend(_selector_problems(node, scrape))
        elif isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            out.extend(_grouping_problems(node.modifier.labels, [node.expr], scrape, str(node.op)))
        elif isinstance(node, promql_parser.BinaryExpr) and node.modifier is not None:
            modifier = node.modifier
            names = list(modifier.matching.labels) if modifier.matching is not None else []
            names += list(modifier.group_labels or [])
            out.extend(_grouping_problems(names, [node.lhs, node.rhs], scrape, "vector matching"))

    promql_parser.walk(expr, visit)
    return out


def _selector_problems(selector: Any, scrape: Scrape) -> list[str]:
    name = selector.name
    if not name:
        return [f"{selector}: selects no metric by name"]
    if not scrape.has(name):
        return [f"{name}: no such series in the scrape"]
    out = []
    known = scrape.labels_of(name)
    matchers = list(selector.matchers.matchers)
    for group in selector.matchers.or_matchers:
        matchers.extend(group)
    for m in matchers:
        if m.name == "__name__":
            continue
        if m.name not in known:
            out.append(f"{name}: no label {m.name!r} (it has {sorted(known)})")
            continue
        if m.name in TARGET_LABELS or name in SYNTHETIC_SERIES:
            continue  # their values are the target's, not the exposition's
        values = scrape.values.get((name, m.name), set())
        if m.op == promql_parser.MatchOp.Equal and m.value not in values:
            out.append(f"{name}: no series with {m.name}={m.value!r} (values: {sorted(values)})")
        elif m.op == promql_parser.MatchOp.Re and not any(re.fullmatch(m.value, v) for v in values):
            out.append(f"{name}: no series with {m.name}=~{m.value!r} (values: {sorted(values)})")
    return out


def _grouping_problems(names: list[str], operands: list[Any], scrape: Scrape, where: str) -> list[str]:
    beneath: set[str] = set(TARGET_LABELS)
    for operand in operands:
        for selector in _selectors(operand):
            beneath |= scrape.labels_of(selector.name or "")
    return [f"{where}: label {n!r} is on no series beneath it" for n in names if n not in beneath]


def grafana_expr(expr: str) -> str:
    """A Grafana target's expression with its template variables replaced, ready for :func:`problems`."""
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr
