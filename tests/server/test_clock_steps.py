"""A wall clock that steps (NTP, a VM resync, ``date -s``): waits keep their time, the step is said once.

Servers run in this process on :class:`~helpers.clocks.SteppedClocks`: the test lets time pass
(both clocks move) or steps the wall clock alone, and ticks the server's loop itself. Windows
and the I/O budget have their own cases beside their other tests (``test_windows.py``,
``test_io_budget.py``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from compactor.dbfactory import make_bloated_db
from helpers.clocks import SteppedClocks
from helpers.daemon import wait_for
from helpers.jobs_table import record_of
from server.test_server import FailingCompactor, make_config
from smoosh.daemon.record.status import STATUS_INTERVAL_S, read_node_statuses

DAY_S = 86_400.0
#: The backoff after a first crash in make_config's settings.
BACKOFF_S = 100.0


def ratio(server: Any) -> dict[str, Any]:
    return server.status()["channels"]["ratio_dbs"]


@pytest.mark.parametrize("step_s", [-DAY_S, DAY_S], ids=["back", "forward"])
def test_a_crash_backoff_is_neither_delayed_nor_brought_forward_by_a_day_step_of_the_wall_clock(
    tmp_path: Path, running: Any, dbs: Path, step_s: float,
) -> None:
    # Given a key whose compaction crashed once: it waits 100 s in its channel
    clocks = SteppedClocks()
    compactor = FailingCompactor(RuntimeError("disk I/O error"))
    server = running(make_config(tmp_path), workers=1, clock=clocks, compactors=[compactor])
    key = str(dbs / "x.db")
    server.enqueue(key)
    wait_for(lambda: record_of(server, key).get("error_count") == 1, 20, what="the first crash")
    retry_at = record_of(server, key)["retry_at"]
    assert retry_at == clocks.wall() + BACKOFF_S

    # When the wall clock steps a day, and 99 s pass
    clocks.step_wall(step_s)
    clocks.advance(BACKOFF_S - 1)
    server.tick()

    # Then the key still waits (a step forward brings nothing forward) ...
    status = ratio(server)
    assert (status["deferred"], status["starting"], status["active"]) == (1, 0, 0)
    assert compactor.calls == 1
    shown_at = record_of(server, key)["retry_at"]
    # ... it is retried 100 s after its crash, not a day later ...
    clocks.advance(2)
    server.tick()
    wait_for(lambda: compactor.calls == 2, 20, what="the retry 100 s after the crash")
    # ... and meanwhile /jobs showed its retry at the wall time it came at on the stepped clock
    assert shown_at == retry_at + step_s


@pytest.mark.parametrize("step_s", [-DAY_S, DAY_S], ids=["back", "forward"])
def test_a_file_event_is_examined_after_its_quiet_second_whatever_the_wall_clock_did(
    tmp_path: Path, running: Any, dbs: Path, step_s: float,
) -> None:
    # Given a database the watcher saw change (its event waits for a second without events)
    clocks = SteppedClocks()
    server = running(make_config(tmp_path), workers=0, clock=clocks)
    db = dbs / "x.db"
    make_bloated_db(str(db), rows=4000, delete_fraction=0.9)
    server.intake.on_event(str(db))
    server.tick()
    # When the wall clock steps a day, and half a second passes: the event is not due yet
    clocks.step_wall(step_s)
    clocks.advance(0.5)
    server.tick()
    assert server.intake.debouncer.counts()["pending"] == 1
    # Then a second after the event, it is examined and its channel takes it
    clocks.advance(0.5)
    server.tick()
    wait_for(lambda: str(db) in server.channels()["ratio_dbs"].keys(), 10, what="the key queued")


def test_the_node_status_record_keeps_its_cadence_and_says_the_stepped_wall_time(tmp_path: Path, running: Any) -> None:
    # Given a node writing its status record every few seconds (other nodes read it; older
    # than 15 s, it is stale)
    clocks = SteppedClocks()
    server = running(make_config(tmp_path), workers=0, clock=clocks)

    def updated_at() -> float | None:
        return read_node_statuses(server.store, now=clocks.wall()).get("t", {}).get("updated_at")

    wait_for(lambda: updated_at() == clocks.wall(), 10, what="the first status record")
    # When the wall clock is set back a day, and one status interval passes
    clocks.step_wall(-DAY_S)
    clocks.advance(STATUS_INTERVAL_S)
    server.tick()
    # Then the record is written again, stamped with the wall time a reader compares it with
    wait_for(lambda: updated_at() == clocks.wall(), 10, what="the status record after the step")


def step_line(direction: str) -> str:
    return (f"the wall clock stepped {direction} by 86400.0 s; waits, backoffs and pacing run on the monotonic "
            "clock and keep their time, and every channel looks at its window again now")


def test_a_step_of_the_wall_clock_is_logged_once_naming_its_size_and_direction(
    tmp_path: Path, running: Any, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="smoosh.daemon.host.housekeeping")
    clocks = SteppedClocks()
    server = running(make_config(tmp_path), workers=0, clock=clocks)

    def lines() -> list[tuple[int, str]]:
        return [(r.levelno, r.getMessage()) for r in caplog.records if "wall clock" in r.getMessage()]

    def let_time_pass(ticks: int = 3) -> None:
        for _ in range(ticks):
            clocks.advance(STATUS_INTERVAL_S)  # the housekeeping is due at least this often
            server.tick()

    let_time_pass()
    assert lines() == []  # time passing is no step
    clocks.step_wall(-DAY_S)
    let_time_pass()
    assert lines() == [(logging.WARNING, step_line("back"))]
    clocks.step_wall(DAY_S)
    let_time_pass()
    assert lines() == [(logging.WARNING, step_line("back")), (logging.WARNING, step_line("forward"))]
