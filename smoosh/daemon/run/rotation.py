"""Rotation (DESIGN §5.6) as a pure policy: which runs to ask to make way for waiting work.

Every ``interval``, when every one of the ``max_jobs`` slots is busy and some channel is in
line for one, up to ``max_churn`` of the longest-running *suspendable* runs (chunked
compactions, whose progress lives in the file; never a full VACUUM) that have held their
slot for at least ``interval`` are asked to stop at their next chunk boundary, never more
than there are keys waiting. Their channels queue them again, and the freed slots go to the
channels that waited longest. No clock, no I/O: the server's loop calls :func:`choose`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

__all__ = ["Candidate", "choose"]


@dataclass(frozen=True)
class Candidate:
    """A running compaction rotation might stop.

    ``suspendable`` is None when not known here (a run in this process: its worker decides
    when asked, under the same lock a full VACUUM registers its cancel callback with).
    """

    key: str
    running_since: float
    suspendable: bool | None
    run_id: str | None = None


def choose(
    now: float,
    runs: Sequence[Candidate],
    *,
    interval_s: float,
    max_churn: int,
    busy_slots: int,
    max_jobs: int,
    waiting_keys: int,
) -> list[Candidate]:
    """The runs to ask to stop, longest-running first (empty when nothing waits for a slot).

    Parameters:
        now: the current time (Unix seconds).
        runs: the runs in progress.
        interval_s: a run must have held its slot at least this long.
        max_churn: at most this many runs per round (0 turns rotation off).
        busy_slots, max_jobs: rotation only runs when every slot is busy.
        waiting_keys: keys waiting in the channels that are in line for a slot.
    """
    if max_churn <= 0 or waiting_keys <= 0 or busy_slots < max_jobs:
        return []
    eligible = sorted(
        (r for r in runs if r.suspendable is not False and now - r.running_since >= interval_s),
        key=lambda r: r.running_since,
    )
    return eligible[: min(max_churn, waiting_keys)]
