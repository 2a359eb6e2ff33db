"""GET /metrics: Prometheus text with the names and labels of DESIGN §4.2, never a per-database label."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

from opslib import PausedDaemon, request
from prometheus_client.parser import text_string_to_metric_families

from compactor.dbfactory import make_bloated_db
from helpers.daemon import Daemon, free_port, wait_for, write_config

CHANNELS = {"upgrade_dbs", "ratio_dbs", "slack_dbs", "index_cleanup"}
PER_CHANNEL = ("smoosh_active_jobs", "smoosh_starting_jobs", "smoosh_waiting_jobs", "smoosh_reclaimable_bytes")


def scrape(url: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """{sample name: {sorted label items: value}} of one real scrape."""
    reply = request(url + "/metrics")
    assert reply.status == 200
    assert reply.headers["Content-Type"].startswith("text/plain; version=")
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(reply.body.decode()):
        for s in family.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return samples


def by_label(samples: dict[tuple[tuple[str, str], ...], float], label: str) -> dict[str, float]:
    return {dict(labels)[label]: value for labels, value in samples.items()}


def test_metrics_carry_the_pinned_names_and_labels(paused: PausedDaemon) -> None:
    m = scrape(paused.url)
    assert m["smoosh_channel_count"] == {(): 4.0}
    for name in PER_CHANNEL:
        assert set(by_label(m[name], "channel")) == CHANNELS, name
    assert set(by_label(m["smoosh_evicted_total"], "channel")) == CHANNELS
    waiting = by_label(m["smoosh_waiting_jobs"], "channel")
    assert waiting["ratio_dbs"] == 3.0
    assert by_label(m["smoosh_reclaimable_bytes"], "channel")["ratio_dbs"] > 0
    assert m["smoosh_node_reclaimable_bytes"][()] == sum(m["smoosh_reclaimable_bytes"].values())
    enqueues = by_label(m["smoosh_enqueue_total"], "outcome")
    assert set(enqueues) == {"stale", "examined", "accepted", "rejected"}
    assert enqueues["accepted"] >= 1 and enqueues["examined"] >= enqueues["accepted"]
    # Never labelled by database: the only label names are channel, result and outcome.
    label_names = {k for samples in m.values() for labels in samples for k, _ in labels}
    assert label_names <= {"channel", "result", "outcome"}


def test_every_result_of_every_channel_exists_at_zero_from_start(paused: PausedDaemon) -> None:
    # Given a daemon that has compacted nothing yet
    m = scrape(paused.url)
    # Then every channel has every result of the one vocabulary, at 0
    results = ("ok", "failed", "busy", "gone", "interrupted", "replaced", "blocked")
    expected = {(("channel", c), ("result", r)): 0.0 for c in CHANNELS for r in results}
    assert m["smoosh_compactions_total"] == expected


def test_rejected_enqueues_are_counted(paused: PausedDaemon) -> None:
    before = by_label(scrape(paused.url)["smoosh_enqueue_total"], "outcome")["rejected"]
    reply = request(paused.url + "/enqueue", "POST", {"keys": ["relative.db", "/elsewhere/x.db"]})
    assert reply.status == 202 and reply.json()["accepted"] == 0
    after = by_label(scrape(paused.url)["smoosh_enqueue_total"], "outcome")["rejected"]
    assert after == before + 2


def test_a_finished_compaction_counts_its_result_and_reclaimed_bytes(tmp_path: Path, daemons: list[Daemon]) -> None:
    d = Daemon(write_config(tmp_path, port=free_port()))
    daemons.append(d)
    d.wait_ready()
    db = tmp_path / "dbs" / "tenant.db"
    make_bloated_db(str(db), rows=3000, delete_fraction=0.9)
    before = db.stat().st_size

    def counted() -> Any:
        m = scrape(d.url)
        return m if any(m.get("smoosh_compactions_total", {}).values()) else None

    m = wait_for(counted, 30, what="a compaction in /metrics", daemon=d)
    nonzero = {labels: n for labels, n in m["smoosh_compactions_total"].items() if n}
    assert nonzero == {(("channel", "ratio_dbs"), ("result", "ok")): 1.0}
    reclaimed = by_label(m["smoosh_reclaimed_bytes_total"], "channel")
    assert set(reclaimed) == {"ratio_dbs"}
    assert reclaimed["ratio_dbs"] >= (before - db.stat().st_size) * 0.9 > 0
    assert d.stop() == 0


def test_two_servers_in_one_process_have_private_registries(tmp_path: Path) -> None:
    from smoosh.config import load_config
    from smoosh.daemon.metrics import _registries, render
    from smoosh.daemon.server import Server

    servers = []
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        config = write_config(tmp_path / name, port=0, extra_global=f"node = {name}\nwatch =")
        servers.append(Server(load_config(str(config)), workers=0, watch_config=False))
    for s in servers:
        s.start()
    try:
        s1, s2 = servers
        s1.counters.compactions[("ratio_dbs", "ok")] = 5
        body1, content_type = render(s1)
        body2, _ = render(s2)
        assert content_type.startswith("text/plain")
        assert b'smoosh_compactions_total{channel="ratio_dbs",result="ok"} 5.0' in body1
        assert b'smoosh_compactions_total{channel="ratio_dbs",result="ok"} 0.0' in body2
    finally:
        for s in servers:
            s.stop()
    count = len(_registries)
    del servers, s1, s2, s
    gc.collect()
    assert len(_registries) == count - 2  # a stopped, dropped server is not kept alive by its registry
