"""GET /metrics: Prometheus text with the names and labels of DESIGN §4.2, never a per-database label."""

from __future__ import annotations

import gc
import platform
import time
from pathlib import Path
from typing import Any

from opslib import PausedDaemon, request, smoosh_cli
from prometheus_client.parser import text_string_to_metric_families

from compactor.dbfactory import make_bloated_db
from helpers.daemon import HANG_S, Daemon, free_port, wait_for, write_config

CHANNELS = {"upgrade_dbs", "ratio_dbs", "slack_dbs", "index_cleanup"}
RESULTS = ("ok", "failed", "busy", "gone", "interrupted", "replaced", "blocked")
#: The duration histogram's bounds: from 10 ms to 3 hours.
BUCKETS = ("0.01", "0.05", "0.25", "1.0", "5.0", "15.0", "60.0", "300.0", "900.0", "3600.0", "10800.0", "+Inf")
PER_CHANNEL = ("smoosh_active_jobs", "smoosh_starting_jobs", "smoosh_waiting_jobs", "smoosh_deferred_jobs",
               "smoosh_reclaimable_bytes")


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
    assert m["smoosh_channels"] == {(): 4.0}
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
    # Never labelled by database: the only label names of smoosh's series are these.
    label_names = {k for name, samples in m.items() if name.startswith("smoosh_") for labels in samples for k, _ in labels}
    # (reason: the admin API's shed connections; state: the job store's; root: a file system under the
    # roots; lock: whether a look at a database took a SQLite lock)
    assert label_names == {"channel", "result", "outcome", "phase", "le", "version", "reason", "state", "root", "lock"}


def test_every_series_of_every_channel_exists_at_zero_from_start(paused: PausedDaemon) -> None:
    # Given a daemon that has compacted nothing yet
    m = scrape(paused.url)
    # Then every channel has every result of the one vocabulary, at 0: counts and durations
    pairs = {(("channel", c), ("result", r)): 0.0 for c in CHANNELS for r in RESULTS}
    assert m["smoosh_compactions_total"] == pairs
    assert m["smoosh_compaction_duration_seconds_count"] == pairs
    assert m["smoosh_compaction_duration_seconds_sum"] == pairs
    assert m["smoosh_compaction_duration_seconds_bucket"] == {
        tuple(sorted((*pair, ("le", le)))): 0.0 for pair in pairs for le in BUCKETS
    }
    # and its bytes before and after, reclaimed bytes, last success and crashing keys
    assert m["smoosh_compacted_bytes_total"] == {
        (("channel", c), ("phase", phase)): 0.0 for c in CHANNELS for phase in ("before", "after")
    }
    per_channel = {(("channel", c),): 0.0 for c in CHANNELS}
    assert m["smoosh_reclaimed_bytes_total"] == per_channel
    assert m["smoosh_last_success_timestamp_seconds"] == per_channel
    assert m["smoosh_crashing_jobs"] == per_channel


def test_the_build_and_the_process_are_described(paused: PausedDaemon) -> None:
    m = scrape(paused.url)
    # The version `smoosh --version` prints
    version = smoosh_cli("--version").stdout.split()[1]
    assert m["smoosh_build_info"] == {(("version", version),): 1.0}
    # The default process collector: this daemon's start, memory and files, from /proc
    started = m["process_start_time_seconds"][()]
    assert time.time() - 3600 < started <= time.time()
    assert m["process_resident_memory_bytes"][()] > 0
    assert m["process_open_fds"][()] > 0
    assert m["process_cpu_seconds_total"][()] > 0
    (python,) = m["python_info"]
    assert dict(python)["implementation"] == platform.python_implementation()


def test_rejected_enqueues_are_counted(paused: PausedDaemon) -> None:
    before = by_label(scrape(paused.url)["smoosh_enqueue_total"], "outcome")["rejected"]
    reply = request(paused.url + "/enqueue", "POST", {"keys": ["relative.db", "/elsewhere/x.db"]})
    assert reply.status == 202 and reply.json()["accepted"] == 0
    after = by_label(scrape(paused.url)["smoosh_enqueue_total"], "outcome")["rejected"]
    assert after == before + 2


