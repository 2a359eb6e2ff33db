"""Contract: ``Store.transact`` retries as FoundationDB's loop does."""

from __future__ import annotations

import random

import pytest

from helpers.codes import code_of
from smoosh.store.errors import StoreError
from smoosh.store.retry import Backoff


def test_retryable_error_runs_the_body_again(ctx):
    ctx.without_faults()  # counts attempts
    calls = []

    def body(tr):
        calls.append(1)
        if len(calls) < 3:
            raise StoreError(1020)
        tr.set(ctx.k(b"a"), b"done")
        return "result"

    assert ctx.store.transact(body) == "result"
    assert len(calls) == 3
    assert ctx.store.create_transaction().get(ctx.k(b"a")) == b"done"


def test_retry_limit_raises_the_last_retryable_error(ctx):
    ctx.without_faults()
    calls = []

    def body(tr):
        calls.append(1)
        raise StoreError(1007)

    with pytest.raises(StoreError) as e:
        ctx.store.transact(body, retry_limit=2)
    assert e.value.code == 1007
    assert len(calls) == 3


@pytest.mark.parametrize(
    "error", [StoreError(2101), StoreError(1025), StoreError(2000), StoreError(1101), ValueError("bug")], ids=str
)
def test_non_retryable_error_is_raised_at_once_with_itscode_of(ctx, error):
    ctx.without_faults()
    calls = []

    def body(tr):
        calls.append(1)
        tr.set(ctx.k(b"a"), b"never")
        raise error

    with pytest.raises(type(error)) as raised:
        ctx.store.transact(body)
    assert raised.value is error
    assert len(calls) == 1
    assert ctx.store.create_transaction().get(ctx.k(b"a")) is None


def test_retrying_past_the_timeout_raises_1031(ctx):
    def body(tr):
        raise StoreError(1020)

    with pytest.raises(StoreError) as e:
        ctx.store.transact(body, timeout_s=0.05)
    assert e.value.code == 1031
    assert not e.value.retryable


def test_writes_of_a_failed_attempt_are_discarded_before_the_retry(ctx):
    ctx.without_faults()
    calls = []

    def body(tr):
        calls.append(1)
        tr.set(ctx.k(b"attempt%d" % len(calls)), b"")
        if len(calls) == 1:
            raise StoreError(1020)

    ctx.store.transact(body)
    got = [k for k, _ in ctx.store.create_transaction().get_range_startswith(ctx.prefix)]
    assert got == [ctx.k(b"attempt2")]


def test_a_locked_store_is_reported_once_per_transaction_as_a_warning(ctx, caplog):
    # 1038 means another process held the write lock for a whole busy timeout: an operator
    # should hear of it, but a long lock must not flood the log with one line per retry.
    ctx.only("memory", "sqlite", why="FoundationDB never reports 1038")
    ctx.without_faults()
    attempts = []

    def body(tr):
        attempts.append(1)
        if len(attempts) <= 3:
            raise StoreError(1038)
        return "done"

    with caplog.at_level("DEBUG", logger="smoosh.store"):
        assert ctx.store.transact(body) == "done"
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(attempts) == 4
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "1038" in warnings[0].getMessage() and "retrying" in warnings[0].getMessage()


def test_timed_out_attempt_is_retried_on_a_fresh_transaction(ctx):
    # 1031 is outside FoundationDB's on_error set; smoosh's loop retries it (couch_jobs does).
    ctx.without_faults()
    seen = []

    def body(tr):
        seen.append(tr)
        tr.set(ctx.k(b"a"), b"%d" % len(seen))
        if len(seen) == 1:
            raise StoreError(1031)

    ctx.store.transact(body)
    assert len(seen) == 2 and seen[0] is not seen[1]
    assert ctx.store.create_transaction().get(ctx.k(b"a")) == b"2"


