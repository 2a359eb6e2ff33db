"""What store call raised: the FoundationDB code of its StoreError, for tests that compare codes step by step."""

from __future__ import annotations

from typing import Any, Callable

from smoosh.store.errors import StoreError


def code_of(fn: Callable[[], Any]) -> int | None:
    """The code of the ``StoreError`` ``fn()`` raises, or None if it returns."""
    try:
        fn()
    except StoreError as e:
        return e.code
    return None
