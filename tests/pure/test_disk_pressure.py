"""Disk pressure: file systems under the roots past disk_pressure, one line per change (smoosh.daemon.control.pressure)."""

from __future__ import annotations

import logging

import pytest

from helpers.clocks import FakeClock
from smoosh.daemon.control.pressure import DiskPressure
from smoosh.disk_room import parse_disk_pressure

LOGGER = "smoosh.daemon.control.pressure"


class Disks:
    """/srv/a and /srv/b on one file system, /data on another; their use is set by the test."""

    def __init__(self) -> None:
        self.used = {1: 0.5, 2: 0.5}

    def device(self, directory: str) -> int:
        return 2 if directory.startswith("/data") else 1

    def usage(self, directory: str) -> float:
        return self.used[self.device(directory)]


def test_a_file_system_past_its_threshold_is_under_pressure_with_one_line_each_way(caplog: pytest.LogCaptureFixture) -> None:
    disks, clock = Disks(), FakeClock(1000.0)
    p = DiskPressure(0.9, usage=disks.usage, device=disks.device, clock=clock)
    roots = ["/srv/a", "/srv/b", "/data"]
    with caplog.at_level(logging.INFO, logger=LOGGER):
        p.check(roots)
        assert not p.any and not p.on("/srv/a/t.db")
        disks.used[1] = 0.93
        for _ in range(3):  # still full: no more lines
            clock.advance(5)
            p.check(roots)
        assert p.on("/srv/a/t.db") and p.on("/srv/b/x/t.db") and not p.on("/data/t.db") and not p.on("/elsewhere.db")
        (fs,) = [fs for fs in p.snapshot() if fs.pressure]
        assert fs.roots == ("/srv/a", "/srv/b") and fs.used == 0.93 and fs.since == 1005.0
        disks.used[1] = 0.85
        clock.advance(60)
        p.check(roots)
        assert not p.any
    assert [r.getMessage() for r in caplog.records if r.name == LOGGER] == [
        "Disk pressure on the file system of /srv/a, /srv/b: 93% used (disk_pressure 90%): its databases are "
        "compacted worst-first by reclaimable bytes, and channels with under_pressure = ignore_window run outside "
        "their windows.",
        "Disk pressure ended on the file system of /srv/a, /srv/b: 85% used, after 70 s.",
    ]
    assert [r.levelname for r in caplog.records if r.name == LOGGER] == ["WARNING", "INFO"]


def test_off_is_never_under_pressure_and_a_reload_applies_at_the_next_check() -> None:
    disks = Disks()
    disks.used[1] = 0.99
    p = DiskPressure(None, usage=disks.usage, device=disks.device, clock=FakeClock())
    p.check(["/srv/a"])
    assert not p.any
    p.set_threshold(0.95)
    p.check(["/srv/a"])
    assert p.on("/srv/a/t.db")


@pytest.mark.parametrize(("text", "value"), [("90%", 0.9), ("100%", 1.0), ("1%", 0.01), ("off", None), (" OFF ", None)])
def test_disk_pressure_parses(text: str, value: float | None) -> None:
    assert parse_disk_pressure(text) == value


@pytest.mark.parametrize("text", ["0%", "101%", "0.9", "90", "lots"])
def test_a_bad_disk_pressure_says_what_it_takes(text: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_disk_pressure(text)
    assert str(info.value) == "must be a percentage of a file system's use from 1% to 100% (e.g. 90%), or off"
