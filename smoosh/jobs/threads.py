"""The job layer's background roles, all stepped on one loop thread, restarted after a crash.

A role (activity monitor, type monitor, notifier, type scanner) holds the logic and is
steppable on its own in tests: ``step()`` does one round and returns how long to wait before
the next (None: until kicked). A :class:`Runner` puts one role on a
:class:`~smoosh.loop.Loop`; a layer's roles share one loop (:class:`Roles`), so however
many types and subscriptions it has, it runs one thread, asleep until a role is due or
kicked. No role blocks: a type monitor arms a store watch whose callback kicks it.

If a step raises, the runner logs it with the traceback, resets the role to the state of a
fresh start (what a supervisor restart does in Erlang) and steps it again after
:data:`RESTART_DELAY_S`, so one bad transaction never silently stops a monitor.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

from smoosh.loop import Loop

__all__ = ["Role", "Runner", "Roles", "RESTART_DELAY_S", "THREAD_NAME_PREFIX"]

log = logging.getLogger(__name__)

#: Pause (seconds) after a crashed step before the restarted role runs, so a persistent
#: failure logs a few lines per second rather than spinning.
RESTART_DELAY_S = 0.2
#: How long (seconds) stopping the roles' thread may take.
JOIN_TIMEOUT_S = 5.0
#: Prefix of every job-layer thread's name (tests look for leaked threads by it).
THREAD_NAME_PREFIX = "smoosh-jobs"


class Role(Protocol):
    """What a runner runs."""

    def step(self) -> float | None:
        """Do one round of work; return seconds to wait before the next (None: until kicked)."""

    def reset(self) -> None:
        """Return to the state of a fresh start (called after a crashed step)."""

    def wake(self) -> None:
        """The role is being stopped: release what it holds (a store watch)."""


class Roles:
    """One loop thread for every role of a job layer, started with the first role.

    Owner: the layer's supervisor; runners add and remove their tasks through it.
    """

    def __init__(self, name: str = "roles") -> None:
        self.loop = Loop(f"{THREAD_NAME_PREFIX}-{name}")
        self._lock = threading.Lock()
        self._closed = False

    def ensure_running(self) -> None:
        """Start the loop's thread (again, if it died)."""
        with self._lock:
            if not self._closed and not self.loop.is_alive():
                self.loop.stop(0)  # forget a dead thread before starting anew
                self.loop.start()

    def is_alive(self) -> bool:
        """Whether the loop's thread runs."""
        return self.loop.is_alive()

    def close(self, timeout_s: float = JOIN_TIMEOUT_S) -> None:
        """Stop the thread (after the step in progress)."""
        with self._lock:
            self._closed = True
        self.loop.stop(timeout_s)


class Runner:
    """One role on a :class:`Roles` loop (its own, when none is given)."""

    def __init__(self, role: Role, name: str, roles: Roles | None = None) -> None:
        self.role = role
        self.name = f"{THREAD_NAME_PREFIX}-{name}"
        #: Crashed steps so far (for tests and status).
        self.crashes = 0
        self._roles = roles if roles is not None else Roles(name)
        self._owns_roles = roles is None
        self._stopping = threading.Event()
        self._added = False

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def start(self) -> None:
        """Put the role on its loop (again, if it was taken off or the loop's thread died)."""
        if self._stopping.is_set():
            return
        self._roles.ensure_running()
        if not self._added:
            self._added = True
            self._roles.loop.add(self, self.name)

    def is_alive(self) -> bool:
        """Whether the role is stepped: on its loop, and the loop's thread runs."""
        return self._added and self._roles.is_alive()

    def kick(self) -> None:
        """Step the role now instead of after the wait its last step asked for (any thread)."""
        self._roles.loop.wake(self)

    def stop(self) -> None:
        """Take the role off its loop and release what it holds; see :meth:`join`."""
        self._stopping.set()
        self._added = False
        self._roles.loop.remove(self)
        try:
            self.role.wake()
        except Exception:  # waking is best effort
            log.debug("waking %s failed", self.name, exc_info=True)
        if self._owns_roles:
            self._roles.close(0)

    def join(self, timeout_s: float = JOIN_TIMEOUT_S) -> None:
        """Wait for a step in progress to end (a role stopped while its step runs)."""
        if self._owns_roles:
            self._roles.close(timeout_s)
        elif not self._roles.loop.on_loop_thread() and self._roles.is_alive():
            try:
                self._roles.loop.call(lambda: None, timeout_s)
            except Exception:  # a loop that stops or hangs: nothing more to wait for here
                log.debug("waiting for %s failed", self.name, exc_info=True)

    def tick(self, now: float) -> float | None:
        """The loop's tick: one step of the role (a crash is logged, the role reset)."""
        if self._stopping.is_set():
            return None
        try:
            wait_s = self.role.step()
        except Exception:
            if self._stopping.is_set():
                return None  # a step interrupted by stop() is not a crash
            self.crashes += 1
            log.exception("background thread %s crashed; restarting it", self.name)
            try:
                self.role.reset()
            except Exception:
                log.exception("resetting background thread %s failed", self.name)
            return now + RESTART_DELAY_S
        return None if wait_s is None else now + max(0.0, wait_s)
