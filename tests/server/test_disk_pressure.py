"""Issue 27: under disk pressure, databases go worst-first and opted-in channels run outside their windows.

A real server with an in-process worker and real SQLite files; how full the file system is
comes from a stand-in for ``statvfs`` (the pressure module's one look at the disk), and the
housekeeping is ticked by hand.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from pathlib import Path
from typing import Any, Iterator

import pytest

import smoosh.daemon.control.pressure as pressure_module
from compactor.dbfactory import make_bloated_db
from helpers.clocks import FakeClock
from helpers.daemon import wait_for
from smoosh import Server
from smoosh.config import parse_config
from server.test_server import make_config

DB_CHANNELS = "night_dbs"


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Path, dict[str, float]]]:
    dbs = tmp_path / "dbs"
    dbs.mkdir()
    # small.db: few bytes to reclaim at a high ratio; big.db: many bytes at a lower one.
    make_bloated_db(str(dbs / "small.db"), rows=300, delete_fraction=0.9)
    make_bloated_db(str(dbs / "big.db"), rows=6000, delete_fraction=0.6)
    used = {"ratio": 0.5}
    monkeypatch.setattr(pressure_module, "_usage", lambda directory: used["ratio"])
    text = f"""[smoosh]
watch =
roots = {dbs}
state_dir = {tmp_path / 'state'}
store = memory:
node = t
wait_secs = 0
staleness = 0
db_channels = night_dbs
disk_pressure = 90%

