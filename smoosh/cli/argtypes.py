"""Argument types shared by the subcommands' parsers (argparse calls them on the option's text)."""

from __future__ import annotations

import argparse
import urllib.parse

from smoosh.config.values import parse_node

__all__ = ["positive_int", "non_negative_int", "node_name", "daemon_url", "shared_store_url", "private_store"]

#: URL schemes the admin API is reached by (https through a TLS-terminating proxy).
URL_SCHEMES = ("http", "https")


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def positive_int(text: str) -> int:
    """An integer of at least 1 (``--concurrency``, ``--limit``)."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1")
    return value


def non_negative_int(text: str) -> int:
    """An integer of 0 or more (``--workers``, ``--offset``)."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be 0 or more")
    return value


def node_name(text: str) -> str:
    """A node name (``--node``): the config's ``node`` rule, no spaces or control characters."""
    try:
        return parse_node(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a node name has no spaces or control characters") from None


def daemon_url(text: str) -> str:
    """The daemon's admin API (``--url``): ``http://HOST:PORT``, checked before any request is made.

    A ``host:port`` without a scheme is refused with the URL it probably meant; a port that is not
    a number, a bracket left open and a scheme the API does not speak are refused by name.
    """
    if "://" not in text:
        raise argparse.ArgumentTypeError(f"{text!r} is not a URL: did you mean http://{text}?")
    try:
        parts = urllib.parse.urlsplit(text)
        _ = parts.port  # parsed lazily: a port that is not a number raises only here
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not a valid URL: {e}") from None
    if parts.scheme not in URL_SCHEMES:
        raise argparse.ArgumentTypeError(f"{text!r}: the admin API is reached by http:// (or https:// through a "
                                         f"proxy), not {parts.scheme}://")
    if not parts.hostname:
        raise argparse.ArgumentTypeError(f"{text!r} names no host, e.g. http://127.0.0.1:5986")
    return text


def private_store(url: str) -> bool:
    """Whether a store URL names a store only its own process sees (``memory:``, also inside ``faulty:``)."""
    from smoosh.store.faulty import parse_url

    while url.startswith("faulty:"):
        try:
            url = parse_url(url[len("faulty:"):])[2]
        except ValueError:
            return False  # malformed: open_store says what is wrong with it
    return url.partition(":")[0] == "memory"


def shared_store_url(text: str) -> str:
    """A store another process shares (``smoosh worker --store``): ``memory:`` is refused.

    A memory store lives inside one process: a worker given one would wait for jobs the daemon
    never sees, forever.
    """
    if private_store(text):
        raise argparse.ArgumentTypeError(
            f"{text!r}: a memory: store lives inside one process, so a worker's is not the daemon's and it would "
            "wait for jobs forever; pass the daemon's store (sqlite:PATH or fdb:[CLUSTER_FILE])")
    return text
