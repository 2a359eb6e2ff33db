"""A channel: a capacity-bounded priority queue of keys and the jobs it runs for them.

One channel is one loop, stepped by :meth:`Channel.tick` (tests call it with an injected
clock; :meth:`Channel.start` runs it on a daemon thread). An iteration

1. drains the events of the jobs it follows (``running``: starting -> active; ``pending``
   after running: back to starting; ``finished`` / ``not_found``: the slot is freed),
2. ends the initial pause once ``wait_s`` has passed,
3. checks the time window (every 60 s, and before every start),
4. tells ``on_hold`` whether running work must hold (operator suspension, strict window),
5. starts work while it runs and has free slots (re-checking each key's priority),
6. schedules a checkpoint (written on another thread) and republishes its status.

Locks, and why there are three:

* ``_lock`` guards the queue, the runs and the flags. It is held only for dictionary work,
  never across a callback or a job-layer call: the server's callbacks take the server's
  own lock, and the server may call :meth:`enqueue` while holding it, so calling out with
  ``_lock`` held would be a lock-order deadlock (and would stall enqueues on store I/O).
* ``_tick_lock`` keeps iterations one at a time (a test's ``tick`` and the thread's).
* ``_hold_lock`` serialises ``on_hold`` calls, so "hold" and "release" from two threads
  (operator suspend vs. a window check) reach the server in the order they were decided.

Checkpoint writes happen off the loop (:mod:`channels.checkpointer`). Readers of
:meth:`Channel.status` take no lock: the status is an immutable snapshot, rebuilt on every
change and swapped in with one attribute store.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Protocol

from channels.checkpointer import Checkpointer, checkpoint_mapping
from channels.priority_queue import PriorityQueue, _check_priority

__all__ = ["Channel", "ChannelSettings"]

#: Seconds the background loop sleeps between iterations when nothing wakes it.
LOOP_INTERVAL_S = 0.2
#: Seconds between two routine checks of the time window (it is also checked before a start).
WINDOW_CHECK_INTERVAL_S = 60.0
#: Seconds between two routine republications of the status snapshot.
STATUS_INTERVAL_S = 5.0
#: Default seconds between two checkpoints of the queue.
DEFAULT_CHECKPOINT_INTERVAL_S = 180.0
#: Default seconds a new channel stays paused, so early events sort before the first start.
DEFAULT_WAIT_S = 30.0
#: Seconds ``close`` waits for the loop thread, and for a checkpoint write in progress.
JOIN_TIMEOUT_S = 30.0
#: The ``error`` reported when a followed job disappears from the job layer.
JOB_REMOVED_ERROR = "job removed"


class ChannelSettings(Protocol):
    """What a channel reads from its settings (smoosh's ``ChannelConfig`` fits)."""

    @property
    def capacity(self) -> int: ...
    @property
    def concurrency(self) -> int: ...
    @property
    def window(self) -> Any: ...  # channels.window.Window | None
    @property
    def strict_window(self) -> bool: ...


@dataclass(eq=False)
class _Run:
    """One key the channel has handed to the job layer (starting or active)."""

    key: str
    priority: float
    slot: bool  # acquire_slot granted a global slot that must be released
    data: dict[str, Any] = field(default_factory=dict)
    sub: Any = None  # the job layer's Subscription, once the job exists


class _RunningElsewhere(Exception):
    """Raised (internally) when the key's job is already running for another channel."""

    def __init__(self, owner: object) -> None:
        super().__init__(owner)
        self.owner = owner


def _is_not_found(exc: BaseException) -> bool:
    # channels imports nothing from smoosh, so the job layer's NotFound is known by name.
    return any(cls.__name__ == "NotFound" for cls in type(exc).__mro__)


def _is_priority(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


class Channel:
    """A named priority channel that starts compaction jobs, one tick at a time.

    Parameters
    ----------
    name:
        The channel's name (also its checkpoint file's name).
    settings:
        Any object with ``capacity``, ``concurrency``, ``window`` and ``strict_window``.
    jobs:
        The job layer (or anything with ``add``, ``remove``, ``subscribe`` and
        ``get_job_state``/``get_job_data``).
    job_type:
        The job type work is added under (``"smoosh:" + node``).
    priority_of:
        ``priority_of(key) -> float``: the re-check before a start; 0 drops the key.
    on_job_done:
        ``on_job_done(channel, key, data)`` for every finished job except interrupted ones
        (which the channel re-queues itself); ``data`` carries ``result``.
    on_hold:
        ``on_hold(channel, hold)``: running work must hold (True) or may go on (False).
    acquire_slot, release_slot:
        An optional global gate: ``acquire_slot(channel, key) -> bool`` before each start,
        ``release_slot(channel, key)`` when that job ends or fails to start.
    state_dir:
        Directory of ``<name>.smooshq``; None turns persistence off.
    checkpoint_interval_s:
        Seconds between checkpoints.
    wait_s:
        Seconds the channel stays paused after construction.
    dry_run:
        Queue and rank, never start.
    clock:
        Wall-clock seconds, used by the background loop and by ``update_settings``.

    Raises
    ------
    ValueError, TypeError
        ``settings.capacity`` is not an int >= 1.

    A restored checkpoint (``state_dir`` set) is read at construction: missing means empty,
    a damaged one is moved aside to ``.corrupt-<unix seconds>`` and the channel starts empty.
    """

    def __init__(
        self,
        name: str,
        settings: ChannelSettings,
        *,
        jobs: Any,
        job_type: Any,
        priority_of: Callable[[str], float],
        on_job_done: Callable[[str, str, dict[str, Any]], None],
        on_hold: Callable[[str, bool], None] | None = None,
        acquire_slot: Callable[[str, str], bool] | None = None,
        release_slot: Callable[[str, str], None] | None = None,
        state_dir: str | os.PathLike[str] | None = None,
        checkpoint_interval_s: float = DEFAULT_CHECKPOINT_INTERVAL_S,
        wait_s: float = DEFAULT_WAIT_S,
        dry_run: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = name
        self._log = logging.getLogger(f"{__name__}.{name}")
        self._settings = settings
        self._jobs = jobs
        self._job_type = job_type
        self._priority_of = priority_of
        self._on_job_done = on_job_done
        self._on_hold = on_hold
        self._acquire_slot = acquire_slot
        self._release_slot = release_slot
        self._checkpointer = (
            None if state_dir is None else Checkpointer(state_dir, name, self._log, self._on_checkpoint_error)
        )
        self._checkpoint_interval_s = float(checkpoint_interval_s)
        self._dry_run = dry_run
        self._clock = clock

        self._lock = threading.Lock()
        # Re-entrant: a callback that closes the channel from inside a tick must not hang.
        self._tick_lock = threading.RLock()
        self._hold_lock = threading.Lock()

        now = clock()
        self._unpause_at = now + float(wait_s)
        self._paused = True
        self._suspended = False
        self._in_window = self._window_open(settings, now, default=True)
        self._next_window_check = now
        self._next_status_at = now + STATUS_INTERVAL_S
        self._next_checkpoint_at = now + self._checkpoint_interval_s
        # None = never told: the first iteration always reports the real state, which
        # clears a hold that a crashed predecessor of this channel left set in the store.
        self._hold_sent: bool | None = None

        self._queue = PriorityQueue(settings.capacity)
        self._starting: dict[str, _Run] = {}
        self._active: dict[str, _Run] = {}
        # Keys rotation stopped (DESIGN §5.6), set aside until this channel starts another
        # key: re-queued at once, the stopped key would often be the head again and restart
        # in the slot rotation freed for the work that was waiting. Checkpointed and shown
        # as waiting like the queue.
        self._benched: dict[str, float] = {}

        self._changes = 0  # bumped whenever the checkpoint's content changes

        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._closed = False
        self._status: dict[str, Any] = {}

        self._restore(now)
        with self._lock:
            self._publish_locked()

    # -- public API -------------------------------------------------------------------------

    def start(self) -> None:
        """Run :meth:`tick` on a daemon thread until :meth:`close`.

        Raises
        ------
        RuntimeError
            The channel was already started or is closed.
        """
        if self._thread is not None or self._closed:
            raise RuntimeError(f"channel {self.name} was already started or closed")
        self._thread = threading.Thread(target=self._loop, name=f"smoosh-channel-{self.name}", daemon=True)
        self._thread.start()

    def tick(self, now: float) -> None:
        """Run one iteration of the channel's loop at time ``now`` (Unix seconds).

        Every phase catches, logs and goes on: one bad key never stops a channel.
        """
        with self._tick_lock:
            if self._closed:
                return
            for what, phase in (
                ("following jobs", self._poll_jobs),
                ("unpausing", self._maybe_unpause),
                ("the window check", self._check_window),
                ("holding", self._sync_hold_phase),
                ("starting work", self._start_work),
                ("checkpointing", self._maybe_checkpoint),
                ("publishing status", self._maybe_republish),
            ):
                try:
                    phase(now)
                except Exception:
                    self._log.exception("Channel %s: %s failed; going on.", self.name, what)

    def enqueue(self, key: str, priority: float) -> bool:
        """Queue ``key`` at ``priority`` (or move it there); thread-safe.

        Returns
        -------
        True if the key is now waiting; False if it is already starting or active here, if
        the full queue evicted it at once, or if the channel is closed.

        Raises
        ------
        TypeError, ValueError
            ``priority`` is not an int or float, or is NaN.
        """
        with self._lock:
            if self._closed or key in self._starting or key in self._active:
                return False
            if key in self._benched:
                _check_priority(priority)
                self._benched[key] = priority
                self._changed_locked()
                return True
            evicted = self._queue.push(key, priority)
            self._changed_locked()
        if evicted is not None:
            self._log.debug("Channel %s is full: evicted %r.", self.name, evicted)
        self._log.debug("Channel %s: queued %r at priority %r.", self.name, key, priority)
        self._wake.set()
        return evicted != key

    def suspend(self) -> None:
        """Stop starting work and hold running work until :meth:`resume` (idempotent).

        A window check never undoes it.
        """
        with self._lock:
            changed = not self._suspended
            self._suspended = True
            self._publish_locked()
        if changed:
            self._log.info("Channel %s suspended.", self.name)
        self._sync_hold()

    def resume(self) -> None:
        """Undo :meth:`suspend` (idempotent), also ending the initial pause.

        Running work is released (unless a strict window is closed) and queued work starts
        at the next iteration, which the call wakes at once.
        """
        with self._lock:
            changed = self._suspended or self._paused
            self._suspended = False
            self._paused = False
            self._publish_locked()
        if changed:
            self._log.info("Channel %s resumed.", self.name)
        self._sync_hold()
        self._wake.set()

    def flush(self) -> None:
        """Empty the waiting queue and delete the checkpoint file; running jobs go on."""
        with self._lock:
            dropped = len(self._queue) + len(self._benched)
            self._queue.clear()
            self._benched.clear()
            self._changed_locked()
            seq = self._checkpointer.next_seq() if self._checkpointer else 0
            changes = self._changes
        self._log.info("Channel %s flushed: %d waiting key(s) dropped.", self.name, dropped)
        if self._checkpointer is not None:
            self._checkpointer.write(seq, {}, changes)  # {} deletes the file
        self._wake.set()

    def update_settings(self, settings: ChannelSettings) -> None:
        """Apply new settings live.

        A smaller capacity truncates the queue at once (evictions counted); concurrency
        applies at the next start; window and strict_window take effect at once.

        Raises
        ------
        ValueError, TypeError
            ``settings.capacity`` is not an int >= 1; nothing changed.
        """
        with self._lock:
            evicted = self._queue.set_capacity(settings.capacity)
            self._settings = settings
            if evicted:
                self._changed_locked()
            self._publish_locked()
        if evicted:
            self._log.info("Channel %s: capacity now %d, %d key(s) evicted.", self.name, settings.capacity, len(evicted))
        self._check_window(self._clock(), force=True)
        self._wake.set()

    def close(self, checkpoint: bool = True) -> None:
        """Stop the loop and, with ``checkpoint``, write the final checkpoint.

        Running jobs go on in their workers, untracked; the checkpoint lists them at
        priority infinity so that a successor channel follows them first. Global slots held
        for them are released (a successor acquires its own). Never raises for a failed
        write (it is logged and counted).
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(JOIN_TIMEOUT_S)
            if thread.is_alive():
                self._log.error("Channel %s: loop did not stop within %.0f s.", self.name, JOIN_TIMEOUT_S)
        # A test's tick may still run on another thread: let it end before the snapshot.
        got_tick = self._tick_lock.acquire(timeout=JOIN_TIMEOUT_S)
        runs: list[_Run] = []
        try:
            if checkpoint and self._checkpointer is not None:
                with self._lock:
                    seq, changes = self._checkpointer.next_seq(), self._changes
                    in_flight, waiting = self._snapshot_locked()
                self._checkpointer.write(seq, checkpoint_mapping(in_flight, waiting), changes)
            with self._lock:
                runs = list(self._starting.values()) + list(self._active.values())
                self._starting.clear()
                self._active.clear()
                self._publish_locked()
        finally:
            if got_tick:
                self._tick_lock.release()
        for run in runs:
            self._close_sub(run)
            if run.slot:
                self._release(run.key)
        self._log.info("Channel %s closed (%d running job(s) left to their workers).", self.name, len(runs))

    def join_checkpoint(self, timeout: float | None = None) -> bool:
        """Wait for a background checkpoint write to end; True if none is running now."""
        return self._checkpointer is None or self._checkpointer.join(timeout)

    def status(self) -> dict[str, Any]:
        """Return the published status snapshot; never waits on the channel.

        Returns
        -------
        ``{"active", "starting", "waiting": {"size", "min", "max"}, "paused", "suspended",
        "in_window", "held", "evicted", "concurrency", "checkpoint_errors"}`` (a copy).
        """
        snapshot = self._status  # one attribute load: the snapshot is never mutated
        return {**snapshot, "waiting": dict(snapshot["waiting"])}

    def is_alive(self) -> bool:
        """True until closed, and while the loop thread (once started) is running."""
        thread = self._thread
        return not self._closed and (thread is None or thread.is_alive())

    def keys(self) -> set[str]:
        """Return every key waiting, starting or active in this channel."""
        with self._lock:
            keys = set(self._queue)
            keys.update(self._benched)
            keys.update(self._starting)
            keys.update(self._active)
        return keys

    def try_snapshot(self, timeout_s: float = 0.05) -> tuple[set[str], list[tuple[str, float]]] | None:
        """``(keys(), waiting())`` taken together, or None if the channel stays busy past ``timeout_s``.

        For readers that must never wait on a slow or stuck channel (the status table).
        """
        if not self._lock.acquire(timeout=timeout_s):
            return None
        try:
            keys = set(self._queue)
            keys.update(self._benched)
            keys.update(self._starting)
            keys.update(self._active)
            return keys, self._waiting_locked()
        finally:
            self._lock.release()

    def waiting(self) -> list[tuple[str, float]]:
        """Return the waiting ``(key, priority)`` pairs, highest first (oldest among equals).

        Keys set aside after a rotation come last: they start after the queue's head.
        """
        with self._lock:
            return self._waiting_locked()

    def _waiting_locked(self) -> list[tuple[str, float]]:
        items = self._queue.items()
        if self._benched:
            items.extend(self._benched.items())
        return items

    def __repr__(self) -> str:
        s = self._status
        return f"<Channel {self.name} active={s.get('active')} starting={s.get('starting')} waiting={s.get('waiting')}>"

    # -- the loop -----------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick(self._clock())
            except Exception:  # tick catches per phase; this is the last line of defence
                self._log.exception("Channel %s: iteration failed; going on.", self.name)
            if self._wake.wait(LOOP_INTERVAL_S):
                # Cleared before the next tick, so a wake during that tick is not lost.
                self._wake.clear()

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
        try:
            return bool(window.is_open(datetime.fromtimestamp(now, timezone.utc)))
        except Exception:
            self._log.exception("Channel %s: window check failed; keeping the last state.", self.name)
            return default

    def _check_window(self, now: float, force: bool = False) -> None:
        with self._lock:
            if not force and now < self._next_window_check:
                return
            self._next_window_check = now + WINDOW_CHECK_INTERVAL_S
            settings, was_open = self._settings, self._in_window
        is_open = self._window_open(settings, now, default=was_open)
        with self._lock:
            changed = is_open != self._in_window
            self._in_window = is_open
            if changed:
                self._publish_locked()
        if changed:
            self._log.info("Channel %s %s its window.", self.name, "entered" if is_open else "left")
        self._sync_hold()

    def _sync_hold_phase(self, now: float) -> None:
        self._sync_hold()

    def _sync_hold(self) -> None:
        """Tell ``on_hold`` the hold state if it changed (or was never told)."""
        with self._hold_lock:
            with self._lock:
                want = self._held_locked()
            if want == self._hold_sent:
                return
            if self._on_hold is not None:
                try:
                    self._on_hold(self.name, want)
                except Exception:
                    # Left unsent: the next iteration tries again.
                    self._log.exception("Channel %s: on_hold(%s) failed.", self.name, want)
                    return
            self._hold_sent = want
        if want:
            self._log.info("Channel %s: running work holds.", self.name)
        else:
            self._log.debug("Channel %s: running work may go on.", self.name)

    def _held_locked(self) -> bool:
        return self._suspended or (bool(self._settings.strict_window) and not self._in_window)

    def _maybe_republish(self, now: float) -> None:
        if now < self._next_status_at:
            return
        self._next_status_at = now + STATUS_INTERVAL_S
        with self._lock:
            self._publish_locked()

    # -- starting work ------------------------------------------------------------------------

    def _can_start_locked(self) -> bool:
        return (
            not self._closed
            and not self._paused
            and not self._suspended
            and self._in_window
            and len(self._queue) > 0
            and len(self._active) + len(self._starting) < self._settings.concurrency
        )

    def _unbench_locked(self) -> None:
        """Put keys set aside after a rotation back into the queue."""
        for key, priority in self._benched.items():
            self._queue.push(key, priority)
        self._benched.clear()
        self._changed_locked()

    def _start_work(self, now: float) -> None:
        if self._dry_run:
            return
        while True:
            with self._lock:
                if self._benched and not len(self._queue):
                    self._unbench_locked()  # nothing else waits here: no reason to hold them back
                if not self._can_start_locked():
                    return
                head = self._queue.peek()
            assert head is not None
            key = head[0]
            self._check_window(now, force=True)  # the window is checked before every start
            granted = False
            if self._acquire_slot is not None:
                try:
                    granted = bool(self._acquire_slot(self.name, key))
                except Exception:
                    self._log.exception("Channel %s: acquire_slot failed for %r.", self.name, key)
                if not granted:
                    self._log.debug("Channel %s: no global slot free for %r.", self.name, key)
                    return
            with self._lock:
                priority = self._queue.get(key)
                ok = priority is not None and self._can_start_locked()
                if ok:
                    # The key is marked starting in the same critical section that pops it,
                    # so a concurrent enqueue of it is refused rather than queued twice.
                    self._queue.remove(key)
                    run = _Run(key, priority, slot=granted)
                    self._starting[key] = run
                    if self._benched:
                        self._unbench_locked()  # the work they made way for has its slot
                    self._changed_locked()
            if not ok:
                if granted:
                    self._release(key)
                if priority is None:
                    continue  # flushed or evicted meanwhile: look at the new head
                return
            self._launch(run)

    def _launch(self, run: _Run) -> None:
        key = run.key
        try:
            priority = self._priority_of(key)
        except Exception:
            self._log.warning("Channel %s: priority re-check of %r failed; counted as 0.", self.name, key, exc_info=True)
            priority = 0
        if not _is_priority(priority):
            self._log.info("Channel %s: dropped %r: its priority is now 0 (compacted or gone).", self.name, key)
            self._abandon(run)
            return
        run.priority = priority
        run.data = {"channel": self.name, "key": key, "priority": float(priority), "progress": 0.0}
        try:
            sub = self._add_and_subscribe(run)
        except _RunningElsewhere as exc:
            self._log.info(
                "Channel %s: dropped %r: it is already being compacted by channel %r.", self.name, key, exc.owner
            )
            self._abandon(run)
            return
        except Exception:
            self._log.warning("Channel %s: could not start %r; dropped.", self.name, key, exc_info=True)
            self._abandon(run)
            return
        if sub is None:
            self._finish(run, {**run.data, "result": "failed", "error": JOB_REMOVED_ERROR}, remove_job=False)
            return
        run.sub = sub
        self._log.info("Channel %s: starting compaction of %r at priority %r.", self.name, key, priority)
        state = sub.state
        if state in ("running", "finished", "not_found"):
            if self._on_event(run, state, sub.data):
                return
        self._poll_run(run)

    def _add_and_subscribe(self, run: _Run) -> Any:
        """Add the job (or adopt one already running here) and subscribe; None if it vanished."""
        key = run.key
        try:
            state = self._jobs.get_job_state(self._job_type, key)
            owner = self.name
            if state == "running":
                owner = (self._jobs.get_job_data(self._job_type, key) or {}).get("channel", self.name)
        except Exception as exc:
            if not _is_not_found(exc):
                raise
            state = None
        if state == "running" and owner != self.name:
            raise _RunningElsewhere(owner)
        if state == "running":
            # A worker kept this job across a restart of the channel: follow it rather than
            # add it again (adding a running job flags it to run a second time).
            self._log.info("Channel %s: %r is already running; following its job.", self.name, key)
        else:
            self._jobs.add(self._job_type, key, run.data)
        try:
            return self._jobs.subscribe(self._job_type, key)
        except Exception as exc:
            if _is_not_found(exc):
                return None
            try:
                self._jobs.remove(self._job_type, key)  # nobody would ever follow it
            except Exception:
                pass
            raise

    def _abandon(self, run: _Run) -> None:
        with self._lock:
            if self._starting.get(run.key) is run:
                del self._starting[run.key]
                self._changed_locked()
        if run.slot:
            self._release(run.key)

    def _release(self, key: str) -> None:
        if self._release_slot is None:
            return
        try:
            self._release_slot(self.name, key)
        except Exception:
            self._log.exception("Channel %s: release_slot failed for %r.", self.name, key)

    # -- following jobs -----------------------------------------------------------------------

    def _poll_jobs(self, now: float) -> None:
        with self._lock:
            runs = list(self._starting.values()) + list(self._active.values())
        for run in runs:
            try:
                self._poll_run(run)
            except Exception:
                self._log.exception("Channel %s: following the job of %r failed.", self.name, run.key)

    def _poll_run(self, run: _Run) -> None:
        sub = run.sub
        if sub is None:
            return
        while True:
            event = sub.wait(timeout=0)
            if event is None:
                return
            if self._on_event(run, event[2], event[3]):
                return

    def _on_event(self, run: _Run, state: str, data: Any) -> bool:
        """Apply one job event; True when the run has ended."""
        key = run.key
        if state == "running":
            with self._lock:
                moved = self._starting.get(key) is run
                if moved:
                    del self._starting[key]
                    self._active[key] = run
                    self._publish_locked()
            if moved:
                self._log.info("Channel %s: started compaction of %r.", self.name, key)
            return False
        if state == "pending":
            with self._lock:
                moved = self._active.get(key) is run
                if moved:
                    del self._active[key]
                    self._starting[key] = run
                    self._publish_locked()
            if moved:
                self._log.info("Channel %s: the job of %r is pending again; waiting for a worker.", self.name, key)
            return False
        if state == "finished":
            self._finish(run, data if isinstance(data, dict) else dict(run.data), remove_job=True)
            return True
        if state == "not_found":
            self._finish(run, {**run.data, "result": "failed", "error": JOB_REMOVED_ERROR}, remove_job=False)
            return True
        self._log.debug("Channel %s: ignored job event %r for %r.", self.name, state, key)
        return False

    def _finish(self, run: _Run, data: dict[str, Any], *, remove_job: bool) -> None:
        key = run.key
        with self._lock:
            for runs in (self._starting, self._active):
                if runs.get(key) is run:
                    del runs[key]
                    self._changed_locked()
        self._close_sub(run)
        if run.slot:
            self._release(key)
        if remove_job:
            try:
                self._jobs.remove(self._job_type, key)
            except Exception as exc:
                if not _is_not_found(exc):
                    self._log.warning("Channel %s: could not remove the job of %r.", self.name, key, exc_info=True)
        result = data.get("result")
        if result == "interrupted":
            priority = data.get("priority")
            if not _is_priority(priority):
                priority = run.priority
            rotated = bool(data.get("rotated"))
            with self._lock:
                if not self._closed:
                    if rotated and len(self._queue) and key not in self._queue:
                        self._benched[key] = priority
                    else:
                        self._queue.push(key, priority)
                    self._changed_locked()
            self._log.info(
                "Channel %s: compaction of %r was %s; re-queued at priority %r.",
                self.name, key, "rotated out" if rotated else "interrupted", priority,
            )
        else:
            self._log.info("Channel %s: compaction of %r ended: %s.", self.name, key, result)
            try:
                self._on_job_done(self.name, key, data)
            except Exception:
                self._log.exception("Channel %s: on_job_done failed for %r.", self.name, key)
        self._wake.set()

    def _close_sub(self, run: _Run) -> None:
        if run.sub is None:
            return
        try:
            run.sub.close()
        except Exception:
            self._log.debug("Channel %s: closing the subscription of %r failed.", self.name, run.key, exc_info=True)

    # -- status and persistence -----------------------------------------------------------------

    def _changed_locked(self) -> None:
        """The checkpoint's content changed: note it and republish the status."""
        self._changes += 1
        self._publish_locked()

    def _publish_locked(self) -> None:
        info = self._queue.info()
        size, low, high = info["size"], info["min"], info["max"]
        if self._benched:
            benched = self._benched.values()
            low = min(benched) if not size else min(low, min(benched))
            high = max(benched) if not size else max(high, max(benched))
            size += len(self._benched)
        self._status = {
            "active": len(self._active),
            "starting": len(self._starting),
            "waiting": {"size": size, "min": low, "max": high},
            "paused": self._paused,
            "suspended": self._suspended,
            "in_window": self._in_window,
            "held": self._held_locked(),
            "evicted": self._queue.evicted,
            "concurrency": self._settings.concurrency,
            "checkpoint_errors": 0 if self._checkpointer is None else self._checkpointer.errors,
        }

    def _snapshot_locked(self) -> tuple[list[str], list[tuple[str, float]]]:
        """The checkpoint's content as cheap copies; the mapping is built outside the lock."""
        return [*self._starting, *self._active], self._waiting_locked()

    def _on_checkpoint_error(self) -> None:
        with self._lock:
            self._publish_locked()

    def _maybe_checkpoint(self, now: float) -> None:
        checkpointer = self._checkpointer
        if checkpointer is None or now < self._next_checkpoint_at:
            return
        self._next_checkpoint_at = now + self._checkpoint_interval_s
        if checkpointer.busy():
            self._log.debug("Channel %s: previous checkpoint still running; skipped.", self.name)
            return
        with self._lock:
            if checkpointer.is_current(self._changes):
                return  # the file already holds exactly this state
            seq, changes = checkpointer.next_seq(), self._changes
            in_flight, waiting = self._snapshot_locked()
        checkpointer.write_async(seq, in_flight, waiting, changes)

    def _restore(self, now: float) -> None:
        checkpointer = self._checkpointer
        if checkpointer is None:
            return
        mapping = checkpointer.restore(now)
        # Stable sort: equal priorities keep the file's (oldest-first) order.
        entries = sorted(mapping.items(), key=lambda item: item[1], reverse=True)
        capacity = self._queue.capacity
        for key, priority in entries[:capacity]:
            self._queue.push(key, priority)
        dropped = max(0, len(entries) - capacity)
        if not dropped:
            checkpointer.restored(self._changes)  # the file holds exactly this state
        if entries:
            self._log.info(
                "Channel %s: restored %d key(s) from %r (%d dropped over capacity).",
                self.name, min(len(entries), capacity), checkpointer.path, dropped,
            )
