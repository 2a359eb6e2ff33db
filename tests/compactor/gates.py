"""A compactor wrapper that stops a real compaction at a chosen point until the test lets it go."""

from __future__ import annotations

import threading
from typing import Any, Callable

from helpers.daemon import HANG_S
from smoosh.compactors.base import CompactionContext, CompactionResult

#: Longest a gate waits for the test (seconds), so a broken test never hangs the suite; a
#: ceiling only, never reached by a test that releases it (a busy machine is no reason to).
GATE_TIMEOUT_S = HANG_S


class _GatedContext:
    def __init__(self, gated: "GatedCompactor", ctx: CompactionContext) -> None:
        self._gated = gated
        self._ctx = ctx
        self._checkpoints = 0
        self._progress_gate_done = False

    def progress(self, fraction: float) -> None:
        self._ctx.progress(fraction)
        if self._gated.at_progress and not self._progress_gate_done and 0 < fraction < 1:
            self._progress_gate_done = True
            self._gated.pass_gate()

    def checkpoint(self) -> None:
        self._checkpoints += 1
        if self._checkpoints == self._gated.at_checkpoint:
            self._gated.pass_gate()
        self._gated.entered_checkpoint.set()
        self._ctx.checkpoint()
        self._gated.checkpoints_passed += 1

    def on_cancel(self, fn: Callable[[], None]) -> None:
        self._ctx.on_cancel(fn)

    def pause(self, seconds: float) -> None:
        self._ctx.pause(seconds)


class GatedCompactor:
    """Delegates to ``inner``; at the ``at_checkpoint``-th chunk boundary (or the first
    mid-way progress report, with ``at_progress``) it sets ``reached`` and waits for ``release``."""

    def __init__(self, inner: Any, *, at_checkpoint: int | None = None, at_progress: bool = False,
                 timeout_s: float = GATE_TIMEOUT_S) -> None:
        self.inner = inner
        self.name = inner.name
        self.at_checkpoint = at_checkpoint
        self.at_progress = at_progress
        self.timeout_s = timeout_s
        self.reached = threading.Event()
        self.release = threading.Event()
        self.entered_checkpoint = threading.Event()
        self.checkpoints_passed = 0
        self.on_reached: Callable[[], None] | None = None

    def pass_gate(self) -> None:
        self.reached.set()
        if self.on_reached is not None:
            self.on_reached()
        self.release.wait(self.timeout_s)

    def claims(self, key: str) -> bool:
        return self.inner.claims(key)

    def sizes(self, key: str, **kw: Any) -> Any:
        return self.inner.sizes(key, **kw)

    def needs_upgrade(self, key: str) -> bool:
        return self.inner.needs_upgrade(key)

    def cleanup_priority(self, key: str) -> float:
        return self.inner.cleanup_priority(key)

    def compact(self, key: str, ctx: CompactionContext) -> CompactionResult:
        return self.inner.compact(key, _GatedContext(self, ctx))


class GateEachRun(GatedCompactor):
    """A :class:`GatedCompactor` whose gate stops every run, not only the first: ``arrived``
    counts the runs that reached it, and each :meth:`let_one_through` lets one of them on."""

    def __init__(self, inner: Any, *, at_checkpoint: int, timeout_s: float = GATE_TIMEOUT_S) -> None:
        super().__init__(inner, at_checkpoint=at_checkpoint, timeout_s=timeout_s)
        self.arrived = threading.Semaphore(0)
        self._through = threading.Semaphore(0)

    def pass_gate(self) -> None:
        self.reached.set()
        self.arrived.release()
        self._through.acquire(timeout=self.timeout_s)

    def let_one_through(self) -> None:
        """Let the run waiting at the gate (or the next to reach it) go on."""
        self._through.release()
