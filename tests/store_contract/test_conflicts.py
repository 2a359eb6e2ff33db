"""Contract: FoundationDB's optimistic concurrency — conflict ranges, 1020, and the retry loop."""

from __future__ import annotations

import threading

import pytest

from smoosh.store.errors import StoreError

U64 = 8


def _int(b):
    return int.from_bytes(b or b"\x00", "little")


def _commit_code(tr):
    try:
        tr.commit()
    except StoreError as e:
        return e.code
    return None


def _begin(ctx):
    """A transaction with a read version (taken by a snapshot read of an unrelated key)."""
    tr = ctx.store.create_transaction()
    tr.snapshot.get(ctx.k(b"~unrelated"))
    return tr


def test_read_then_concurrent_write_fails_commit_with_1020(ctx):
    k = ctx.k
    t1 = _begin(ctx)
    assert t1.get(k(b"a")) is None
    t1.set(k(b"out"), b"1")
    ctx.store.transact(lambda tr: tr.set(k(b"a"), b"other"))
    assert _commit_code(t1) == 1020


def test_range_read_conflicts_with_a_new_key_inside_the_range(ctx):
    k = ctx.k
    ctx.store.transact(lambda tr: [tr.set(k(b"a"), b""), tr.set(k(b"c"), b"")])
    t1 = _begin(ctx)
    assert len(t1.get_range(k(b"a"), k(b"d"))) == 2
    t1.set(k(b"out"), b"1")
    ctx.store.transact(lambda tr: tr.set(k(b"b"), b"phantom"))
    assert _commit_code(t1) == 1020


def test_limited_range_read_does_not_conflict_beyond_its_last_key(ctx):
    k = ctx.k
    ctx.store.transact(lambda tr: [tr.set(k(b"a"), b""), tr.set(k(b"c"), b"")])
    t1 = _begin(ctx)
    assert len(t1.get_range(k(b"a"), k(b"z"), limit=1)) == 1
    t1.set(k(b"out"), b"1")
    ctx.store.transact(lambda tr: tr.set(k(b"y"), b"beyond"))
    assert _commit_code(t1) is None


def test_snapshot_reads_add_no_conflicts(ctx):
    k = ctx.k
    ctx.store.transact(lambda tr: tr.set(k(b"a"), b"1"))
    t1 = _begin(ctx)
    assert t1.snapshot.get(k(b"a")) == b"1"
    assert len(t1.snapshot.get_range_startswith(ctx.prefix)) == 1
    t1.set(k(b"out"), b"1")
    ctx.store.transact(lambda tr: [tr.set(k(b"a"), b"2"), tr.set(k(b"b"), b"2")])
    assert _commit_code(t1) is None


def test_add_read_conflict_key_makes_a_concurrent_write_conflict(ctx):
    k = ctx.k
    t1 = _begin(ctx)
    t1.add_read_conflict_key(k(b"a"))
    t1.set(k(b"out"), b"1")
    ctx.store.transact(lambda tr: tr.set(k(b"a"), b"other"))
    assert _commit_code(t1) == 1020


def test_add_read_conflict_range_makes_a_concurrent_write_conflict(ctx):
    k = ctx.k
    t1 = _begin(ctx)
    t1.add_read_conflict_range(k(b"a"), k(b"c"))
    t1.set(k(b"out"), b"1")
    ctx.store.transact(lambda tr: tr.set(k(b"b"), b"other"))
    assert _commit_code(t1) == 1020


def test_reading_own_write_adds_no_conflict(ctx):
    k = ctx.k
    t1 = _begin(ctx)
    t1.set(k(b"a"), b"mine")
    assert t1.get(k(b"a")) == b"mine"
    ctx.store.transact(lambda tr: tr.set(k(b"a"), b"other"))
    assert _commit_code(t1) is None
    assert ctx.store.create_transaction().get(k(b"a")) == b"mine"


def test_concurrent_read_write_transactions_on_different_keys_both_commit(ctx):
    k = ctx.k
    t1, t2 = _begin(ctx), _begin(ctx)
    t1.set(k(b"a"), (_int(t1.get(k(b"a"))) + 1).to_bytes(U64, "little"))
    t2.set(k(b"b"), (_int(t2.get(k(b"b"))) + 1).to_bytes(U64, "little"))
    assert _commit_code(t1) is None
    assert _commit_code(t2) is None


def test_write_only_transactions_never_conflict(ctx):
    k = ctx.k
    t1 = _begin(ctx)
    t1.set(k(b"a"), b"blind")
    t1.clear_range(k(b"m"), k(b"n"))
    ctx.store.transact(lambda tr: [tr.get(k(b"a")), tr.set(k(b"a"), b"other"), tr.set(k(b"m1"), b"x")])
    assert _commit_code(t1) is None
    assert ctx.store.create_transaction().get(k(b"a")) == b"blind"


def test_atomic_add_adds_no_read_conflict(ctx):
    k = ctx.k
    t1 = _begin(ctx)
    t1.add(k(b"n"), (1).to_bytes(U64, "little"))
    ctx.store.transact(lambda tr: tr.set(k(b"n"), (41).to_bytes(U64, "little")))
    assert _commit_code(t1) is None
    assert _int(ctx.store.create_transaction().get(k(b"n"))) == 42


def test_transact_retries_a_real_conflict_and_both_effects_land(ctx):
    ctx.without_faults()  # counts attempts
    k = ctx.k
    calls = []

    def body(tr):
        calls.append(1)
        n = _int(tr.get(k(b"n")))
        if len(calls) == 1:
            # Another client increments the key between our read and our commit.
            ctx.store.transact(lambda t: t.set(k(b"n"), (_int(t.get(k(b"n"))) + 1).to_bytes(U64, "little")))
        tr.set(k(b"n"), (n + 1).to_bytes(U64, "little"))

    ctx.store.transact(body)
    assert len(calls) == 2
    assert _int(ctx.store.create_transaction().get(k(b"n"))) == 2


def test_threads_incrementing_one_key_lose_no_update(ctx):
    k = ctx.k
    threads_n, per_thread = 4, 15
    barrier = threading.Barrier(threads_n)
    errors = []

    def incr(tr):
        n = _int(tr.get(k(b"n")))
        tr.set(k(b"n"), (n + 1).to_bytes(U64, "little"))

    def worker():
        try:
            barrier.wait()
            for _ in range(per_thread):
                ctx.store.transact(incr)
        except Exception as e:  # surfaced below
            errors.append(e)

    ts = [threading.Thread(target=worker) for _ in range(threads_n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert errors == []
    # Under injected faults an increment that committed but reported "may have committed"
    # runs again: none is lost, and each extra one is accounted for by such a fault.
    n = _int(ctx.store.create_transaction().get(k(b"n")))
    assert threads_n * per_thread <= n <= threads_n * per_thread + ctx.after_commit_faults()


def test_cancelled_transaction_refuses_further_use(ctx):
    tr = ctx.store.create_transaction()
    tr.cancel()
    tr.set(ctx.k(b"a"), b"1")  # a write never raises at the call; on a cancelled transaction it is ignored
    for step in (lambda: tr.get(ctx.k(b"a")), lambda: tr.snapshot.get(ctx.k(b"a")), tr.commit,
                 lambda: tr.on_error(StoreError(1020)), lambda: tr.watch(ctx.k(b"a")).wait(5.0)):
        with pytest.raises(StoreError) as e:
            step()
        assert e.value.code == 1025
    tr.reset()  # a reset transaction is usable again
    tr.set(ctx.k(b"a"), b"2")
    tr.commit()
    assert ctx.store.create_transaction().get(ctx.k(b"a")) == b"2"
