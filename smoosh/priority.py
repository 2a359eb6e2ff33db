"""How urgently a database needs compacting: the ratio / slack / upgrade rules, and quantizing.

The rules are CouchDB smoosh's, edges included (``file <= min_size`` is not eligible; the
value must be strictly above ``min_priority`` and at most ``max_priority``), with one
deliberate difference: an upgrade channel gives 0 to a database that needs no upgrade, even
an empty one (CouchDB gives it ``min_priority`` when ``active == 0``, so every empty database
was "upgraded"). A priority of 0 means "not eligible".
"""

from __future__ import annotations

import math

__all__ = [
    "compute",
    "quantize",
    "METHODS",
    "DEFAULT_MIN_PRIORITY",
    "DEFAULT_MAX_PRIORITY",
    "DEFAULT_MIN_SIZE_BYTES",
    "DEFAULT_MAX_SIZE_BYTES",
    "UPGRADE_PRIORITY",
]

#: The priority methods a channel can use.
METHODS = ("ratio", "slack", "upgrade")

#: Per method, the value a priority must exceed (ratio: file/active; slack: bytes). Also the
#: priority of a database with no live data (``active == 0``).
DEFAULT_MIN_PRIORITY: dict[str, float] = {"ratio": 2.0, "slack": 536870912, "upgrade": 2.0}

#: Priorities above this are not eligible; infinity = no ceiling.
DEFAULT_MAX_PRIORITY = math.inf

#: Files of this size or smaller are not worth compacting (1 MiB; exactly 1 MiB is too small).
DEFAULT_MIN_SIZE_BYTES = 1048576

#: Files larger than this are left to another channel; infinity = no limit.
DEFAULT_MAX_SIZE_BYTES = math.inf

#: The priority an upgrade channel gives a database that needs a format upgrade.
UPGRADE_PRIORITY = 1

#: Priorities below this are quantized to 1/QUANTUM_STEPS steps; from it up, to integers.
QUANTUM_LIMIT = 16

#: Steps per unit for small priorities (CouchDB's 1/16).
QUANTUM_STEPS = 16


def compute(
    method: str,
    *,
    file: int,
    active: int,
    min_priority: float | None = None,
    max_priority: float = DEFAULT_MAX_PRIORITY,
    min_size: float = DEFAULT_MIN_SIZE_BYTES,
    max_size: float = DEFAULT_MAX_SIZE_BYTES,
    changes: int | None = None,
    min_changes: int = 0,
    needs_upgrade: bool = False,
) -> float:
    """Compute a database's priority for one channel; the first matching rule decides.

    1. ``min_changes > 0`` and ``changes`` known and ``changes < min_changes`` -> 0.
    2. ``upgrade``: 1 if ``needs_upgrade`` (even below ``min_size``), else 0.
    3. ``file <= min_size`` -> 0.   4. ``file > max_size`` -> 0.
    5. ``active == 0`` -> ``min_priority``.
    6. ratio ``file / active`` or slack ``file - active``, if ``> min_priority`` and
       ``<= max_priority``, else 0.

    Parameters
    ----------
    method:
        ``"ratio"``, ``"slack"`` or ``"upgrade"``.
    file, active:
        Bytes on disk and live bytes.
    min_priority:
        The threshold of rule 6 and the result of rule 5; None = the method's default
        (:data:`DEFAULT_MIN_PRIORITY`).
    max_priority, min_size, max_size:
        As in the rules (sizes in bytes); ``math.inf`` allowed.
    changes, min_changes:
        Changes since the last compaction (None = unknown) and the minimum required.
    needs_upgrade:
        Whether the database's on-disk format is out of date.

    Returns
    -------
    The priority: 0 for "not eligible"; a float for ratio, an int for slack (bytes), 1 for
    upgrade; ``min_priority`` as given for ``active == 0``. Not quantized.

    Raises
    ------
    ValueError
        ``method`` is not one of :data:`METHODS`.
    """
    if method not in DEFAULT_MIN_PRIORITY:
        raise ValueError(f"unknown priority method {method!r}: expected one of {METHODS}")
    if min_changes > 0 and changes is not None and changes < min_changes:
        return 0
    if method == "upgrade":
        # Deliberate difference from CouchDB: rule 5 never applies to upgrade channels.
        return UPGRADE_PRIORITY if needs_upgrade else 0
    if file <= min_size or file > max_size:
        return 0
    if min_priority is None:
        min_priority = DEFAULT_MIN_PRIORITY[method]
    if active == 0:
        return min_priority
    value = file / active if method == "ratio" else file - active
    if min_priority < value <= max_priority:
        return value
    return 0


def _round_half_away(x: float) -> int:
    # Erlang's round/1: halves go away from zero (Python's round() goes to even). floor and
    # the subtraction are exact for doubles, so no 0.49999999999999994 + 0.5 == 1.0 trap.
    magnitude = abs(x)
    whole = math.floor(magnitude)
    if magnitude - whole >= 0.5:
        whole += 1
    return whole if x >= 0 else -whole


def quantize(x: float) -> float | int:
    """Quantize a priority so near-equal priorities tie (and then go first-in first-out).

    Parameters
    ----------
    x:
        A priority.

    Returns
    -------
    Ints unchanged; infinities unchanged; a float >= 16 as the nearest int; a smaller
    float rounded to a multiple of 1/16 (a float). Halves round away from zero.

    Raises
    ------
    TypeError
        ``x`` is not an int or float.
    ValueError
        ``x`` is NaN.
    """
    if isinstance(x, int):
        return x
    if not isinstance(x, float):
        raise TypeError(f"priority must be an int or a float, not {type(x).__name__}")
    if math.isnan(x):
        raise ValueError("priority must not be NaN")
    if math.isinf(x):
        return x
    if x >= QUANTUM_LIMIT:
        return _round_half_away(x)
    return _round_half_away(x * QUANTUM_STEPS) / QUANTUM_STEPS
