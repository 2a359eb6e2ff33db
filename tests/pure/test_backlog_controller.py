"""The backlog controller: slots follow the backlog between min_jobs and max_jobs, and back off on harm (AIMD)."""

from __future__ import annotations

import logging

import pytest

from smoosh.daemon.control.backlog import BacklogController

MiB = 2**20


def controller() -> BacklogController:
    return BacklogController(min_jobs=1, max_jobs=4, backlog_full_bytes=256 * MiB)


def test_every_slot_until_the_first_look_then_as_many_as_the_backlog_asks() -> None:
    c = controller()
    assert c.last.slots == 4  # a daemon starting on a fleet drains it as before
    # Nothing waiting: every slot stays open (they run nothing), so a burst arriving before the
    # next look (a start-up scan still running at the first look) is not held to min_jobs
    assert c.step(0, 0).slots == 4
    assert c.step(10 * MiB, 0).slots == 2  # a small backlog: min_jobs plus its share, rounded up
    assert c.step(128 * MiB, 0).slots == 3
    assert c.step(256 * MiB, 0).slots == 4
    assert c.step(10**12, 0).slots == 4


def test_harm_halves_the_slots_at_once_and_each_quiet_look_gives_one_back(caplog: pytest.LogCaptureFixture) -> None:
    c = controller()
    c.step(10**12, 0)
    with caplog.at_level(logging.INFO, logger="smoosh.daemon.control.backlog"):
        assert c.step(10**12, 3).slots == 2  # three busy results since the last look
        assert c.step(10**12, 5).slots == 1  # two more: halved again, never below min_jobs
        assert c.step(10**12, 5).slots == 2  # quiet: one back
        assert c.step(10**12, 5).slots == 3
        assert c.step(10**12, 5).slots == 4
        assert c.step(10**12, 5).slots == 4
    assert [r.getMessage() for r in caplog.records][:2] == [
        "Compactions at once: 4 -> 2 (3 compaction(s) gave up on a busy database: backing off).",
        "Compactions at once: 2 -> 1 (2 compaction(s) gave up on a busy database: backing off).",
    ]
    assert c.last.busy == 0 and c.last.for_harm == 4


def test_the_slots_are_the_fewer_of_the_backlogs_and_harms() -> None:
    c = controller()
    c.step(10**12, 0)
    c.step(10**12, 1)  # harm: 2
    d = c.step(1 * MiB, 1)  # small backlog: 2, harm recovering: 3
    assert (d.for_backlog, d.for_harm, d.slots) == (2, 3, 2)


def test_new_bounds_apply_at_the_next_look() -> None:
    c = controller()
    c.configure(min_jobs=2, max_jobs=8, backlog_full_bytes=MiB)
    assert c.step(0, 0).slots == 8
    assert c.step(MiB, 0).slots == 8
    assert c.step(MiB, 5).slots == 4  # harm halves
    assert c.step(MiB, 10).slots == 2
    assert c.step(MiB, 20).slots == 2  # never below the new min_jobs


def test_the_gate_holds_to_the_controllers_slots_but_lets_a_forced_key_up_to_max_jobs() -> None:
    from smoosh.daemon.control.slots import SlotGate

    gate = SlotGate(3)
    gate.soft_limit = 1  # what the controller lets run now
    assert gate.acquire("ratio_dbs")
    assert not gate.acquire("slack_dbs")  # the backlog asks for one
    gate.withdraw("slack_dbs")  # (out of work: it waits in line no more)
    assert gate.acquire("upgrade_dbs", forced=True)  # an operator forced its next key
    assert gate.acquire("ratio_dbs", forced=True)
    assert not gate.acquire("ratio_dbs", forced=True)  # max_jobs holds for everyone
    assert gate.in_force == 1 and gate.busy == 3


def test_a_change_with_nothing_waiting_is_not_news(caplog: pytest.LogCaptureFixture) -> None:
    c = controller()
    with caplog.at_level(logging.INFO, logger="smoosh.daemon.control.backlog"):
        c.step(10 * MiB, 0)  # a small backlog: news
        c.step(0, 0)  # drained: every slot open again, which runs nothing: not news
    assert [r.getMessage() for r in caplog.records] == [
        "Compactions at once: 4 -> 2 (backlog of 10485760 reclaimable bytes)."]
    assert c.last.slots == 4


def test_the_pace_of_shared_incremental_chunks_follows_the_backlog_gentle_when_small_brisk_when_full() -> None:
    from smoosh.daemon.control.backlog import GAP_FACTOR_BRISK, GAP_FACTOR_GENTLE

    c = controller()
    assert c.last.chunk_gap_factor == GAP_FACTOR_BRISK  # before the first look: drain as before
    assert c.step(0, 0).chunk_gap_factor == GAP_FACTOR_GENTLE  # nothing waits: no hurry
    half = c.step(128 * MiB, 0).chunk_gap_factor
    assert GAP_FACTOR_BRISK < half < GAP_FACTOR_GENTLE
    assert half == pytest.approx((GAP_FACTOR_BRISK * GAP_FACTOR_GENTLE) ** 0.5, abs=0.01)  # geometric
    assert c.step(256 * MiB, 0).chunk_gap_factor == GAP_FACTOR_BRISK
    assert c.step(10**12, 0).chunk_gap_factor == GAP_FACTOR_BRISK


def test_harm_doubles_the_gap_at_once_up_to_its_cap_and_each_quiet_look_halves_it_back() -> None:
    from smoosh.daemon.control.backlog import GAP_FACTOR_BRISK, GAP_FACTOR_MAX

    c = controller()
    c.step(10**12, 0)
    gaps = [c.step(10**12, busy).chunk_gap_factor for busy in (*range(1, 11), 10, 10, 10)]  # 10 with harm, 3 quiet
    assert gaps[:3] == [2 * GAP_FACTOR_BRISK, 4 * GAP_FACTOR_BRISK, 8 * GAP_FACTOR_BRISK]
    assert max(gaps) == GAP_FACTOR_MAX  # harm every look: stretched to the cap, never beyond
    assert gaps[-4:] == [GAP_FACTOR_MAX, GAP_FACTOR_MAX / 2, GAP_FACTOR_MAX / 4, GAP_FACTOR_MAX / 8]  # 3 quiet
    for _ in range(10):
        d = c.step(10**12, 10)
    assert d.chunk_gap_factor == GAP_FACTOR_BRISK  # quiet long enough: back to the backlog's pace


def test_lock_waits_are_harm_too_halving_the_slots_and_stretching_the_pace(caplog: pytest.LogCaptureFixture) -> None:
    from smoosh.daemon.control.backlog import GAP_FACTOR_BRISK

    c = controller()
    c.step(10**12, 0, 0)
    with caplog.at_level(logging.INFO, logger="smoosh.daemon.control.backlog"):
        d = c.step(10**12, 0, 3)  # three chunks found the application holding the write lock
    assert (d.slots, d.lock_waits, d.busy, d.chunk_gap_factor) == (2, 3, 0, 2 * GAP_FACTOR_BRISK)
    assert [r.getMessage() for r in caplog.records] == [
        "Compactions at once: 4 -> 2 (3 chunk(s) found the application holding the write lock: backing off).",
    ]
    d = c.step(10**12, 0, 3)  # none since: quiet
    assert (d.slots, d.lock_waits, d.chunk_gap_factor) == (3, 0, GAP_FACTOR_BRISK)
