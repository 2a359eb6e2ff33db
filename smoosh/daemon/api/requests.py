"""What a request to the admin API must carry, checked without the server: its ``Host``, its ``Origin``, the queries.

Pure functions of the request's text (no I/O), so the handler (:mod:`smoosh.daemon.api.http`)
stays about answering, and each rule is tested on its own.
"""

from __future__ import annotations

import ipaddress
from typing import Sequence

from channels.ports import RESULTS
from smoosh.daemon.history import RECORD_STATES

__all__ = ["host_allowed", "own_page", "parse_jobs_query", "parse_queue_query", "parse_history_query",
           "DEFAULT_PAGE", "MAX_PAGE"]

#: Rows of ``/queue`` and ``/history`` when ``limit`` is not given.
DEFAULT_PAGE = 50
#: Most rows one ``/queue`` or ``/history`` answer carries: never the whole fleet in one response.
MAX_PAGE = 500


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


def own_page(origin: str, host: str | None, fetch_site: str | None) -> bool:
    """Whether a request that carries ``Origin`` comes from the page this daemon served itself.

    A browser names in ``Origin`` the scheme, host and port of the page that sent the request,
    and in ``Host`` where the request goes. The two agree only when the page was loaded from the
    very address the request is sent to, which serves nothing but smoosh's own page: a page on
    any other host, port or scheme names itself and is refused, and so is a sandboxed page or a
    file (``Origin: null``). A browser that also says ``Sec-Fetch-Site`` must say
    ``same-origin``. The ``Host`` itself has passed :func:`host_allowed` first: a page of a
    rebound domain, whose ``Origin`` and ``Host`` would agree, never gets here.

    Parameters:
        origin: the ``Origin`` header.
        host: the ``Host`` header, or None.
        fetch_site: the ``Sec-Fetch-Site`` header, or None.
    """
    if not host:
        return False
    if fetch_site is not None and fetch_site.strip().lower() != "same-origin":
        return False
    wanted = host.strip().lower()
    return origin.strip().lower() in (f"http://{wanted}", f"https://{wanted}")


def parse_jobs_query(query: dict[str, list[str]]) -> tuple[frozenset[str] | None, int | None, int]:
    """``state``, ``limit`` and ``offset`` of ``GET /jobs``, checked.

    ``state`` may repeat and may list several states separated by commas.

    Returns:
        ``(states or None for all, limit or None for all, offset)``.

    Raises:
        ValueError: an unknown parameter or state, or a limit or offset that is not a whole
            number in range; the message names the value.
    """
    _known(query, "/jobs", ("state", "limit", "offset"))
    states = _listed(query, "state", RECORD_STATES)
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


def parse_queue_query(query: dict[str, list[str]]) -> tuple[str, int, int]:
    """``channel``, ``offset`` and ``limit`` of ``GET /queue``, checked.

    Returns:
        ``(channel, offset, limit)``; ``limit`` defaults to :data:`DEFAULT_PAGE`.

    Raises:
        ValueError: an unknown parameter, no channel or more than one, or an offset or limit
            that is not a whole number in range; the message names the value.
    """
    _known(query, "/queue", ("channel", "offset", "limit"))
    channels = query.get("channel", [])
    if len(channels) != 1 or not channels[0]:
        raise ValueError("name one channel: /queue?channel=NAME")
    return channels[0], _whole("offset", query.get("offset"), minimum=0) or 0, _limit(query.get("limit"))


def parse_history_query(query: dict[str, list[str]]) -> tuple[frozenset[str] | None, str | None, int, int]:
    """``result``, ``channel``, ``offset`` and ``limit`` of ``GET /history``, checked.

    ``result`` may repeat and may list several results separated by commas.

    Returns:
        ``(results or None for all, channel or None for all, offset, limit)``.

    Raises:
        ValueError: an unknown parameter or result, a channel given twice, or an offset or
            limit that is not a whole number in range; the message names the value.
    """
    _known(query, "/history", ("result", "channel", "offset", "limit"))
    results = _listed(query, "result", RESULTS)
    channels = query.get("channel")
    if channels is not None and (len(channels) != 1 or not channels[0]):
        raise ValueError("channel must be given once, and not empty")
    channel = channels[0] if channels else None
    return results, channel, _whole("offset", query.get("offset"), minimum=0) or 0, _limit(query.get("limit"))


def _known(query: dict[str, list[str]], path: str, names: tuple[str, ...]) -> None:
    unknown = sorted(set(query) - set(names))
    if unknown:
        raise ValueError(f"unknown parameter {unknown[0]!r}: {path} takes {', '.join(names[:-1])} and {names[-1]}")


def _listed(query: dict[str, list[str]], name: str, allowed: Sequence[str]) -> frozenset[str] | None:
    """The values of a parameter given as a comma-separated list of ``allowed`` names (None: not
    given); an unknown name raises ValueError naming it."""
    if name not in query:
        return None
    wanted = [part.strip() for value in query[name] for part in value.split(",")]
    for value in wanted:
        if value not in allowed:
            raise ValueError(f"unknown {name} {value!r}: one of {', '.join(allowed)}")
    return frozenset(wanted)


def _limit(values: list[str] | None) -> int:
    limit = _whole("limit", values, minimum=1)
    if limit is None:
        return DEFAULT_PAGE
    if limit > MAX_PAGE:
        raise ValueError(f"limit must be at most {MAX_PAGE}, not {limit}")
    return limit
