"""Job data encoding: msgpack with explicit limits; decoding refuses damaged or hostile bytes."""

from __future__ import annotations

import math

import msgpack
import pytest

from smoosh.jobs import EncodingError
from smoosh.jobs.encoding import MAX_DATA_BYTES, check_sched_time, decode_data, encode_data


def test_smoosh_job_data_round_trips() -> None:
    data = {"channel": "ratio_dbs", "key": "/data/a.db", "priority": math.inf, "progress": 0.0,
            "result": None, "size_before_bytes": 2**40, "duration_s": 1.5}
    assert decode_data(encode_data(data)) == data


@pytest.mark.parametrize(
    "raw",
    [
        b"",  # truncated
        b"\xc1",  # a reserved byte
        b"\x81\x01\x02",  # an int map key
        b"\x81\xa1a",  # a key without a value
        b"\x81\xa1a\x01\x02",  # trailing bytes
        msgpack.packb([1, 2]),  # not a map
        b"\xd6\x01abcd",  # an extension type
        b"\xdd\xff\xff\xff\xff",  # a claimed 4-billion-item array
        b"\x81\xa1a\xdb\x7f\xff\xff\xff",  # a claimed 2 GiB string
    ],
)
def test_damaged_or_hostile_bytes_raise_encoding_error(raw: bytes) -> None:
    with pytest.raises(EncodingError):
        decode_data(raw)


def test_oversized_stored_data_is_refused_before_decoding() -> None:
    with pytest.raises(EncodingError):
        decode_data(b"\x80" + b"\x00" * MAX_DATA_BYTES)


def test_deep_nesting_is_refused() -> None:
    data: dict = {}
    inner = data
    for _ in range(40):
        inner["x"] = {}
        inner = inner["x"]
    with pytest.raises(EncodingError):
        encode_data(data)


@pytest.mark.parametrize("bad", [-1, math.inf, math.nan, "5", True, None])
def test_bad_scheduled_times_raise_value_error(bad: object) -> None:
    with pytest.raises(ValueError):
        check_sched_time(bad)


def test_float_scheduled_times_are_floored() -> None:
    assert check_sched_time(7.999) == 7
    assert check_sched_time(0) == 0
