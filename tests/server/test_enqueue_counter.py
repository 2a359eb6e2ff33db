"""``smoosh_enqueue_total`` counts enqueue requests, not file events: an operator's request (the
API, HTTP, the CLI) is one, and so is each key the watcher hands in after its debounce; a WAL
database's commit makes several inotify events, and counting each made 16,305 "stale" of two writes.

A real watched directory, real SQLite writes, the real inotify observer; the debounce is stepped
with an injected clock.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import apsw
import pytest

from compactor.dbfactory import make_bloated_db
from helpers.clocks import FakeClock
from helpers.daemon import wait_for
from server.test_server import make_config
from smoosh.config import parse_config
from smoosh.daemon.watch.inotify import inotify_available

#: Ceiling on the server's threads doing what the test waits for (only bounds a hang).
SETTLE_S = 30.0


def drained(server: Any) -> None:
    """Wait until the observer has dispatched every event of the writes made before this call."""
    done = threading.Event()
    assert server._housekeeping._observer.after_drain(done.set)
    assert done.wait(SETTLE_S), "the observer did not drain its queue"


@pytest.mark.skipif(not inotify_available(), reason="needs Linux inotify (the observer that can drain its queue)")
def test_writes_to_a_key_accepted_recently_count_one_stale_request_per_debounce(
    tmp_path: Path, running: Any, dbs: Path
) -> None:
    # Given a database the ratio channel accepted, fresh for 5 minutes, waiting in the channel
    # (concurrency 0: never started, so its files' events are never taken for a worker's own)
    db = dbs.resolve() / "tenant.db"
    make_bloated_db(str(db), delete_fraction=0.9)
    clock = FakeClock()
    make_config(tmp_path, extra=f"watch = {dbs}\nstaleness = 5m")
    ini = tmp_path / "smoosh.ini"
    text = ini.read_text().replace("[smoosh.ratio_dbs]\n", "[smoosh.ratio_dbs]\nconcurrency = 0\n", 1)
    server = running(parse_config(text, str(ini)), workers=0, clock=clock)
    wait_for(lambda: server.status()["scan"]["scans_completed"] >= 1, SETTLE_S, what="the start-up scan")
    clock.advance(5)
    server.tick(clock())
    wait_for(lambda: server.counters.enqueue_accepted == 1, SETTLE_S, what="the database accepted")
    stale = server.counters.enqueue_stale
    # When its application commits twice (each commit several file events: the -wal, the -shm)
    conn = apsw.Connection(str(db))
    try:
        for _ in range(2):
            conn.execute("INSERT INTO docs(key, body) VALUES ('k', randomblob(5000))")
    finally:
        conn.close()
    drained(server)
    # ... and the burst has had its debounce
    clock.advance(5)
    server.tick(clock())
    wait_for(lambda: server.intake.debouncer.next_due() is None, SETTLE_S, what="the debounce to end")
    # Then one request was counted stale: one key, however many events
    assert server.counters.enqueue_stale == stale + 1
    assert (server.counters.enqueue_examined, server.counters.enqueue_accepted) == (1, 1)
    # And an operator's request is one each, as before
    for _ in range(3):
        server.enqueue(str(db))
    assert server.counters.enqueue_stale == stale + 4
