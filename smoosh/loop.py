"""One loop abstraction for every background role: tasks ticked on one thread, one injected monotonic clock.

A role is a :class:`Task`: ``tick(now)`` does whatever is due at ``now`` and returns when it
next wants to run (an absolute time on the loop's clock), or None to wait until it is woken.
The clock is monotonic (DESIGN §12): a due time is "so many seconds from now", and a wall
clock set back a day would keep every task asleep for that day.
A :class:`Loop` runs many tasks one iteration at a time and is the owner of everything its
tasks touch: other threads never call into a task, they :meth:`Loop.post` a message (a
callable) that the loop runs between ticks, or :meth:`Loop.call` one and wait for its answer.
So the state of a role needs no lock, and an idle loop sleeps until the earliest due time or a
message: it never wakes on a polling interval.

An iteration runs on the loop's own thread or, while that thread sleeps, on a thread that
posted news and then offers to run it (:meth:`Loop.help`, at a point where it holds no lock):
a compaction thread that tells the loop its run ended then starts the next run itself, and the
loop's thread sleeps through the hand-off. Either way one iteration runs at a time, under
``_run_lock``, so the tasks keep a single owner: whoever runs the iteration.

Tests do not start the thread: they call :meth:`Loop.run_once` with their own ``now`` (the
injected clock), which runs the queued messages and every due task, exactly as the thread
would.

A task that raises is logged with its traceback and ticked again after :data:`CRASH_PAUSE_S`
(its :meth:`Task.reset`, if it has one, runs first): one bad tick never ends a loop.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, TypeVar

__all__ = ["Clock", "Task", "Loop", "LoopStopped", "CRASH_PAUSE_S", "quietly"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Monotonic seconds (``time.monotonic``); tests inject their own.
Clock = Callable[[], float]

#: Seconds before a task whose tick raised is ticked again (a persistent failure logs a few
#: lines a second instead of spinning).
CRASH_PAUSE_S = 1.0
#: Seconds :meth:`Loop.stop` waits for the thread to end.
JOIN_TIMEOUT_S = 10.0
#: Iterations one :meth:`Loop.help` runs at most: news its own iteration posted or woke runs
#: in the next, and a helper that keeps finding more hands the rest to the loop's thread.
HELP_ITERATIONS = 3


class LoopStopped(RuntimeError):
    """Raised by :meth:`Loop.call` when the loop stops before it ran the call."""


class Task(Protocol):
    """A background role stepped by a :class:`Loop`."""

    def tick(self, now: float) -> float | None:
        """Do what is due at ``now``; return the next time to be ticked (None: only when woken)."""


@dataclass(eq=False)
class _Entry:
    task: Task
    name: str
    due: float | None = 0.0  # 0: tick at the first run
    woken: bool = False
    crashes: int = 0


@dataclass(eq=False)
class _Reply:
    done: threading.Event = field(default_factory=threading.Event)
    value: Any = None
    error: BaseException | None = None


class Loop:
    """Runs tasks and messages one iteration at a time (on its thread, or a helper's); the owner of their state.

    Parameters:
        name: the thread's name.
        clock: the clock ``now`` is read from and due times are on (``time.monotonic`` by
            default; a wall clock would stall every task for as long as it is set back).
    """

    def __init__(self, name: str, *, clock: Clock = time.monotonic) -> None:
        self.name = name
        self.clock = clock
        self._cond = threading.Condition()
        self._inbox: collections.deque[Callable[[], None]] = collections.deque()
        self._tasks: dict[Task, _Entry] = {}
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._woken = False
        # The thread's wait (under _cond): whether it waits now, and until when (None: until
        # woken). help() reads them: it runs an iteration only while the thread sleeps, and
        # wakes it after when a task is due before the end of that sleep.
        self._waiting = False
        self._wait_until: float | None = None
        # One iteration at a time: the thread's, a helper's (help()) or a test's run_once.
        self._run_lock = threading.RLock()
        self._current: threading.Thread | None = None  # the thread inside run_once now

    # -- tasks -----------------------------------------------------------------------------

    def add(self, task: Task, name: str, *, due: float | None = 0.0) -> None:
        """Start ticking ``task`` (first at ``due``; 0 = at once). Owner thread or before start."""
        with self._cond:
            self._tasks[task] = _Entry(task, name, due)
            self._cond.notify()

    def remove(self, task: Task) -> None:
        """Stop ticking ``task`` (a no-op if it is not there)."""
        with self._cond:
            self._tasks.pop(task, None)

    def wake(self, task: Task | None = None) -> None:
        """Tick ``task`` (or just run the loop) as soon as possible; callable from any thread."""
        with self._cond:
            if task is not None:
                entry = self._tasks.get(task)
                if entry is not None:
                    entry.woken = True
            self._woken = True
            if self._current is not threading.current_thread():
                # From inside an iteration, its runner looks again before it sleeps (or leaves).
                self._cond.notify()

    # -- messages --------------------------------------------------------------------------

    def post(self, fn: Callable[[], None], *, helped: bool = False) -> None:
        """Run ``fn`` in the loop's next iteration, before its ticks; callable from any thread.

        Messages run in the order they were posted. An exception is logged and dropped.

        ``helped``: the caller calls :meth:`help` on this thread right after, holding no lock
        the loop's work may take. The loop's thread is then not woken for ``fn`` (a wake-up is
        a thread hand-off): asleep, the caller runs the iteration; awake, the thread looks at
        its messages before it sleeps again.
        """
        with self._cond:
            self._inbox.append(fn)
            if helped or self._current is threading.current_thread():
                return  # a helper comes, or this is inside an iteration, whose runner looks again
            self._cond.notify()

    def help(self) -> None:
        """Run the messages waiting (and the ticks they lead to) on this thread, while the
        loop's thread sleeps; a no-op otherwise. Any thread that holds no lock the loop's work
        may take (see :meth:`post`'s ``helped``).

        When another iteration runs now, the loop's thread is woken to take the messages after
        it. When a task is due before the loop's thread would wake, it is woken to sleep less.
        A loop without its thread (tests stepping :meth:`run_once`) is never helped.
        """
        if self._thread is None or self.on_loop_thread():
            return
        with self._cond:
            if not self._inbox or not self._waiting:
                return  # nothing waits, or the thread is awake and looks before it sleeps
        if not self._run_lock.acquire(blocking=False):
            with self._cond:
                self._cond.notify()  # the thread takes them once the iteration under way ends
            return
        try:
            for _ in range(HELP_ITERATIONS):
                next_due = self.run_once()
                with self._cond:
                    if self._stopping or not (self._inbox or self._woken):
                        break
            with self._cond:
                if self._stopping or self._inbox or self._woken:
                    self._cond.notify()
                elif self._waiting and next_due is not None and (
                        self._wait_until is None or next_due < self._wait_until):
                    self._cond.notify()
        finally:
            self._run_lock.release()

    def call(self, fn: Callable[[], T], timeout_s: float | None = None) -> T:
        """Run ``fn`` in the loop's next iteration and return its result (or raise its exception).

        Inside an iteration (on the loop's thread or a helper's), or when no thread runs (tests
        stepping ``run_once``, a server that is not started), ``fn`` runs at once in the caller.

        Raises:
            LoopStopped: the loop stopped first.
            TimeoutError: ``timeout_s`` passed first.
        """
        thread = self._thread
        me = threading.current_thread()
        if thread is None or thread is me or self._current is me or not thread.is_alive():
            return fn()
        reply = _Reply()

        def run() -> None:
            try:
                reply.value = fn()
            except BaseException as exc:  # handed to the caller, who re-raises it
                reply.error = exc
            finally:
                reply.done.set()

        with self._cond:
            if self._stopping:
                raise LoopStopped(f"{self.name} is stopping")
            self._inbox.append(run)
            self._cond.notify()
        if not reply.done.wait(timeout_s):
            raise TimeoutError(f"{self.name} did not answer within {timeout_s} s")
        if reply.error is not None:
            raise reply.error
        return reply.value

    def on_loop_thread(self) -> bool:
        """Whether the caller runs on this loop's thread (or inside one of its iterations)."""
        me = threading.current_thread()
        return self._thread is me or self._current is me

    # -- running ---------------------------------------------------------------------------

    def run_once(self, now: float | None = None) -> float | None:
        """Run every queued message, then every task that is due or woken, once.

        Parameters:
            now: the time to tick at; None reads the clock.

        Returns:
            The earliest time any task wants to be ticked next (None: none does).
        """
        with self._run_lock:
            previous, self._current = self._current, threading.current_thread()
            try:
                return self._run_once(now)
            finally:
                self._current = previous

    def _run_once(self, now: float | None) -> float | None:
        while True:
            with self._cond:
                if not self._inbox:
                    self._woken = False
                    break
                fn = self._inbox.popleft()
            try:
                fn()
            except Exception:
                log.exception("%s: a message failed", self.name)
        now = self.clock() if now is None else now
        with self._cond:
            entries = list(self._tasks.values())
        for entry in entries:
            if not entry.woken and (entry.due is None or entry.due > now):
                continue
            entry.woken = False
            try:
                entry.due = entry.task.tick(now)
                entry.crashes = 0
            except Exception:
                entry.crashes += 1
                log.exception("%s: %s failed; ticking it again in %.0f s", self.name, entry.name, CRASH_PAUSE_S)
                reset = getattr(entry.task, "reset", None)
                if reset is not None:
                    try:
                        reset()
                    except Exception:
                        log.exception("%s: resetting %s failed", self.name, entry.name)
                entry.due = now + CRASH_PAUSE_S
        with self._cond:
            dues = [e.due for e in self._tasks.values() if e.due is not None]
            if any(e.woken for e in self._tasks.values()):
                return now
        return min(dues) if dues else None

    def start(self) -> None:
        """Run the loop on a daemon thread until :meth:`stop`."""
        if self._thread is not None:
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = JOIN_TIMEOUT_S) -> None:
        """End the thread after the iteration in progress; messages still queued run first."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
            if thread.is_alive():
                log.error("%s did not stop within %.0f s", self.name, timeout_s)
        self._thread = None

    def is_alive(self) -> bool:
        """Whether the loop's thread runs."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def _run(self) -> None:
        while True:
            try:
                next_due = self.run_once()
            except BaseException:
                log.exception("%s: iteration failed", self.name)
                next_due = self.clock() + CRASH_PAUSE_S
            with self._cond:
                if self._stopping:
                    break
                if self._inbox or self._woken:
                    continue
                self._waiting, self._wait_until = True, next_due
                try:
                    self._cond.wait(None if next_due is None else max(0.0, next_due - self.clock()))
                finally:
                    self._waiting, self._wait_until = False, None
        # What was posted before stop() still runs (a stop message, a final checkpoint).
        self.run_once()


def quietly(fn: Callable[[], Any], doing: str, logger: logging.Logger = log) -> None:
    """Run ``fn``; an error is logged (``error while <doing>``, with its traceback), never raised.

    For the steps of stopping, closing or retuning several parts in turn: one part's failure
    must not keep the others from their turn.
    """
    try:
        fn()
    except Exception:
        logger.exception("error while %s", doing)
