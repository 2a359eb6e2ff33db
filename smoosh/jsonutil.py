"""JSON output that never carries ``Infinity``: an infinite priority is the string ``"infinity"``."""

from __future__ import annotations

import json
import math
from typing import Any


def jsonable(value: Any) -> Any:
    """A copy of ``value`` with infinite floats as ``"infinity"`` / ``"-infinity"`` and NaN as None.

    Tuples become lists; mapping keys become strings.
    """
    if isinstance(value, float):
        if math.isinf(value):
            return "infinity" if value > 0 else "-infinity"
        if math.isnan(value):
            return None
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def dumps(value: Any, *, indent: int | None = None) -> str:
    """Strict JSON text of ``value`` (``allow_nan=False`` guards against a missed infinity)."""
    return json.dumps(jsonable(value), indent=indent, allow_nan=False, sort_keys=indent is not None)
