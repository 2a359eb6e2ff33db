"""The I/O budget in the server: a start waits for it holding no slot, and becomes eligible exactly when the debt is paid.

A real server with an in-process worker compacts real SQLite files; the clock is injected and
stepped by hand (it does not move during a compaction, so each VACUUM ends at a known time).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from compactor.dbfactory import integrity, make_bloated_db
from helpers.clocks import FakeClock, SteppedClocks
from helpers.daemon import HANG_S, wait_for
from helpers.jobs_table import record_of, state_of
from smoosh import Server
from smoosh.cli.format import format_status
from smoosh.config import parse_config
from smoosh.daemon.api.metrics import render
from smoosh.ioprio import IOPRIO_CLASS_IDLE, get_thread_ioprio

MiB = 1 << 20
#: The budget of these tests: a ~2 MB VACUUM leaves a debt of about 2 s.
RATE = MiB


def config_text(tmp_path: Path, extra: str = "") -> str:
    return f"""[smoosh]
watch =
roots = {tmp_path / 'dbs'}
state_dir = {tmp_path / 'state'}
store = memory:
node = t
wait_secs = 0
db_channels = ratio_dbs
{extra}

[smoosh.ratio_dbs]
min_size = 64KiB
concurrency = 1
"""


@pytest.fixture
def dbs(tmp_path: Path) -> tuple[str, str]:
    (tmp_path / "dbs").mkdir()
    first, second = str(tmp_path / "dbs" / "first.db"), str(tmp_path / "dbs" / "second.db")
    make_bloated_db(first, delete_fraction=0.8)  # ratio ~5: compacted first
    make_bloated_db(second, delete_fraction=0.6)  # ratio ~2.5
    return first, second


@pytest.fixture
def started(tmp_path: Path, running: Any) -> Any:
    """Start a server with one worker on this file's config plus ``extra``, on ``clock``."""

    def start(extra: str, clock: FakeClock, **kw: Any) -> Server:
        config = parse_config(config_text(tmp_path, extra), str(tmp_path / "smoosh.ini"))
        return running(config, workers=1, clock=clock, **kw)

    return start


def sample(server: Server, name: str) -> float:
    """The value of the unlabelled sample ``name`` in a scrape of ``/metrics``'s body."""
    for family in text_string_to_metric_families(render(server)[0].decode()):
        for s in family.samples:
            if s.name == name:
                return float(s.value)
    raise AssertionError(f"{name} is not in /metrics")


def waiting_on_the_budget(server: Server) -> bool:
    status = server.status()
    ch = status["channels"]["ratio_dbs"]
    return (ch["waiting"]["size"], ch["active"], ch["starting"]) == (1, 0, 0) and \
        status["io_budget"]["waiting_channels"] == ["ratio_dbs"]


def test_a_full_vacuum_delays_the_next_start_by_its_size_over_the_rate(started: Any, dbs: tuple[str, str]) -> None:
    # Given max_io_rate = 1MiB, a clock frozen at T, and two bloated databases queued
    first, second = dbs
    size_first, size_second = os.path.getsize(first), os.path.getsize(second)
    clock = FakeClock(1_800_000_000.0)
    t = clock()
    server = started("max_io_rate = 1MiB", clock)
    server.suspend("ratio_dbs")  # both queued before either starts: the bloated one goes first
    server.enqueue(first)
    server.enqueue(second)
    wait_for(lambda: server.status()["channels"]["ratio_dbs"]["waiting"]["size"] == 2, HANG_S, what="both queued")
    server.resume("ratio_dbs")

    # When the first VACUUM ends (charged its file size)
    wait_for(lambda: state_of(server, first) == "finished", HANG_S, what="the first VACUUM")
    assert server.io_budget.charged_bytes == size_first
    paid_at = t + size_first / RATE
    assert server.io_budget.paid_at() == pytest.approx(paid_at)

    # Then the second waits queued, holding neither a channel slot nor a max_jobs slot
    wait_for(lambda: waiting_on_the_budget(server), HANG_S, what="the second start to wait on the budget")
    assert server._slots.busy == 0
    budget = server.status()["io_budget"]
    assert budget["max_io_rate"] == RATE and budget["charged_bytes"] == size_first
    assert budget["debt_s"] == pytest.approx(size_first / RATE, abs=0.001)
    assert f"I/O budget: 1.0 MiB/s, {size_first / MiB:.1f} MiB charged, in debt" in format_status(server.status())
    assert sample(server, "smoosh_io_budget_bytes_per_second") == RATE
    assert sample(server, "smoosh_io_charged_bytes_total") == size_first

    # ... not a moment before the debt is paid ...
    clock.set(paid_at - 0.01)
    server.tick()
    server.tick()
    assert waiting_on_the_budget(server) and state_of(server, second) == "pending"

    # ... and at once when it is: the gate's timer is due exactly then
    clock.set(paid_at)
    server.tick()
    server.tick()
    wait_for(lambda: state_of(server, second) == "finished", HANG_S, what="the second VACUUM")
    assert server.io_budget.charged_bytes == size_first + size_second
    assert integrity(first) == integrity(second) == "ok"


