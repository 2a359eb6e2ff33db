"""Background threads of the job layer: a role's ``step`` on a loop, restarted after a crash.

A role (activity monitor, type monitor, notifier, type scanner) holds the logic and is
steppable on its own in tests; a :class:`Runner` only calls ``role.step()`` in a thread and
waits between steps. If a step raises, the runner logs it with the traceback, resets the
role to the state of a fresh start (what a supervisor restart does in Erlang) and goes on,
so one bad transaction never silently stops a monitor.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

log = logging.getLogger(__name__)

#: Pause (seconds) after a crashed step before the restarted role runs, so a persistent
#: failure logs a few lines per second rather than spinning.
RESTART_DELAY_S = 0.2
#: How long (seconds) :meth:`Runner.stop` waits for its thread to end.
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
        """Interrupt a step that is blocked (e.g. on a store watch) because the runner stops."""


class Runner:
    """Runs one role in a daemon thread until :meth:`stop`."""

    def __init__(self, role: Role, name: str) -> None:
        self.role = role
        self.name = f"{THREAD_NAME_PREFIX}-{name}"
        #: Crashed steps so far (for tests and status).
        self.crashes = 0
        self._kick = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def start(self) -> None:
        """Start (or, if its thread died, restart) the thread."""
        if self._stopping.is_set():
            return
        if self._thread is not None and self._thread.is_alive():
            return
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def kick(self) -> None:
        """Run the next step now instead of after the wait the last step asked for."""
        self._kick.set()

    def stop(self) -> None:
        """Ask the thread to end and interrupt whatever it waits on; see :meth:`join`."""
        self._stopping.set()
        self._kick.set()
        try:
            self.role.wake()
        except Exception:  # waking is best effort: the join below bounds the wait anyway
            log.debug("waking %s failed", self.name, exc_info=True)

    def join(self, timeout_s: float = JOIN_TIMEOUT_S) -> None:
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
            if thread.is_alive():
                log.warning("background thread %s did not stop within %.1f s", self.name, timeout_s)

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                wait_s = self.role.step()
            except Exception:
                if self._stopping.is_set():
                    break  # a step interrupted by stop() is not a crash
                self.crashes += 1
                log.exception("background thread %s crashed; restarting it", self.name)
                try:
                    self.role.reset()
                except Exception:
                    log.exception("resetting background thread %s failed", self.name)
                wait_s = RESTART_DELAY_S
            if self._stopping.is_set():
                break
            if wait_s is None or wait_s > 0:
                self._kick.wait(wait_s)
            # Cleared after the wait and before the next step: a kick that arrives during
            # the step makes the next wait return at once, so no kick is ever lost.
            self._kick.clear()
