"""Priority rules and quantization (DESIGN §5.2; upstream smoosh_server eunit vectors)."""

from __future__ import annotations

import math

import pytest

from smoosh.priority import DEFAULT_MIN_PRIORITY, compute, quantize

MiB = 1048576


# -- worked cases (upstream t_ratio_view, t_slack_view, t_no_data_view, ... and DESIGN) ----


@pytest.mark.parametrize(
    ("file", "active", "ratio", "slack", "upgrade"),
    [
        (5242880, 524288, 10.0, 0, 0),
        (1073741824, 536870911, 2.0000000037252903, 536870913, 0),
        (5242880, 1048576, 5.0, 0, 0),
        (1048576, 512000, 0, 0, 0),  # exactly 1 MiB: not eligible
        # active == 0 gives min_priority; for upgrade CouchDB also gives 2.0, we give 0.
        (5242880, 0, 2.0, 536870912, 0),
    ],
)
def test_worked_priorities(file: int, active: int, ratio: float, slack: int, upgrade: int) -> None:
    assert compute("ratio", file=file, active=active) == ratio
    assert compute("slack", file=file, active=active) == slack
    assert compute("upgrade", file=file, active=active) == upgrade


def test_design_example_ratio_is_ten() -> None:
    assert compute("ratio", file=5242880, active=524288) == 10.0


def test_slack_priority_is_an_int_of_bytes() -> None:
    result = compute("slack", file=1073741824, active=536870911)
    assert result == 536870913 and isinstance(result, int)


def test_upgrade_of_an_empty_database_is_zero() -> None:
    # Deliberate difference: CouchDB's upgrade channel gives min_priority when active == 0,
    # so it "upgraded" every empty database.
    assert compute("upgrade", file=5242880, active=0) == 0
    assert compute("upgrade", file=5242880, active=0, min_priority=7.0) == 0


def test_upgrade_needed_gives_one_even_below_min_size() -> None:
    assert compute("upgrade", file=4096, active=4096, needs_upgrade=True) == 1
    assert compute("upgrade", file=10 * MiB, active=0, needs_upgrade=True) == 1
    assert compute("upgrade", file=10 * MiB, active=MiB, needs_upgrade=False) == 0


def test_needs_upgrade_does_not_matter_to_ratio_or_slack() -> None:
    assert compute("ratio", file=4096, active=100, needs_upgrade=True) == 0
    assert compute("ratio", file=5242880, active=524288, needs_upgrade=True) == 10.0


def test_file_of_exactly_min_size_is_not_eligible() -> None:
    assert compute("ratio", file=MiB, active=1) == 0
    assert compute("ratio", file=MiB + 1, active=1) == MiB + 1
    assert compute("ratio", file=10 * MiB, active=1, min_size=10 * MiB) == 0
    # ... and this comes before the active == 0 rule.
    assert compute("ratio", file=MiB, active=0) == 0


def test_file_above_max_size_is_not_eligible() -> None:
    assert compute("ratio", file=10 * MiB, active=MiB, max_size=10 * MiB) == 10.0
    assert compute("ratio", file=10 * MiB + 1, active=MiB, max_size=10 * MiB) == 0
    assert compute("ratio", file=10 * MiB + 1, active=0, max_size=10 * MiB) == 0


def test_min_priority_is_a_strict_threshold() -> None:
    assert compute("ratio", file=4 * MiB, active=2 * MiB) == 0  # exactly 2.0
    assert compute("ratio", file=4 * MiB + 1, active=2 * MiB) > 2.0
    slack_floor = DEFAULT_MIN_PRIORITY["slack"]
    assert compute("slack", file=slack_floor + MiB, active=MiB) == 0  # exactly the floor
    assert compute("slack", file=slack_floor + MiB + 1, active=MiB) == slack_floor + 1


def test_max_priority_is_inclusive() -> None:
    assert compute("ratio", file=10 * MiB, active=MiB, max_priority=10.0) == 10.0
    assert compute("ratio", file=10 * MiB, active=MiB, max_priority=9.99) == 0
    assert compute("slack", file=2 * 10**9, active=10**9, max_priority=10**9) == 10**9
    assert compute("slack", file=2 * 10**9, active=10**9, max_priority=10**9 - 1) == 0


def test_custom_min_priority_is_threshold_and_empty_database_value() -> None:
    assert compute("ratio", file=3 * MiB, active=2 * MiB, min_priority=1.0) == 1.5
    assert compute("ratio", file=3 * MiB, active=0, min_priority=1.0) == 1.0
    assert compute("slack", file=3 * MiB, active=0, min_priority=1000) == 1000


def test_min_changes_comes_first() -> None:
    kwargs = dict(file=5242880, active=524288, min_changes=100)
    assert compute("ratio", changes=99, **kwargs) == 0
    assert compute("ratio", changes=100, **kwargs) == 10.0
    assert compute("ratio", changes=None, **kwargs) == 10.0  # unknown: the rule is skipped
    assert compute("upgrade", changes=99, needs_upgrade=True, **kwargs) == 0
    assert compute("ratio", file=5242880, active=524288, changes=0, min_changes=0) == 10.0


def test_default_min_priorities() -> None:
    assert DEFAULT_MIN_PRIORITY == {"ratio": 2.0, "slack": 536870912, "upgrade": 2.0}


def test_unknown_method_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown priority method 'size'"):
        compute("size", file=5242880, active=524288)


# -- quantize (upstream quantize_test, DESIGN §5.2) ----------------------------------------


@pytest.mark.parametrize(
    ("x", "expected"),
    [
        (0, 0),
        (1, 1),
        (0.0, 0.0),
        (16.0, 16),
        (15.0, 15.0),
        (0.01, 0.0),
        (0.1, 0.125),
        (0.1042, 0.125),
        (0.125111, 0.125),
        (10.0002, 10.0),
    ],
)
def test_upstream_quantize_vectors(x: float, expected: float) -> None:
    result = quantize(x)
    assert result == expected
    assert type(result) is type(expected)


def test_large_floats_become_ints() -> None:
    assert quantize(2.0000000037252903e9) == 2000000004
    assert type(quantize(16.0)) is int and type(quantize(15.999)) is float


def test_halves_round_away_from_zero() -> None:
    # Python's round() would give 16, 18, 0.0 and -0.0 (banker's rounding).
    assert quantize(16.5) == 17
    assert quantize(17.5) == 18
    assert quantize(1 / 32) == 0.0625  # x * 16 == 0.5
    assert quantize(-1 / 32) == -0.0625
    assert quantize(3 / 32) == 0.125  # x * 16 == 1.5
    assert quantize(0.49999999999999994 / 16) == 0.0  # just below a half stays down


def test_ints_and_infinities_are_unchanged() -> None:
    assert quantize(536870913) == 536870913
    assert quantize(math.inf) == math.inf
    assert quantize(-math.inf) == -math.inf


def test_quantize_refuses_nan_and_non_numbers() -> None:
    with pytest.raises(ValueError, match="NaN"):
        quantize(math.nan)
    with pytest.raises(TypeError):
        quantize("1.5")  # type: ignore[arg-type]


def test_compute_then_quantize_matches_the_queue_priorities() -> None:
    assert quantize(compute("ratio", file=1073741824, active=536870911)) == 2.0
    assert quantize(compute("ratio", file=5242880, active=524288)) == 10.0
    assert quantize(compute("slack", file=1073741824, active=536870911)) == 536870913
