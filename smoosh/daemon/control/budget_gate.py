"""Starts that wait for the I/O budget: refused while it is in debt, woken the moment it is paid.

``max_io_rate`` is part of a start's eligibility (DESIGN §11): a channel asks the server for a
slot, and while the process's :class:`~smoosh.io_budget.IoBudget` is in debt the answer is
no. The key stays at the head of its channel's queue, holding no channel slot and no
``max_jobs`` slot, and the channel joins this gate's line. The gate is a task on the server's
loop due exactly when the debt is paid (a timer at that moment, never a poll); then it wakes
every channel in line, and they ask again. Whatever was charged meanwhile (a running
compaction's chunks) moves the moment on, and the gate waits for the new one.

Owner: the server's loop thread (channels ask from their ticks; the gate is ticked there).
The line is replaced whole on every change, so :meth:`BudgetGate.waiting` may read it from
any thread.
"""

from __future__ import annotations

from typing import Callable

from smoosh.io_budget import IoBudget

__all__ = ["BudgetGate"]


class BudgetGate:
    """The channels waiting for the I/O budget, and the timer that wakes them.

    Parameters:
        budget: the process's I/O budget.
        wake_channel: ticks a channel soon (the server's ``wake``).
        rearm: ticks this gate soon, so it sets its due time anew (``Loop.wake(gate)``).
    """

    def __init__(self, budget: IoBudget, *, wake_channel: Callable[[str], None], rearm: Callable[[], None]) -> None:
        self._budget = budget
        self._wake_channel = wake_channel
        self._rearm = rearm
        self._line: tuple[str, ...] = ()

    def admits(self, channel: str) -> bool:
        """Whether ``channel`` may start a compaction now; if not, it is woken once the debt is paid."""
        if not self._budget.in_debt():
            return True
        if channel not in self._line:
            self._line = (*self._line, channel)
            self._rearm()
        return False

    def tick(self, now: float) -> float | None:
        """Wake the channels in line once the debt is paid; else be due when it will be."""
        if not self._line:
            return None
        paid_at = self._budget.paid_at()
        if paid_at is not None:
            return paid_at
        line, self._line = self._line, ()
        for name in line:
            self._wake_channel(name)
        return None

    def rate_changed(self) -> None:
        """The rate was changed live: the debt is paid at another moment, so look again now."""
        if self._line:
            self._rearm()

    def waiting(self) -> list[str]:
        """The channels waiting for the budget now, in the order they asked (any thread)."""
        return list(self._line)
