"""Checkpoint bytes: random, mutated and well-framed hostile files give a dict or CorruptCheckpoint, fast.

The mutated files keep a valid header and CRC around a hostile msgpack payload, so the decoder
itself is exercised, not only the CRC in front of it.
"""

from __future__ import annotations

import math
import struct
import time
import zlib
from pathlib import Path

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzz.fuzzlib import FAST, SOAK_EXAMPLES, fuzz_settings
from persist import CorruptCheckpoint, read_checkpoint, write_checkpoint
from persist.checkpoint import FORMAT_VERSION, HEADER_SIZE, MAGIC

#: A read of a fuzzed file (at most a few KiB) must end within this many seconds: no hang.
READ_LIMIT_S = 2.0

_HEADER = struct.Struct(">8sHIQ")

MSGPACK_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats() | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8) | st.integers(-99, 99), inner, max_size=5),
    max_leaves=20,
)

QUEUES = st.dictionaries(
    st.text(min_size=1, max_size=40).filter(lambda k: not any(0xD800 <= ord(c) <= 0xDFFF for c in k)),
    st.floats(allow_nan=False) | st.integers(-(2**63), 2**63 - 1),
    max_size=30,
)


def framed(payload: bytes, *, version: int = FORMAT_VERSION) -> bytes:
    """A checkpoint file around ``payload`` with a correct header and CRC."""
    return _HEADER.pack(MAGIC, version, zlib.crc32(payload), len(payload)) + payload


def read_bytes(tmp: Path, raw: bytes) -> dict[str, float] | None:
    """The property: read ``raw`` as a checkpoint -> dict of str -> number, or None for CorruptCheckpoint."""
    path = tmp / "fuzz.smooshq"
    path.write_bytes(raw)
    t0 = time.monotonic()
    try:
        result = read_checkpoint(path)
    except CorruptCheckpoint as e:
        assert e.path == str(path) and e.reason
        result = None
    assert time.monotonic() - t0 < READ_LIMIT_S, "read_checkpoint took too long on a small file"
    if result is not None:
        assert isinstance(result, dict)
        for key, priority in result.items():
            assert type(key) is str
            assert type(priority) in (int, float) and not (isinstance(priority, float) and math.isnan(priority))
    return result


@fuzz_settings(FAST * 3)
@given(raw=st.binary(max_size=200))
def test_random_bytes_read_as_a_queue_or_corrupt(raw: bytes, tmp_path: Path) -> None:
    read_bytes(tmp_path, raw)


@fuzz_settings(FAST * 3)
@given(raw=st.binary(max_size=200), prefix=st.integers(0, HEADER_SIZE))
def test_bytes_behind_a_valid_magic_read_as_a_queue_or_corrupt(raw: bytes, prefix: int, tmp_path: Path) -> None:
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(raw))[:prefix]
    read_bytes(tmp_path, header + raw)


@fuzz_settings(FAST * 3)
@given(value=MSGPACK_VALUES, version=st.sampled_from([FORMAT_VERSION, FORMAT_VERSION, 0, 2, 65535]))
def test_a_hostile_payload_with_a_correct_crc_reads_as_a_queue_or_corrupt(value: object, version: int, tmp_path: Path) -> None:
    payload = msgpack.packb(value, use_bin_type=True)
    read_bytes(tmp_path, framed(payload, version=version))


@fuzz_settings(FAST * 3)
@given(queue=QUEUES, data=st.data())
def test_a_mutated_valid_checkpoint_reads_back_whole_or_corrupt(queue: dict, data: st.DataObject, tmp_path: Path) -> None:
    path = tmp_path / "valid.smooshq"
    write_checkpoint(path, queue)
    raw = bytearray(path.read_bytes()) if queue else bytearray()
    if not raw:
        assert read_checkpoint(path) == {}
        return
    assert read_checkpoint(path) == queue
    mutation = data.draw(st.sampled_from(["flip", "truncate", "extend", "reframe"]))
    if mutation == "flip":
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] ^= data.draw(st.integers(1, 255))
    elif mutation == "truncate":
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
    elif mutation == "extend":
        raw += data.draw(st.binary(min_size=1, max_size=20))
    else:  # damage the payload, then fix the CRC and length so the decoder has to judge it
        payload = bytearray(raw[HEADER_SIZE:])
        i = data.draw(st.integers(0, len(payload) - 1))
        payload[i] ^= data.draw(st.integers(1, 255))
        raw = bytearray(framed(bytes(payload)))
    result = read_bytes(tmp_path, bytes(raw))
    if result is not None and mutation != "reframe":
        # The CRC guards everything: a damaged file is never read as a different queue.
        assert result == queue


def test_a_zero_length_or_header_only_file_is_corrupt(tmp_path: Path) -> None:
    assert read_bytes(tmp_path, b"") is None
    assert read_bytes(tmp_path, MAGIC) is None
    assert read_bytes(tmp_path, framed(b"")) is None


def test_a_payload_claiming_a_huge_chunk_is_refused_without_allocating(tmp_path: Path) -> None:
    # An array header of 2**32-1 chunks, then a map header of 2**32-1 entries: only limits stop it.
    payload = b"\xdd\xff\xff\xff\xff" + b"\xdf\xff\xff\xff\xff"
    assert read_bytes(tmp_path, framed(payload)) is None
    # A string header claiming 4 GiB.
    assert read_bytes(tmp_path, framed(b"\x91\x81\xdb\xff\xff\xff\xff")) is None


@pytest.mark.slow
@fuzz_settings(SOAK_EXAMPLES)
@given(value=MSGPACK_VALUES, version=st.sampled_from([FORMAT_VERSION, 2]))
def test_a_hostile_payload_with_a_correct_crc_reads_as_a_queue_or_corrupt_soak(value: object, version: int, tmp_path: Path) -> None:
    payload = msgpack.packb(value, use_bin_type=True)
    read_bytes(tmp_path, framed(payload, version=version))


@pytest.mark.slow
@fuzz_settings(SOAK_EXAMPLES)
@given(raw=st.binary(max_size=2000))
def test_random_bytes_read_as_a_queue_or_corrupt_soak(raw: bytes, tmp_path: Path) -> None:
    read_bytes(tmp_path, raw)
