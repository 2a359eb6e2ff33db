"""Contract: watches fire when a key's committed value changes, and fail as FoundationDB's do."""

from __future__ import annotations

import pytest

from smoosh.store.errors import StoreError

#: Generous bound for a watch that must fire (FoundationDB delivers them asynchronously).
FIRE_S = 5.0
#: How long a watch that must NOT fire is given (longer than the SQLite poller's period).
QUIET_S = 0.2


def _watch(ctx, key):
    tr = ctx.store.create_transaction()
    w = tr.watch(key)
    tr.commit()
    return w


def test_watch_fires_when_another_transaction_changes_the_key(ctx):
    k = ctx.k(b"w")
    ctx.store.transact(lambda tr: tr.set(k, b"1"))
    w = _watch(ctx, k)
    assert not w.is_ready()
    ctx.store.transact(lambda tr: tr.set(k, b"2"))
    assert w.wait(FIRE_S) is True
    assert w.is_ready()


def test_watch_fires_when_the_key_is_cleared_or_created(ctx):
    k = ctx.k(b"w")
    w_created = _watch(ctx, k)
    ctx.store.transact(lambda tr: tr.set(k, b"now"))
    assert w_created.wait(FIRE_S)
    w_cleared = _watch(ctx, k)
    ctx.store.transact(lambda tr: tr.clear_range_startswith(ctx.prefix))
    assert w_cleared.wait(FIRE_S)


def test_watch_does_not_fire_when_the_same_value_is_written(ctx):
    k = ctx.k(b"w")
    ctx.store.transact(lambda tr: tr.set(k, b"same"))
    w = _watch(ctx, k)
    ctx.store.transact(lambda tr: tr.set(k, b"same"))
    assert w.wait(QUIET_S) is False
    ctx.store.transact(lambda tr: tr.set(k, b"different"))
    assert w.wait(FIRE_S) is True


def test_watch_baseline_is_the_transactions_own_write(ctx):
    k = ctx.k(b"w")
    tr = ctx.store.create_transaction()
    tr.set(k, b"mine")
    w = tr.watch(k)
    tr.commit()
    assert w.wait(QUIET_S) is False
    ctx.store.transact(lambda t: t.add(k, b"\x01"))
    assert w.wait(FIRE_S)


def test_watch_fires_at_once_if_the_key_changed_after_the_read_version(ctx):
    k = ctx.k(b"w")
    tr = ctx.store.create_transaction()
    assert tr.get(k) is None
    w = tr.watch(k)
    ctx.store.transact(lambda t: t.set(k, b"meanwhile"))
    tr.commit()
    assert w.wait(FIRE_S)


def test_cancelled_watch_raises_1101(ctx):
    w = _watch(ctx, ctx.k(b"w"))
    w.cancel()
    with pytest.raises(StoreError) as e:
        w.wait(FIRE_S)
    assert e.value.code == 1101


@pytest.mark.parametrize("end", ["cancel", "reset", "drop"])
def test_watch_of_a_transaction_that_never_commits_raises_1025(ctx, end):
    import gc

    tr = ctx.store.create_transaction()
    w = tr.watch(ctx.k(b"w"))
    if end == "drop":  # abandoned: the garbage collector ends it
        del tr
        gc.collect()
    else:
        getattr(tr, end)()
    with pytest.raises(StoreError) as e:
        w.wait(FIRE_S)
    assert e.value.code == 1025


def test_watch_of_a_transaction_that_fails_to_commit_raises_its_error(ctx):
    k = ctx.k(b"w")
    tr = ctx.store.create_transaction()
    tr.get(k)
    tr.set(ctx.k(b"x"), b"")
    w = tr.watch(k)
    ctx.store.transact(lambda t: t.set(k, b"conflict"))
    with pytest.raises(StoreError):
        tr.commit()
    with pytest.raises(StoreError) as e:
        w.wait(FIRE_S)
    assert e.value.code == 1020


def test_watches_beyond_the_limit_raise_1032(ctx):
    store = ctx.make(max_watches=2)
    tr = store.create_transaction()
    ws = [tr.watch(ctx.k(b"w%d" % i)) for i in range(3)]
    tr.commit()
    assert not ws[0].is_ready() and not ws[1].is_ready()
    with pytest.raises(StoreError) as e:
        ws[2].wait(0)
    assert e.value.code == 1032
    ws[0].cancel()  # frees a slot
    tr2 = store.create_transaction()
    w = tr2.watch(ctx.k(b"w9"))
    tr2.commit()
    assert not w.is_ready()
