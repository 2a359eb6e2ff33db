"""Contract: FoundationDB's size limits and the 5 second transaction age."""

from __future__ import annotations

from smoosh.store.errors import StoreError
from helpers.clocks import FakeClock


def _code(fn):
    try:
        fn()
    except StoreError as e:
        return e.code
    return None


def test_key_over_10000_bytes_is_2102(ctx):
    tr = ctx.store.create_transaction()
    big = ctx.k(b"k").ljust(10_001, b"x")
    assert _code(lambda: tr.set(big, b"")) == 2102
    assert _code(lambda: tr.set(big[:10_000], b"")) is None


def test_value_over_100000_bytes_is_2103(ctx):
    tr = ctx.store.create_transaction()
    assert _code(lambda: tr.set(ctx.k(b"k"), b"v" * 100_001)) == 2103
    assert _code(lambda: tr.set(ctx.k(b"k"), b"v" * 100_000)) is None


def test_transaction_over_10_mb_fails_commit_with_2101(ctx):
    tr = ctx.store.create_transaction()

    def fill_and_commit():
        for i in range(106):
            tr.set(ctx.k(b"big%03d" % i), b"v" * 95_000)
        tr.commit()

    assert _code(fill_and_commit) == 2101
    assert ctx.store.create_transaction().get(ctx.k(b"big000")) is None


def test_lowered_size_limit_counts_keys_values_and_conflict_ranges(ctx):
    store = ctx.make(size_limit_bytes=1000)
    tr = store.create_transaction()
    tr.set(ctx.k(b"a"), b"v" * 500)
    tr.commit()
    tr = store.create_transaction()
    tr.set(ctx.k(b"a"), b"v" * 500)
    tr.add_read_conflict_range(ctx.k(b"a") * 100, ctx.k(b"b") * 100)
    assert _code(tr.commit) == 2101


def test_transaction_older_than_the_age_limit_fails_reads_and_commit_with_1007(ctx):
    clock = FakeClock(1000.0)
    store = ctx.make(max_age_s=5.0, clock=clock)
    tr = store.create_transaction()
    tr.get(ctx.k(b"a"))
    tr.set(ctx.k(b"a"), b"1")
    clock.now += 4.9
    assert tr.get(ctx.k(b"b")) is None
    clock.now += 0.2
    assert _code(lambda: tr.get(ctx.k(b"b"))) == 1007
    assert _code(tr.commit) == 1007


def test_transact_retries_a_too_old_transaction_with_a_fresh_one(ctx):
    clock = FakeClock(1000.0)
    store = ctx.make(max_age_s=1.0, clock=clock)
    ctx.without_faults(store)  # counts attempts
    calls = []

    def body(tr):
        calls.append(1)
        tr.get(ctx.k(b"a"))
        if len(calls) == 1:
            clock.now += 2.0
        tr.set(ctx.k(b"a"), b"ok")

    store.transact(body)
    assert len(calls) == 2
    assert store.create_transaction().get(ctx.k(b"a")) == b"ok"


def test_write_only_transaction_has_no_age_limit(ctx):
    clock = FakeClock(1000.0)
    store = ctx.make(max_age_s=1.0, clock=clock)
    tr = store.create_transaction()
    tr.set(ctx.k(b"a"), b"1")
    clock.now += 10
    tr.commit()


def test_keys_at_or_after_0xff_are_outside_the_legal_range(ctx):
    tr = ctx.store.create_transaction()
    assert _code(lambda: tr.set(b"\xff/x", b"")) == 2004
