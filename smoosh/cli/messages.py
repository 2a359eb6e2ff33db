"""The one shape of what the CLI says on stderr: ``smoosh: MESSAGE`` for an error,
``smoosh: config error: MESSAGE`` for a config that does not load (the same line from
``smoosh run`` and ``smoosh config check``), ``smoosh: warning: MESSAGE`` for a warning.

Usage errors are argparse's own (the subcommand's usage, then ``smoosh COMMAND: error: ...``,
exit 2), the convention every argparse program follows.
"""

from __future__ import annotations

import sys
from typing import TextIO

__all__ = ["PREFIX", "print_error", "print_config_error", "print_warning"]

#: What every error and warning line of the CLI starts with.
PREFIX = "smoosh: "


def print_error(message: str, *, stream: TextIO | None = None) -> None:
    """Print ``smoosh: MESSAGE`` on stderr (or ``stream``)."""
    print(f"{PREFIX}{message}", file=stream or sys.stderr)


def print_config_error(message: str, *, stream: TextIO | None = None) -> None:
    """Print ``smoosh: config error: MESSAGE`` on stderr (or ``stream``)."""
    print_error(f"config error: {message}", stream=stream)


def print_warning(message: str, *, stream: TextIO | None = None) -> None:
    """Print ``smoosh: warning: MESSAGE`` on stderr (or ``stream``)."""
    print_error(f"warning: {message}", stream=stream)
