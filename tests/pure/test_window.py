"""Time windows (DESIGN §4.4, §5.3; upstream smoosh_utils t_allowed_window)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from channels.window import Window

UTC = timezone.utc
AT_0330 = datetime(2024, 5, 17, 3, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("from_", "to", "expected"),
    [
        ("02:30", "04:30", True),
        ("3:35", "3:50", False),
        ("1:20", "3:29", False),
        ("23:30", "3:52", True),
        ("23:30", "3:29", False),
        # CouchDB's default window (00:00-24:00) is open all day.
        ("00:00", "24:00", True),
    ],
)
def test_upstream_window_vectors_at_0330(from_: str, to: str, expected: bool) -> None:
    assert Window.parse(from_, to).is_open(AT_0330) is expected


@pytest.mark.parametrize(
    ("from_", "to", "bad"),
    [
        ("blah", "04:30", "blah"),
        ("X:Y", "9.5:Z", "X:Y"),
        ("02:30", "9.5:Z", "9.5:Z"),
    ],
)
def test_upstream_malformed_windows_are_errors_not_open(from_: str, to: str, bad: str) -> None:
    # Deliberate difference: CouchDB logs these and opens the window all day.
    with pytest.raises(ValueError, match=f"invalid window time '{bad}'"):
        Window.parse(from_, to)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("25:00", "invalid window time '25:00': hours must be 0-23"),
        ("24:30", "invalid window time '24:30': hours must be 0-23"),
        ("3:60", "invalid window time '3:60': minutes must be 00-59"),
        ("3:5", "invalid window time '3:5': expected H:MM or HH:MM"),
        ("03:300", "invalid window time '03:300': expected H:MM or HH:MM"),
        ("003:30", "invalid window time '003:30': expected H:MM or HH:MM"),
        ("-1:00", "invalid window time '-1:00': expected H:MM or HH:MM"),
        ("+3:00", "invalid window time '+3:00': expected H:MM or HH:MM"),
        ("3:30:00", "invalid window time '3:30:00': expected H:MM or HH:MM"),
        ("", "invalid window time '': expected H:MM or HH:MM"),
        ("\u0663:\u0663\u0660", "invalid window time '\u0663:\u0663\u0660': expected H:MM or HH:MM"),
        ("24:00", "invalid window time '24:00': 24:00 is only allowed as the end"),
    ],
)
def test_malformed_start_time_names_the_value(text: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        Window.parse(text, "12:00")
    assert str(caught.value) == message


def test_malformed_end_time_names_the_value() -> None:
    with pytest.raises(ValueError) as caught:
        Window.parse("12:00", "24:01")
    assert str(caught.value) == "invalid window time '24:01': hours must be 0-23"


def test_non_string_time_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="invalid window time None"):
        Window.parse(None, "12:00")  # type: ignore[arg-type]


def test_one_and_two_digit_hours_mean_the_same() -> None:
    assert Window.parse("3:52", "9:05") == Window.parse("03:52", "09:05")


def test_surrounding_whitespace_is_ignored() -> None:
    assert Window.parse(" 03:52 ", "\t09:05\n") == Window.parse("03:52", "09:05")


@pytest.mark.parametrize("same", ["00:00", "03:30", "12:00", "23:59"])
def test_from_equal_to_is_always_open(same: str) -> None:
    window = Window.parse(same, same)
    assert window.always_open
    for minute in range(0, 24 * 60, 7):
        now = datetime(2024, 1, 1, tzinfo=UTC) + timedelta(minutes=minute)
        assert window.is_open(now)


def at(hour: int, minute: int, second: int = 0) -> datetime:
    return datetime(2024, 1, 1, hour, minute, second, tzinfo=UTC)


def test_start_is_inclusive_and_end_exclusive() -> None:
    window = Window.parse("02:30", "04:30")
    assert not window.is_open(at(2, 29, 59))
    assert window.is_open(at(2, 30))
    assert window.is_open(at(4, 29, 59))
    assert not window.is_open(at(4, 30))


def test_window_wraps_at_midnight() -> None:
    window = Window.parse("23:30", "3:52")
    assert window.is_open(at(23, 30))
    assert window.is_open(at(0, 0))
    assert window.is_open(at(3, 51, 59))
    assert not window.is_open(at(3, 52))
    assert not window.is_open(at(23, 29))
    assert not window.always_open


def test_end_of_2400_runs_until_midnight() -> None:
    window = Window.parse("22:00", "24:00")
    assert window.is_open(at(22, 0))
    assert window.is_open(at(23, 59, 59))
    assert not window.is_open(at(0, 0))
    assert not window.is_open(at(21, 59))


def test_times_are_wall_clock_in_the_windows_timezone() -> None:
    window = Window.parse("09:00", "17:00", timezone="Europe/Berlin")
    # Winter: UTC+1. 08:30 UTC is 09:30 in Berlin; 07:30 UTC is 08:30 there.
    assert window.is_open(datetime(2024, 1, 15, 8, 30, tzinfo=UTC))
    assert not window.is_open(datetime(2024, 1, 15, 7, 30, tzinfo=UTC))
    # Summer: UTC+2. 07:30 UTC is 09:30 in Berlin.
    assert window.is_open(datetime(2024, 7, 15, 7, 30, tzinfo=UTC))
    assert not window.is_open(datetime(2024, 7, 15, 15, 0, tzinfo=UTC))


def test_now_in_another_zone_is_converted() -> None:
    window = Window.parse("02:30", "04:30")  # UTC
    tokyo = timezone(timedelta(hours=9))
    assert window.is_open(datetime(2024, 5, 17, 12, 30, tzinfo=tokyo))  # 03:30 UTC
    assert not window.is_open(datetime(2024, 5, 17, 3, 30, tzinfo=tokyo))  # 18:30 UTC


def test_naive_now_is_refused() -> None:
    with pytest.raises(ValueError, match="aware datetime"):
        Window.parse("02:30", "04:30").is_open(datetime(2024, 5, 17, 3, 30))


@pytest.mark.parametrize("zone", ["Mars/Olympus_Mons", "../etc/passwd", "/etc/localtime", ""])
def test_unknown_timezone_is_a_value_error_naming_it(zone: str) -> None:
    with pytest.raises(ValueError) as caught:
        Window.parse("02:30", "04:30", timezone=zone)
    assert str(caught.value) == f"unknown timezone {zone!r}"


def test_str_shows_times_and_zone() -> None:
    assert str(Window.parse("23:30", "3:52")) == "23:30-03:52 UTC"
    assert str(Window.parse("9:00", "24:00", "Europe/Berlin")) == "09:00-24:00 Europe/Berlin"


def test_windows_compare_and_hash_by_value() -> None:
    a = Window.parse("9:00", "17:00", "Europe/Berlin")
    b = Window.parse("09:00", "17:00", "Europe/Berlin")
    assert a == b and hash(a) == hash(b)
    assert a != Window.parse("09:00", "17:00")
    assert a != Window.parse("09:00", "17:01", "Europe/Berlin")


def test_window_built_directly_is_validated() -> None:
    assert Window(60, 120).is_open(at(1, 30))
    assert Window(60, 120, "Asia/Tokyo").is_open(datetime(2024, 1, 1, 16, 30, tzinfo=UTC))
    with pytest.raises(ValueError, match="start_min"):
        Window(1440, 10)
    with pytest.raises(ValueError, match="end_min"):
        Window(0, 1441)
    with pytest.raises(ValueError, match="unknown timezone"):
        Window(0, 60, "Nowhere/Land")


@pytest.mark.parametrize(
    ("from_", "to", "expected"),
    [
        ("02:30", "04:30", AT_0330),  # open now: now
        ("3:35", "3:50", datetime(2024, 5, 17, 3, 35, tzinfo=UTC)),  # later today
        ("1:20", "3:29", datetime(2024, 5, 18, 1, 20, tzinfo=UTC)),  # closed for today: tomorrow
        ("23:30", "3:29", datetime(2024, 5, 17, 23, 30, tzinfo=UTC)),  # wraps midnight, opens tonight
    ],
)
def test_next_open_is_now_inside_else_the_next_from(from_: str, to: str, expected: datetime) -> None:
    opening = Window.parse(from_, to).next_open(AT_0330)
    assert opening == expected
    assert Window.parse(from_, to).is_open(opening)


def test_next_open_counts_in_the_windows_zone() -> None:
    # 03:30 UTC is 05:30 in Berlin (summer): a 06:00-07:00 Berlin window opens at 04:00 UTC
    opening = Window.parse("06:00", "07:00", "Europe/Berlin").next_open(AT_0330)
    assert opening.astimezone(UTC) == datetime(2024, 5, 17, 4, 0, tzinfo=UTC)
