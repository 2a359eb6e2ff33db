"""A compactor that runs the real SQLite compaction slowly enough for a test to act mid-run."""

from __future__ import annotations

import time
from typing import Any


class SlowChunks:
    """The real SQLite compactor, pausing ``pause_s`` at each chunk boundary."""

    def __init__(self, settings: Any, pause_s: float = 0.005) -> None:
        from smoosh.compactors.sqlite import SqliteCompactor

        self.inner = SqliteCompactor(settings)
        self.name = self.inner.name
        self.pause_s = pause_s

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def compact(self, key: str, ctx: Any) -> Any:
        pause_s = self.pause_s

        class Ctx:
            def progress(self, fraction: float) -> None:
                ctx.progress(fraction)

            def on_cancel(self, fn: Any) -> None:
                ctx.on_cancel(fn)

            def checkpoint(self) -> None:
                time.sleep(pause_s)
                ctx.checkpoint()

        return self.inner.compact(key, Ctx())