def test_a_reload_to_a_higher_rate_brings_the_waiting_start_forward(started: Any, dbs: tuple[str, str], tmp_path: Path) -> None:
    first, second = dbs
    size_first = os.path.getsize(first)
    clock = FakeClock(1_800_000_000.0)
    t = clock()
    server = started("max_io_rate = 1MiB", clock)
    server.suspend("ratio_dbs")
    server.enqueue(first)
    server.enqueue(second)
    wait_for(lambda: server.status()["channels"]["ratio_dbs"]["waiting"]["size"] == 2, HANG_S, what="both queued")
    server.resume("ratio_dbs")
    wait_for(lambda: state_of(server, first) == "finished", HANG_S, what="the first VACUUM")
    wait_for(lambda: waiting_on_the_budget(server), HANG_S, what="the second start to wait on the budget")

    # When the rate is raised to 4MiB by a live reload
    server.apply_config(parse_config(config_text(tmp_path, "max_io_rate = 4MiB"), str(tmp_path / "smoosh.ini")))

    # Then the bytes still owed are re-priced: the start comes a quarter of the time after the VACUUM
    assert server.status()["io_budget"]["max_io_rate"] == 4 * MiB
    assert server.io_budget.paid_at() == pytest.approx(t + size_first / (4 * RATE))
    clock.set(t + size_first / (4 * RATE))
    server.tick()
    server.tick()
    wait_for(lambda: state_of(server, second) == "finished", HANG_S, what="the second VACUUM")


def test_an_unlimited_budget_never_holds_a_start_back(started: Any, dbs: tuple[str, str]) -> None:
    first, second = dbs
    clock = FakeClock(1_800_000_000.0)  # never moved: a start waiting on the budget would never come
    server = started("", clock)
    server.enqueue(first)
    server.enqueue(second)
    wait_for(lambda: state_of(server, first) == state_of(server, second) == "finished", HANG_S, what="both VACUUMs")
    budget = server.status()["io_budget"]
    assert budget["max_io_rate"] == "infinity" and budget["debt_s"] == 0 and budget["charged_bytes"] > 0
    assert sample(server, "smoosh_io_budget_bytes_per_second") == math.inf


class RecordsIoPriority:
    """The real SQLite compactor, noting the I/O class of the thread that runs each compaction."""

    def __init__(self, settings: Any) -> None:
        from smoosh.compactors.sqlite import SqliteCompactor

        self.inner = SqliteCompactor(settings)
        self.name = self.inner.name
        self.seen: list[tuple[int, int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def compact(self, key: str, ctx: Any) -> Any:
        self.seen.append(get_thread_ioprio())
        return self.inner.compact(key, ctx)


@pytest.mark.skipif(not os.uname().sysname == "Linux", reason="ioprio_set is Linux only")
def test_io_priority_idle_puts_the_compaction_thread_in_the_idle_class_for_that_compaction(
    started: Any, dbs: tuple[str, str], tmp_path: Path,
) -> None:
    first, second = dbs
    clock = FakeClock(1_800_000_000.0)
    config = parse_config(config_text(tmp_path, "io_priority = idle"), str(tmp_path / "smoosh.ini"))
    recorder = RecordsIoPriority(config.sqlite)
    server = started("io_priority = idle", clock, compactors=[recorder])
    server.enqueue(first)
    wait_for(lambda: state_of(server, first) == "finished", HANG_S, what="the first compaction")
    assert recorder.seen[0][0] == IOPRIO_CLASS_IDLE

    # A reload back to normal applies to the next compaction, on the same pooled thread
    server.apply_config(parse_config(config_text(tmp_path, "io_priority = normal"), str(tmp_path / "smoosh.ini")))
    server.enqueue(second)
    wait_for(lambda: state_of(server, second) == "finished", HANG_S, what="the second compaction")
    assert recorder.seen[1][0] != IOPRIO_CLASS_IDLE
    assert get_thread_ioprio()[0] != IOPRIO_CLASS_IDLE  # the rest of the process never changed class


DAY_S = 86_400.0
#: Pages per incremental chunk in the pacing case: each chunk owes CHUNK_PAGES pages of bytes.
CHUNK_PAGES = 50


def test_a_paced_incremental_compaction_keeps_its_pace_across_a_wall_clock_set_back_a_day(
    tmp_path: Path, running: Any,
) -> None:
    # Given an incremental compaction paced at 1 KiB/s: each 50-page chunk owes minutes, so
    # no wait of the compaction thread ever runs out by itself during the test
    (tmp_path / "dbs").mkdir()
    db = str(tmp_path / "dbs" / "inc.db")
    make_bloated_db(db, auto_vacuum="incremental")
    text = config_text(tmp_path, "max_io_rate = 1KiB") + f"\n[smoosh.sqlite]\nincremental_chunk_pages = {CHUNK_PAGES}\n"
    clocks = SteppedClocks()
    server = running(parse_config(text, str(tmp_path / "smoosh.ini")), workers=1, clock=clocks)
    budget = server.io_budget
    server.enqueue(db)
    wait_for(lambda: budget.waiting() == 1, 20, what="the first chunk's wait")
    charged = budget.charged_bytes

    # When the wall clock is set back a day, then the debt's time passes and the compaction
    # thread looks at the clock once (as its timed wait running out would have it)
    owed_s = budget.debt_s()
    clocks.step_wall(-DAY_S)
    clocks.advance(owed_s)
    budget.wake()

    # Then the next chunk runs (it does not sleep a day), and each one after it runs when its
    # own debt is paid, to the end
    wait_for(lambda: budget.charged_bytes > charged, 10, what="the next chunk after the step")
    while state_of(server, db) != "finished":
        wait_for(lambda: budget.waiting() == 1 or state_of(server, db) == "finished", 20, what="the next chunk")
        clocks.advance(budget.debt_s())
        budget.wake()
    assert record_of(server, db)["error_count"] == 0
    assert integrity(db) == "ok"