def test_may_have_committed_errors_are_retried_and_reported_to_on_retry(ctx):
    ctx.without_faults()
    codes = [1021, 1039, 1031, 1020]
    reported = []

    def body(tr):
        if codes:
            raise StoreError(codes.pop(0))
        tr.set(ctx.k(b"a"), b"done")
        return "ok"

    before = ctx.store.retry_stats.snapshot()
    assert ctx.store.transact(body, on_retry=lambda e: reported.append((e.code, e.maybe_committed))) == "ok"
    assert reported == [(1021, True), (1039, True), (1031, True), (1020, False)]
    after = ctx.store.retry_stats.snapshot()
    assert after["retries"] - before["retries"] == 4
    assert after["maybe_committed"] - before["maybe_committed"] == 3
    assert after["max_retries"] >= 4


def test_on_error_resets_for_a_retryable_code_and_raises_any_other(ctx):
    tr = ctx.store.create_transaction()
    tr.set(ctx.k(b"a"), b"1")
    tr.on_error(StoreError(1020))
    assert tr.get(ctx.k(b"a")) is None  # the attempt's writes are gone; the transaction is usable
    tr.set(ctx.k(b"b"), b"1")
    assert code_of(lambda: tr.on_error(StoreError(1031))) == 1031
    # An on_error that raised cancelled the transaction (FoundationDB at API >= 610): every
    # later call answers 1025, on_error included, and writes are ignored, until a reset.
    assert code_of(lambda: tr.on_error(StoreError(2101))) == 1025
    assert code_of(lambda: tr.on_error(StoreError(1020))) == 1025
    tr.set(ctx.k(b"c"), b"1")
    assert code_of(lambda: tr.get(ctx.k(b"b"))) == 1025
    assert code_of(tr.commit) == 1025
    tr.reset()
    tr.set(ctx.k(b"d"), b"1")
    tr.commit()
    assert [k for k, _ in ctx.store.create_transaction().get_range_startswith(ctx.prefix)] == [ctx.k(b"d")]


@pytest.mark.parametrize("code", [1039, 1031, 2101])
def test_on_error_raises_1039_as_a_native_transaction_does_and_cancels(ctx, code):
    # FoundationDB's predicate calls 1039 retryable, but libfdb_c without an external client
    # (bypass mode) runs native transactions, whose onError raises it: so does every store's.
    tr = ctx.store.create_transaction()
    assert code_of(lambda: tr.on_error(StoreError(code))) == code
    assert code_of(lambda: tr.get(ctx.k(b"a"))) == 1025


def test_retry_sleeps_stay_under_max_retry_delay(ctx, monkeypatch):
    ctx.only("memory", "sqlite", "faulty-memory", "faulty-sqlite", why="the binding's on_error sleeps inside libfdb_c")
    ctx.without_faults()
    slept = []
    monkeypatch.setattr("smoosh.store.retry.time.sleep", slept.append)
    attempts = []

    def body(tr):
        attempts.append(1)
        if len(attempts) <= 8:
            raise StoreError(1020 if len(attempts) % 2 else 1031)

    ctx.store.transact(body, max_retry_delay_s=0.03)
    assert len(slept) == 8
    assert all(0 <= s <= 0.03 for s in slept)


def test_backoff_doubles_from_ten_milliseconds_up_to_its_ceiling():
    class Top(random.Random):
        def random(self):
            return 1.0  # the top of the jitter: the full delay

    slept = []
    backoff = Backoff(0.1, sleep=slept.append, rng=Top())
    for _ in range(6):
        backoff.wait()
    assert slept == pytest.approx([0.01, 0.02, 0.04, 0.08, 0.1, 0.1])


def test_backoff_is_a_random_fraction_of_the_delay_and_respects_a_cap():
    slept = []
    backoff = Backoff(1.0, sleep=slept.append, rng=random.Random(3))
    for _ in range(12):
        backoff.wait()
    assert len(set(slept)) == len(slept)  # jittered: a crowd of retriers does not move in lockstep
    assert all(0 <= s <= min(1.0, 0.01 * 2**i) for i, s in enumerate(slept))
    for _ in range(20):
        backoff.wait(cap_s=0.05)
    assert all(0 <= s <= 0.05 for s in slept[12:])
