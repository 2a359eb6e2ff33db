"""Contract: FoundationDB's size limits and the 5 second transaction age.

A write beyond a limit does not raise at the call: as FoundationDB's client does, the store
defers the error to the next read and the commit (smoosh.store.base, "where errors surface").
"""

from __future__ import annotations

import pytest

from smoosh.store.errors import StoreError
from helpers.clocks import FakeClock
from helpers.codes import code_of


def _deferred(ctx, write):
    """The codes of the write itself, then of the next read, then of the commit."""
    tr = ctx.store.create_transaction()
    return code_of(lambda: write(tr)), code_of(lambda: tr.get(ctx.k(b"other"))), code_of(tr.commit)


def test_key_over_10000_bytes_is_2102(ctx):
    big = ctx.k(b"k").ljust(10_001, b"x")
    assert _deferred(ctx, lambda tr: tr.set(big, b"")) == (None, 2102, 2102)
    assert _deferred(ctx, lambda tr: tr.add(big, b"\x01")) == (None, 2102, 2102)
    assert _deferred(ctx, lambda tr: tr.set(big[:10_000], b"")) == (None, None, None)
    assert ctx.store.create_transaction().get(big[:10_000]) == b""


def test_value_over_100000_bytes_is_2103(ctx):
    assert _deferred(ctx, lambda tr: tr.set(ctx.k(b"k"), b"v" * 100_001)) == (None, 2103, 2103)
    assert _deferred(ctx, lambda tr: tr.set(ctx.k(b"k"), b"v" * 100_000)) == (None, None, None)


def test_clearing_a_key_longer_than_any_key_can_be_is_no_error(ctx):
    # No key over 10,000 bytes can exist, so there is nothing to clear: FoundationDB's client
    # skips such a clear instead of failing the transaction.
    big = ctx.k(b"k").ljust(10_001, b"x")
    assert _deferred(ctx, lambda tr: (tr.clear(big), tr.set(ctx.k(b"a"), b"1"))) == (None, None, None)
    assert ctx.store.create_transaction().get(ctx.k(b"a")) == b"1"


def test_a_deferred_error_is_the_first_and_every_read_the_commit_and_a_watch_meet_it(ctx):
    tr = ctx.store.create_transaction()
    tr.set(ctx.k(b"kept"), b"1")
    tr.set(ctx.k(b"v"), b"v" * 100_001)  # 2103: deferred, and the attempt takes no more writes
    tr.set(b"\xff/x", b"")  # would be 2004: skipped
    tr.set(ctx.k(b"ignored"), b"1")
    watch = tr.watch(ctx.k(b"w"))
    assert code_of(lambda: tr.get(ctx.k(b"kept"))) == 2103
    assert code_of(lambda: tr.snapshot.get(ctx.k(b"kept"))) == 2103
    assert code_of(lambda: tr.get_range_startswith(ctx.prefix)) == 2103
    assert code_of(lambda: watch.wait(5.0)) == 2103
    assert code_of(tr.commit) == 2103
    assert code_of(tr.commit) == 2103  # it stays until the transaction is reset
    assert ctx.store.create_transaction().get_range_startswith(ctx.prefix) == []


def test_reset_and_a_retrying_on_error_clear_a_deferred_error(ctx):
    tr = ctx.store.create_transaction()
    tr.set(b"\xff/x", b"")
    tr.reset()
    tr.set(ctx.k(b"a"), b"1")
    tr.commit()
    tr = ctx.store.create_transaction()
    tr.clear_range(ctx.k(b"b"), ctx.k(b"a"))
    tr.on_error(StoreError(1020))
    tr.set(ctx.k(b"b"), b"2")
    tr.commit()
    assert ctx.store.create_transaction().get_range_startswith(ctx.prefix) == [(ctx.k(b"a"), b"1"), (ctx.k(b"b"), b"2")]


def test_transact_raises_a_deferred_error_from_the_commit_with_itscode_of(ctx):
    ctx.without_faults()  # counts attempts
    calls = []

    def body(tr):
        calls.append(1)
        tr.set(ctx.k(b"big"), b"v" * 100_001)

    with pytest.raises(StoreError) as e:
        ctx.store.transact(body)
    assert (e.value.code, len(calls)) == (2103, 1)
    assert str(e.value) == "Value length exceeds limit (2103)"


def test_transaction_over_10_mb_fails_commit_with_2101(ctx):
    tr = ctx.store.create_transaction()

    def fill_and_commit():
        for i in range(106):
            tr.set(ctx.k(b"big%03d" % i), b"v" * 95_000)
        tr.commit()

    assert code_of(fill_and_commit) == 2101
    assert ctx.store.create_transaction().get(ctx.k(b"big000")) is None


def test_lowered_size_limit_counts_keys_values_and_conflict_ranges(ctx):
    store = ctx.make(size_limit_bytes=1000)
    tr = store.create_transaction()
    tr.set(ctx.k(b"a"), b"v" * 500)
    tr.commit()
    tr = store.create_transaction()
    tr.set(ctx.k(b"a"), b"v" * 500)
    tr.add_read_conflict_range(ctx.k(b"a") * 100, ctx.k(b"b") * 100)
    assert code_of(tr.commit) == 2101


def test_transaction_older_than_the_age_limit_fails_reads_and_commit_with_1007(ctx):
    clock = FakeClock(1000.0)
    store = ctx.make(max_age_s=5.0, clock=clock)
    tr = store.create_transaction()
    tr.get(ctx.k(b"a"))
    tr.set(ctx.k(b"a"), b"1")
    clock.now += 4.9
    assert tr.get(ctx.k(b"b")) is None
    clock.now += 0.2
    assert code_of(lambda: tr.get(ctx.k(b"b"))) == 1007
    assert code_of(tr.commit) == 1007


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
    assert _deferred(ctx, lambda tr: tr.set(b"\xff/x", b"")) == (None, 2004, 2004)
    assert _deferred(ctx, lambda tr: tr.clear(b"\xff")) == (None, 2004, 2004)
    assert _deferred(ctx, lambda tr: tr.clear_range(ctx.k(b"a"), b"\xff\x00")) == (None, 2004, 2004)
