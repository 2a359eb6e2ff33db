"""Checkpoints of a channel queue (DESIGN §9, §5.4).

* write: ``persist.write_checkpoint`` of 1,000,000 entries (tmp file, fsync, rename, fsync
  of the directory), timed alone. Budget <= 1 s.
* enqueue latency during a checkpoint: a real ``channels.Channel`` (paused; memory job
  layer) holds 1,000,000 waiting keys; one thread enqueues a key every 0.2 ms and times
  each ``Channel.enqueue`` while the channel writes its checkpoint on its own writer thread
  (the snapshot is taken under the channel's lock, the packing and fsync outside it).
  Reported: p50 / p99 / max of the enqueues issued while the checkpoint ran. Budget p99 < 5 ms.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Any
from types import SimpleNamespace

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._harness import Metric, parse_args, percentile, repeat, report  # noqa: E402

#: Seconds between two timed enqueues while a checkpoint runs.
ENQUEUE_INTERVAL_S = 0.0002


def _key(i: int) -> str:
    return f"/srv/dbs/shard-{i % 256:03d}/tenant-{i:08d}.sqlite"


def write_time(d: str, n: int) -> float:
    from persist import write_checkpoint

    mapping = {_key(i): float(i % 1000) / 16 for i in range(n)}
    path = os.path.join(d, "ratio_dbs.smooshq")
    t0 = time.perf_counter()
    write_checkpoint(path, mapping)
    return time.perf_counter() - t0


class _Idle:
    """The channel's scheduler and host for a channel that never starts anything."""

    def submit(self, channel: str, key: str, priority: float) -> int:
        raise AssertionError("the benchmark's channel started work")

    def adopt(self, channel: str, key: str) -> int | None:
        return None

    def acquire_slot(self, channel: str, *, force: bool = False, forced: bool = False) -> bool:
        return False

    def release_slot(self, channel: str) -> None:
        pass

    def withdraw(self, channel: str) -> None:
        pass

    def on_hold(self, channel: str, held: bool) -> None:
        pass

    def on_outcome(self, channel: str, key: str, outcome: Any, now: float) -> float | None:
        return None

    def admits(self, key: str) -> bool:
        return True

    def wake(self, channel: str) -> None:
        pass

    def running_at_once(self, key: str, token: int) -> bool:
        return False

    def wall_time(self) -> float | None:
        return None

    def window_waived(self, channel: str) -> bool:
        return False

    def concurrency_raised(self, channel: str) -> int:
        return 0


def latency_during_checkpoint(d: str, n: int) -> dict[str, float]:
    from channels import Channel

    settings = SimpleNamespace(capacity=n + 1_000_000, concurrency=0, window=None, strict_window=False)
    clock = [1_700_000_000.0]
    # Nothing starts (concurrency 0, a long start-up pause): the channel's scheduler and host
    # are never asked for work, only for what a checkpoint restore and a tick need.
    channel = Channel("ratio_dbs", settings, scheduler=_Idle(), host=_Idle(), now=clock[0], state_dir=d,
                      checkpoint_interval_s=60.0, wait_s=3600.0)
    try:
        for i in range(n):
            channel.enqueue(_key(i), float(i % 1000) / 16)
        samples: list[float] = []
        stop = threading.Event()

        def enqueuer() -> None:
            i = n
            while not stop.is_set():
                t0 = time.perf_counter()
                channel.enqueue(_key(i), 3.0)
                samples.append(time.perf_counter() - t0)
                i += 1
                time.sleep(ENQUEUE_INTERVAL_S)

        thread = threading.Thread(target=enqueuer)
        thread.start()
        time.sleep(0.05)
        start = len(samples)
        t0 = time.perf_counter()
        clock[0] += 61.0
        channel.tick(clock[0])  # due: takes the snapshot and starts the writer thread
        channel.join_checkpoint(60.0)
        total_s = time.perf_counter() - t0
        during = samples[start:]
        stop.set()
        thread.join()
        assert os.path.exists(os.path.join(d, "ratio_dbs.smooshq")), "no checkpoint was written"
        return {"p50": percentile(during, 0.5) * 1000, "p99": percentile(during, 0.99) * 1000,
                "max": max(during) * 1000, "total": total_s, "count": float(len(during))}
    finally:
        channel.close(checkpoint=False)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv)
    n = 100_000 if args.quick else 1_000_000

    def one() -> dict[str, float]:
        d = tempfile.mkdtemp(prefix="smoosh-bench-ckpt-")
        try:
            out = {"write": write_time(d, n)}
            out.update(latency_during_checkpoint(d, n))
            return out
        finally:
            shutil.rmtree(d, ignore_errors=True)

    res = repeat(one, args.runs)
    metrics = [
        Metric(f"write_checkpoint of {n:,} entries", "s", res["write"], higher_is_better=False, budget=1.0),
        Metric("enqueue latency p50 during a checkpoint", "ms", res["p50"], higher_is_better=False),
        Metric("enqueue latency p99 during a checkpoint", "ms", res["p99"], higher_is_better=False, budget=5.0,
               budget_text="< 5 ms"),
        Metric("enqueue latency max during a checkpoint", "ms", res["max"], higher_is_better=False),
        Metric("channel checkpoint, snapshot to file", "s", res["total"], higher_is_better=False),
        Metric("enqueues timed during the checkpoint", "", res["count"]),
    ]
    report("checkpoint", "Checkpoint: write time and enqueue latency while it runs", metrics, args,
           [f"Channel holding {n:,} waiting keys; an enqueue every {ENQUEUE_INTERVAL_S * 1000:.1f} ms from another thread."])
    return 0


if __name__ == "__main__":
    sys.exit(main())
