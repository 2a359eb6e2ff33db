"""A channel: a capacity-bounded priority queue of keys, and the runs it starts for them.

A channel decides what to start and when; its :class:`~channels.ports.Scheduler` starts it
and its :class:`~channels.ports.Host` (the daemon) lends it global slots and records
outcomes. It has no thread: its owner's loop calls :meth:`Channel.tick`, which

1. ends the initial pause once ``wait_s`` has passed,
2. checks the time window (when due, and before every start),
3. puts back into the queue the keys whose not-before time (a crash's backoff) has come,
4. tells the host whether running work must hold (operator suspension, an outside hold,
   strict window),
5. starts work while the channel runs and has free slots,
6. writes a checkpoint (on another thread) when one is due,

and returns when it next needs a tick; run events arrive through :meth:`on_run_event`.

This module owns the channel's construction, its tick and the phases above, and the
operator and routing calls. Its other parts are its bases: :mod:`channels.channel_state`
(the shared state, the status snapshot and the readers), :mod:`channels.channel_runs` (each
run from its start to its outcome) and :mod:`channels.channel_checkpoints` (when a checkpoint
is written, what a restore takes).

Ownership: the owner's loop thread makes every call except :meth:`enqueue` (any thread: the
intake routes keys from its own threads) and the readers :meth:`status`, :meth:`keys`,
:meth:`waiting`, :meth:`try_snapshot` and :meth:`head` (any thread). What ``_lock`` guards for them, and
why :meth:`status` needs no lock, is told in :mod:`channels.channel_state`.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from datetime import datetime, timezone
from typing import Any, Mapping

from channels.channel_checkpoints import ChannelCheckpoints
from channels.channel_runs import ChannelRuns
from channels.channel_state import ChannelSettings, Run
from channels.checkpointer import Checkpointer, checkpoint_mapping
from channels.ports import Host, Scheduler
from channels.waiting import Waiting

__all__ = ["Channel"]

#: Seconds between two routine checks of the time window (it is also checked before a start).
WINDOW_CHECK_INTERVAL_S = 60.0
#: Default seconds between two checkpoints of the queue.
DEFAULT_CHECKPOINT_INTERVAL_S = 180.0
#: Default seconds a new channel stays paused, so early events sort before the first start.
DEFAULT_WAIT_S = 30.0


class Channel(ChannelRuns, ChannelCheckpoints):
    """A named priority channel that starts work through its scheduler, one tick at a time.

    Parameters:
        name: the channel's name (also its checkpoint file's name).
        settings: ``capacity``, ``concurrency``, ``window`` and ``strict_window``.
        scheduler: starts the chosen keys (:class:`~channels.ports.Scheduler`).
        host: slots, holds, outcomes and wake-ups (:class:`~channels.ports.Host`).
        now: the current time on the owner's clock (the one it ticks with): the initial pause
            and the first window check count from it. The window is read in wall time: the
            host's ``wall_time()`` when it has one (see :class:`~channels.ports.Host`), else
            ``now`` itself.
        state_dir: directory of ``<name>.smooshq``; None turns persistence off.
        checkpoint_interval_s: seconds between checkpoints.
        wait_s: seconds the channel stays paused after construction.
        dry_run: queue and rank, never start.

    Raises:
        ValueError, TypeError: ``settings.capacity`` is not an int >= 1.

    A checkpoint (``state_dir`` set) is restored at construction: missing means empty; a
    damaged one is moved aside to ``.corrupt-<unix seconds>`` and the channel starts empty.

    Every time the channel keeps (the pause's end, the next window check and checkpoint, a
    deferred key's not-before time) is on the owner's clock; only the window is wall time.
    """

    def __init__(
        self,
        name: str,
        settings: ChannelSettings,
        *,
        scheduler: Scheduler,
        host: Host,
        now: float,
        state_dir: str | os.PathLike[str] | None = None,
        checkpoint_interval_s: float = DEFAULT_CHECKPOINT_INTERVAL_S,
        wait_s: float = DEFAULT_WAIT_S,
        dry_run: bool = False,
    ) -> None:
        self.name = name
        self._log = logging.getLogger(f"{__name__}.{name}")
        self._settings = settings
        self._scheduler = scheduler
        self._host = host
        self._checkpointer = (
            None if state_dir is None else Checkpointer(state_dir, name, self._log, self._on_checkpoint_error)
        )
        self._checkpoint_interval_s = float(checkpoint_interval_s)
        self._dry_run = dry_run
        self._lock = threading.Lock()

        self._unpause_at = now + float(wait_s)
        self._paused = True
        self._suspended = False
        self._held = None
        self._in_window = self._window_open(settings, now, default=True)
        self._next_window_check = now
        self._next_checkpoint_at = now + self._checkpoint_interval_s
        # None = never told: the first tick reports the real state, which clears a hold a
        # crashed predecessor of this channel left in force.
        self._hold_sent: bool | None = None

        self._waiting = Waiting(settings.capacity)
        self._queue = self._waiting.queue
        self._starting = {}
        self._active = {}
        # Keys an operator forced (enqueue --force), oldest first: they start before the rest
        # of the queue, even during the start-up pause. Under _lock.
        self._forced: dict[str, None] = {}
        self._changes = 0
        self._closed = False
        self._status = {}
        self._restore(now)
        with self._lock:
            self._publish_locked()

    # -- the owner's loop -------------------------------------------------------------------

    def tick(self, now: float) -> float | None:
        """Run one iteration at ``now``; return when the channel next needs a tick (None: when woken).

        Every phase catches, logs and goes on: one bad key never stops a channel.
        """
        if self._closed:
            return None
        for what, phase in (
            ("unpausing", self._maybe_unpause),
            ("the window check", self._check_window),
            ("waking deferred keys", self._undefer),
            ("holding", self._sync_hold),
            ("starting work", self._start_work),
            ("checkpointing", self._maybe_checkpoint),
        ):
            try:
                phase(now)
            except Exception:
                self._log.exception("Channel %s: %s failed; going on.", self.name, what)
        return self.next_due()

    def next_due(self) -> float | None:
        """The earliest time something of this channel is due (None: nothing until woken)."""
        dues = []
        if self._paused:
            dues.append(self._unpause_at)
        if self._settings.window is not None:
            dues.append(self._next_window_check)
        with self._lock:
            not_before = self._waiting.earliest_not_before()
            if not_before is not None:
                dues.append(not_before)
            changed = self._checkpointer is not None and not self._checkpointer.is_current(self._changes)
        if changed:
            dues.append(self._next_checkpoint_at)
        return min(dues) if dues else None

    # -- operator and routing calls -------------------------------------------------------------

    def enqueue(self, key: str, priority: float) -> bool:
        """Queue ``key`` at ``priority`` (or move it there); any thread.

        Returns:
            True if the key is now waiting (or deferred); False if it is starting or active
            here, if the full queue evicted it at once, or if the channel is closed.

        Raises:
            TypeError, ValueError: ``priority`` is not an int or float, or is NaN.
        """
        with self._lock:
            if self._closed or key in self._starting or key in self._active:
                return False
            checkpointer = self._checkpointer
            # Written and unchanged since the owner's last tick, which then told it no checkpoint is due.
            was_current = checkpointer is not None and checkpointer.is_current(self._changes)
            changed, evicted = self._waiting.push(key, priority)
            if changed:
                self._changed_locked()
            # The owner's loop is woken only for what this key changes: a start it could make
            # now, or a checkpoint it does not know is due (and always before its first tick,
            # which has told it nothing yet). A paused, stopped or full channel, or one outside
            # its window, is ticked when that ends (its due time, a resume, a run's event), so
            # a key queued meanwhile needs no tick of its own: a backlog arriving key by key
            # would otherwise cost the loop one tick (a thread hand-off) each.
            wake = self._hold_sent is None or self._can_start_locked() or (changed and was_current)
        if evicted is not None:
            self._log.debug("Channel %s is full: evicted %r.", self.name, evicted)
        self._log.debug("Channel %s: queued %r at priority %r.", self.name, key, priority)
        if wake:
            self._host.wake(self.name)
        return evicted != key

    def force(self, key: str) -> bool:
        """Queue ``key`` to start before every other waiting key, now (``enqueue --force``); any thread.

        A key deferred after a crash leaves its backoff; the start-up pause does not hold it
        back. Operator suspension, the window, the concurrency and the host's slots still
        do: it then waits at the top of the queue (priority infinity) until they let it go.

        Returns:
            True if the key now waits here; False if it is starting or active here, or the
            channel is closed.
        """
        with self._lock:
            if self._closed or key in self._starting or key in self._active:
                return False
            self._waiting.take(key)
            evicted = self._queue.push(key, math.inf)
            if evicted != key:
                self._forced[key] = None
            self._changed_locked()
        if evicted is not None:
            self._log.debug("Channel %s is full: evicted %r.", self.name, evicted)
        self._log.info("Channel %s: %r forced to the top of the queue.", self.name, key)
        self._host.wake(self.name)
        return evicted != key

    def defer(self, key: str, priority: float, not_before: float) -> None:
        """Keep ``key`` out of the queue until ``not_before`` (a crash's backoff restored at start)."""
        with self._lock:
            self._waiting.defer(key, priority, not_before)
            self._forced.pop(key, None)
            self._changed_locked()

    def suspend(self) -> None:
        """Stop starting work and hold running work until :meth:`resume` (idempotent).

        A window check never undoes it.
        """
        with self._lock:
            changed = not self._suspended
            self._suspended = True
            self._publish_locked()
        if changed:
            self._log.debug("Channel %s suspended.", self.name)
        self._sync_hold()

    def resume(self) -> None:
        """Undo :meth:`suspend` (idempotent), also ending the initial pause; queued work starts at once."""
        with self._lock:
            changed = self._suspended or self._paused
            self._suspended = False
            self._paused = False
            self._publish_locked()
        if changed:
            self._log.debug("Channel %s resumed.", self.name)
        self._sync_hold()
        self._host.wake(self.name)

    def set_held(self, hold: Mapping[str, Any] | None) -> bool:
        """Hold the channel from outside, or release it (None): a second stop beside :meth:`suspend`.

        smoosh holds a channel this way for a cluster hold in the store; ``hold`` describes it
        for the status (who, when). Either this or a suspension stops the channel (nothing
        starts, running work holds); :meth:`resume` does not release this one, and releasing
        it does not resume a suspended channel.

        Returns:
            Whether the hold changed.
        """
        new = None if hold is None else dict(hold)
        with self._lock:
            if new == self._held:
                return False
            self._held = new
            self._publish_locked()
        if new is None:
            self._log.debug("Channel %s: its outside hold is released.", self.name)
        else:
            self._log.debug("Channel %s held from outside: %s.", self.name, new)
        self._sync_hold()
        if new is None:
            self._host.wake(self.name)
        return True

    def flush(self) -> list[str]:
        """Empty the waiting queue (deferred and benched keys too) and delete the checkpoint file.

        Returns:
            The keys dropped (the host forgets what it remembers of them: their staleness).
        """
        with self._lock:
            dropped = self._waiting.clear()
            self._forced.clear()
            self._changed_locked()
            seq = self._checkpointer.next_seq() if self._checkpointer else 0
            changes = self._changes
        self._log.debug("Channel %s flushed: %d waiting key(s) dropped.", self.name, len(dropped))
        if self._checkpointer is not None:
            self._checkpointer.write(seq, {}, changes)  # {} deletes the file
        return dropped

    def check_window(self, now: float) -> None:
        """Look at the window now, whatever its schedule says (owner's loop): the wall clock stepped,
        or the host's ``window_waived`` (or ``concurrency_raised``) changed its answer.

        The routine check comes every :data:`WINDOW_CHECK_INTERVAL_S` on the owner's clock,
        which a step of the wall clock does not move: a step into (or out of) the window
        would wait for it. Entering the window starts queued work at the next tick.
        """
        self._check_window(now, force=True)
        with self._lock:
            self._publish_locked()  # the concurrency in force may have changed with it
        self._host.wake(self.name)

    def update_settings(self, settings: ChannelSettings, now: float) -> None:
        """Apply new settings live: capacity truncates at once, the rest applies from the next tick.

        Raises:
            ValueError, TypeError: ``settings.capacity`` is not an int >= 1; nothing changed.
        """
        with self._lock:
            evicted = self._queue.set_capacity(settings.capacity)
            self._settings = settings
            if evicted:
                self._changed_locked()
            self._publish_locked()
        if evicted:
            self._log.info("Channel %s: capacity now %d, %d key(s) evicted.", self.name, settings.capacity, len(evicted))
        self._check_window(now, force=True)
        self._sync_hold()  # strict_window may have changed with the window state unchanged

    def close(self, checkpoint: bool = True) -> list[str]:
        """Stop the channel and, with ``checkpoint``, write its final checkpoint.

        Keys in flight are checkpointed at priority infinity so a successor follows them
        first. Global slots held for them are given back (a successor takes its own).
        Never raises for a failed write (it is logged and counted).

        Returns:
            The keys that were starting or active.
        """
        with self._lock:
            if self._closed:
                return []
            self._closed = True
            if checkpoint and self._checkpointer is not None:
                seq, changes = self._checkpointer.next_seq(), self._changes
                in_flight, waiting = self._snapshot_locked()
            runs = [*self._starting.values(), *self._active.values()]
            self._starting.clear()
            self._active.clear()
            self._publish_locked()
        if checkpoint and self._checkpointer is not None:
            self._checkpointer.join()
            self._checkpointer.write(seq, checkpoint_mapping(in_flight, waiting), changes)
        for run in runs:
            if run.slot:
                self._host.release_slot(self.name)
        self._host.withdraw(self.name)
        self._log.info("Channel %s closed (%d run(s) left to their workers).", self.name, len(runs))
        return [run.key for run in runs]

    # -- phases ------------------------------------------------------------------------------------

    def _maybe_unpause(self, now: float) -> None:
        with self._lock:
            if not (self._paused and now >= self._unpause_at):
                return
            self._paused = False
            self._publish_locked()
        self._log.info("Channel %s unpaused.", self.name)

    def _window_open(self, settings: ChannelSettings, now: float, default: bool) -> bool:
        window = settings.window
        if window is None:
            return True
        if self._host.window_waived(self.name):
            return True
        try:
            return bool(window.is_open(datetime.fromtimestamp(self._wall_time(now), timezone.utc)))
        except Exception:
            self._log.exception("Channel %s: window check failed; keeping the last state.", self.name)
            return default

    def _check_window(self, now: float, force: bool = False) -> None:
        if not force and now < self._next_window_check:
            return
        self._next_window_check = now + WINDOW_CHECK_INTERVAL_S
        is_open = self._window_open(self._settings, now, default=self._in_window)
        if is_open == self._in_window:
            return
        with self._lock:
            self._in_window = is_open
            self._publish_locked()
        self._log.info("Channel %s %s its window.", self.name, "entered" if is_open else "left")
        self._sync_hold()

    def _undefer(self, now: float) -> None:
        with self._lock:
            due = self._waiting.undefer(now)
            if due:
                self._changed_locked()
        for key in due:
            self._log.info("Channel %s: %r may start again after its wait.", self.name, key)

    def _sync_hold(self, now: float | None = None) -> None:
        """Tell the host the hold state if it changed (or was never told)."""
        with self._lock:
            want = self._held_locked()
        if want == self._hold_sent:
            return
        try:
            self._host.on_hold(self.name, want)
        except Exception:
            # Left unsent: the next tick tries again.
            self._log.exception("Channel %s: on_hold(%s) failed.", self.name, want)
            return
        self._hold_sent = want
        if want:
            self._log.debug("Channel %s: running work holds.", self.name)
        else:
            self._log.debug("Channel %s: running work may go on.", self.name)

    def _can_start_locked(self) -> bool:
        return (
            not self._closed
            and (not self._paused or self._forced_waiting_locked())
            and not self._stopped_locked()
            and self._in_window
            and len(self._queue) > 0
            and len(self._active) + len(self._starting) < self._concurrency_locked()
        )

    def _forced_waiting_locked(self) -> bool:
        """Whether a forced key waits in the queue (forgetting those that left it)."""
        for key in list(self._forced):
            if key in self._queue:
                return True
            del self._forced[key]
        return False

    def _pop_locked(self) -> tuple[Any, float] | None:
        """The next key to start: a forced one first (even while paused), else the queue's head."""
        while self._forced:
            key = next(iter(self._forced))
            del self._forced[key]
            priority = self._queue.get(key)
            if priority is not None:
                self._queue.remove(key)
                return key, priority
        return None if self._paused else self._queue.pop()

    def _unbench_locked(self) -> None:
        """Put keys set aside after a rotation back into the queue."""
        self._waiting.unbench()
        self._changed_locked()

    def _start_work(self, now: float) -> None:
        if self._dry_run:
            return
        while True:
            with self._lock:
                if self._waiting.has_benched() and not len(self._queue):
                    self._unbench_locked()  # nothing else waits here: no reason to hold them back
                if not self._can_start_locked():
                    break
            self._check_window(now, force=True)  # the window is checked before every start
            with self._lock:
                if not self._can_start_locked():
                    break
                forced_next = self._forced_waiting_locked()
            if not (self._host.acquire_slot(self.name, forced=True) if forced_next else self._host.acquire_slot(self.name)):
                self._log.debug("Channel %s: no global slot free.", self.name)
                return  # in line for a slot: the host wakes this channel when one frees
            with self._lock:
                head = self._pop_locked() if self._can_start_locked() else None
                if head is not None:
                    key, priority = head
                    # Marked starting in the same critical section that pops it, so a
                    # concurrent enqueue of the key is refused rather than queued twice.
                    run = Run(str(key), priority)
                    self._starting[run.key] = run
                    if self._waiting.has_benched():
                        self._unbench_locked()  # the work they made way for has its slot
                    # Published by _launch once the scheduler has the run: a run a worker
                    # takes at once is never shown as starting (waiting for a worker).
                    self._changes += 1
            if head is None:
                self._host.release_slot(self.name)
                break
            self._launch(run)
        self._host.withdraw(self.name)
