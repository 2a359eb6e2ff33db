"""The daemon's two clocks: what one ``clock`` argument means, and a wall-clock step noticed once."""

from __future__ import annotations

import time

import pytest

from helpers.clocks import FakeClock, SteppedClocks
from smoosh.clocks import STEP_THRESHOLD_S, Clocks, WallSteps

DAY_S = 86_400.0


def test_one_clock_argument_is_the_real_pair_a_test_pair_or_one_clock_for_both() -> None:
    assert Clocks.of(time.time) == Clocks(time.time, time.monotonic)
    pair = SteppedClocks()
    assert Clocks.of(pair) == Clocks(pair.wall, pair.monotonic)
    fake = FakeClock()
    assert Clocks.of(fake) == Clocks(fake, fake)  # a test's one clock, as before there were two
    clocks = Clocks()
    assert Clocks.of(clocks) is clocks
    with pytest.raises(TypeError, match="a clock must be callable"):
        Clocks.of(42)


def test_a_monotonic_moment_is_shown_in_wall_time_as_the_wall_clock_stands_now() -> None:
    pair = SteppedClocks(wall=1_700_000_000.0, monotonic=500.0)
    clocks = Clocks.of(pair)
    assert clocks.wall_at(530.0) == 1_700_000_030.0
    assert clocks.monotonic_at(1_700_000_030.0) == 530.0
    pair.step_wall(-DAY_S)  # the same moment, shown on the stepped clock
    assert clocks.wall_at(530.0) == 1_700_000_030.0 - DAY_S


@pytest.mark.parametrize("step_s", [-DAY_S, DAY_S, -3.0, 3.0])
def test_a_step_of_the_wall_clock_is_reported_once_with_its_size_and_direction(step_s: float) -> None:
    pair = SteppedClocks()
    steps = WallSteps(Clocks.of(pair))
    pair.advance(60)
    assert steps.check() is None  # time passing is no step
    pair.step_wall(step_s)
    pair.advance(1)
    assert steps.check() == step_s
    pair.advance(60)
    assert steps.check() is None  # once


def test_divergence_under_the_threshold_is_no_step_and_never_adds_up_to_one() -> None:
    pair = SteppedClocks()
    steps = WallSteps(Clocks.of(pair))
    for _ in range(10):  # NTP slewing: the wall clock gains a little at every look
        pair.step_wall(STEP_THRESHOLD_S / 4)
        pair.advance(1)
        assert steps.check() is None


def test_a_reading_both_clocks_moved_in_the_middle_of_is_taken_again() -> None:
    # Given a monotonic clock that moves on by a minute the first time it is read after the wall
    # clock (a long pause between the two readings, or a test moving both clocks meanwhile)
    pair = SteppedClocks()
    paused = [False]

    def wall() -> float:
        value = pair.wall()
        if paused[0]:
            paused[0] = False
            pair.advance(60)  # both move, as time passing does: no step
        return value

    steps = WallSteps(Clocks(wall, pair.monotonic))
    paused[0] = True
    # Then it is not taken for a step
    assert steps.check() is None
    assert steps.check() is None
