"""Argument types shared by the subcommands' parsers (argparse calls them on the option's text)."""

from __future__ import annotations

import argparse

from smoosh.config.values import parse_node

__all__ = ["positive_int", "non_negative_int", "node_name"]


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
