"""What a ``smoosh doctor`` check found: :class:`Finding`, and the small helpers every check shares."""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from typing import Any, Sequence

__all__ = ["Finding", "OK", "WARN", "FAIL", "EXAMPLES", "user_name", "existing_ancestor", "examples"]

OK, WARN, FAIL = "ok", "warn", "fail"
#: Examples of a kind of problem named in one finding (the rest are counted).
EXAMPLES = 3


@dataclass(frozen=True)
class Finding:
    """What one check found.

    Attributes:
        status: ``ok``, ``warn`` or ``fail`` (``smoosh doctor`` exits 1 if any is ``fail``).
        check: what was checked, e.g. ``inotify watches``.
        finding: what was found, one sentence.
        fix: how to fix it (warn and fail only).
    """

    status: str
    check: str
    finding: str
    fix: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The finding as a JSON object (``fix`` null when there is none)."""
        return {"status": self.status, "check": self.check, "finding": self.finding, "fix": self.fix}


def user_name() -> str:
    """The name of the user this process runs as (the user the daemon would run as, presumably)."""
    uid = os.geteuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def existing_ancestor(path: str) -> str:
    """The nearest directory above ``path`` that exists (where ``makedirs`` would start creating)."""
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.isdir(parent) and parent != os.path.dirname(parent):
        parent = os.path.dirname(parent)
    return parent


def examples(paths: Sequence[str]) -> str:
    """The first few of ``paths``, and how many more there are."""
    more = f" and {len(paths) - EXAMPLES} more" if len(paths) > EXAMPLES else ""
    return ", ".join(paths[:EXAMPLES]) + more
