"""The global ``max_jobs`` gate, fair across channels (DESIGN §5.6, §7).

Per-channel concurrency alone cannot bound a node's total I/O, so every start takes one of
``max_jobs`` slots first. When channels compete for the last slots, the one that has waited
longest goes first: a channel refused a slot joins a line, and a free slot goes to whoever
is ahead in it, so a busy channel can never starve a quieter one (an ``upgrade`` channel,
say) that asked earlier. A channel that can no longer start anything (suspended, out of its
window, out of work) leaves the line with :meth:`SlotGate.withdraw`, so it never holds a
slot back from the others. When a slot frees, the owner wakes the channels in line.

Two limits: ``limit`` is ``max_jobs``, which nothing passes; ``soft_limit`` is what the backlog
controller lets run now (:mod:`~smoosh.daemon.control.backlog`), which a forced key (an
operator's ``enqueue --force``) passes, up to ``max_jobs``.

Owner: the server's loop thread (no lock; channels ask from their ticks).
"""

from __future__ import annotations

__all__ = ["SlotGate"]


class SlotGate:
    """Counts running compactions against a limit and hands free slots out oldest-waiter first.

    Parameters:
        limit: the number of slots (``max_jobs``); may be changed live through :attr:`limit`.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        #: The slots the backlog controller lets run now (at most ``limit`` counts).
        self.soft_limit = limit
        self._busy = 0
        self._serial = 0
        # channel -> when it joined the line (a serial number: the order is all that counts).
        self._line: dict[str, int] = {}

    @property
    def in_force(self) -> int:
        """The slots that may run now: ``min(limit, soft_limit)``."""
        return min(self.limit, self.soft_limit)

    @property
    def busy(self) -> int:
        """Slots taken now."""
        return self._busy

    def acquire(self, channel: str, *, force: bool = False, forced: bool = False) -> bool:
        """Take a slot for ``channel``; False (and a place in line) when none is free for it.

        A slot is free for ``channel`` when more slots are free than channels ahead of it.
        ``force`` takes one past the limit (a run that runs already, adopted at start-up);
        ``forced`` (the channel's next key is an operator's forced one) counts ``limit`` only,
        not the backlog controller's ``soft_limit``.
        """
        since = self._line.get(channel)
        ahead = sum(1 for name, s in self._line.items() if name != channel and (since is None or s < since))
        limit = self.limit if forced else self.in_force
        if force or limit - self._busy > ahead:
            self._line.pop(channel, None)
            self._busy += 1
            return True
        if since is None:
            self._serial += 1
            self._line[channel] = self._serial
        return False

    def release(self, channel: str) -> None:
        """Give back a slot ``channel`` took (never below zero)."""
        self._busy = max(0, self._busy - 1)

    def recount(self, busy: int) -> None:
        """Set the slots taken to ``busy``, what the runs hold (the run audit's repair of a count
        that drifted from them: a release lost, or one too many)."""
        self._busy = max(0, busy)

    def withdraw(self, channel: str) -> None:
        """``channel`` stops waiting for a slot (it cannot start anything now)."""
        self._line.pop(channel, None)

    def waiting(self) -> list[str]:
        """Channels in line now, longest-waiting first."""
        return sorted(self._line, key=self._line.__getitem__)
