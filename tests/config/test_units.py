"""Sizes and durations as operators write them."""

from __future__ import annotations

import math

import pytest

from smoosh.units import format_duration, format_size, parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("1048576", 1048576),
        ("512B", 512),
        ("1KB", 1000),
        ("1kb", 1000),
        ("1MB", 1000**2),
        ("1GB", 1000**3),
        ("2TB", 2 * 1000**4),
        ("1KiB", 1024),
        ("512MiB", 536870912),
        ("512mib", 536870912),
        ("1GiB", 1024**3),
        ("1TiB", 1024**4),
        ("64 MiB", 64 * 1024**2),
        ("  64MiB  ", 64 * 1024**2),
        ("1.5KiB", 1536),
        ("0.5GiB", 536870912),
        ("536870912.0", 536870912),
    ],
)
def test_size_in_bytes(text: str, expected: int) -> None:
    value = parse_size(text)
    assert value == expected
    assert type(value) is int


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "expected a non-negative number with an optional unit"),
        ("-1", "expected a non-negative number with an optional unit"),
        ("1e6", "expected a non-negative number with an optional unit"),
        ("1K", "unknown unit 'k'"),
        ("1,000", "expected a non-negative number with an optional unit"),
        ("12 parsecs", "unknown unit 'parsecs'"),
        ("1.5B", "not a whole number of bytes"),
        ("infinity", "expected a non-negative number with an optional unit"),
        ("١٢", "expected a non-negative number with an optional unit"),
    ],
)
def test_bad_size_names_the_value(text: str, problem: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_size(text)
    assert str(info.value).startswith(f"invalid size {text!r}: ")
    assert problem in str(info.value)


def test_infinity_only_where_the_caller_allows_it() -> None:
    assert parse_size("infinity", allow_infinity=True) == math.inf
    assert parse_size("Infinity", allow_infinity=True) == math.inf
    assert parse_size("1MiB", allow_infinity=True) == 1048576


@pytest.mark.parametrize(
    ("text", "bare_unit_s", "expected"),
    [
        ("90s", 1.0, 90.0),
        ("5m", 1.0, 300.0),
        ("2h", 1.0, 7200.0),
        ("1d", 1.0, 86400.0),
        ("500ms", 1.0, 0.5),
        ("1.5h", 1.0, 5400.0),
        ("10 s", 1.0, 10.0),
        ("30", 1.0, 30.0),
        ("5", 60.0, 300.0),
        ("0", 60.0, 0.0),
        ("90S", 60.0, 90.0),
    ],
)
def test_duration_in_seconds(text: str, bare_unit_s: float, expected: float) -> None:
    assert parse_duration(text, bare_unit_s) == expected


@pytest.mark.parametrize("text", ["", "-5s", "5 minutes", "1w", "s", "5m30s"])
def test_bad_duration_names_the_value(text: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_duration(text)
    assert str(info.value).startswith(f"invalid duration {text!r}: ")


def test_log_formats_round_trip() -> None:
    assert format_size(64 * 1024**2) == "64MiB"
    assert format_size(1000) == "1000"
    assert format_size(math.inf) == "infinity"
    assert parse_size(format_size(536870912)) == 536870912
    assert format_duration(300.0) == "5m"
    assert format_duration(90.0) == "90s"
    assert format_duration(3600.0) == "1h"
    assert parse_duration(format_duration(0.5)) == 0.5
