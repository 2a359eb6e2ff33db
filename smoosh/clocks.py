"""The daemon's two clocks: wall time for what a person reads, monotonic time for everything that waits.

DESIGN §12: whatever waits, paces, backs off or times out (the loop's timers, the I/O budget,
a crash's backoff, the debounce, staleness, rotation, checkpoints, the status record's
cadence) counts on the **monotonic** clock, which never steps; the **wall** clock is read only
where a person reads the time (``/jobs``, log lines, ``updated_at``), where a window is
defined (``from = 01:00``) and where a time must outlive the process (a crash's retry time
in the store: monotonic time means nothing after a restart).

NTP, a VM resync or an operator's ``date -s`` step the wall clock; a suspended machine moves
it on while monotonic time stands still. :class:`WallSteps` notices either as the two clocks
moving apart between two looks, so the daemon can say so once and look at its windows again.

:class:`Clocks` carries both; tests inject one whose wall clock they step by hand without
moving monotonic time. Pure: no threads, no I/O.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["Clock", "Clocks", "WallSteps", "STEP_THRESHOLD_S"]

#: Seconds of a clock (wall or monotonic, each says which).
Clock = Callable[[], float]

#: Times a reading of the two clocks is taken again when a pause came in the middle of it.
READ_TRIES = 3

#: Seconds by which wall time and monotonic time must move apart between two looks to count as
#: a step of the wall clock: far above what NTP's slewing does between two looks (at most
#: 0.5 ms a second) and the time between reading the two clocks, far below any step that
#: matters to a window.
STEP_THRESHOLD_S = 2.0


@dataclass(frozen=True)
class Clocks:
    """The wall clock and the monotonic clock of one daemon.

    Attributes:
        wall: Unix seconds (``time.time``): steps when the system's clock is set.
        monotonic: seconds from an arbitrary origin (``time.monotonic``): never steps.
    """

    wall: Clock = time.time
    monotonic: Clock = time.monotonic

    @classmethod
    def of(cls, clock: Any) -> Clocks:
        """The clocks a caller handed in as one ``clock`` argument.

        Parameters:
            clock: a :class:`Clocks`, or any object with ``wall()`` and ``monotonic()`` (a
                test's pair it steps by hand); ``time.time`` for the real clocks; any other
                callable is one clock for both (a test's clock that only moves forward when
                told: what every part of smoosh read before it had two).

        Returns:
            The clocks.

        Raises:
            TypeError: ``clock`` is neither a pair of clocks nor callable.
        """
        if isinstance(clock, Clocks):
            return clock
        wall, monotonic = getattr(clock, "wall", None), getattr(clock, "monotonic", None)
        if callable(wall) and callable(monotonic):
            return cls(wall, monotonic)
        if clock is time.time:
            return cls()
        if not callable(clock):
            raise TypeError(f"a clock must be callable or carry wall() and monotonic(), not {clock!r}")
        return cls(clock, clock)

    def wall_at(self, monotonic_s: float) -> float:
        """The wall time of the monotonic time ``monotonic_s``, as the wall clock stands now.

        For showing a person a moment kept on the monotonic clock (a channel's not-before
        time, the end of its start-up pause): it follows the wall clock if that steps.
        """
        return monotonic_s + (self.wall() - self.monotonic())

    def monotonic_at(self, wall_s: float) -> float:
        """The monotonic time of the wall time ``wall_s``, as the wall clock stands now."""
        return wall_s + (self.monotonic() - self.wall())


class WallSteps:
    """Notices the wall clock stepping: it and the monotonic clock moved apart between two looks.

    Owner: one thread looks (the server's loop, on its housekeeping tick).

    Parameters:
        clocks: the clocks compared.
        threshold_s: the least divergence that counts as a step.
    """

    def __init__(self, clocks: Clocks, *, threshold_s: float = STEP_THRESHOLD_S) -> None:
        self._clocks = clocks
        self._threshold_s = threshold_s
        self._offset_s = self._offset()

    def _offset(self) -> float:
        """Wall minus monotonic time, the wall clock read between two monotonic readings.

        The two clocks cannot be read at one instant: a reading the thread was paused in the
        middle of (or a test moved both clocks during) would show them apart by the pause.
        Monotonic time read on both sides bounds that, and such a reading is taken again.
        """
        clocks = self._clocks
        for _ in range(READ_TRIES):
            before_s = clocks.monotonic()
            wall_s = clocks.wall()
            after_s = clocks.monotonic()
            if after_s - before_s < self._threshold_s / 2:
                break
        return wall_s - (before_s + after_s) / 2

    def check(self) -> float | None:
        """Look again: the step since the last look, in seconds (negative: back), or None.

        A step is reported once: the next look compares with the clocks as they stand after
        it. Divergence below the threshold is absorbed at every look, so slewing never adds
        up to a step.
        """
        offset_s = self._offset()
        step_s, self._offset_s = offset_s - self._offset_s, offset_s
        return step_s if abs(step_s) >= self._threshold_s else None
