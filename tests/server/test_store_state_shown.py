"""`smoosh status` says when the job store is not ok: a line under the table and a part of systemd's
STATUS= line, from the ``store`` field of ``/status`` (while it is not ok no compaction starts, and
the table alone showed keys waiting with nothing running, for no reason it gave).

A real server over the seeded fault-injecting store (``faulty:`` around ``memory:``), as in
test_store_health.py: switched on, every write commit fails as a cluster that does not answer.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Iterator

import pytest

from helpers.clocks import FakeClock
from helpers.daemon import wait_for
from server.test_server import make_config
from smoosh import Server
from smoosh.cli.format import format_status, status_summary
from smoosh.daemon.record.status import STATUS_INTERVAL_S
from smoosh.jsonutil import jsonable
from smoosh.store import open_store
from smoosh.store.faulty import FaultyStore

#: Ceiling on the server's threads finding the store out (only bounds a hang).
SETTLE_S = 30.0


@pytest.fixture
def faulty() -> Iterator[FaultyStore]:
    store = FaultyStore(open_store("memory:"), seed=30, rate=1.0, read_rate=0.0, max_retry_delay_s=0.001)
    store.enabled = False
    yield store
    store.close()


def test_status_says_the_job_store_is_unreachable_since_when_and_why(tmp_path: Path, faulty: FaultyStore) -> None:
    clock = FakeClock()
    server = Server(make_config(tmp_path), store=faulty, workers=0, clock=clock, watch_config=False)
    server.start()
    try:
        # Given a healthy store: the table and the STATUS= line say nothing of it
        healthy = jsonable(server.status())
        assert "job store" not in format_status(healthy)
        assert status_summary(healthy) == "0 active, 0 starting, 0 waiting"
        # When the store stops answering (the next status record finds it out)
        faulty.enabled = True
        clock.advance(STATUS_INTERVAL_S)
        server.tick(clock())
        wait_for(lambda: server.status()["store"]["state"] == "unreachable", SETTLE_S, what="the store unreachable")
        body = jsonable(server.status())
        store = body["store"]
        since = datetime.datetime.fromtimestamp(store["since"]).strftime("%Y-%m-%d %H:%M:%S")
        # Then both say so: the table with the store's error, the one line without it
        assert (f"job store unreachable since {since}: {store['error']}; no compaction starts until it is back"
                in format_status(body).splitlines())
        assert status_summary(body) == f"0 active, 0 starting, 0 waiting, job store unreachable since {since}"
    finally:
        faulty.enabled = False
        server.stop()
