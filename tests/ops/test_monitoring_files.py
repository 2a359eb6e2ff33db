"""The shipped Prometheus rules and Grafana dashboard: valid files whose every expression is PromQL
over series a real daemon's /metrics exposes (DESIGN §11: checked for valid PromQL structure
and every metric it names exists, not only parsed as YAML)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml
from opslib import PausedDaemon, request

from helpers.promql import TARGET_LABELS, Scrape, grafana_expr, problems, selected_names

ROOT = Path(__file__).resolve().parents[2]
RULES_PATH = ROOT / "conf" / "prometheus" / "smoosh-rules.yml"
DASHBOARD_PATH = ROOT / "conf" / "grafana" / "smoosh.json"

#: The keys Prometheus accepts in a rule group and in a rule (it refuses any other).
GROUP_KEYS = {"name", "interval", "limit", "query_offset", "rules"}
RULE_KEYS = {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}
#: Alert and label names as Prometheus validates them.
NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def rules() -> list[dict[str, Any]]:
    data = yaml.safe_load(RULES_PATH.read_text())
    return [rule for group in data["groups"] for rule in group["rules"]]


def dashboard_targets() -> list[tuple[str, str]]:
    """(panel title, expression) of every query of the dashboard, rows' panels included."""
    dashboard = json.loads(DASHBOARD_PATH.read_text())
    panels = list(dashboard["panels"])
    for panel in dashboard["panels"]:
        panels.extend(panel.get("panels", []))
    return [(p["title"], t["expr"]) for p in panels for t in p.get("targets", [])]


@pytest.fixture(scope="module")
def scraped(paused: PausedDaemon) -> Scrape:
    """One real scrape of a running daemon that has compacted nothing: every series at 0."""
    reply = request(paused.url + "/metrics")
    assert reply.status == 200
    return Scrape.parse(reply.body.decode())


def test_the_rules_file_has_prometheus_rule_file_syntax() -> None:
    data = yaml.safe_load(RULES_PATH.read_text())
    assert set(data) == {"groups"}
    names = [group["name"] for group in data["groups"]]
    assert len(names) == len(set(names)), "group names must be unique"
    alerts: list[str] = []
    for group in data["groups"]:
        assert set(group) <= GROUP_KEYS, group["name"]
        assert group["rules"], group["name"]
        for rule in group["rules"]:
            assert set(rule) <= RULE_KEYS, rule
            assert ("alert" in rule) != ("record" in rule), rule
            assert isinstance(rule["expr"], str) and rule["expr"].strip(), rule
            assert NAME.fullmatch(rule["alert"]), rule["alert"]
            alerts.append(rule["alert"])
            if "for" in rule:
                assert promql_parser.parse_duration(rule["for"]).total_seconds() > 0, rule["for"]
            for mapping in ("labels", "annotations"):
                assert all(NAME.fullmatch(k) and isinstance(v, str) for k, v in rule.get(mapping, {}).items()), rule
            assert rule["labels"]["severity"] in {"info", "warning", "critical"}, rule["alert"]
            assert rule["annotations"].keys() >= {"summary", "description"}, rule["alert"]
    assert len(alerts) == len(set(alerts)), "alert names must be unique"


def test_every_rule_is_promql_over_series_a_real_scrape_exposes(scraped: Scrape) -> None:
    found = {rule["alert"]: problems(rule["expr"], scraped) for rule in rules()}
    assert {alert: p for alert, p in found.items() if p} == {}


def test_every_label_an_alert_text_names_is_on_its_series(scraped: Scrape) -> None:
    for rule in rules():
        named = set(re.findall(r"\$labels\.(\w+)", " ".join(rule["annotations"].values())))
        carried = set(TARGET_LABELS)
        for name in selected_names(rule["expr"]):
            carried |= scraped.labels_of(name)
        assert named <= carried, rule["alert"]


def test_the_rules_cover_failures_crashing_jobs_no_success_and_a_growing_queue() -> None:
    exprs = {rule["alert"]: rule["expr"] for rule in rules()}
    assert 'smoosh_compactions_total{result="failed"}' in exprs["SmooshCompactionsFailing"]
    assert selected_names(exprs["SmooshCrashingJobs"]) == {"smoosh_crashing_jobs"}
    assert "smoosh_last_success_timestamp_seconds" in selected_names(exprs["SmooshNoRecentSuccess"])
    assert selected_names(exprs["SmooshQueueGrowing"]) == {"smoosh_waiting_jobs"}


