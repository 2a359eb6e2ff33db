"""The daemon's job store, seen through: every transaction reported to the store's health.

Everything the daemon does with its store, the job layer's roles included, goes through
:meth:`~smoosh.store.base.Store.transact`; this wrapper runs each one on the real store and
tells :class:`~smoosh.daemon.control.store_health.StoreHealth` that it began, each retried
attempt's error, how it ended, and whether it wrote. The store underneath is untouched: its
retry loop, its errors and its semantics are the real store's own.

Owner: none of its own (any thread may transact, as on any store); the health it reports to
takes its lock.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from smoosh.daemon.control.store_health import FULL, UNREACHABLE, StoreHealth, classify
from smoosh.store.base import DEFAULT_RETRY_LIMIT, DEFAULT_TIMEOUT_S, Store, Transaction
from smoosh.store.errors import StoreError
from smoosh.store.retry import MAX_RETRY_DELAY_S, RetryStats

__all__ = ["WatchedStore"]

T = TypeVar("T")


class WatchedStore(Store):
    """``inner``, with its transactions reported to ``health``.

    Parameters:
        inner: the real store (closed by :meth:`close` only when ``owns_inner``).
        health: where each transaction is reported.
        owns_inner: close ``inner`` with this store (False: the caller owns it).
    """

    def __init__(self, inner: Store, health: StoreHealth, *, owns_inner: bool = True) -> None:
        self.inner = inner
        self.health = health
        self.owns_inner = owns_inner
        self.url = inner.url
        self.commit_outcome_may_be_unknown = inner.commit_outcome_may_be_unknown

    def transact(
        self,
        fn: Callable[[Transaction], T],
        *,
        retry_limit: int = DEFAULT_RETRY_LIMIT,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_retry_delay_s: float = MAX_RETRY_DELAY_S,
        on_retry: Callable[[StoreError], None] | None = None,
    ) -> T:
        """The inner store's :meth:`~smoosh.store.base.Store.transact`, reported to the health.

        Raises:
            StoreError: as the inner store raises it (and whatever ``fn`` raises).
        """
        health = self.health
        wrote = False
        # A transaction whose attempts found the store full and then ran out of time failed
        # because the store is full, whatever the timeout says.
        full: StoreError | None = None

        def body(tr: Transaction) -> T:
            nonlocal wrote
            result = fn(tr)
            wrote = tr.has_writes  # the attempt that commits is the last one to get here
            return result

        def retried(error: StoreError) -> None:
            nonlocal full
            if classify(error) == FULL:
                full = error
            health.attempt_failed(error)
            if on_retry is not None:
                on_retry(error)

        token = health.began()
        try:
            result = self.inner.transact(
                body, retry_limit=retry_limit, timeout_s=timeout_s, max_retry_delay_s=max_retry_delay_s,
                on_retry=retried,
            )
        except Exception as e:
            health.failed(e if full is None or classify(e) != UNREACHABLE else full)
            raise
        finally:
            health.ended(token)
        if wrote:
            health.wrote()
        return result

    def create_transaction(self) -> Transaction:
        """A transaction of the inner store (outside :meth:`transact`: not reported)."""
        return self.inner.create_transaction()

    @property
    def retry_stats(self) -> RetryStats:
        """The inner store's retry counts."""
        return self.inner.retry_stats

    def close(self) -> None:
        """Stop reporting; close the inner store when this store owns it."""
        self.health.closing()
        if self.owns_inner:
            self.inner.close()

    def __getattr__(self, name: str) -> Any:
        # What a particular store offers beyond the interface (a faulty store's inject, a
        # SQLite store's path) stays reachable.
        return getattr(self.inner, name)
