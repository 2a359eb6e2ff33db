"""Contract: key order, point and range reads, selectors, clears and read-your-writes."""

from __future__ import annotations

import pytest

from smoosh.store import KeySelector as KS
from smoosh.store.errors import StoreError


def _fill(ctx, names):
    def body(tr):
        for n in names:
            tr.set(ctx.k(n), b"v" + n)

    ctx.store.transact(body)


def _keys(ctx, pairs):
    return [k[len(ctx.prefix) :] for k, _ in pairs]


def test_get_returns_committed_value_and_none_for_missing(ctx):
    ctx.store.transact(lambda tr: tr.set(ctx.k(b"a"), b"1"))
    tr = ctx.store.create_transaction()
    assert tr.get(ctx.k(b"a")) == b"1"
    assert tr.get(ctx.k(b"zz")) is None


def test_keys_order_as_unsigned_bytes_with_prefix_first(ctx):
    names = [b"\x02", b"\x01\x00", b"\x00\xff", b"\x01", b"\xfe", b"\x80"]
    _fill(ctx, names)
    got = ctx.store.transact(lambda tr: tr.get_range_startswith(ctx.prefix))
    assert _keys(ctx, got) == [b"\x00\xff", b"\x01", b"\x01\x00", b"\x02", b"\x80", b"\xfe"]


def test_get_range_with_bytes_limit_and_reverse(ctx):
    _fill(ctx, [b"a", b"b", b"c", b"d", b"e"])
    tr = ctx.store.create_transaction()
    assert _keys(ctx, tr.get_range(ctx.k(b"b"), ctx.k(b"d"))) == [b"b", b"c"]
    assert _keys(ctx, tr.get_range(ctx.k(b"a"), ctx.k(b"z"), limit=2)) == [b"a", b"b"]
    assert _keys(ctx, tr.get_range(ctx.k(b"a"), ctx.k(b"z"), limit=2, reverse=True)) == [b"e", b"d"]
    assert _keys(ctx, tr.get_range(ctx.k(b"a"), ctx.k(b"z"), reverse=True)) == [b"e", b"d", b"c", b"b", b"a"]
    assert tr.get_range(ctx.k(b"d"), ctx.k(b"b")) == []
    assert tr.get_range(ctx.k(b"c"), ctx.k(b"c")) == []
    assert tr.get_range(ctx.k(b"b"), ctx.k(b"c"))[0] == (ctx.k(b"b"), b"vb")


def test_get_range_with_all_four_selector_forms(ctx):
    _fill(ctx, [b"a", b"b", b"c", b"d", b"e"])
    tr = ctx.store.create_transaction()
    k = ctx.k
    assert _keys(ctx, tr.get_range(KS.first_greater_or_equal(k(b"b")), KS.first_greater_or_equal(k(b"d")))) == [b"b", b"c"]
    assert _keys(ctx, tr.get_range(KS.first_greater_than(k(b"b")), KS.first_greater_than(k(b"d")))) == [b"c", b"d"]
    assert _keys(ctx, tr.get_range(KS.last_less_than(k(b"b")), KS.last_less_than(k(b"d")))) == [b"a", b"b"]
    assert _keys(ctx, tr.get_range(KS.last_less_or_equal(k(b"b")), KS.last_less_or_equal(k(b"d")))) == [b"b", b"c"]
    # Offsets move the resolved key.
    assert _keys(ctx, tr.get_range(KS.first_greater_or_equal(k(b"a")) + 1, KS.first_greater_or_equal(k(b"a")) + 3)) == [b"b", b"c"]
    assert _keys(ctx, tr.get_range(KS.last_less_than(k(b"e")) - 1, k(b"e"))) == [b"c", b"d"]
    # Selector keys need not exist.
    assert _keys(ctx, tr.get_range(KS.first_greater_than(k(b"bb")), k(b"z"), limit=1)) == [b"c"]
    assert _keys(ctx, tr.get_range(k(b"a"), KS.first_greater_or_equal(k(b"b")) + 2, reverse=True, limit=2)) == [b"c", b"b"]


def test_get_key_resolves_selectors_and_offsets(ctx):
    _fill(ctx, [b"a", b"c", b"e"])
    tr = ctx.store.create_transaction()
    k = ctx.k
    assert tr.get_key(KS.first_greater_or_equal(k(b"c"))) == k(b"c")
    assert tr.get_key(KS.first_greater_than(k(b"c"))) == k(b"e")
    assert tr.get_key(KS.last_less_than(k(b"c"))) == k(b"a")
    assert tr.get_key(KS.last_less_or_equal(k(b"c"))) == k(b"c")
    assert tr.get_key(KS.last_less_or_equal(k(b"d"))) == k(b"c")
    assert tr.get_key(KS.first_greater_or_equal(k(b"b")) + 1) == k(b"e")
    assert tr.get_key(KS.last_less_or_equal(k(b"e")) - 2) == k(b"a")
    assert tr.snapshot.get_key(KS.first_greater_than(k(b"a"))) == k(b"c")