@pytest.mark.parametrize(("expr", "problem"), [
    ("rate(smoosh_evicted_total[1h]", "not PromQL: unclosed left parenthesis"),
    ("sum(smoosh_waiting_jobs))", "not PromQL: unexpected right parenthesis ')'"),
    ('smoosh_waiting_jobs{channel="ratio_dbs"', "not PromQL"),
    ("rate(smoosh_evicted_total)", "not PromQL: expected type matrix"),
    ("rate(smoosh_compaction_duration_seconds[5m])", "smoosh_compaction_duration_seconds: no such series"),
    ("smoosh_compactions > 0", "smoosh_compactions: no such series"),
    ("smoosh_reclaimed_bytes > 0", "smoosh_reclaimed_bytes: no such series"),
    ('smoosh_waiting_jobs{result="ok"}', "smoosh_waiting_jobs: no label 'result'"),
    ('smoosh_compactions_total{result="exploded"}', "no series with result='exploded'"),
    ('smoosh_compacted_bytes_total{phase=~"during|while"}', "no series with phase=~'during|while'"),
    ("sum by (database) (smoosh_waiting_jobs)", "label 'database' is on no series beneath it"),
    ("smoosh_waiting_jobs > on (result) smoosh_active_jobs", "label 'result' is on no series beneath it"),
])
def test_the_checker_refuses_what_prometheus_or_the_scrape_would(scraped: Scrape, expr: str, problem: str) -> None:
    found = problems(expr, scraped)
    assert any(problem in p for p in found), found


def test_the_dashboard_is_a_grafana_dashboard_with_a_prometheus_source() -> None:
    dashboard = json.loads(DASHBOARD_PATH.read_text())
    assert dashboard["title"] == "smoosh" and dashboard["uid"] == "smoosh"
    assert isinstance(dashboard["schemaVersion"], int)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]) and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]


def test_every_dashboard_query_is_promql_over_series_a_real_scrape_exposes(scraped: Scrape) -> None:
    found = {(title, expr): problems(grafana_expr(expr), scraped) for title, expr in dashboard_targets()}
    assert {key: p for key, p in found.items() if p} == {}
    # The instance picker lists the daemons by a series every daemon has.
    instance = {v["name"]: v for v in json.loads(DASHBOARD_PATH.read_text())["templating"]["list"]}["instance"]
    metric, label = re.fullmatch(r"label_values\((\w+), (\w+)\)", instance["definition"]).groups()
    assert scraped.has(metric) and label in TARGET_LABELS


def test_the_dashboard_shows_reclaimed_bytes_queues_durations_and_failures() -> None:
    shown = {name for _, expr in dashboard_targets() for name in selected_names(grafana_expr(expr))}
    assert {
        "smoosh_reclaimed_bytes_total", "smoosh_waiting_jobs", "smoosh_active_jobs", "smoosh_crashing_jobs",
        "smoosh_compaction_duration_seconds_bucket", "smoosh_compactions_total", "smoosh_compacted_bytes_total",
        "smoosh_last_success_timestamp_seconds",
    } <= shown
    failures = [expr for _, expr in dashboard_targets() if "smoosh_compactions_total" in expr and "failed" in expr]
    assert failures


def test_every_smoosh_metric_a_scrape_exposes_is_declared_with_its_labels(scraped: Scrape) -> None:
    # The metrics reference is generated from the declarations: a scrape must show nothing else.
    from smoosh.daemon.api.metrics import METRICS

    declared = {m.name: set(m.labels) for m in METRICS}
    exposed: dict[str, set[str]] = {}
    for name, labels in scraped.labels.items():
        if name.startswith("smoosh_"):
            base = re.sub(r"_(bucket|sum|count)$", "", name) if name not in declared else name
            exposed.setdefault(base, set()).update(labels - {"le"})
    assert exposed == declared
    assert all(m.doc.strip() and m.kind in ("gauge", "counter", "histogram") for m in METRICS)
