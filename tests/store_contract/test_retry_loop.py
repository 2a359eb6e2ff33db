"""Contract: ``Store.transact`` retries as FoundationDB's loop does."""

from __future__ import annotations

import pytest

from smoosh.store.errors import StoreError


def test_retryable_error_runs_the_body_again(ctx):
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
    calls = []

    def body(tr):
        calls.append(1)
        raise StoreError(1007)

    with pytest.raises(StoreError) as e:
        ctx.store.transact(body, retry_limit=2)
    assert e.value.code == 1007
    assert len(calls) == 3


@pytest.mark.parametrize("error", [StoreError(2101), ValueError("bug")])
def test_non_retryable_error_is_raised_at_once(ctx, error):
    calls = []

    def body(tr):
        calls.append(1)
        tr.set(ctx.k(b"a"), b"never")
        raise error

    with pytest.raises(type(error)):
        ctx.store.transact(body)
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