def test_selectors_off_the_ends_resolve_to_keyspace_bounds(ctx):
    ctx.only("memory", "sqlite", why="the keyspace ends are shared with other data on a cluster")
    _fill(ctx, [b"a", b"b"])
    tr = ctx.store.create_transaction()
    k = ctx.k
    assert tr.get_key(KS.last_less_than(k(b"a"))) == b""
    assert tr.get_key(KS.first_greater_than(k(b"b"))) == b"\xff"
    assert tr.get_key(KS.first_greater_or_equal(k(b"a")) + 10) == b"\xff"
    assert tr.get_key(KS.last_less_or_equal(k(b"b")) - 10) == b""
    assert _keys(ctx, tr.get_range(KS.last_less_than(k(b"a")) - 5, KS.first_greater_than(k(b"b")) + 5)) == [b"a", b"b"]
    assert _keys(ctx, tr.get_range(b"", b"\xff", reverse=True)) == [b"b", b"a"]


def test_clear_and_clear_range_remove_keys(ctx):
    _fill(ctx, [b"a", b"b", b"c", b"d", b"e"])

    def body(tr):
        tr.clear(ctx.k(b"a"))
        tr.clear_range(ctx.k(b"b"), ctx.k(b"d"))
        tr.clear(ctx.k(b"missing"))

    ctx.store.transact(body)
    got = ctx.store.transact(lambda tr: tr.get_range_startswith(ctx.prefix))
    assert _keys(ctx, got) == [b"d", b"e"]
    ctx.store.transact(lambda tr: tr.clear_range_startswith(ctx.prefix))
    assert ctx.store.transact(lambda tr: tr.get_range_startswith(ctx.prefix)) == []


def test_interleaved_writes_commit_with_the_effect_of_their_issue_order(ctx):
    # Stores may fold a commit's mutations into a net effect per key; the result must be
    # what applying them one by one, in order, gives.
    _fill(ctx, [b"a", b"b", b"c", b"n"])
    k = ctx.k

    def body(tr):
        tr.set(k(b"a"), b"1")
        tr.clear(k(b"a"))
        tr.set(k(b"a"), b"2")  # set, clear, set: 2
        tr.set(k(b"b"), b"kept?")
        tr.clear_range(k(b"b"), k(b"c"))  # clears the b written above
        tr.set(k(b"bz"), b"after")  # inside the cleared range, written after it
        tr.clear(k(b"c"))
        tr.set(k(b"d"), b"x")
        tr.clear(k(b"d"))  # a new key set then cleared: absent
        tr.add(k(b"n"), (1).to_bytes(2, "little"))
        tr.set(k(b"n"), (7).to_bytes(2, "little"))
        tr.add(k(b"n"), (1).to_bytes(2, "little"))  # set then add: 8

    ctx.store.transact(body)
    got = dict(ctx.store.transact(lambda tr: tr.get_range_startswith(ctx.prefix)))
    assert got == {k(b"a"): b"2", k(b"bz"): b"after", k(b"n"): (8).to_bytes(2, "little")}


def test_a_commit_of_hundreds_of_sets_and_clears_applies_them_all(ctx):
    names = [b"k%04d" % i for i in range(300)]
    ctx.store.transact(lambda tr: [tr.set(ctx.k(n), n) for n in names])
    ctx.store.transact(lambda tr: [tr.clear(ctx.k(n)) for n in names[::2]])
    got = ctx.store.transact(lambda tr: tr.get_range_startswith(ctx.prefix))
    assert got == [(ctx.k(n), n) for n in names[1::2]]


def test_clear_range_with_begin_after_end_is_inverted_range(ctx):
    # Deferred, as FoundationDB's client defers every write's error: the call returns, the
    # next read and the commit raise it. A read conflict range is checked at the call.
    tr = ctx.store.create_transaction()
    tr.clear_range(ctx.k(b"b"), ctx.k(b"a"))
    for step in (lambda: tr.get(ctx.k(b"a")), tr.commit):
        with pytest.raises(StoreError) as e:
            step()
        assert e.value.code == 2005
    tr = ctx.store.create_transaction()
    with pytest.raises(StoreError) as e:
        tr.add_read_conflict_range(ctx.k(b"b"), ctx.k(b"a"))
    assert e.value.code == 2005


