"""The run audit: every slot held has a live run behind it, or it is said once and freed.

A run's slots are freed by construction (:meth:`~smoosh.daemon.run.scheduler.JobScheduler.end`
is the one way a run ends, and every thread that works on a run ends in an event for it). This
is the net under that construction, for whatever breaks it anyway: it compares, on the
server's loop, what the channels hold with what runs, and repairs what does not match, with one
ERROR line per repair. Three checks:

* **a phantom run**: a channel counts a run (STARTING or ACTIVE, one of its places and a
  global slot) that the scheduler does not follow (no run of that token in its table). It is
  dropped from its channel, which frees both slots and starts its next key.
* **a run nothing runs**: the scheduler follows a run this process's worker said it runs,
  and the worker no longer runs it, at two looks at least :data:`GRACE_S` apart (its end's
  news is posted before the worker lets go of the key, so one look may fall between the
  two). It is ended as failed, which frees its slots and gives the key its backoff.
* **the global slots**: the ``max_jobs`` gate counts as many slots taken as the channels'
  runs hold, no more (a count that drifted would keep every channel from starting).

Before, such a run wedged its channel silently until a restart (issue 45): ``/status`` showed
it ACTIVE, nothing ran, and no alert fired.

Owner: the server's loop thread (a task on it: it looks every :data:`AUDIT_INTERVAL_S` while
any run or slot is held, and sleeps otherwise until a run starts).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from channels import Channel
from channels.ports import FAILED, Outcome, RunEvent
from smoosh.daemon.control.slots import SlotGate
from smoosh.daemon.run.runs import RUNNING
from smoosh.daemon.run.scheduler import JobScheduler

__all__ = ["RunAudit", "AUDIT_INTERVAL_S", "GRACE_S", "PHANTOM_REASON", "VANISHED_ERROR"]

log = logging.getLogger(__name__)

#: Seconds between two looks while runs or slots are held (the loop's monotonic clock).
AUDIT_INTERVAL_S = 1.0
#: Seconds a run this process's worker no longer runs must stay so before it is ended.
GRACE_S = 1.0
#: Why a phantom run is dropped from its channel (``/jobs`` shows it as the key's reason).
PHANTOM_REASON = "its channel held a slot for it with no run behind it (freed by the run audit)"
#: The error of a run that was ended because nothing ran it any more.
VANISHED_ERROR = "its compaction ended without a word (ended by the run audit)"


@dataclass
class Repairs:
    """What one look found and repaired (for the tests and the log)."""

    phantoms: list[tuple[str, str]] = field(default_factory=list)  # (channel, key)
    vanished: list[tuple[str, str]] = field(default_factory=list)  # (channel, key)
    slots: tuple[int, int] | None = None  # (counted, held by runs)

    def __bool__(self) -> bool:
        return bool(self.phantoms or self.vanished or self.slots)


class RunAudit:
    """Finds slots with no run behind them and frees them (see the module docstring).

    Parameters:
        channels: the registry's channels now (a whole map, replaced, never changed in place).
        slots: the global ``max_jobs`` gate.
        scheduler_of: the job scheduler once the server runs (None before).
        worker_of: this process's worker, if it has one.
        deliver: hands a run's event to its channel the way the scheduler's own do (the
            server's :meth:`~smoosh.daemon.host.channel_host.ChannelHost.deliver`: the history
            records the drop, the channel frees the slots).
        wake: tick a channel soon (the slots freed let it start).
    """

    def __init__(
        self, *, channels: Callable[[], Mapping[str, Channel]], slots: SlotGate,
        scheduler_of: Callable[[], JobScheduler | None], worker_of: Callable[[], Any],
        deliver: Callable[[str, RunEvent], Any], wake: Callable[[str], None],
    ) -> None:
        self._channels = channels
        self._slots = slots
        self._scheduler_of = scheduler_of
        self._worker_of = worker_of
        self._deliver = deliver
        self._wake = wake
        # token -> when a run this process's worker no longer runs was first seen so.
        self._vanishing: dict[int, float] = {}
        #: Whether the task sleeps until woken (no run and no slot at its last look).
        self.asleep = False

    def tick(self, now: float) -> float | None:
        """Look once at ``now``; the next look while anything is held, else None (woken by a start)."""
        self.check(now)
        if self._anything_held():
            self.asleep = False
            return now + AUDIT_INTERVAL_S
        self.asleep = True
        return None

    def check(self, now: float) -> Repairs:
        """Compare the channels' runs and slots with the runs followed; repair what differs."""
        repairs = Repairs()
        scheduler = self._scheduler_of()
        if scheduler is None:
            return repairs
        channels = self._channels()
        for name, channel in channels.items():
            for key, token in channel.in_flight().items():
                run = scheduler.table.get(token)
                if run is not None and run.key == key and not run.ended:
                    continue
                log.error("channel %s counted a compaction of %r that nothing runs (a phantom run, token %d); "
                          "its slot is freed and its channel goes on", name, key, token)
                repairs.phantoms.append((name, key))
                self._deliver(name, RunEvent(key, token, "dropped", reason=PHANTOM_REASON))
        self._check_vanished(scheduler, now, repairs)
        held = sum(channel.slots_held() for channel in self._channels().values())
        if self._slots.busy != held:
            log.error("the max_jobs gate counted %d slot(s) taken while the runs hold %d; counted again as %d",
                      self._slots.busy, held, held)
            repairs.slots = (self._slots.busy, held)
            self._slots.recount(held)
            for name in self._slots.waiting() or list(channels):
                self._wake(name)
        return repairs

    def _check_vanished(self, scheduler: JobScheduler, now: float, repairs: Repairs) -> None:
        """End the runs this process's worker said it runs and no longer does (after the grace)."""
        worker = self._worker_of()
        seen: set[int] = set()
        for run in scheduler.runs():
            if not run.local or run.state != RUNNING or worker is None or worker.is_running(run.key):
                continue
            seen.add(run.token)
            since = self._vanishing.setdefault(run.token, now)
            if now - since < GRACE_S:
                continue
            log.error("the compaction of %r in %s is no longer run by this daemon's worker and its end was never "
                      "heard; it is ended as failed and its slot freed", run.key, run.channel)
            repairs.vanished.append((run.channel, run.key))
            scheduler.end(run, RunEvent(run.key, run.token, "ended", outcome=Outcome(FAILED, VANISHED_ERROR)))
        self._vanishing = {token: since for token, since in self._vanishing.items() if token in seen}

    def _anything_held(self) -> bool:
        scheduler = self._scheduler_of()
        if self._slots.busy or (scheduler is not None and len(scheduler.table)):
            return True
        return any(channel.in_flight() for channel in self._channels().values())
