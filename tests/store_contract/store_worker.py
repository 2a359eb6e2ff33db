"""A second process for the SQLite store tests: ``python store_worker.py COMMAND PATH ...``.

Commands:
    incr PATH KEY N GO_FILE   wait for GO_FILE, then N read-modify-write increments of KEY
                              (8-byte little-endian); prints the number of bodies run. The
                              first body, having read KEY, waits until the other worker's has
                              read it too (files GO_FILE.read.PID): both write on the same
                              read, so one commit must conflict, however the two are scheduled.
    set PATH KEY VALUE        set KEY to VALUE in one transaction.
    hammer PATH THREADS       THREADS threads commit one new key each per transaction, forever;
                              after each commit returns its thread prints the key (hex) and the
                              largest group committed so far, one line, flushed: the commit is
                              acknowledged. For the kill -9 test: run until killed.
Keys and values are given as hex.
"""

from __future__ import annotations

import glob
import itertools
import os
import sys
import time

from smoosh.store.sqlite import SqliteStore

#: Seconds a worker waits for the go file (or the other worker's first read) before giving up.
GO_TIMEOUT_S = 60.0
#: Workers that meet at their first read.
WORKERS = 2


def meet_after_first_read(go: str) -> None:
    """Say this worker has read, then wait until every worker has (a barrier across processes)."""
    open(f"{go}.read.{os.getpid()}", "w").close()
    deadline = time.monotonic() + GO_TIMEOUT_S
    while len(glob.glob(glob.escape(go) + ".read.*")) < WORKERS and time.monotonic() < deadline:
        time.sleep(0.001)


def hammer(store: SqliteStore, threads: int) -> None:
    import threading

    out = threading.Lock()

    def work(t: int) -> None:
        for i in itertools.count():
            key = b"h/%02d/%08d" % (t, i)
            store.transact(lambda tr: tr.set(key, b"v" * 100))
            with out:  # printed only after commit() returned: acknowledged
                sys.stdout.write(f"{key.hex()} {store.stats.max_group}\n")
                sys.stdout.flush()

    for t in range(threads):
        threading.Thread(target=work, args=(t,), daemon=True).start()
    threading.Event().wait()


def main(argv: list[str]) -> int:
    cmd, path = argv[0], argv[1]
    store = SqliteStore(path)
    try:
        if cmd == "incr":
            key, n, go = bytes.fromhex(argv[2]), int(argv[3]), argv[4]
            deadline = time.monotonic() + GO_TIMEOUT_S
            while not os.path.exists(go):
                if time.monotonic() > deadline:
                    return 2
                time.sleep(0.001)
            runs = 0

            def incr(tr):
                nonlocal runs
                runs += 1
                value = int.from_bytes(tr.get(key) or b"\x00", "little")
                if runs == 1:
                    meet_after_first_read(go)
                time.sleep(0.001)  # widen the race window so the processes conflict more often
                tr.set(key, (value + 1).to_bytes(8, "little"))

            for _ in range(n):
                store.transact(incr)
            print(runs)
        elif cmd == "hammer":
            hammer(store, int(argv[2]))
        elif cmd == "set":
            key, value = bytes.fromhex(argv[2]), bytes.fromhex(argv[3])
            store.transact(lambda tr: tr.set(key, value))
        else:
            return 2
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
