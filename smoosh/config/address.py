"""Addresses: ``HOST:PORT`` for the admin API, and whether a host is loopback only.

One parser for the config check, ``smoosh run --http`` and the admin server, so a value one
accepts the others accept too (``LOCALHOST:0`` included: host names compare case-blind).
"""

from __future__ import annotations

import ipaddress
import re

__all__ = ["split_host_port", "is_loopback_host"]

#: A port: digits only.
_INT_RE = re.compile(r"\+?[0-9]+")
#: A DNS host name (RFC 1123 labels).
_HOSTNAME_RE = re.compile(r"(?=.{1,253}\Z)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                          r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?")


def split_host_port(text: str) -> tuple[str, int]:
    """Split ``host:port`` / ``[v6]:port`` into ``(host, port)``; ValueError if malformed."""
    problem = "must be HOST:PORT (port 0-65535; an IPv6 host in brackets, e.g. [::1]:5986)"
    if text.startswith("["):
        close = text.find("]")
        if close < 0 or text[close + 1:close + 2] != ":":
            raise ValueError(problem)
        host, port_text = text[1:close], text[close + 2:]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(problem) from None
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep or not host or ":" in host:
            raise ValueError(problem)
        if not _is_ipv4(host) and not _HOSTNAME_RE.fullmatch(host):
            raise ValueError(problem)
    if not _INT_RE.fullmatch(port_text) or int(port_text) > 65535:
        raise ValueError(problem)
    return host, int(port_text)


def _is_ipv4(host: str) -> bool:
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return False
    return True


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` (any case) and loopback address literals (127.0.0.0/8, ::1)."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve anywhere
