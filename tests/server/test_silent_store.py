"""A store that stops answering, as a FoundationDB cluster that is down does (issue 50).

A real server over the ``fdb:`` adapter and the stand-in for the binding (``helpers/fdb_standin.py``),
whose cluster can go silent: a client is not refused, its futures just never settle. Within
seconds the daemon logs it, ``/status`` shows it, ``smoosh_store_up`` (which the shipped alert
``SmooshStoreUnreachable`` reads) drops to 0; a database whose start waits on the silent
store is shown ``starting``, never ``active``, and is compacted once the store is back.
The time it takes to notice runs on the server's stepped clock (the stall's 10 s), never on
a sleep.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Iterator

import pytest

from compactor.dbfactory import make_bloated_db
from helpers.clocks import FakeClock
from helpers.daemon import wait_for
from helpers.fdb_standin import Binding
from helpers.jobs_table import record_of
from server.test_server import make_config
from smoosh import Server
from smoosh.daemon.api.metrics import render
from smoosh.daemon.control.store_health import OK, STALL_S, UNREACHABLE
from smoosh.daemon.record.status import STATUS_INTERVAL_S
from smoosh.store.fdb import FdbStore

RATIO = "ratio_dbs"
#: Real seconds a test waits for what the server's threads do before it fails (a hang's bound).
SETTLE_S = 30.0


@pytest.fixture
def standin() -> Iterator[Binding]:
    binding = Binding()
    yield binding
    binding.cluster.close()  # answers again: nothing stays blocked


def gauge(server: Server, name: str) -> float:
    text = render(server)[0].decode()
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    assert found, text
    return float(found.group(1))


def test_a_silent_store_is_logged_shown_and_alerted_and_a_start_waiting_on_it_is_not_shown_running(
    tmp_path: Path, dbs: Path, standin: Binding, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    store = FdbStore(None, url="fdb:stand-in", binding=standin)
    server = Server(make_config(tmp_path), store=store, workers=2, clock=clock, watch_config=False)
    server.start()
    cluster = standin.cluster
    try:
        assert server.status()["store"]["state"] == OK and gauge(server, "smoosh_store_up") == 1.0
        caplog.set_level(logging.DEBUG)
        caplog.clear()
        # When the cluster goes silent and a database is queued: its start's claim waits on it
        cluster.stop_answering()
        key = str(dbs / "tenant.db")
        make_bloated_db(key, rows=400)
        server.enqueue(key)
        wait_for(lambda: server.status()["channels"][RATIO]["runs"], SETTLE_S, what="the database's start")
        wait_for(lambda: cluster.in_flight >= 1, SETTLE_S, what="the claim waiting on the silent cluster")
        channel = server.status()["channels"][RATIO]
        # Then the table shows it starting, not running: nothing compacts it until the store answers
        assert (channel["active"], channel["starting"]) == (0, 1), channel
        assert [run["state"] for run in channel["runs"]] == ["claimed"]
        # When the status record is due, its write waits too; after the stall's 10 s the daemon says so
        clock.advance(STATUS_INTERVAL_S)
        server.tick(clock())
        clock.advance(STALL_S)
        server.tick(clock())
        wait_for(lambda: server.status()["store"]["state"] == UNREACHABLE, SETTLE_S, what="the store found silent")
        state = server.status()["store"]
        assert state["error"] == f"no answer from the store for {STALL_S + STATUS_INTERVAL_S:.0f} s"
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [
            f"job store fdb:stand-in is unreachable: {state['error']}; new compactions wait until it answers"]
        assert gauge(server, "smoosh_store_up") == 0.0
        assert (server.status()["channels"][RATIO]["active"], server.status()["channels"][RATIO]["starting"]) == (0, 1)
        # When the cluster answers again: the claim commits, the store is ok at the next record,
        # and the waiting database is compacted
        cluster.answer_again()
        wait_for(lambda: record_of(server, key).get("state") == "finished", SETTLE_S, what="the compaction")
        clock.advance(STATUS_INTERVAL_S)
        server.tick(clock())
        wait_for(lambda: server.status()["store"]["state"] == OK, SETTLE_S, what="the store back")
        assert gauge(server, "smoosh_store_up") == 1.0
        assert re.fullmatch(r"job store fdb:stand-in is ok again; it was unreachable for \d+\.\d s.*",
                            [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING][-1])
    finally:
        server.stop()
        store.close()
