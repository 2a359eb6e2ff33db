"""What a request to the admin API must carry, checked without the server: its ``Host``, and ``/jobs``'s query.

Pure functions of the request's text (no I/O), so the handler (:mod:`smoosh.daemon.api.http`)
stays about answering, and each rule is tested on its own.
"""

from __future__ import annotations

import ipaddress

from smoosh.daemon.history import RECORD_STATES

__all__ = ["host_allowed", "parse_jobs_query"]


def host_allowed(header: str | None, names: frozenset[str]) -> bool:
    """Whether a request's ``Host`` header names this daemon (DNS rebinding defence).

    An IP address literal always does (a rebinding attack needs a name it controls), and so do
    ``names`` (lower case, without a trailing dot). A missing header is allowed: browsers always
    send one, and an HTTP/1.0 tool may not.

    Parameters:
        header: the ``Host`` header, or None.
        names: host names that mean this daemon.
    """
    if header is None:
        return True
    host = header.strip().lower()
    if host.startswith("["):
        end = host.find("]")
        rest = host[end + 1:]
        if end < 0 or (rest and not rest.startswith(":")):
            return False
        name = host[1:end]
    else:
        name = host.rpartition(":")[0] if ":" in host else host
    name = name.rstrip(".")
    if name in names:
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def parse_jobs_query(query: dict[str, list[str]]) -> tuple[frozenset[str] | None, int | None, int]:
    """``state``, ``limit`` and ``offset`` of ``GET /jobs``, checked.

    ``state`` may repeat and may list several states separated by commas.

    Returns:
        ``(states or None for all, limit or None for all, offset)``.

    Raises:
        ValueError: an unknown parameter or state, or a limit or offset that is not a whole
            number in range; the message names the value.
    """
    unknown = sorted(set(query) - {"state", "limit", "offset"})
    if unknown:
        raise ValueError(f"unknown parameter {unknown[0]!r}: /jobs takes state, limit and offset")
    states = None
    if "state" in query:
        wanted = [part.strip() for value in query["state"] for part in value.split(",")]
        for state in wanted:
            if state not in RECORD_STATES:
                raise ValueError(f"unknown state {state!r}: one of {', '.join(RECORD_STATES)}")
        states = frozenset(wanted)
    limit = _whole("limit", query.get("limit"), minimum=1)
    offset = _whole("offset", query.get("offset"), minimum=0)
    return states, limit, offset or 0


def _whole(name: str, values: list[str] | None, *, minimum: int) -> int | None:
    if values is None:
        return None
    if len(values) > 1:
        raise ValueError(f"{name} given {len(values)} times; give it once")
    text = values[0]
    if not text.isascii() or not text.isdigit() or int(text) < minimum:
        raise ValueError(f"{name} must be a whole number of at least {minimum}, not {text!r}")
    return int(text)
