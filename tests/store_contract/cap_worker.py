"""One node racing for the fleet-wide cap's slots: ``python cap_worker.py URL NODE LIMIT N OUT GO``.

Says it is ready (the file GO.ready.PID), waits for the file GO, then takes a slot, notes the moment it holds one, notes the moment it
lets go, gives it back, N times over, each slot in the transaction a claim would take it in
(:meth:`ClusterCap.take`). A refused take waits for a slot given back (the refusal's watch),
one second at most, and asks again. OUT gets one line per slot held: ``START END`` in
nanoseconds of the machine's monotonic clock (``time.monotonic_ns``: one clock for every
process), written after the take committed and before the give-back did, so each line's span
lies inside the slot's life in the store: if the store let more than LIMIT slots be held at
once, more than LIMIT spans would overlap. Prints the refusals it met.
"""

from __future__ import annotations

import os
import random
import sys
import time

from smoosh.daemon.control.cluster_cap import ClusterCap
from smoosh.store import open_store

#: Seconds a worker waits for the go file before giving up.
GO_TIMEOUT_S = 60.0


def main(argv: list[str]) -> int:
    url, node, limit, n, out_path, go = argv[0], argv[1], int(argv[2]), int(argv[3]), argv[4], argv[5]
    cap = ClusterCap()
    rng = random.Random()
    refused = 0
    with open_store(url) as store, open(out_path, "w") as out:
        open(f"{go}.ready.{os.getpid()}", "w").close()  # the test starts the race once every worker is here
        deadline = time.monotonic() + GO_TIMEOUT_S
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.001)
        held = 0
        while held < n:
            token = rng.getrandbits(62)

            def take(tr):  # type: ignore[no-untyped-def]
                refusal = cap.take(tr, node, token, limit, time.time())
                return None if refusal is None else cap.watch_freed(tr)

            watch = store.transact(take)
            if watch is not None:
                refused += 1
                watch.wait(1.0)
                watch.cancel()
                continue
            start = time.monotonic_ns()
            time.sleep(rng.uniform(0, 0.002))  # the slot's compaction: the spans must be able to overlap
            end = time.monotonic_ns()
            out.write(f"{start} {end}\n")
            store.transact(lambda tr: cap.release(tr, node, token))
            held += 1
    print(refused)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
