"""Both sides of the open races of ``test_open_races.py``, each a real process (not a test module).

Usage:
    race_proc.py compactor ROOT DB ROUNDS      compact DB ROUNDS times as the daemon does (roots =
                                               ROOT); print one JSON line of outcomes
    race_proc.py attacker MODE ROOT DB OUTSIDE STOP SEED
                                               until the file STOP exists, race the compactions:
                                               MODE shm / journal plants a hard link to OUTSIDE as
                                               DB's side file and takes it away again; MODE
                                               exchange swaps DB with ROOT/evil.db, a hard link to
                                               the outside database OUTSIDE; print the count

The attacker never waits on the compactor: it plants and withdraws at random moments, a few
hundred microseconds apart, so some plants land between the compaction's checks by path and
its opens.
"""

from __future__ import annotations

import collections
import json
import os
import random
import sys
import time
from types import SimpleNamespace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from compactor.contexts import RecordingContext  # noqa: E402
from helpers.exchange import exchange  # noqa: E402
from smoosh.compactors import SqliteCompactor  # noqa: E402
from smoosh.compactors.base import CompactionError  # noqa: E402
from smoosh.compactors.sqlite_open import canonical_roots  # noqa: E402


def compactor(root: str, db: str, rounds: int) -> int:
    settings = SimpleNamespace(page_size=None, auto_vacuum=None, incremental_chunk_pages=100, busy_timeout_s=0.2)
    compactor = SqliteCompactor(settings, roots=canonical_roots([root]))
    outcomes: collections.Counter[str] = collections.Counter()
    for _ in range(rounds):
        try:
            compactor.compact(db, RecordingContext())
            outcomes["ok"] += 1
        except CompactionError as exc:
            outcomes[f"{type(exc).__name__}: {exc}"] += 1
    print(json.dumps(dict(outcomes)), flush=True)
    return 0


def attacker(mode: str, root: str, db: str, outside: str, stop: str, seed: int) -> int:
    rng = random.Random(seed)
    acts = 0
    side = {"shm": "-shm", "journal": "-journal"}.get(mode)
    evil = os.path.join(root, "evil.db")
    while not os.path.exists(stop):
        if side is not None:
            try:
                os.link(outside, db + side)
                acts += 1
            except FileExistsError:
                pass
            time.sleep(rng.uniform(0, 0.0005))
            try:
                if os.stat(db + side).st_ino == os.stat(outside).st_ino:
                    os.unlink(db + side)
            except FileNotFoundError:
                pass
        else:
            exchange(db, evil)
            acts += 1
        time.sleep(rng.uniform(0, 0.0005))
    if side is None and os.stat(evil).st_ino != os.stat(outside).st_ino:
        exchange(db, evil)  # leave each name with its own file
    print(acts, flush=True)
    return 0


def main(argv: list[str]) -> int:
    if argv[0] == "compactor":
        return compactor(argv[1], argv[2], int(argv[3]))
    return attacker(argv[1], argv[2], argv[3], argv[4], argv[5], int(argv[6]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