def footprint(db: Path) -> int:
    """A database's bytes as the compactor measures them: the file and its WAL."""
    wal = Path(f"{db}-wal")
    return db.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


def test_a_finished_compaction_counts_its_result_duration_and_bytes(tmp_path: Path, daemons: list[Daemon]) -> None:
    # Given a daemon, and a bloated database measured before it appears in the watched directory
    d = Daemon(write_config(tmp_path, port=free_port()))
    daemons.append(d)
    d.wait_ready()
    outside = tmp_path / "tenant.db"
    make_bloated_db(str(outside), rows=3000, delete_fraction=0.9)
    before = footprint(outside)
    db = tmp_path / "dbs" / "tenant.db"
    started = time.time()
    outside.rename(db)

    # When the daemon compacts it
    def counted() -> Any:
        m = scrape(d.url)
        return m if any(m.get("smoosh_compactions_total", {}).values()) else None

    m = wait_for(counted, HANG_S, what="a compaction in /metrics", daemon=d)
    jobs = {j["key"]: j for j in d.get("/jobs")["jobs"]}
    after = footprint(db)
    # Then one successful compaction of ratio_dbs is counted, with its duration
    nonzero = {labels: n for labels, n in m["smoosh_compactions_total"].items() if n}
    ok = (("channel", "ratio_dbs"), ("result", "ok"))
    assert nonzero == {ok: 1.0}
    assert {labels: n for labels, n in m["smoosh_compaction_duration_seconds_count"].items() if n} == {ok: 1.0}
    assert 0 < m["smoosh_compaction_duration_seconds_sum"][ok] < time.time() - started
    assert m["smoosh_compaction_duration_seconds_bucket"][tuple(sorted((*ok, ("le", "+Inf"))))] == 1.0
    # and its bytes are the file's sizes before and after, their difference what it reclaimed
    compacted = m["smoosh_compacted_bytes_total"]
    assert compacted[(("channel", "ratio_dbs"), ("phase", "before"))] == before
    assert compacted[(("channel", "ratio_dbs"), ("phase", "after"))] == after < before
    assert by_label(m["smoosh_reclaimed_bytes_total"], "channel") == {
        "ratio_dbs": before - after, "upgrade_dbs": 0, "slack_dbs": 0, "index_cleanup": 0}
    (finished,) = [e for e in jobs[str(db)]["history"] if e["event"] == "finished"]
    assert finished["reason"] == f"reclaimed {before - after} bytes"
    # and its time is the channel's last success
    last_success = by_label(m["smoosh_last_success_timestamp_seconds"], "channel")
    assert started <= last_success["ratio_dbs"] <= time.time()
    assert last_success["slack_dbs"] == 0
    assert d.stop() == 0


def test_two_servers_in_one_process_have_private_registries(tmp_path: Path) -> None:
    from channels.ports import Outcome
    from smoosh.config import load_config
    from smoosh.daemon.api.metrics import _registries, render
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
        for _ in range(5):
            s1.counters.count("ratio_dbs", Outcome("ok", size_before_bytes=10, size_after_bytes=4), 1.0)
        body1, content_type = render(s1)
        body2, _ = render(s2)
        assert content_type.startswith("text/plain")
        assert b'smoosh_compactions_total{channel="ratio_dbs",result="ok"} 5.0' in body1
        assert b'smoosh_compactions_total{channel="ratio_dbs",result="ok"} 0.0' in body2
    finally:
        for s in servers:
            s.stop()
    gc.collect()  # registries of servers other tests dropped go first: only these two are counted
    count = len(_registries)
    del servers, s1, s2, s
    gc.collect()
    assert len(_registries) == count - 2  # a stopped, dropped server is not kept alive by its registry
