"""Friendly sizes (``512MiB``, ``1GB``) and durations (``90s``, ``5m``) for config values.

Parsed once at the config boundary; everything inside smoosh works in bytes and seconds.

Sizes: a bare number is bytes; ``B``; ``KB``/``MB``/``GB``/``TB`` are powers of 1000 and
``KiB``/``MiB``/``GiB``/``TiB`` powers of 1024 (disk vendors and ``ls -h`` disagree, so both
are spelled out). Units are case-insensitive (``mib`` = ``MiB``; ``kb`` = 1000 bytes) and may
follow the number after a space. A decimal is accepted only when the result is a whole
number of bytes (``1.5KiB`` = 1536; ``1.5B`` is an error), so a size is always exact.
Negative numbers, exponents and thousands separators are errors.

Durations: ``500ms``, ``90s``, ``5m``, ``2h``, ``1d`` (case-insensitive, optional space,
decimals allowed); a bare number is in the unit the caller names (CouchDB's unit for the key:
minutes for ``staleness``, seconds elsewhere).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

__all__ = ["parse_size", "parse_duration", "format_size", "format_duration", "SIZE_UNITS", "DURATION_UNITS"]

#: Bytes per size unit, keyed by the lower-cased unit ("" = bare number = bytes).
SIZE_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}

#: Seconds per duration unit, keyed by the lower-cased unit.
DURATION_UNITS: dict[str, float] = {
    "ms": 0.001,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
}

#: The spelling of "no limit" CouchDB uses for ``max_size`` and ``max_priority``.
INFINITY = "infinity"

# ASCII digits only: `\d` would also accept digits of other scripts, which int() then
# happily converts, so a config could pass here and read differently to a human.
_NUMBER_UNIT_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?|\.[0-9]+)[ \t]*([A-Za-z]*)")


def _split(text: object, what: str) -> tuple[Decimal, str]:
    if not isinstance(text, str):
        raise ValueError(f"invalid {what} {text!r}: expected a string")
    match = _NUMBER_UNIT_RE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"invalid {what} {text!r}: expected a non-negative number with an optional unit")
    return Decimal(match.group(1)), match.group(2).lower()


def parse_size(text: str, *, allow_infinity: bool = False) -> int | float:
    """Parse a size such as ``512MiB``, ``1GB`` or ``1048576`` into bytes.

    Parameters
    ----------
    text:
        The size as written; surrounding whitespace is ignored.
    allow_infinity:
        Accept ``infinity`` (any case), returned as ``math.inf``. Only for keys where
        CouchDB accepts it (``max_size``, a slack channel's ``max_priority``).

    Returns
    -------
    The size in bytes as an int (``math.inf`` only when allowed and written).

    Raises
    ------
    ValueError
        Malformed, negative, an unknown unit, or a fraction of a byte; the message names the
        value.
    """
    if allow_infinity and isinstance(text, str) and text.strip().lower() == INFINITY:
        return math.inf
    number, unit = _split(text, "size")
    factor = SIZE_UNITS.get(unit)
    if factor is None:
        raise ValueError(
            f"invalid size {text!r}: unknown unit {unit!r} (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)"
        )
    size = number * factor
    if size != size.to_integral_value():
        raise ValueError(f"invalid size {text!r}: not a whole number of bytes")
    return int(size)


def parse_duration(text: str, bare_unit_s: float = 1.0) -> float:
    """Parse a duration such as ``90s``, ``5m``, ``2h``, ``1d`` or ``500ms`` into seconds.

    Parameters
    ----------
    text:
        The duration as written; surrounding whitespace is ignored.
    bare_unit_s:
        Seconds per unit of a bare number (60.0 for a key CouchDB counts in minutes).

    Returns
    -------
    The duration in seconds.

    Raises
    ------
    ValueError
        Malformed, negative or an unknown unit; the message names the value.
    """
    number, unit = _split(text, "duration")
    if unit == "":
        return float(number) * bare_unit_s
    factor = DURATION_UNITS.get(unit)
    if factor is None:
        raise ValueError(f"invalid duration {text!r}: unknown unit {unit!r} (use ms, s, m, h or d)")
    return float(number * Decimal(str(factor)))


def format_size(size_bytes: int | float) -> str:
    """Render bytes for a log line: ``64MiB`` when exact in a binary unit, else plain bytes.

    Parameters
    ----------
    size_bytes:
        Bytes, or ``math.inf``.

    Returns
    -------
    ``"infinity"``, ``"<n><unit>"`` or ``"<n>"``.
    """
    if size_bytes == math.inf:
        return INFINITY
    size = int(size_bytes)
    for unit, factor in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size and size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)


def format_duration(seconds: float) -> str:
    """Render seconds for a log line in the largest unit that keeps it whole (``5m``, ``90s``).

    Parameters
    ----------
    seconds:
        The duration.

    Returns
    -------
    For example ``"1h"``, ``"10m"``, ``"90s"``, ``"0.5s"``.
    """
    for unit, factor in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds and seconds % factor == 0:
            return f"{int(seconds // factor)}{unit}"
    return f"{seconds:g}s"
