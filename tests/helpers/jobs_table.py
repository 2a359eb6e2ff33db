"""A key's row of an in-process server's ``/jobs`` table, for the tests that wait on it."""

from __future__ import annotations

from typing import Any


def record_of(server: Any, key: str) -> dict[str, Any]:
    """``key``'s row of ``server.jobs_table()``, or ``{}`` when the table has none."""
    return {j["key"]: j for j in server.jobs_table()}.get(key, {})


def state_of(server: Any, key: str) -> str | None:
    """``key``'s state in the table (``pending``, ``running``, ``finished``...), or None."""
    return record_of(server, key).get("state")
