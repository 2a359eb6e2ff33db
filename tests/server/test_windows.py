"""Time windows on a real incremental compaction: the server, its channels and an in-process worker.

The channels' clock is injected and moved by hand; the worker compacts a real SQLite file.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, Iterator

import pytest

from compactor.dbfactory import db_stats, integrity
from compactor.gates import GatedCompactor
from helpers.chunked import chunk_section, chunked_db
from helpers.clocks import FakeClock, SteppedClocks
from helpers.daemon import HANG_S, wait_for
from helpers.jobs_table import state_of
from helpers.locks import other_process_write
from smoosh import Server
from smoosh.compactors import SqliteCompactor
from smoosh.config import parse_config


def at(day: int, hour: int, minute: int = 0) -> float:
    return dt.datetime(2026, 11, day, hour, minute, tzinfo=dt.timezone.utc).timestamp()


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[Any, Path, FakeClock]]:
    dbs = tmp_path / "dbs"
    dbs.mkdir()
    db = dbs / "big.db"
    made = chunked_db(db)
    text = f"""[smoosh]
watch =
roots = {dbs}
state_dir = {tmp_path / 'state'}
store = memory:
node = t
wait_secs = 0
job_timeout = 3s
db_channels = night_dbs

[smoosh.night_dbs]
priority = ratio
min_size = 64KiB
from = 01:00
to = 05:00
strict_window = true

{chunk_section(made)}"""
    config = parse_config(text, str(tmp_path / "smoosh.ini"))
    clock = FakeClock(at(23, 12))
    yield config, db, clock


def progress_of(server: Server) -> float | None:
    """The running compaction's progress, straight from the in-process worker (None: none runs)."""
    running = server._worker.status()  # type: ignore[attr-defined]
    return running[0]["progress"] if running else None


def started_with_the_key_queued(config: Any, db: Path, clock: Any, compactor: Any = None) -> Server:
    """A server with one worker (its compactor: ``compactor``, or the SQLite one) and ``db`` queued."""
    server = Server(config, workers=1, watch_config=False, clock=clock,
                    compactors=[compactor or SqliteCompactor(config.sqlite)])
    server.start()
    try:
        server.enqueue(str(db))
        wait_for(lambda: server.status()["channels"]["night_dbs"]["waiting"]["size"] == 1, HANG_S, what="queued")
    except BaseException:
        server.stop()
        raise
    return server


def test_work_waits_for_the_window_and_a_strict_window_pauses_it_between_chunks(setup: Any) -> None:
    config, db, clock = setup
    # The compaction stops at its second chunk boundary until the test has moved the clock:
    # there is always a "while it runs" to act in, however fast the chunks are
    gated = GatedCompactor(SqliteCompactor(config.sqlite), at_checkpoint=2)
    server = started_with_the_key_queued(config, db, clock, gated)
    try:
        for _ in range(3):
            server.tick()  # ticks at noon: outside the window, nothing starts
        status = server.status()["channels"]["night_dbs"]
        assert (status["in_window"], status["active"], status["starting"]) == (False, 0, 0)

        clock.set(at(24, 1, 30))  # inside: queued work starts at once, without a new event
        server.wake("night_dbs")
        server.tick()
        assert gated.reached.wait(HANG_S), "the compaction never ran"
        assert (progress_of(server) or 0) > 0

        clock.set(at(24, 5, 30))  # leaving a strict window holds the running compaction at once
        server.wake("night_dbs")
        server.tick()
        assert server.status()["channels"]["night_dbs"]["in_window"] is False
        assert server._worker.status()[0]["held"]  # type: ignore[attr-defined]
        gated.release.set()  # on to its chunk boundary, where the hold stops it

        def paused() -> bool:
            # Between chunks it holds no lock: the application (another process) writes at once.
            return other_process_write(db) == "wrote"

        wait_for(paused, HANG_S, what="the compaction to pause at a chunk boundary")
        held_at = progress_of(server)
        assert held_at is not None and held_at < 1.0
        assert paused() and progress_of(server) == held_at  # still paused: no chunk ran meanwhile

        clock.set(at(25, 2))  # back inside: it resumes and finishes
        server.wake("night_dbs")
        server.tick()
        wait_for(lambda: state_of(server, str(db)) == "finished",
                 HANG_S, what="the compaction to finish")
    finally:
        gated.release.set()
        server.stop()
    # Read through apsw, the compactor's own library (DESIGN §11: one SQLite library per file).
    assert integrity(str(db)) == "ok"
    assert db_stats(str(db))["freelist_count"] == 0


@pytest.mark.parametrize(
    "step_s",
    [-(10 * 3600 + 30 * 60), 13 * 3600 + 30 * 60],  # from noon to 01:30 the same day, or the next
    ids=["back", "forward"],
)
def test_a_step_of_the_wall_clock_into_the_window_is_seen_within_a_second(setup: Any, step_s: float) -> None:
    # Given a key queued at noon, outside the 01:00-05:00 window
    config, db, _ = setup
    clocks = SteppedClocks(wall=at(23, 12))
    server = started_with_the_key_queued(config, db, clocks)
    try:
        server.tick()
        assert server.status()["channels"]["night_dbs"]["in_window"] is False

        # When the wall clock steps to 01:30, and one second passes
        clocks.step_wall(step_s)
        clocks.advance(1.0)
        server.tick()

        # Then the channel is in its window (its routine check is a minute away), and the
        # queued key starts without a new event
        assert server.status()["channels"]["night_dbs"]["in_window"] is True
        server.tick()
        wait_for(lambda: state_of(server, str(db)) in ("running", "finished"), HANG_S, what="the compaction to start")
    finally:
        server.stop()
