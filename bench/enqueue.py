"""Enqueue paths through ``Server.enqueue`` (DESIGN §9), in process.

* hot path: a key a channel accepted within ``staleness`` (5 min) is enqueued again, N times.
  It must be dropped by the access table (a dict lookup) before any validation or I/O.
  Budget >= 1,000,000/s.
* full enqueue of new keys: N new small bloated SQLite files (copies of one ~100 KB template
  with 60% of its rows deleted) are enqueued; the clock runs from the first ``enqueue`` to
  the moment the last key is queued in a channel (``counters.enqueue_accepted``), so it
  covers canonicalisation, validation, the job check, the cheap sizes (opening each file)
  and the channel push. Budget >= 10,000/s.

Server: ``memory:`` store, ``workers=0``, no HTTP, no watch, channels paused (nothing starts).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._fixtures import SMALL_DB_ROWS, SMALL_MIN_SIZE, clone_fleet, config_text, make_bloated_db  # noqa: E402
from bench._harness import Metric, parse_args, repeat, report  # noqa: E402

#: Seconds to wait for every new key to reach a channel before giving up.
QUEUE_TIMEOUT_S = 120.0


def _server(base: Path):
    from smoosh.config import parse_config
    from smoosh.daemon.server import Server

    text = config_text(base, min_size=SMALL_MIN_SIZE)
    path = base / "smoosh.ini"
    path.write_text(text)
    server = Server(parse_config(text, str(path)), workers=0, watch_config=False)
    server.start()
    return server


def _wait_accepted(server, target: int) -> None:
    deadline = time.monotonic() + QUEUE_TIMEOUT_S
    while server.counters.enqueue_accepted < target:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {server.counters.enqueue_accepted} of {target} keys queued")
        time.sleep(0.0005)


def hot_path(base: Path, template: str, n: int) -> float:
    """Enqueues/s of one already-accepted key."""
    key = clone_fleet(template, str(base / "dbs"), 1)[0]
    server = _server(base)
    try:
        server.enqueue(key)
        _wait_accepted(server, 1)
        enqueue = server.enqueue
        t0 = time.perf_counter()
        for _ in range(n):
            enqueue(key)
        dt = time.perf_counter() - t0
        assert server.counters.enqueue_stale >= n, "the hot path did not drop the events"
        return n / dt
    finally:
        server.stop()


def full_enqueue(base: Path, template: str, n: int) -> float:
    """New keys/s from enqueue to queued in a channel."""
    keys = clone_fleet(template, str(base / "dbs"), n)
    server = _server(base)
    try:
        t0 = time.perf_counter()
        for key in keys:
            server.enqueue(key)
        _wait_accepted(server, n)
        return n / (time.perf_counter() - t0)
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv)
    n_hot = 200_000 if args.quick else 2_000_000
    n_new = 500 if args.quick else 5000
    work = Path(tempfile.mkdtemp(prefix="smoosh-bench-enqueue-"))
    try:
        template = str(work / "template.sqlite")
        size = make_bloated_db(template, rows=SMALL_DB_ROWS, row_bytes=400, journal_mode="wal")  # slack qualifies it on cheap sizes

        def one() -> dict[str, float]:
            out = {}
            for name, fn, n in (("hot", hot_path, n_hot), ("new", full_enqueue, n_new)):
                base = work / f"run-{name}-{time.monotonic_ns()}"
                base.mkdir()
                try:
                    out[name] = fn(base, template, n)
                finally:
                    shutil.rmtree(base, ignore_errors=True)
            return out

        res = repeat(one, args.runs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    metrics = [
        Metric("hot path: seen key re-enqueued", "/s", res["hot"], budget=1_000_000),
        Metric("full enqueue: new SQLite key to queued", "/s", res["new"], budget=10_000,
               note=f"{n_new} new files of {size // 1024} KiB each (60% rows deleted), cheap sizes"),
    ]
    report("enqueue", "Enqueue: hot path and new keys", metrics, args,
           [f"{n_hot:,} hot-path enqueues per run; memory: store, workers=0, no HTTP, no watch."])
    return 0


if __name__ == "__main__":
    sys.exit(main())