[smoosh.night_dbs]
priority = ratio
min_size = 0
from = 01:00
to = 05:00
under_pressure = ignore_window
# Queue, never start: the order the channel would start them in stays in view.
concurrency = 0
"""
    yield parse_config(text, str(tmp_path / "smoosh.ini")), dbs, used


def noon() -> float:
    return dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.timezone.utc).timestamp()


def test_a_full_disk_takes_the_largest_reclaim_first_and_opens_the_window(
    fleet: tuple[Any, Path, dict[str, float]], caplog: pytest.LogCaptureFixture
) -> None:
    config, dbs, used = fleet
    clock = FakeClock(noon())
    server = Server(config, workers=0, watch_config=False, clock=clock)
    server.start()
    try:
        for name in ("small.db", "big.db"):
            server.enqueue(str(dbs / name))
        wait_for(lambda: server.status()["channels"][DB_CHANNELS]["waiting"]["size"] == 2, 30, what="both queued")
        channel = server.channels()[DB_CHANNELS]

        def order() -> list[str]:
            snapshot = channel.try_snapshot()
            return [k for k, _p in snapshot[1]] if snapshot is not None else []

        # A normal day at noon: outside the night window, the highest ratio first
        assert order() == [str(dbs / "small.db"), str(dbs / "big.db")]
        assert server.status()["channels"][DB_CHANNELS]["in_window"] is False
        # When the disk fills past disk_pressure
        used["ratio"] = 0.95
        with caplog.at_level(logging.WARNING, logger="smoosh.daemon.control.pressure"):
            clock.advance(6)  # the next status interval: the disk is looked at with every record
            server.tick()
        # Then it is said once, the night channel runs outside its window, and a key examined
        # again is queued at the bytes it would reclaim: the big database first
        assert [r.getMessage().split(":")[0] for r in caplog.records] == [f"Disk pressure on the file system of {dbs}"]
        wait_for(lambda: server.status()["channels"][DB_CHANNELS]["in_window"], 30, what="the window waived")
        for name in ("small.db", "big.db"):
            server.enqueue(str(dbs / name), force=False)
        wait_for(lambda: order()[:1] == [str(dbs / "big.db")], 30, what="big first")
        assert order() == [str(dbs / "big.db"), str(dbs / "small.db")]
        priorities = dict(channel.try_snapshot()[1])
        assert priorities[str(dbs / "big.db")] > 1_000_000  # its reclaimable bytes, not its ratio
        disk = server.status()["disk"]
        assert disk["disk_pressure"] == "90%"
        assert disk["filesystems"] == [{"roots": [str(dbs)], "used": 0.95, "pressure": True,
                                        "since": disk["filesystems"][0]["since"]}]
        assert server.explain(str(dbs / "big.db"))["disk_pressure"] is True
        # And when the pressure ends the window holds again
        used["ratio"] = 0.5
        clock.advance(6)
        server.tick()
        wait_for(lambda: not server.status()["channels"][DB_CHANNELS]["in_window"], 30, what="the window back")
    finally:
        server.stop()


def _order(server: Any) -> list[tuple[str, float]]:
    snapshot = server.channels()[DB_CHANNELS].try_snapshot()
    return [(Path(k).name, p) for k, p in snapshot[1]] if snapshot is not None else []


def test_keys_already_waiting_go_worst_first_as_the_pressure_starts_and_back_as_it_ends(
    fleet: tuple[Any, Path, dict[str, float]],
) -> None:
    config, dbs, used = fleet
    clock = FakeClock(noon())
    server = Server(config, workers=0, watch_config=False, clock=clock)
    server.start()
    try:
        # Given a backlog queued on a normal day, by ratio: the small database first
        for name in ("small.db", "big.db"):
            server.enqueue(str(dbs / name))
        wait_for(lambda: len(_order(server)) == 2, 30, what="both queued")
        normal = _order(server)
        assert [n for n, _p in normal] == ["small.db", "big.db"]
        assert all(p < 100 for _n, p in normal)  # ratios
        # When the disk fills past disk_pressure (no new event for either key)
        used["ratio"] = 0.95
        clock.advance(6)
        server.tick()
        # Then the waiting keys move to the bytes they would reclaim: the big one first
        wait_for(lambda: [n for n, _p in _order(server)] == ["big.db", "small.db"], 30, what="big first")
        assert all(p > 1000 for _n, p in _order(server))
        # And when the pressure ends, each goes back to its channel's own priority
        used["ratio"] = 0.5
        clock.advance(6)
        server.tick()
        wait_for(lambda: _order(server) == normal, 30, what="the ratio order back")
    finally:
        server.stop()


def test_a_daemon_started_on_a_full_disk_queues_worst_first_from_its_first_key(
    fleet: tuple[Any, Path, dict[str, float]],
) -> None:
    config, dbs, used = fleet
    # Given a disk already past disk_pressure when the daemon starts
    used["ratio"] = 0.95
    clock = FakeClock(noon())
    server = Server(config, workers=0, watch_config=False, clock=clock)
    server.start()
    try:
        # Then it knows before any key is offered (the start-up scan's first key included),
        # and the window the pressure waives is open from the channel's first look
        assert server.pressure.any
        assert server.status()["channels"][DB_CHANNELS]["in_window"] is True
        # When keys arrive before the loop has looked at anything
        for name in ("small.db", "big.db"):
            server.enqueue(str(dbs / name))
        wait_for(lambda: len(_order(server)) == 2, 30, what="both queued")
        # Then the first queued at its reclaimable bytes, the big one first
        assert [n for n, _p in _order(server)] == ["big.db", "small.db"]
        assert all(p > 1000 for _n, p in _order(server))
    finally:
        server.stop()


def test_the_node_runs_as_many_compactions_as_its_backlog_asks(tmp_path: Path, running: Any, dbs: Path) -> None:
    # Issue 27's backlog controller on a real server: a small backlog takes one slot of four at
    # the first status interval, and /status and /metrics say what it saw and set.
    from server.test_server import make_config

    make_bloated_db(str(dbs / "a.db"), rows=300, delete_fraction=0.8)
    clock = FakeClock()
    server = running(make_config(tmp_path, extra="max_jobs = 4\nwait_secs = 3600\nbacklog_full = 1GiB"),
                     workers=0, clock=clock)
    assert server.status()["controller"]["slots"] == 4  # every slot until it has looked
    server.enqueue(str(dbs / "a.db"))
    wait_for(lambda: server.status()["reclaimable_bytes"] > 0, 30, what="the key queued and measured")
    clock.advance(6)
    server.tick()
    controller = server.status()["controller"]
    assert controller["backlog_bytes"] == server.status()["reclaimable_bytes"] > 0
    assert (controller["for_backlog"], controller["slots"]) == (2, 2)  # 1 + its share of 3, rounded up
    assert server._slots.in_force == 2
    # The pace of incremental chunks follows the same small backlog: gentle, on the process's budget
    from smoosh.daemon.control.backlog import GAP_FACTOR_GENTLE

    assert GAP_FACTOR_GENTLE / 2 < controller["chunk_gap_factor"] == server.io_budget.chunk_gap_factor <= GAP_FACTOR_GENTLE


def test_what_running_compactions_have_still_to_give_back_is_backlog_too(tmp_path: Path, running: Any, dbs: Path) -> None:
    # One large database compacting with nothing else waiting is not an empty backlog: its
    # pace would otherwise be the gentlest. Its measured reclaimable bytes, less its progress.
    from types import SimpleNamespace

    from server.test_server import make_config
    from smoosh.compactors.base import Sizes
    from smoosh.daemon.intake.measurement import Measurement

    clock = FakeClock()
    server = running(make_config(tmp_path, extra="max_jobs = 4\nbacklog_full = 1GiB"), workers=0, clock=clock)
    key = str(dbs / "big.db")
    server.intake.measurements[key] = Measurement(Sizes(file_bytes=5 * 2**30, active_bytes=2**30), None, True)
    server._worker = SimpleNamespace(status=lambda: [{"key": key, "progress": 0.25}])
    clock.advance(6)
    server.tick()
    controller = server.status()["controller"]
    assert controller["backlog_bytes"] == 3 * 2**30  # 4 GiB to give back, a quarter given
    assert controller["slots"] == 4
    assert server.io_budget.chunk_gap_factor == 4.0  # backlog_full's pace: brisk


def test_under_pressure_a_channel_runs_as_many_as_the_controller_lets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    used = {"ratio": 0.5}
    monkeypatch.setattr(pressure_module, "_usage", lambda directory: used["ratio"])
    monkeypatch.setattr(os, "cpu_count", lambda: 2)  # a 2-core machine: the raise stops at 2
    # ratio_dbs at its default concurrency of 1; the backlog here (about 1.7 MB) is "full", so
    # the controller lets every slot run.
    config = make_config(tmp_path, extra="staleness = 0\nmax_jobs = 3\nbacklog_full = 1MiB\ndb_channels = ratio_dbs")
    dbs = tmp_path / "dbs"
    for i in range(4):
        make_bloated_db(str(dbs / f"t{i}.db"), rows=400, delete_fraction=0.8)
    clock = FakeClock(noon())
    # No worker: a started run waits for one, and keeps its place in the channel's concurrency.
    server = Server(config, workers=0, watch_config=False, clock=clock)
    server.start()
    try:
        def ratio() -> dict[str, Any]:
            return server.status()["channels"]["ratio_dbs"]

        for i in range(4):
            server.enqueue(str(dbs / f"t{i}.db"))
        # Given a normal day: one at a time, as the channel says
        wait_for(lambda: ratio()["starting"] == 1 and ratio()["waiting"]["size"] == 3, 30, what="one started")
        assert ratio()["concurrency"] == 1
        # When the disk fills past disk_pressure
        used["ratio"] = 0.95
        clock.advance(6)
        server.tick()
        # Then the channel runs as many as the backlog controller lets (all 3 slots here), up
        # to one per core
        wait_for(lambda: ratio()["starting"] == 2, 30, what="two started")
        assert server.status()["controller"]["slots"] == 3
        assert ratio()["concurrency"] == 2 and ratio()["waiting"]["size"] == 2
        # And as the pressure ends its own concurrency holds again: nothing more starts
        used["ratio"] = 0.5
        clock.advance(6)
        server.tick()
        wait_for(lambda: ratio()["concurrency"] == 1, 30, what="its own concurrency back")
        server.tick()
        assert ratio()["starting"] == 2 and ratio()["waiting"]["size"] == 2
    finally:
        server.stop()
