"""A live change of an upgrade target reaches every database (issue 30): one compacted within
``exact_size_interval`` (or accepted within ``staleness``) too, through the rescan a reload makes
and through ``enqueue``; and ``explain`` shows an upgrade channel only the thresholds that apply.

Before, the exact-size memory ("compacted lately, not grown since") kept such a database from
every channel, the upgrade channel included, for up to an hour, and the rescan dropped it as stale.

A real server in process, real SQLite files, the real inotify observer and scan, the daemon's
own worker.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from compactor.dbfactory import db_stats, make_bloated_db
from helpers.clocks import FakeClock
from helpers.daemon import wait_for
from helpers.jobs_table import record_of
from server.test_server import make_config
from smoosh.cli.format import format_explain
from smoosh.config import parse_config

#: Ceiling on compactions, scans and examinations (only bounds a hang).
SETTLE_S = 30.0
#: SQLite's auto_vacuum pragma for INCREMENTAL.
INCREMENTAL = 2


def with_auto_vacuum(tmp_path: Path, extra: str) -> Any:
    """The same config as make_config(tmp_path, extra), with [smoosh.sqlite] auto_vacuum = incremental."""
    base = make_config(tmp_path, extra=extra)
    text = Path(base.path).read_text() + "\n[smoosh.sqlite]\nauto_vacuum = incremental\n"
    return parse_config(text, base.path)


def compacted_once(server: Any, key: str) -> None:
    wait_for(lambda: record_of(server, key).get("state") == "finished", SETTLE_S, what="the first compaction")
    assert record_of(server, key)["channel"] == "ratio_dbs"
    assert db_stats(key)["auto_vacuum"] == 0


def test_an_enqueue_after_a_target_change_upgrades_a_database_compacted_lately(
    tmp_path: Path, running: Any, dbs: Path
) -> None:
    # Given a database just compacted by the ratio channel (within exact_size_interval, and fresh)
    key = str(dbs.resolve() / "tenant.db")
    make_bloated_db(key, rows=3000, delete_fraction=0.9)
    server = running(make_config(tmp_path, extra="staleness = 5m"), workers=1)
    server.enqueue(key)
    compacted_once(server, key)
    (before,) = server.enqueue_and_wait([key])
    assert before.outcome == "not_queued"
    # When [smoosh.sqlite] auto_vacuum is changed live, and the database is enqueued
    server.apply_config(with_auto_vacuum(tmp_path, "staleness = 5m"))
    (verdict,) = server.enqueue_and_wait([key])
    # Then the upgrade channel takes it, whatever the exact-size memory says, and upgrades it
    assert (verdict.outcome, verdict.channel) == ("queued", "upgrade_dbs")
    wait_for(lambda: db_stats(key)["auto_vacuum"] == INCREMENTAL, SETTLE_S, what="the upgrade")


def test_the_rescan_of_a_reload_that_changes_a_target_reaches_a_database_compacted_lately(
    tmp_path: Path, running: Any, dbs: Path
) -> None:
    # Given a watched database compacted by the ratio channel a moment ago
    key = str(dbs.resolve() / "tenant.db")
    make_bloated_db(key, rows=3000, delete_fraction=0.9)
    clock = FakeClock()
    extra = f"watch = {dbs}\nstaleness = 5m"
    server = running(make_config(tmp_path, extra=extra), workers=1, clock=clock)
    wait_for(lambda: server.status()["scan"]["scans_completed"] >= 1, SETTLE_S, what="the start-up scan")
    clock.advance(5)  # the new file's events fall quiet
    server.tick(clock())
    compacted_once(server, key)
    # When the config changes its auto_vacuum target (no one touches the database)
    scans = server.status()["scan"]["scans_completed"]
    server.apply_config(with_auto_vacuum(tmp_path, extra))
    wait_for(lambda: server.status()["scan"]["scans_completed"] > scans, SETTLE_S, what="the reload's rescan")
    clock.advance(5)  # whatever the scan found still settling falls quiet
    server.tick(clock())
    # Then the reload's full rescan reaches it and the upgrade channel upgrades it
    wait_for(lambda: db_stats(key)["auto_vacuum"] == INCREMENTAL, SETTLE_S, what="the upgrade after the rescan")
    assert record_of(server, key)["channel"] == "upgrade_dbs"


def test_explain_shows_an_upgrade_channel_only_the_thresholds_that_apply(
    tmp_path: Path, running: Any, dbs: Path
) -> None:
    key = str(dbs.resolve() / "tenant.db")
    make_bloated_db(key, rows=500, delete_fraction=0.5)
    server = running(with_auto_vacuum(tmp_path, ""), workers=0)
    answer = server.explain(key)
    assert answer["channels"]["upgrade_dbs"]["thresholds"] == {"priority": "upgrade", "min_changes": 0, "match": []}
    assert answer["channels"]["upgrade_dbs"]["priority"] == 1
    assert set(answer["channels"]["ratio_dbs"]["thresholds"]) == {
        "priority", "min_priority", "max_priority", "min_size", "max_size", "min_changes", "match"}
    assert ("    thresholds: upgrade (priority 1 while the file's page_size or auto_vacuum differs from [smoosh.sqlite], "
            "else 0, whatever its size), min_changes 0") in format_explain(answer).splitlines()

