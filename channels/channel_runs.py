"""A channel's runs: the keys it handed to its scheduler, from the start to their outcome.

A run is *starting* once the channel has submitted its key (holding one of the host's global
slots) and *active* once the scheduler reports it running; it goes back to starting when its
job waits for a worker again. It ends when it is dropped or its outcome arrives: an
interrupted run's key is queued again (set aside, after a rotation), any other outcome goes
to the host, which may defer the key for a backoff. However a run ends, its slot is given
back once.

:class:`ChannelRuns` is the run side of :class:`~channels.channel.Channel`: the channel's
start phase creates runs (:meth:`ChannelRuns._launch`), the owner's loop delivers their
events (:meth:`ChannelRuns.on_run_event`) and, at start-up, adopts runs found in flight.
Every method here runs on the owner's loop thread.
"""

from __future__ import annotations

import math

from channels.channel_state import ChannelState, Run
from channels.ports import INTERRUPTED, Outcome, RunEvent

__all__ = ["ChannelRuns"]


class ChannelRuns(ChannelState):
    """The run side of a channel: run events, runs adopted at start-up, and how each run ends."""

    def on_run_event(self, event: RunEvent, now: float) -> None:
        """Apply one step of a run (the owner delivers the scheduler's events here)."""
        key = event.key
        with self._lock:
            run = self._starting.get(key) or self._active.get(key)
        if run is None or run.token != event.run:
            self._log.debug("Channel %s: ignored %s event of an old run of %r.", self.name, event.kind, key)
            return
        if event.kind == "running":
            if event.priority:
                run.priority = event.priority  # re-checked before the start: what it is worth now
            if self._move(run, self._starting, self._active):
                self._log.debug("Channel %s: compaction of %r is running.", self.name, key)
        elif event.kind == "pending":
            if self._move(run, self._active, self._starting):
                self._log.info("Channel %s: the job of %r waits for a worker again.", self.name, key)
        elif event.kind == "dropped":
            self._end(run)
            self._log.info("Channel %s: dropped %r: %s.", self.name, key, event.reason or "it could not start")
        elif event.kind == "ended":
            self._end(run)
            timed = self._ended(run, event.outcome or Outcome("failed", "no outcome"), now)
            if event.continues:
                # Its worker waits for this channel's next key (a batch): started now, with
                # every check a tick's start makes (the window, holds, slots, the head's order).
                # That start is the one a wake would have had the next tick make; a tick still
                # follows when the end left the key waiting on a time (a backoff, a bench),
                # since only a tick sets the timer that lets it go.
                self._start_work(now)
                if timed:
                    self._host.wake(self.name)
                return
        if event.kind in ("ended", "dropped"):
            # A run that ends frees its place: the next may start. One that moves between
            # starting and active changes nothing a tick acts on (both count against the
            # concurrency; holds, windows and checkpoints go by their own state and times), and
            # every compaction's start would otherwise cost its channel a tick.
            self._host.wake(self.name)

    def adopt(self, key: str) -> bool:
        """Follow a run of ``key`` found in flight at start-up (it counts as starting); owner thread."""
        with self._lock:
            if key in self._starting or key in self._active:
                return True
        token = self._scheduler.adopt(self.name, key)
        if token is None:
            return False
        with self._lock:
            priority = self._waiting.take(key)
            self._forced.pop(key, None)
            self._starting[key] = Run(key, math.inf if priority is None else priority, token)
            self._changed_locked()
        self._host.acquire_slot(self.name, force=True)  # it runs: it holds a slot, free or not
        return True

    def in_flight(self) -> dict[str, int]:
        """Keys starting or active here, with their run tokens (owner thread)."""
        with self._lock:
            return {key: run.token for key, run in (*self._starting.items(), *self._active.items())}

    def slots_held(self) -> int:
        """How many of the host's global slots this channel's runs hold now (owner thread)."""
        with self._lock:
            return sum(1 for run in (*self._starting.values(), *self._active.values()) if run.slot)

    def _start_work(self, now: float) -> None:
        """Start work while the channel runs and has free slots (the channel's start phase)."""
        raise NotImplementedError

    def _launch(self, run: Run) -> None:
        try:
            run.token = self._scheduler.submit(self.name, run.key, run.priority)
        except Exception:
            self._log.warning("Channel %s: could not start %r; dropped.", self.name, run.key, exc_info=True)
            self._end(run)
            return
        self._log.debug("Channel %s: starting %r at priority %r.", self.name, run.key, run.priority)
        # STARTING means waiting for a worker: a run a worker took at its submit is active now.
        if self._scheduler.running_at_once(run.key, run.token):
            if self._move(run, self._starting, self._active):
                self._log.debug("Channel %s: compaction of %r is running.", self.name, run.key)
                return
        with self._lock:
            self._publish_locked()

    def _move(self, run: Run, source: dict[str, Run], target: dict[str, Run]) -> bool:
        with self._lock:
            if source.get(run.key) is not run:
                return False
            del source[run.key]
            target[run.key] = run
            self._publish_locked()
        return True

    def _end(self, run: Run) -> None:
        with self._lock:
            for runs in (self._starting, self._active):
                if runs.get(run.key) is run:
                    del runs[run.key]
                    self._changed_locked()
            slot, run.slot = run.slot, False
        if slot:
            self._host.release_slot(self.name)

    def _ended(self, run: Run, outcome: Outcome, now: float) -> bool:
        """Record a run's end; whether it left its key waiting on a time (a backoff, a bench)."""
        key = run.key
        if outcome.result == INTERRUPTED:
            # Taken back: a run stopped for a clean stop goes first after the restart.
            priority = math.inf if outcome.stopping else run.priority
            with self._lock:
                if not self._closed:
                    if outcome.rotated and len(self._queue) and key not in self._queue:
                        self._waiting.bench(key, priority)
                    else:
                        self._waiting.push(key, priority)
                    self._changed_locked()
            self._log.info(
                "Channel %s: compaction of %r was %s; queued again at priority %r.",
                self.name, key, "rotated out" if outcome.rotated else "interrupted", priority,
            )
            return bool(outcome.rotated)
        try:
            not_before = self._host.on_outcome(self.name, key, outcome, now)
        except Exception:
            self._log.exception("Channel %s: recording the outcome of %r failed.", self.name, key)
            return False
        if not_before is not None:
            with self._lock:
                if not self._closed:
                    # Queued again meanwhile (a new event): it still waits out its backoff.
                    waiting = self._waiting.take(key)
                    self._waiting.defer(key, run.priority if waiting is None else waiting, not_before)
                    self._changed_locked()
        return not_before is not None