def test_reads_see_own_sets_clears_and_cleared_ranges(ctx):
    _fill(ctx, [b"a", b"b", b"c", b"d"])
    tr = ctx.store.create_transaction()
    k = ctx.k
    tr.set(k(b"bb"), b"new")
    tr.clear(k(b"a"))
    tr.clear_range(k(b"c"), k(b"d"))
    tr.set(k(b"c2"), b"after-clear")
    assert tr.get(k(b"bb")) == b"new"
    assert tr.get(k(b"a")) is None
    assert tr.get(k(b"c")) is None
    assert tr.get(k(b"c2")) == b"after-clear"
    assert tr.snapshot.get(k(b"bb")) == b"new"
    assert _keys(ctx, tr.get_range_startswith(ctx.prefix)) == [b"b", b"bb", b"c2", b"d"]
    assert _keys(ctx, tr.get_range_startswith(ctx.prefix, reverse=True, limit=3)) == [b"d", b"c2", b"bb"]
    assert tr.get_key(KS.first_greater_than(k(b"b"))) == k(b"bb")
    assert tr.get_key(KS.last_less_than(k(b"d"))) == k(b"c2")
    # Other transactions do not see the buffered writes until commit.
    other = ctx.store.create_transaction()
    assert other.get(k(b"bb")) is None
    tr.commit()
    assert ctx.store.create_transaction().get(k(b"bb")) == b"new"


def test_atomic_add_then_read_sees_the_sum(ctx):
    k = ctx.k
    ctx.store.transact(lambda tr: tr.set(k(b"n"), (5).to_bytes(8, "little")))
    tr = ctx.store.create_transaction()
    tr.add(k(b"n"), (3).to_bytes(8, "little"))
    tr.add(k(b"n"), (2).to_bytes(8, "little"))
    assert int.from_bytes(tr.get(k(b"n")), "little") == 10
    assert dict(tr.get_range_startswith(ctx.prefix))[k(b"n")] == (10).to_bytes(8, "little")
    tr.commit()
    assert ctx.store.create_transaction().get(k(b"n")) == (10).to_bytes(8, "little")


def test_atomic_add_wraps_and_uses_param_width(ctx):
    k = ctx.k

    def body(tr):
        tr.add(k(b"missing"), (7).to_bytes(4, "little"))
        tr.add(k(b"wrap"), b"\xff\xff")
        tr.add(k(b"wide"), b"\x01\x00\x00")

    ctx.store.transact(lambda tr: [tr.set(k(b"wrap"), b"\x02\x00"), tr.set(k(b"wide"), b"\xff")])
    tr = ctx.store.create_transaction()  # once, outside a retry loop: atomic adds are not idempotent
    body(tr)
    tr.commit()
    tr = ctx.store.create_transaction()
    assert tr.get(k(b"missing")) == (7).to_bytes(4, "little")
    assert tr.get(k(b"wrap")) == b"\x01\x00"  # 2 + 0xffff wraps at 16 bits
    assert tr.get(k(b"wide")) == b"\x00\x01\x00"  # zero-extended to the param's width


def test_atomic_add_truncates_a_longer_value(ctx):
    k = ctx.k
    ctx.without_faults()  # a replayed add would add twice
    ctx.store.transact(lambda tr: tr.set(k(b"n"), b"\x01\x02\x03\x04"))
    ctx.store.transact(lambda tr: tr.add(k(b"n"), b"\x01\x00"))
    assert ctx.store.create_transaction().get(k(b"n")) == b"\x02\x02"


def test_transaction_reads_from_one_snapshot(ctx):
    k = ctx.k
    ctx.store.transact(lambda tr: [tr.set(k(b"a"), b"1"), tr.set(k(b"b"), b"1")])
    tr = ctx.store.create_transaction()
    assert tr.get(k(b"a")) == b"1"
    ctx.store.transact(lambda t: [t.set(k(b"b"), b"2"), t.set(k(b"c"), b"2")])
    assert tr.get(k(b"b")) == b"1"
    assert _keys(ctx, tr.snapshot.get_range_startswith(ctx.prefix)) == [b"a", b"b"]


def test_committed_transaction_must_be_reset_before_reuse(ctx):
    tr = ctx.store.create_transaction()
    tr.set(ctx.k(b"a"), b"1")
    tr.commit()
    tr.reset()
    assert tr.get(ctx.k(b"a")) == b"1"
