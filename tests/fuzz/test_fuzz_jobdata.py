"""msgpack job data: random bytes decode to a dict or EncodingError; the size limits hold both ways."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzz.fuzzlib import FAST, SOAK_EXAMPLES, fuzz_settings
from smoosh.jobs import EncodingError
from smoosh.jobs.encoding import MAX_DATA_BYTES, MAX_DEPTH, decode_data, encode_data

def values(int_bits: int) -> st.SearchStrategy[object]:
    """Nested msgpack-shaped values with integers of up to ``int_bits`` bits and non-str keys."""
    return st.recursive(
        st.none() | st.booleans() | st.integers(-(2 ** (int_bits - 1)), 2 ** (int_bits - 1) - 1) | st.floats()
        | st.text(max_size=20) | st.binary(max_size=20),
        lambda inner: st.lists(inner, max_size=5) | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=8) | st.binary(max_size=4) | st.integers(-99, 99), inner, max_size=5),
        max_leaves=25,
    )


#: Values msgpack can pack (64-bit integers), for the decoding properties.
PACKABLE = values(64)
#: Values including integers msgpack cannot hold, for the encoding property.
VALUES = values(72)


def decode_property(raw: bytes) -> None:
    """Stored bytes decode to job data that could be stored again, or raise EncodingError."""
    try:
        data = decode_data(raw)
    except EncodingError:
        return
    assert isinstance(data, dict)
    # Whatever decodes is valid job data: a worker can finish the job with it plus its result.
    encode_data({**data, "result": "ok"})


def encode_property(value: object) -> None:
    """Any value encodes within the limit and round-trips, or raises EncodingError (never TypeError...)."""
    try:
        raw = encode_data(value)
    except EncodingError:
        return
    assert len(raw) <= MAX_DATA_BYTES
    # Compared packed: a NaN anywhere in the value is not equal to itself.
    packed = msgpack.packb(decode_data(raw), use_bin_type=True)
    assert packed == msgpack.packb(msgpack.unpackb(raw, raw=False), use_bin_type=True)


@fuzz_settings(FAST * 3)
@given(raw=st.binary(max_size=300))
def test_random_bytes_decode_to_job_data_or_an_encoding_error(raw: bytes) -> None:
    decode_property(raw)


@fuzz_settings(FAST * 3)
@given(value=PACKABLE)
def test_packed_random_values_decode_to_job_data_or_an_encoding_error(value: object) -> None:
    decode_property(msgpack.packb(value, use_bin_type=True))


@fuzz_settings(FAST * 3)
@given(value=VALUES | st.dictionaries(st.text(max_size=8), VALUES, max_size=6))
def test_any_value_encodes_within_limits_or_raises_an_encoding_error(value: object) -> None:
    encode_property(value)


def test_oversized_job_data_is_refused_both_ways() -> None:
    with pytest.raises(EncodingError, match="more than the limit"):
        encode_data({"blob": b"x" * MAX_DATA_BYTES})
    with pytest.raises(EncodingError, match="more than the limit"):
        decode_data(msgpack.packb({"blob": b"x" * MAX_DATA_BYTES}))


def test_length_headers_claiming_gigabytes_are_refused_without_allocating() -> None:
    for raw in (b"\xdf\xff\xff\xff\xff", b"\xdd\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff"):
        with pytest.raises(EncodingError):
            decode_data(raw)


def test_job_data_nested_deeper_than_the_limit_is_refused_both_ways() -> None:
    deep: dict = {}
    node = deep
    for _ in range(MAX_DEPTH + 1):
        node["x"] = {}
        node = node["x"]
    with pytest.raises(EncodingError, match="deeper"):
        encode_data(deep)
    with pytest.raises(EncodingError):
        decode_data(msgpack.packb(deep))


def test_stored_data_with_binary_keys_is_refused_as_damaged() -> None:
    with pytest.raises(EncodingError):
        decode_data(msgpack.packb({b"channel": "ratio_dbs"}, use_bin_type=True))


@pytest.mark.slow
@fuzz_settings(SOAK_EXAMPLES)
@given(raw=st.binary(max_size=2000))
def test_random_bytes_decode_to_job_data_or_an_encoding_error_soak(raw: bytes) -> None:
    decode_property(raw)


@pytest.mark.slow
@fuzz_settings(SOAK_EXAMPLES)
@given(value=PACKABLE)
def test_packed_random_values_decode_to_job_data_or_an_encoding_error_soak(value: object) -> None:
    decode_property(msgpack.packb(value, use_bin_type=True))
