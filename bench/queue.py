"""The channel queue, ``channels.priority_queue.PriorityQueue`` (DESIGN §9).

* push/pop at 100,000 entries: the queue is filled with 100,000 keys, then runs a mixed
  workload that keeps it near that size (45% push of a new key, 15% re-prioritise a waiting
  key, 40% pop-max) and reports ops/s. The same workload runs on a reference keyed queue
  written here (sortedcontainers ``SortedList`` of ``(-priority, seq, key)`` + dict, the
  design the peers research measured at 765,000 ops/s) as the yardstick. Budget >= 500,000 ops/s.
* memory of 1,000,000 entries: measured twice, in a fresh subprocess each time.
  ``tracemalloc``: the key strings are created *before* tracing starts, so they are NOT
  counted: this is the queue's own structure. RSS delta: the keys are created *after* the
  baseline, so they ARE counted (what the process really pays for a 1M-key queue).
  Budget <= 120 MB (applied to the queue's own memory, keys not counted).
"""

from __future__ import annotations

import itertools
import json
import os
import random
import subprocess
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._harness import REPO_ROOT, Metric, parse_args, repeat, report, rss_bytes  # noqa: E402

MB = 1_000_000


class ReferenceQueue:
    """The peers research's keyed queue: SortedList of (-priority, seq, key) + dict key -> entry."""

    def __init__(self) -> None:
        # sortedcontainers ships no type information (no py.typed, no stubs): as in smoosh/store.
        from sortedcontainers import SortedList  # type: ignore[import-untyped]

        self.sl = SortedList()
        self.entries: dict[str, tuple[float, int, str]] = {}
        self.seq = itertools.count()

    def push(self, key: str, priority: float) -> None:
        old = self.entries.get(key)
        if old is not None:
            if -old[0] == priority:
                return
            self.sl.remove(old)
            entry = (-priority, old[1], key)
        else:
            entry = (-priority, next(self.seq), key)
        self.entries[key] = entry
        self.sl.add(entry)

    def pop(self) -> tuple[str, float] | None:
        if not self.entries:
            return None
        p, _, key = self.sl.pop(0)
        del self.entries[key]
        return key, -p


def _key(i: int) -> str:
    return f"/srv/dbs/shard-{i % 256:03d}/tenant-{i:08d}.sqlite"


#: One mixed-workload operation: ``(0, key, priority)`` pushes, ``(1, None, None)`` pops.
Op = tuple[int, str | None, float | None]


def workload(fill: int, ops: int, seed: int = 1) -> tuple[list[tuple[str, float]], list[Op]]:
    """(fill pushes, mixed ops); priorities quantized like smoosh's (1/16 steps below 16)."""
    rnd = random.Random(seed)
    prio = lambda: round(rnd.random() * 64 * 16) / 16  # noqa: E731
    filled = [(_key(i), prio()) for i in range(fill)]
    nxt = fill
    mixed: list[Op] = []
    for _ in range(ops):
        r = rnd.random()
        if r < 0.45:
            mixed.append((0, _key(nxt), prio()))
            nxt += 1
        elif r < 0.60:
            mixed.append((0, _key(rnd.randrange(nxt)), prio()))  # may be popped already: then a new push
        else:
            mixed.append((1, None, None))
    return filled, mixed


def run_ops(queue, filled: list[tuple[str, float]], mixed: list[Op]) -> float:
    push, pop = queue.push, queue.pop
    for fill_key, fill_p in filled:
        push(fill_key, fill_p)
    t0 = time.perf_counter()
    for op, key, p in mixed:
        if op:
            pop()
        else:
            push(key, p)
    return len(mixed) / (time.perf_counter() - t0)


def memory_child(n: int, mode: str) -> dict:
    """In a fresh process: memory of an ``n``-entry PriorityQueue (see the module docstring)."""
    import gc
    import tracemalloc

    from channels.priority_queue import PriorityQueue

    rnd = random.Random(2)
    prios = [round(rnd.random() * 64 * 16) / 16 for _ in range(n)]
    gc.collect()
    if mode == "tracemalloc":
        keys = [_key(i) for i in range(n)]
        tracemalloc.start()
        q = PriorityQueue(capacity=n)
        for k, p in zip(keys, prios):
            q.push(k, p)
        gc.collect()
        current, _peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return {"bytes": current, "size": len(q)}
    base = rss_bytes()
    q = PriorityQueue(capacity=n)
    for i, p in enumerate(prios):
        q.push(_key(i), p)
    gc.collect()
    return {"bytes": rss_bytes() - base, "size": len(q)}


def memory(n: int, mode: str) -> float:
    out = subprocess.run([sys.executable, "-m", "bench.queue", "--child", mode, str(n)],
                         check=True, capture_output=True, text=True, cwd=REPO_ROOT).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got["size"] == n
    return got["bytes"] / MB


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        print(json.dumps(memory_child(int(argv[2]), argv[1])))
        return 0
    args = parse_args(__doc__, argv)
    from channels.priority_queue import PriorityQueue

    fill = 100_000
    ops = 50_000 if args.quick else 300_000
    n_mem = 100_000 if args.quick else 1_000_000
    filled, mixed = workload(fill, ops)

    def one() -> dict[str, float]:
        return {
            "ours": run_ops(PriorityQueue(capacity=10 * (fill + ops)), filled, mixed),
            "ref": run_ops(ReferenceQueue(), filled, mixed),
            "trace": memory(n_mem, "tracemalloc"),
            "rss": memory(n_mem, "rss"),
        }

    res = repeat(one, args.runs)
    ref = sorted(res["ref"])[len(res["ref"]) // 2]
    scale = 1_000_000 / n_mem
    metrics = [
        Metric("push/pop at 100k entries", "ops/s", res["ours"], budget=500_000, reference=ref, reference_name="SortedList+dict"),
        Metric("reference SortedList+dict, same workload", "ops/s", res["ref"]),
        Metric(f"memory, {n_mem:,} entries, tracemalloc (keys not counted)", "MB", [v * scale for v in res["trace"]],
               higher_is_better=False, budget=120, note="scaled to 1M entries" if scale != 1 else ""),
        Metric(f"memory, {n_mem:,} entries, RSS delta (keys counted)", "MB", [v * scale for v in res["rss"]],
               higher_is_better=False, note="includes ~1M key strings of 45 chars (~94 MB of str objects)"),
    ]
    report("queue", "Channel queue: push/pop and memory", metrics, args,
           [f"workload: fill {fill:,}, then {ops:,} ops (45% new push, 15% re-prioritise, 40% pop); MB = 10^6 bytes."])
    return 0


if __name__ == "__main__":
    sys.exit(main())
