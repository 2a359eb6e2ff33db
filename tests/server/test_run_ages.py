"""Each compaction in flight shows its age and its time since progress, in /status and /metrics
(issue 45: the safety net an operator sees; a run that makes no progress raises an alert).

A real server in process, a real bloated SQLite file compacted by the real compactor, held at a
gate inside its compaction; time passes on an injected clock.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from compactor.dbfactory import make_bloated_db
from helpers.clocks import SteppedClocks
from helpers.daemon import HANG_S, wait_for
from helpers.jobs_table import record_of
from helpers.run_gates import GatedCompactor
from server.test_server import make_config
from smoosh.compactors import load_compactors
from smoosh.daemon.api.metrics import SmooshCollector

CHANNELS = ("upgrade_dbs", "ratio_dbs", "slack_dbs", "index_cleanup")


def metric(server: Any, name: str) -> dict[str, float]:
    """``name`` per channel, from the collector itself (render() keeps a registry per server)."""
    (family,) = [m for m in SmooshCollector(server).collect() if m.name == name]
    return {s.labels["channel"]: float(s.value) for s in family.samples}


def start(tmp_path: Path, running: Any, clocks: SteppedClocks) -> tuple[Any, GatedCompactor]:
    config = make_config(tmp_path)
    gated = GatedCompactor(load_compactors(config.sqlite, roots=config.roots)[0])
    return running(config, workers=1, clock=clocks, compactors=[gated]), gated


def test_every_channel_shows_no_run_and_ages_at_zero_from_start(tmp_path: Path, running: Any) -> None:
    server, _ = start(tmp_path, running, SteppedClocks())
    for name, entry in server.status()["channels"].items():
        assert (entry["runs"], entry["oldest_run_s"], entry["since_progress_s"]) == ([], 0.0, 0.0), name
    assert metric(server, "smoosh_running_seconds") == dict.fromkeys(CHANNELS, 0.0)
    assert metric(server, "smoosh_running_since_progress_seconds") == dict.fromkeys(CHANNELS, 0.0)


def test_a_running_compaction_shows_its_age_and_its_time_since_progress(
    tmp_path: Path, running: Any, dbs: Path,
) -> None:
    clocks = SteppedClocks()
    server, gated = start(tmp_path, running, clocks)
    key = str(dbs.resolve() / "tenant.db")
    make_bloated_db(key, rows=2000, delete_fraction=0.9)
    gate = gated.hold(key)
    started_at = clocks.wall()
    server.enqueue(key)
    gate.wait_entered()
    wait_for(lambda: [r["state"] for r in server.status()["channels"]["ratio_dbs"]["runs"]] == ["running"], HANG_S,
             what="the worker's news that it runs heard")

    # Given its compaction has run 100 s without a word of progress
    clocks.advance(100)
    (run,) = server.status()["channels"]["ratio_dbs"]["runs"]
    assert run == {"key": key, "state": "running", "started_at": started_at, "age_s": 100.0, "progress": 0.0,
                   "progress_at": None, "since_progress_s": 100.0}
    entry = server.status()["channels"]["ratio_dbs"]
    assert (entry["oldest_run_s"], entry["since_progress_s"]) == (100.0, 100.0)
    assert metric(server, "smoosh_running_seconds")["ratio_dbs"] == 100.0
    assert metric(server, "smoosh_running_since_progress_seconds")["ratio_dbs"] == 100.0
    assert metric(server, "smoosh_running_seconds")["slack_dbs"] == 0.0

    # When it reports progress, and 30 s more pass
    gate.ctx.progress(0.25)
    progressed_at = clocks.wall()
    clocks.advance(30)
    (run,) = server.status()["channels"]["ratio_dbs"]["runs"]
    # Then its age goes on and its time since progress counts from the progress
    assert (run["age_s"], run["progress"], run["progress_at"], run["since_progress_s"]) == (
        130.0, 0.25, progressed_at, 30.0)
    assert metric(server, "smoosh_running_since_progress_seconds")["ratio_dbs"] == 30.0

    # And once it ends, nothing shows in flight
    gate.release()
    wait_for(lambda: record_of(server, key).get("state") == "finished", HANG_S, what="the compaction")
    wait_for(lambda: server.status()["channels"]["ratio_dbs"]["runs"] == [], HANG_S, what="the run gone from /status")
    assert metric(server, "smoosh_running_seconds")["ratio_dbs"] == 0.0
    assert metric(server, "smoosh_running_since_progress_seconds")["ratio_dbs"] == 0.0
