"""The run audit: an invariant broken anyway is said once at ERROR and repaired, never a silent wedge.

A run's slots are freed by construction (``JobScheduler.end``); these tests break that on
purpose, each in one way the audit looks for, on a real server in process compacting real
SQLite files: a channel holding a run the scheduler no longer follows (the trial's phantom),
a run the worker no longer runs and never told the end of, and a ``max_jobs`` count that
drifted. Each time: one ERROR line, the slots back, and the next key compacted.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from compactor.dbfactory import make_bloated_db
from helpers.clocks import FakeClock
from helpers.daemon import HANG_S, wait_for
from helpers.jobs_table import record_of
from helpers.run_gates import GatedCompactor
from server.test_server import make_config
from smoosh.compactors import load_compactors
from smoosh.daemon.host.run_audit import GRACE_S, PHANTOM_REASON, VANISHED_ERROR


@pytest.fixture
def setup(tmp_path: Path, running: Any, dbs: Path) -> tuple[Any, GatedCompactor, FakeClock]:
    config = make_config(tmp_path)
    gated = GatedCompactor(load_compactors(config.sqlite, roots=config.roots)[0])
    clock = FakeClock()
    return running(config, workers=1, clock=clock, compactors=[gated]), gated, clock


def bloated(dbs: Path, name: str) -> str:
    key = str(dbs.resolve() / name)
    make_bloated_db(key, rows=2000, delete_fraction=0.9)
    return key


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def idle(server: Any) -> bool:
    return (server._slots.busy == 0 and not server._scheduler.runs()
            and not any(ch["active"] or ch["starting"] for ch in server.status()["channels"].values()))


def next_key_compacts(server: Any, dbs: Path) -> None:
    key = bloated(dbs, "next.db")
    server.enqueue(key)
    wait_for(lambda: record_of(server, key).get("state") == "finished", HANG_S, what="the next key's compaction")
    wait_for(lambda: idle(server), HANG_S, what="its run to end")


def test_a_phantom_run_is_said_once_and_its_slots_freed(
    setup: tuple[Any, GatedCompactor, FakeClock], dbs: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    server, gated, clock = setup
    key = bloated(dbs, "tenant.db")
    gate = gated.hold(key)
    server.enqueue(key)
    gate.wait_entered()
    assert server.status()["channels"]["ratio_dbs"]["active"] == 1

    # Given the scheduler forgets the run while its channel still counts it (what replacing a
    # key's record did before: the channel's run had nothing behind it any more)
    def forget() -> int:
        (run,) = server._scheduler.runs()
        server._scheduler.table.close(run)
        return int(run.token)

    token = server._loop.call(forget)
    caplog.set_level(logging.INFO)
    caplog.clear()
    # When the audit looks, twice
    first = server._loop.call(lambda: server._audit.check(clock()))
    second = server._loop.call(lambda: server._audit.check(clock()))

    # Then it is said once, at ERROR, and the channel's place and the max_jobs slot are free
    assert (first.phantoms, second.phantoms) == ([("ratio_dbs", key)], [])
    assert errors(caplog) == [
        f"channel ratio_dbs counted a compaction of {key!r} that nothing runs (a phantom run, token {token}); "
        "its slot is freed and its channel goes on"]
    assert server.status()["channels"]["ratio_dbs"]["active"] == 0 and server._slots.busy == 0
    assert record_of(server, key)["history"][0]["reason"] == PHANTOM_REASON
    gate.release()  # the forgotten compaction ends; nobody follows it any more
    next_key_compacts(server, dbs)


def test_a_run_the_worker_no_longer_runs_is_ended_after_the_grace(
    setup: tuple[Any, GatedCompactor, FakeClock], dbs: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    server, gated, clock = setup
    key = bloated(dbs, "tenant.db")
    gate = gated.hold(key)
    server.enqueue(key)
    gate.wait_entered()
    wait_for(lambda: [r.local for r in server._scheduler.runs()] == [True], HANG_S, what="the worker's running news")

    # Given the worker lets go of the run without a word of its end (as a thread lost would)
    worker = server._worker
    with worker._cond:
        (running,) = list(worker._running)
        worker._running.discard(running)
        worker._refresh_keys_locked()
    caplog.set_level(logging.INFO)
    caplog.clear()

    # When the audit looks, then again within the grace: nothing yet (its end's news may be on its way)
    assert server._loop.call(lambda: server._audit.check(clock())).vanished == []
    clock.advance(GRACE_S / 2)
    assert server._loop.call(lambda: server._audit.check(clock())).vanished == []
    # ... and once the grace has passed (the audit's own tick, now due, may be the one that sees it)
    clock.advance(GRACE_S)
    server._loop.call(lambda: server._audit.check(clock()))

    # Then it ends failed (said once at ERROR), its slots free, the key in its backoff
    assert errors(caplog) == [
        f"the compaction of {key!r} in ratio_dbs is no longer run by this daemon's worker and its end was never "
        "heard; it is ended as failed and its slot freed"]
    assert record_of(server, key)["last_error"] == VANISHED_ERROR
    assert server.status()["channels"]["ratio_dbs"]["active"] == 0 and server._slots.busy == 0
    gate.release()
    next_key_compacts(server, dbs)


def test_a_drifted_max_jobs_count_is_counted_again(
    setup: tuple[Any, GatedCompactor, FakeClock], dbs: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    server, _, clock = setup
    caplog.set_level(logging.INFO)

    # Given the max_jobs gate counts every slot taken while nothing runs (a release lost)
    def drift() -> None:
        for _ in range(server._slots.limit):
            server._slots.acquire("ratio_dbs", force=True)

    server._loop.call(drift)
    caplog.clear()
    # When the audit looks
    repairs = server._loop.call(lambda: server._audit.check(clock()))
    # Then it counts again what the runs hold, and says so once
    assert repairs.slots == (4, 0) and server._slots.busy == 0
    assert errors(caplog) == ["the max_jobs gate counted 4 slot(s) taken while the runs hold 0; counted again as 0"]
    assert not server._loop.call(lambda: server._audit.check(clock()))
    next_key_compacts(server, dbs)
