"""smoosh's own writes are no news: a database it compacts is examined once, not again after.

A real watched directory, real SQLite files, the real inotify observer and the daemon's own
worker; the debounce is stepped with an injected clock.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from compactor.dbfactory import make_bloated_db
from helpers.clocks import FakeClock
from helpers.daemon import HANG_S, wait_for
from server.test_server import make_config
from smoosh.daemon.watch.inotify import inotify_available

FILES = 6


@pytest.mark.skipif(not inotify_available(), reason="needs Linux inotify (the observer that can tell its queue is handled)")
def test_databases_compacted_are_not_examined_again_for_the_writes_of_their_compaction(
    tmp_path: Path, running: Any, dbs: Path
) -> None:
    for i in range(FILES):
        make_bloated_db(str(dbs / f"t{i}.db"))
    clock = FakeClock()
    config = make_config(tmp_path, extra=f"watch = {dbs}\nstaleness = 0")
    server = running(config, workers=1, clock=clock)
    # Given every database found by the start-up scan (just written: each settles through the
    # debounce first, so the stepped clock lets them fall quiet) and compacted
    wait_for(lambda: server.status()["scan"]["scans_completed"] >= 1, 30, what="the start-up scan")
    clock.advance(5)
    server.tick(clock())
    wait_for(lambda: sum(n for (_ch, result), n in server.counters.compactions.items() if result == "ok") == FILES,
             HANG_S, what="every database compacted")
    # When every event that came meanwhile has had its debounce and its examination
    clock.advance(3600)
    server.tick(clock())
    wait_for(lambda: server.intake.examining() == 0, HANG_S, what="the examinations to end")
    # Then each database was examined once: the writes of its own compaction were no news
    assert server.counters.enqueue_examined == FILES
    assert server.counters.enqueue_accepted == FILES
