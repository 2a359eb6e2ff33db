"""The tuple layer without the native client: bytes identical to fdb.tuple's, versionstamps included."""

from __future__ import annotations

import struct
import uuid

import fdb.tuple as fdbtuple
import pytest

from smoosh.store import tuples
from smoosh.store.tuples import Versionstamp

STAMP = bytes(range(1, 11))


def test_incomplete_versionstamp_layout_matches_the_reference_example():
    packed = tuples.pack_with_versionstamp((b"k", Versionstamp()))
    assert packed.hex() == "016b00" + "33" + "ff" * 10 + "0000" + "04000000"


@pytest.mark.parametrize(
    "t",
    [
        (),
        (b"k", "jobs", 0, 1, -1, 255, -256, 2**64, -(2**64), 1.5, True, False, None),
        (("nested", None, (b"\x00",)), "x\x00y"),
        (uuid.UUID(int=5),),
    ],
)
def test_pack_is_byte_identical_to_the_binding_and_round_trips(t):
    assert tuples.pack(t) == fdbtuple.pack(t)
    assert tuples.pack(t, prefix=b"P") == b"P" + fdbtuple.pack(t)
    assert tuples.unpack(tuples.pack(t)) == t
    assert tuples.unpack(tuples.pack(t, prefix=b"PP"), prefix_len=2) == t


def test_complete_versionstamp_packs_and_round_trips():
    t = ("act", Versionstamp(STAMP, 0xFFFF), (Versionstamp(STAMP, 1),))
    packed = tuples.pack(t)
    assert packed[:6] == b"\x02act\x00\x33"
    assert packed[6:18] == STAMP + b"\xff\xff"
    assert tuples.unpack(packed) == t


def test_offset_of_a_nested_incomplete_stamp_counts_the_prefix():
    packed = tuples.pack_with_versionstamp(("a", (1, Versionstamp(user_version=3))), prefix=b"P")
    body, (offset,) = packed[:-4], struct.unpack("<L", packed[-4:])
    assert body[offset - 1] == 0x33
    assert body[offset : offset + 12] == b"\xff" * 10 + b"\x00\x03"
    completed = body[:offset] + STAMP + body[offset + 10 :]
    assert tuples.unpack(completed, prefix_len=1) == ("a", (1, Versionstamp(STAMP, 3)))


def test_misused_versionstamps_are_rejected():
    with pytest.raises(ValueError):
        tuples.pack((Versionstamp(),))
    with pytest.raises(ValueError):
        tuples.pack_with_versionstamp((b"no stamp",))
    with pytest.raises(ValueError):
        tuples.pack_with_versionstamp((Versionstamp(), Versionstamp(user_version=1)))


def test_packed_ints_and_strings_sort_in_value_order():
    ints = [-(2**70), -300, -1, 0, 1, 255, 256, 2**40, 2**70]
    assert sorted(ints, key=lambda i: tuples.pack((i,))) == ints
    strs = ["", "a", "a\x00", "ab", "b", "\u00e9"]
    assert sorted(strs, key=lambda s: tuples.pack((s,))) == strs
    assert tuples.pack(("a", 2)) < tuples.pack(("a", 10)) < tuples.pack(("b",))


def test_stamps_sort_by_commit_then_user_version():
    later = bytes(9) + b"\x02"
    earlier = bytes(9) + b"\x01"
    keys = [
        tuples.pack((Versionstamp(later, 0),)),
        tuples.pack((Versionstamp(earlier, 0xFFFF),)),
        tuples.pack((Versionstamp(earlier, 0),)),
    ]
    assert sorted(keys) == keys[::-1]


def test_range_covers_extensions_of_the_tuple_only():
    begin, end = tuples.range(("jobs", "t"), prefix=b"P")
    inside = tuples.pack(("jobs", "t", 1), prefix=b"P")
    assert begin <= inside < end
    assert not begin <= tuples.pack(("jobs", "t"), prefix=b"P") < end
    assert not begin <= tuples.pack(("jobs", "u", 1), prefix=b"P") < end


def test_values_that_compare_equal_but_encode_differently_never_share_a_cached_encoding():
    # The pack cache keys on (type, value): True == 1, 1.0 == 1 and -0.0 == 0.0 in Python.
    for first, second in ((1, True), (True, 1), (1, 1.0), (0.0, -0.0), ("a", b"a"), (0, False)):
        for value in (first, second, first):
            assert tuples.pack((value,)) == fdbtuple.pack((value,)), value
            assert tuples.pack(("x", (value, None))) == fdbtuple.pack(("x", (value, None))), value
