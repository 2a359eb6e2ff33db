"""smoosh's own writes are no news: a database it compacts is examined once, not again after.

A real watched directory, real SQLite files, the real inotify observer and the daemon's own
worker, or a real ``smoosh worker`` process; the debounce is stepped with an injected clock.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest

from compactor.dbfactory import make_bloated_db
from helpers.clocks import FakeClock
from helpers.daemon import HANG_S, start_worker, wait_for
from server.test_server import make_config
from smoosh.daemon.watch.inotify import inotify_available

FILES = 6
#: More for a worker in another process: each is a chance for its writes to be taken as news.
WORKER_FILES = 16


def compact_all_then_examine(server: Any, clock: FakeClock, files: int) -> None:
    """Every database the start-up scan finds (just written: each settles through the debounce
    first, so the stepped clock lets them fall quiet) compacted, then every event that came
    meanwhile through its debounce and its examination."""
    wait_for(lambda: server.status()["scan"]["scans_completed"] >= 1, 30, what="the start-up scan")
    clock.advance(5)
    server.tick(clock())
    wait_for(lambda: sum(n for (_ch, result), n in server.counters.compactions.items() if result == "ok") == files,
             HANG_S, what="every database compacted")
    clock.advance(3600)
    server.tick(clock())
    wait_for(lambda: server.intake.examining() == 0, HANG_S, what="the examinations to end")


@pytest.mark.skipif(not inotify_available(), reason="needs Linux inotify (the observer that can tell its queue is handled)")
def test_databases_compacted_are_not_examined_again_for_the_writes_of_their_compaction(
    tmp_path: Path, running: Any, dbs: Path
) -> None:
    for i in range(FILES):
        make_bloated_db(str(dbs / f"t{i}.db"))
    clock = FakeClock()
    config = make_config(tmp_path, extra=f"watch = {dbs}\nstaleness = 0")
    server = running(config, workers=1, clock=clock)
    # Given every database compacted, and every event that came meanwhile examined
    compact_all_then_examine(server, clock, FILES)
    # Then each database was examined once: the writes of its own compaction were no news
    assert server.counters.enqueue_examined == FILES
    assert server.counters.enqueue_accepted == FILES


@pytest.fixture
def worker_processes() -> Iterator[list[subprocess.Popen]]:
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(HANG_S)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@pytest.mark.skipif(not inotify_available(), reason="needs Linux inotify (the observer that can tell its queue is handled)")
def test_databases_compacted_by_a_smoosh_worker_process_are_not_examined_again(
    tmp_path: Path, running: Any, dbs: Path, worker_processes: list[subprocess.Popen]
) -> None:
    for i in range(WORKER_FILES):
        make_bloated_db(str(dbs / f"t{i}.db"))
    clock = FakeClock()
    config = make_config(tmp_path, extra=f"watch = {dbs}\nstaleness = 0\nstore = sqlite:{tmp_path / 'state' / 'jobs.db'}")
    # Given a daemon that runs no compaction itself, and a worker in its own process
    server = running(config, workers=0, clock=clock)
    worker_processes.append(start_worker(tmp_path / "smoosh.ini"))
    compact_all_then_examine(server, clock, WORKER_FILES)
    # Then each database was examined once: the other process's compaction was smoosh's own
    assert server.counters.enqueue_examined == WORKER_FILES
    assert server.counters.enqueue_accepted == WORKER_FILES
