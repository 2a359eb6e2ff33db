"""Gates that hold one run of an in-process server at a chosen point of its life.

The compaction itself is the real one (the built-in SQLite compactor on a real file); a gate
only makes its thread wait, at one of three points, until the test lets it go on:

* in the claim, as the run's priority is re-checked (:func:`gate_recheck`): the run is
  ``claimed``, this process's worker holding a slot for it;
* in the compaction, before the compactor opens the file (:class:`GatedCompactor`): ``running``;
* after the compaction, as the worker tells its end (:func:`gate_end`): ``finishing``, the
  end's news not yet given to the server's loop (the worker's slot free, or kept for the
  channel's next key when the run may go on with it: a batch).

Every wait is bounded (``HANG_S``): a gate nobody opens fails the test instead of hanging it.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from helpers.daemon import HANG_S

__all__ = ["Gate", "GatedCompactor", "gate_recheck", "gate_end"]


class Gate:
    """One point a run's thread waits at until :meth:`release`."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self._released = threading.Event()
        #: The run's compaction context, for a gate in the compaction (progress, stop reason).
        self.ctx: Any = None

    def wait_entered(self) -> None:
        """Wait (bounded) until the run's thread reached the gate."""
        assert self.entered.wait(HANG_S), "the run never reached its gate"

    def release(self) -> None:
        """Let the run's thread go on (idempotent)."""
        self._released.set()

    def pass_through(self) -> None:
        """On the run's thread: say it is here, and wait to be let go."""
        self.entered.set()
        assert self._released.wait(HANG_S), "the gate was never opened"


class GatedCompactor:
    """The real compactor, whose compaction of a key waits at a gate the test closed for it.

    Everything else is the inner compactor's (its look, its live configuration, its roots).
    A run stopped or held while it waits is let go at once, so that it sees the stop.
    """

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._gates: dict[str, Gate] = {}
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def hold(self, key: str) -> Gate:
        """Close a gate on the next compaction of ``key``."""
        gate = Gate()
        with self._lock:
            self._gates[key] = gate
        return gate

    def compact(self, key: str, ctx: Any) -> Any:
        with self._lock:
            gate = self._gates.pop(key, None)
        if gate is not None:
            gate.ctx = ctx
            ctx.on_cancel(gate.release)
            gate.pass_through()
        return self._inner.compact(key, ctx)


def gate_recheck(server: Any, key: str) -> Gate:
    """Close a gate on the next re-check of ``key``'s priority (the claim of its run)."""
    scheduler = server._scheduler
    recheck: Callable[[str, str], float] = scheduler._recheck
    gate = Gate()
    armed = [True]

    def gated(channel: str, checked: str) -> float:
        if checked == key and armed[0]:
            armed[0] = False
            gate.pass_through()
        return recheck(channel, checked)

    scheduler._recheck = gated
    return gate


class _GatedListener:
    """The worker's listener (the server's scheduler), whose news of ``key``'s end waits at a gate."""

    def __init__(self, inner: Any, key: str, gate: Gate) -> None:
        self._inner = inner
        self._key = key
        self._gate: Gate | None = gate

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _pass(self, key: str) -> None:
        gate = self._gate
        if key == self._key and gate is not None:
            self._gate = None
            gate.pass_through()

    def run_ended(self, key: str, data: dict[str, Any], outcome: Any) -> None:
        self._pass(key)
        self._inner.run_ended(key, data, outcome)

    def run_continues(self, key: str, data: dict[str, Any], outcome: Any, taken: Any, carrier: Any) -> Any:
        # A claimed run's end, told by a thread that may take its channel's next key (a batch)
        self._pass(key)
        return self._inner.run_continues(key, data, outcome, taken, carrier)


def gate_end(server: Any, key: str) -> Gate:
    """Close a gate on the news of the end of ``key``'s next run, as its worker tells it."""
    gate = Gate()
    worker = server._worker
    worker.listener = _GatedListener(worker.listener, key, gate)
    return gate
