"""A key in crash backoff is shown apart from the keys waiting to start: in /status, the status
table, systemd's STATUS= line, /metrics, and so in the shipped alert on a backlog not draining.

One corrupt database, as an operator meets it: its compaction fails and it waits out its backoff.
Counted as waiting, it made SmooshBacklogNotDraining ("work waiting and nothing running") fire
beside SmooshCrashingJobs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
import yaml
from opslib import request, smoosh_cli
from prometheus_client.parser import text_string_to_metric_families

from compactor.dbfactory import make_corrupt_db
from helpers.daemon import Daemon, free_port, wait_for, write_config
from helpers.promtool import expr_samples
from smoosh.cli.format import status_summary

ROOT = Path(__file__).resolve().parents[2]
RULES = yaml.safe_load((ROOT / "conf" / "prometheus" / "smoosh-rules.yml").read_text())
#: Ceiling on waiting for the corrupt database's first compaction to fail (only bounds a hang).
FAILED_WITHIN_S = 60.0
#: The channel the corrupt database lands in (its pages half empty, scattered: slack, not ratio).
CHANNEL = "slack_dbs"


@pytest.fixture(scope="module")
def crashing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon one of whose databases failed to compact and now waits out an hour's backoff."""
    base = Path(tmp_path_factory.mktemp("backoff")).resolve()
    config = write_config(base, port=free_port(), extra_global=f"watch =\nroots = {base / 'dbs'}\nbackoff_base = 1h")
    daemon = Daemon(config)
    try:
        daemon.wait_ready()
        db = base / "dbs" / "corrupt.db"
        make_corrupt_db(str(db))
        assert daemon.post("/enqueue", {"keys": [str(db)]})[0] == 202
        wait_for(lambda: daemon.get("/status")["channels"][CHANNEL]["deferred"] == 1, FAILED_WITHIN_S,
                 what="the corrupt database to fail and wait out its backoff", daemon=daemon)
        yield daemon
    finally:
        daemon.kill()


def test_status_counts_a_key_in_backoff_as_deferred_not_waiting(crashing: Daemon) -> None:
    channel = crashing.get("/status")["channels"][CHANNEL]
    assert (channel["active"], channel["starting"], channel["deferred"]) == (0, 0, 1)
    assert channel["waiting"] == {"size": 0, "min": 0, "max": 0}
    (job,) = crashing.get("/jobs")["jobs"]
    assert (job["state"], job["error_count"]) == ("crashing", 1)


def test_the_table_and_the_systemd_line_show_the_key_deferred(crashing: Daemon) -> None:
    out = smoosh_cli("status", "--url", crashing.url)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    header = lines[0].split()
    assert header == ["CHANNEL", "ACTIVE", "STARTING", "WAITING", "MIN", "MAX", "DEFERRED", "WINDOW", "PAUSED",
                      "RECLAIMABLE"]
    row = dict(zip(header, next(line.split() for line in lines if line.startswith(CHANNEL))))
    assert (row["WAITING"], row["DEFERRED"]) == ("0", "1")
    assert status_summary(crashing.get("/status")) == "0 active, 0 starting, 0 waiting, 1 deferred"


def scrape(url: str) -> dict[str, dict[str, float]]:
    """{name: {channel: value}} of the per-channel gauges of one real scrape."""
    reply = request(url + "/metrics")
    assert reply.status == 200
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(reply.body.decode()):
        for s in family.samples:
            if "channel" in s.labels and set(s.labels) == {"channel"}:
                out.setdefault(s.name, {})[s.labels["channel"]] = s.value
    return out


def test_the_metrics_count_it_deferred_and_crashing_not_waiting(crashing: Daemon) -> None:
    m = scrape(crashing.url)
    assert m["smoosh_waiting_jobs"][CHANNEL] == 0
    assert m["smoosh_deferred_jobs"][CHANNEL] == 1
    assert m["smoosh_crashing_jobs"][CHANNEL] == 1


def test_the_shipped_backlog_alert_ignores_a_key_in_backoff(crashing: Daemon) -> None:
    # Given the scrape's series as Prometheus would store them (job and instance from the target)
    m = scrape(crashing.url)
    rule = next(r for g in RULES["groups"] for r in g["rules"] if r["alert"] == "SmooshBacklogNotDraining")
    series = {
        f'{name}{{channel="{channel}",instance="smoosh-1:5986",job="smoosh"}}': value
        for name, per_channel in m.items() for channel, value in per_channel.items()
    }
    # When Prometheus's own evaluation runs the rule's expression over them
    run = expr_samples(rule["expr"], series, [])
    # Then it selects no channel: the only key is waiting out its backoff, and nothing could start
    assert run.returncode == 0, run.stdout + run.stderr
