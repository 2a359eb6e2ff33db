"""The job store's health, visible (issues 25 and 28): one WARNING when the store becomes unreachable
or full and one when it is back (with how long it lasted), a ``store`` state in ``/status``, the
gauge ``smoosh_store_state``, and the keys it holds back saying so in ``/jobs``.

A real server over the seeded fault-injecting store (``faulty:``) around ``memory:``: switched on
at rate 1, every write commit fails with one of FoundationDB's errors, as a cluster that does
not answer; switched off, the store is back. The full disk is tests/faults/test_store_full.py.
"""

from __future__ import annotations

import errno
import logging
import re
import sqlite3
from pathlib import Path
from typing import Iterator

import pytest

from compactor.dbfactory import make_bloated_db
from helpers.clocks import FakeClock
from helpers.daemon import wait_for
from helpers.jobs_table import record_of
from server.test_server import make_config
from smoosh import Server
from smoosh.daemon.api.metrics import render
from smoosh.daemon.control.store_health import FULL, OK, UNREACHABLE, StoreHealth, classify
from smoosh.daemon.record.status import STATUS_INTERVAL_S
from smoosh.jobs import NotFound
from smoosh.store import StoreError, StoreUnavailable, open_store
from smoosh.store.faulty import FaultyStore

RATIO = "ratio_dbs"
HEALTH_LOGGER = "smoosh.daemon.control.store_health"
#: Real seconds a test waits for what the server's threads do before it fails.
SETTLE_S = 30.0


@pytest.fixture
def faulty() -> Iterator[FaultyStore]:
    store = FaultyStore(open_store("memory:"), seed=25, rate=1.0, read_rate=0.0, max_retry_delay_s=0.001)
    store.enabled = False  # healthy until the test says
    yield store
    store.close()


def store_state(server: Server) -> dict:
    return server.status()["store"]


