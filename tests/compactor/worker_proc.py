"""A worker run as a real subprocess by test_worker.py (not a test module).

Usage: worker_proc.py STORE_PATH NODE MARKER [RELEASE]

Runs a Worker for ``smoosh:NODE`` whose SQLite compactor stalls at its second chunk boundary;
when it gets there it writes MARKER (atomically) and waits to be killed, or, given RELEASE,
until that file exists, then goes on.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from compactor.gates import GatedCompactor  # noqa: E402
from smoosh.compactors import SqliteCompactor  # noqa: E402
from smoosh.jobs import Jobs  # noqa: E402
from smoosh.store import open_store  # noqa: E402
from smoosh.daemon.run.worker import Worker  # noqa: E402
from types import SimpleNamespace  # noqa: E402


#: Seconds the gate waits for RELEASE at most (a test that never makes it fails, not hangs).
RELEASE_WAIT_S = 120.0


def main(argv: list[str]) -> int:
    store_path, node, marker = argv[:3]
    release = argv[3] if len(argv) > 3 else None
    store = open_store(f"sqlite:{store_path}")
    jobs = Jobs(store)
    settings = SimpleNamespace(page_size=None, auto_vacuum=None, incremental_chunk_pages=50, busy_timeout_s=0.5)
    gated = GatedCompactor(SqliteCompactor(settings), at_checkpoint=2, timeout_s=RELEASE_WAIT_S)

    def reached() -> None:
        with open(marker + ".tmp", "w") as f:
            f.write("stalled")
        os.rename(marker + ".tmp", marker)
        if release is not None:
            given_up_at = time.monotonic() + RELEASE_WAIT_S
            while not os.path.exists(release) and time.monotonic() < given_up_at:
                time.sleep(0.02)
            gated.release.set()

    gated.on_reached = reached
    worker = Worker(jobs, store, "smoosh:" + node, [gated], node=node, job_timeout_s=1.0)
    worker.start()
    while True:
        time.sleep(60)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
