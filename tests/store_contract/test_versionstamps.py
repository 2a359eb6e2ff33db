"""Contract: versionstamped keys and values, user versions, ``get_versionstamp``."""

from __future__ import annotations

import pytest

from smoosh.store import tuples
from smoosh.store.errors import StoreError
from smoosh.store.tuples import Versionstamp


def _stamped_commit(ctx, user_version=0):
    tr = ctx.store.create_transaction()
    tr.set_versionstamped_key(tuples.pack_with_versionstamp(("vs", Versionstamp(user_version=user_version)), ctx.prefix), b"")
    tr.commit()
    return tr.get_versionstamp()


def _stamps(ctx):
    rows = ctx.store.create_transaction().get_range(*tuples.range(("vs",), ctx.prefix))
    return [tuples.unpack(k, len(ctx.prefix))[1] for k, _ in rows]


def test_versionstamps_are_unique_and_increase_with_every_commit(ctx):
    stamps = [_stamped_commit(ctx) for _ in range(5)]
    assert all(len(s) == 10 for s in stamps)
    assert stamps == sorted(stamps)
    assert len(set(stamps)) == 5
    keyed = _stamps(ctx)
    assert [v.tr_version for v in keyed] == stamps
    assert all(v.is_complete() for v in keyed)


def test_user_versions_order_stamped_keys_written_in_one_transaction(ctx):
    tr = ctx.store.create_transaction()
    for uv in (2, 0, 1):
        tr.set_versionstamped_key(tuples.pack_with_versionstamp(("vs", Versionstamp(user_version=uv)), ctx.prefix), b"%d" % uv)
    tr.commit()
    got = _stamps(ctx)
    assert [v.user_version for v in got] == [0, 1, 2]
    assert {v.tr_version for v in got} == {tr.get_versionstamp()}


def test_versionstamped_value_receives_the_commit_stamp(ctx):
    tr = ctx.store.create_transaction()
    tr.set_versionstamped_value(ctx.k(b"v"), tuples.pack_with_versionstamp((Versionstamp(user_version=7),)))
    tr.commit()
    (stamp,) = tuples.unpack(ctx.store.create_transaction().get(ctx.k(b"v")))
    assert stamp == Versionstamp(tr.get_versionstamp(), 7)


def test_raw_fourteen_byte_operand_places_the_stamp_at_offset_zero(ctx):
    tr = ctx.store.create_transaction()
    tr.set_versionstamped_value(ctx.k(b"v"), b"\x00" * 14)
    tr.commit()
    assert ctx.store.create_transaction().get(ctx.k(b"v")) == tr.get_versionstamp()


def test_reading_back_a_versionstamped_value_is_unreadable(ctx):
    tr = ctx.store.create_transaction()
    tr.set_versionstamped_value(ctx.k(b"v"), b"\x00" * 14)
    with pytest.raises(StoreError) as e:
        tr.get(ctx.k(b"v"))
    assert e.value.code == 1036


def test_get_versionstamp_before_commit_or_after_a_read_only_commit_is_invalid(ctx):
    tr = ctx.store.create_transaction()
    tr.get(ctx.k(b"a"))
    with pytest.raises(StoreError) as e:
        tr.get_versionstamp()
    assert e.value.code == 2000
    tr.commit()
    with pytest.raises(StoreError) as e:
        tr.get_versionstamp()
    assert e.value.code == 2000


def test_versionstamp_operand_without_room_for_the_stamp_is_rejected(ctx):
    # The offset is measured from the key's own length, so the stamp's 10 bytes overrun its
    # end by one whatever the test prefix (45 bytes on FoundationDB, 2 elsewhere).
    body = ctx.k(b"x" * 12)
    offset = len(body) - 9
    tr = ctx.store.create_transaction()
    with pytest.raises(StoreError) as e:
        tr.set_versionstamped_key(body + offset.to_bytes(4, "little"), b"")
        tr.commit()
    assert e.value.code == 2000


def test_versionstamp_operand_shorter_than_the_stamp_and_its_offset_is_rejected(ctx):
    tr = ctx.store.create_transaction()
    with pytest.raises(StoreError) as e:
        tr.set_versionstamped_value(ctx.k(b"v"), b"\x00" * 9 + (0).to_bytes(4, "little"))
        tr.commit()
    assert e.value.code == 2000


def test_versionstamp_operand_that_just_fits_is_accepted(ctx):
    body = ctx.k(b"x") + b"\x00" * 10
    tr = ctx.store.create_transaction()
    tr.set_versionstamped_key(body + (len(body) - 10).to_bytes(4, "little"), b"")
    tr.commit()
    got = [k for k, _ in ctx.store.create_transaction().get_range_startswith(ctx.k(b"x"))]
    assert got == [ctx.k(b"x") + tr.get_versionstamp()]


def test_completed_stamps_from_later_commits_sort_after_earlier_ones(ctx):
    first = _stamped_commit(ctx, user_version=0xFFFF)
    second = _stamped_commit(ctx, user_version=0)
    assert tuples.pack((Versionstamp(first, 0xFFFF),)) < tuples.pack((Versionstamp(second, 0),))


def test_range_where_a_stamped_key_may_land_is_unreadable_until_commit(ctx):
    ctx.store.transact(lambda tr: tr.set(tuples.pack(("other", 1), ctx.prefix), b"x"))
    tr = ctx.store.create_transaction()
    tr.get(ctx.k(b"x"))
    tr.set_versionstamped_key(tuples.pack_with_versionstamp(("vs", Versionstamp()), ctx.prefix), b"")
    assert len(tr.get_range(*tuples.range(("other",), ctx.prefix))) == 1
    with pytest.raises(StoreError) as e:
        tr.get_range(*tuples.range(("vs",), ctx.prefix))
    assert e.value.code == 1036