def metric(server: Server, state: str) -> float:
    text = render(server)[0].decode()
    found = re.search(rf'^smoosh_store_state\{{state="{state}"\}} (\S+)$', text, re.M)
    assert found, text
    return float(found.group(1))


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_an_unreachable_store_is_said_once_shown_counted_and_holds_new_work_until_it_is_back(
    tmp_path: Path, dbs: Path, faulty: FaultyStore, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    server = Server(make_config(tmp_path), store=faulty, workers=1, clock=clock, watch_config=False)
    server.start()
    try:
        assert store_state(server) == {"state": OK, "since": clock(), "error": None}
        assert metric(server, OK) == 1.0
        caplog.set_level(logging.DEBUG)
        caplog.clear()
        # When the store stops taking writes, the next status record (due every 5 s) finds it out
        faulty.enabled = True
        clock.advance(STATUS_INTERVAL_S)
        server.tick(clock())
        wait_for(lambda: store_state(server)["state"] == UNREACHABLE, SETTLE_S, what="the store found unreachable")
        # Then: one WARNING, a state in /status, the gauge
        state = store_state(server)
        assert re.fullmatch(r".+ \(10\d\d\)", state["error"]), state
        assert state["since"] == clock()
        assert warnings(caplog) == [
            f"job store {faulty.url} is unreachable: {state['error']}; new compactions wait until it answers"]
        assert (metric(server, OK), metric(server, FULL), metric(server, UNREACHABLE)) == (0.0, 0.0, 1.0)
        # ... and a key queued meanwhile waits in its channel, saying why in /jobs
        key = str(dbs / "x.db")
        make_bloated_db(key, rows=400)
        server.enqueue(key)
        wait_for(lambda: server.status()["channels"][RATIO]["waiting"]["size"] == 1, SETTLE_S, what="the key queued")
        channel = server.status()["channels"][RATIO]
        assert (channel["active"], channel["starting"]) == (0, 0)
        row = record_of(server, key)
        assert row["state"] == "pending"
        # (the store's latest words: each failure while it is unreachable says it anew)
        assert re.fullmatch(r"the job store is unreachable \(.+ \(10\d\d\)\); compactions start when it is back",
                            row["last_error"]), row
        # When the store answers again, the next status record finds it out: one more WARNING
        faulty.enabled = False
        clock.advance(STATUS_INTERVAL_S)
        server.tick(clock())
        wait_for(lambda: store_state(server)["state"] == OK, SETTLE_S, what="the store back")
        assert store_state(server) == {"state": OK, "since": clock(), "error": None}
        back = warnings(caplog)[1:]
        assert len(back) == 1 and re.fullmatch(
            rf"job store {re.escape(faulty.url)} is ok again; it was unreachable for \d+\.\d s"
            r"(; \d+ failed store operation\(s\) meanwhile were not logged one by one)?", back[0]), back
        assert metric(server, OK) == 1.0
        # ... and the key waiting for it is compacted
        wait_for(lambda: record_of(server, key).get("state") == "finished", SETTLE_S, what="the compaction")
        assert len(warnings(caplog)) == 2
    finally:
        server.stop()


# ---------------------------------------------------------------- the state machine itself


class Monotonic:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_transaction_with_no_answer_makes_the_store_unreachable_from_when_it_began(
    caplog: pytest.LogCaptureFixture,
) -> None:
    wall, mono, woken = FakeClock(), Monotonic(), []
    health = StoreHealth("fdb:", clock=wall, monotonic=mono, wake_channel=woken.append, stall_s=10.0)
    caplog.set_level(logging.WARNING, logger=HEALTH_LOGGER)
    token = health.began()
    mono.now += 9.9
    health.check()
    assert health.state == OK and health.admits(RATIO)
    mono.now += 0.1
    wall.advance(10)
    health.check()
    assert health.snapshot() == {"state": UNREACHABLE, "since": wall() - 10, "error": "no answer from the store for 10 s"}
    assert not health.admits(RATIO) and not health.admits(RATIO)  # in line once
    assert health.holding() == ("the job store is unreachable (no answer from the store for 10 s); "
                                "compactions start when it is back")
    # A read that answers proves nothing of writes; the stalled write that commits does.
    mono.now += 15.0
    health.ended(token)
    assert health.state == UNREACHABLE
    health.wrote()
    assert health.state == OK and woken == [RATIO]
    assert caplog.messages == [
        "job store fdb: is unreachable: no answer from the store for 10 s; new compactions wait until it answers",
        "job store fdb: is ok again; it was unreachable for 25.0 s",
    ]


def test_a_full_store_is_full_at_its_first_failed_attempt_and_a_later_timeout_does_not_make_it_unreachable() -> None:
    health = StoreHealth("sqlite:/srv/jobs.db")
    full = StoreError(1021, "SQLite COMMIT failed: database or disk is full")
    health.attempt_failed(StoreError(1020))  # a conflict retried: nothing to say
    assert health.state == OK
    health.attempt_failed(full)
    assert health.snapshot()["state"] == FULL
    assert health.snapshot()["error"] == str(full)
    health.closing()  # what the last transactions of a stopping daemon meet is not reported
    health.failed(StoreError(1031))
    assert health.state == FULL


@pytest.mark.parametrize(("error", "state"), [
    (StoreError(1021, "SQLite COMMIT failed: database or disk is full"), FULL),
    (sqlite3.OperationalError("database or disk is full"), FULL),
    (OSError(errno.ENOSPC, "No space left on device"), FULL),
    (StoreError(1031), UNREACHABLE),
    (StoreError(1020), UNREACHABLE),
    (StoreError(1038, "SQLite store is locked: database is locked"), UNREACHABLE),
    (sqlite3.OperationalError("unable to open database file"), UNREACHABLE),
    (sqlite3.DatabaseError("file is not a database"), UNREACHABLE),
    (StoreUnavailable("cannot open FoundationDB cluster"), UNREACHABLE),
    (StoreError(2101), None),
    (StoreError(1025), None),
    (sqlite3.ProgrammingError("Cannot operate on a closed database."), None),
    (NotFound("no job"), None),
    (ValueError("a bug"), None),
])
def test_what_an_error_says_of_the_store(error: BaseException, state: str | None) -> None:
    assert classify(error) == state
