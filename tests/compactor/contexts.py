"""A CompactionContext for driving compactors directly in tests."""

from __future__ import annotations

import threading
from typing import Callable

from smoosh.compactors.base import Interrupted


class RecordingContext:
    """Records progress; ``before_chunk(n)`` runs at the n-th checkpoint (may raise or cancel)."""

    def __init__(
        self, before_chunk: Callable[[int], None] | None = None, *, on_pause: Callable[[float], None] | None = None,
    ) -> None:
        self.on_pause = on_pause  # what a pause does instead of sleeping (a test's recorder)
        self.fractions: list[float] = []
        self.checkpoints = 0
        self.cancel_fns: list[Callable[[], None]] = []
        self.before_chunk = before_chunk
        self.stop = threading.Event()
        self._lock = threading.Lock()

    def progress(self, fraction: float) -> None:
        with self._lock:
            self.fractions.append(fraction)

    def checkpoint(self) -> None:
        self.checkpoints += 1
        if self.before_chunk is not None:
            self.before_chunk(self.checkpoints)
        if self.stop.is_set():
            raise Interrupted("stopped")

    def on_cancel(self, fn: Callable[[], None]) -> None:
        self.cancel_fns.append(fn)
        if self.stop.is_set():
            fn()

    def pause(self, seconds: float) -> None:
        """A plain sleep, ended early by a stop (as the worker's is); ``on_pause`` instead when given."""
        if self.on_pause is not None:
            self.on_pause(seconds)
        else:
            self.stop.wait(seconds)

    def cancel(self) -> None:
        self.stop.set()
        for fn in list(self.cancel_fns):
            fn()
