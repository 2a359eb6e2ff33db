"""Stores with FoundationDB's semantics: ``memory:``, ``sqlite:PATH``, ``fdb:`` / ``fdb:CLUSTER_FILE``,
and ``faulty:SEED[:RATE]:INNER``, which injects FoundationDB's errors into any of them."""

from __future__ import annotations

from smoosh.store.base import KeySelector, Store, Transaction, Watch
from smoosh.store.errors import StoreError, StoreUnavailable

__all__ = ["open_store", "KeySelector", "Store", "Transaction", "Watch", "StoreError", "StoreUnavailable"]


def open_store(url: str, *, create: bool = True) -> Store:
    """Open the store a URL names.

    Parameters:
        url: ``memory:`` (this process only, nothing on disk), ``sqlite:PATH`` (the embedded
            default; relative paths resolve against the working directory), ``fdb:`` (the
            default cluster file), ``fdb:CLUSTER_FILE``, or ``faulty:SEED[:RATE]:INNER``
            (any of those with FoundationDB's errors injected; see :mod:`smoosh.store.faulty`).
        create: a ``sqlite:`` store that does not exist is created (``smoosh run``, ``smoosh
            worker``); False: it is an error (every command that reads or marks a store).

    Returns:
        An open :class:`Store`; close it when done.

    Raises:
        StoreUnavailable: an unknown scheme, an empty SQLite path, a malformed ``faulty:``
            URL, or no FoundationDB client; a ``sqlite:`` file that is an application's database,
            or (``create=False``) that does not exist.
    """
    scheme, sep, rest = url.partition(":")
    if not sep:
        raise StoreUnavailable(f"store URL {url!r} has no scheme: use memory:, sqlite:PATH or fdb:[CLUSTER_FILE]")
    if scheme == "memory":
        from smoosh.store.memory import MemoryStore

        return MemoryStore(url)
    if scheme == "sqlite":
        if not rest:
            raise StoreUnavailable(f"store URL {url!r} names no file: use sqlite:PATH")
        from smoosh.store.sqlite import SqliteStore

        return SqliteStore(rest, url=url, create=create)
    if scheme == "fdb":
        from smoosh.store.fdb import FdbStore

        return FdbStore(rest or None, url=url)
    if scheme == "faulty":
        from smoosh.store.faulty import FaultyStore, parse_url

        try:
            seed, rate, inner_url = parse_url(rest)
        except ValueError as e:
            raise StoreUnavailable(f"store URL {url!r}: {e}") from None
        return FaultyStore(open_store(inner_url, create=create), seed=seed, rate=rate, url=url)
    raise StoreUnavailable(f"store URL {url!r} has unknown scheme {scheme!r}: use memory:, sqlite:PATH or fdb:[CLUSTER_FILE]")
