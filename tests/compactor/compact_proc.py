"""Runs one compaction in a real subprocess for the kill -9 tests (not a test module).

Usage: compact_proc.py DB_PATH PAGE_SIZE_TARGET AUTO_VACUUM_TARGET

Targets are "-" for none. Prints "go" (flushed) just before compact() and "done" after it.
"""

from __future__ import annotations

import sys
import time
from types import SimpleNamespace

from smoosh.compactors import SqliteCompactor


class _Ctx:
    def progress(self, fraction: float) -> None:
        pass

    def checkpoint(self) -> None:
        pass

    def on_cancel(self, fn: object) -> None:
        pass

    def pause(self, seconds: float) -> None:
        time.sleep(seconds)


def main(argv: list[str]) -> int:
    path, page_size, auto_vacuum = argv
    settings = SimpleNamespace(
        page_size=None if page_size == "-" else int(page_size),
        auto_vacuum=None if auto_vacuum == "-" else auto_vacuum,
        incremental_chunk_pages=100,
        busy_timeout_s=1.0,
    )
    compactor = SqliteCompactor(settings)
    print("go", flush=True)
    compactor.compact(path, _Ctx())
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
