"""No silent starvation: a database its application keeps locked is shown starved after busy_retries busy results.

The busy results are real: an application in a child process holds the write lock
(``BEGIN IMMEDIATE``) on a bloated database, and every VACUUM smoosh tries gives up after its
busy timeout. The 60 s between retries pass on an injected clock, stepped by the test.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from compactor.dbfactory import make_bloated_db
from helpers.clocks import FakeClock
from helpers.daemon import HANG_S, wait_for
from helpers.jobs_table import record_of
from helpers.locks import ChildConnection
from server.test_server import make_config
from smoosh.daemon.history import BUSY_RETRY_S
from smoosh.daemon.api.metrics import SmooshCollector


def _starved_metric(server: Any, channel: str) -> float:
    # The collector itself, not render(): render keeps a registry per server for the process.
    (family,) = [m for m in SmooshCollector(server).collect() if m.name == "smoosh_starved_jobs"]
    (value,) = [s.value for s in family.samples if s.labels == {"channel": channel}]
    return float(value)


def test_a_database_busy_more_than_busy_retries_times_in_a_row_is_starved_until_it_compacts(
    tmp_path: Path, running: Any, dbs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = dbs / "tenant.db"
    key = str(db)
    make_bloated_db(key, rows=3000, delete_fraction=0.9, journal_mode="delete")
    clock = FakeClock()
    config = make_config(tmp_path, extra="busy_retries = 2", channels="[smoosh.sqlite]\nbusy_timeout = 50ms\n")
    server = running(config, workers=1, clock=clock)
    # Every channel has the gauge at 0 from the start
    assert {name: _starved_metric(server, name) for name in server.status()["channels"]} == {
        "upgrade_dbs": 0.0, "ratio_dbs": 0.0, "slack_dbs": 0.0, "index_cleanup": 0.0}

    with ChildConnection(db) as app, caplog.at_level(logging.INFO, logger="smoosh.daemon.record.outcomes"):
        app.execute("BEGIN IMMEDIATE")  # the application holds the write lock and never lets go
        server.enqueue(key)
        states = []
        for attempt in range(1, 5):
            if attempt > 1:
                clock.advance(BUSY_RETRY_S + 1)
                server.tick(clock())
            wait_for(lambda: record_of(server, key).get("busy_count") == attempt and record_of(server, key).get("retry_at"),
                     HANG_S, what=f"busy result {attempt}")
            states.append(record_of(server, key)["state"])

        # Then busy twice is still pending; the third and fourth busy results in a row are starved
        assert states == ["pending", "pending", "starved", "starved"]
        job = record_of(server, key)
        assert (job["error_count"], job["starved_since"]) == (0, job["history"][0]["at"] - (BUSY_RETRY_S + 1))  # since the third
        assert server.status()["channels"]["ratio_dbs"]["starved"] == 1
        assert _starved_metric(server, "ratio_dbs") == 1.0
        # And one WARNING line, when it became starved, with the advice
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warnings == [
            f"{key!r} in ratio_dbs was busy 3 times in a row and is starved: its application never leaves it idle "
            "long enough to compact: give channel ratio_dbs a window when the application is idle (from/to), or set "
            "auto_vacuum = INCREMENTAL on the database so it is compacted in short chunks beside the writer; "
            "retrying in 60 s"
        ]
        app.execute("ROLLBACK")

    # When the application lets go, the next retry compacts it and the starvation ends
    clock.advance(BUSY_RETRY_S + 1)
    server.tick(clock())
    wait_for(lambda: record_of(server, key).get("state") == "finished", HANG_S, what="the compaction once the lock is gone")
    assert record_of(server, key)["busy_count"] == 0
    assert server.status()["channels"]["ratio_dbs"]["starved"] == 0
    assert _starved_metric(server, "ratio_dbs") == 0.0
