"""Issue 45: the outside trial's three side-file races, run as real processes, with 0 escapes.

A compactor process compacts one database over and over, as the daemon does; an attacker
process races it without waiting on it: a ``-shm`` or ``-journal`` hard link to an outside file
planted and withdrawn at random moments, or the database exchanged with a hard link to an
outside database (``renameat2(RENAME_EXCHANGE)``). The outside file must come out byte for byte
what it was, and the database intact. ``make test`` runs a few dozen rounds of each;
``make soak`` runs hundreds (the issue's "repeated enough times to mean something").
``test_open_check.py`` plays each race at its one decisive moment, deterministically.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from compactor.dbfactory import integrity, make_bloated_db
from helpers.exchange import exchange_works

RACE = Path(__file__).with_name("race_proc.py")
#: Compactions per race: a bounded run in `make test`, hundreds in `make soak`.
ROUNDS = 30
SOAK_ROUNDS = 400
#: Longest a race may take before the test says it wedged (not a speed budget).
HANG_S = 600.0


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def race(tmp_path: Path, mode: str, rounds: int) -> dict[str, int]:
    root, outside_dir = tmp_path / "dbs", tmp_path / "outside"
    root.mkdir()
    outside_dir.mkdir()
    db = root / "raced.db"
    make_bloated_db(str(db), rows=300, journal_mode="wal" if mode == "shm" else "delete")
    if mode == "exchange":
        outside = outside_dir / "victim.db"
        make_bloated_db(str(outside), rows=300, journal_mode="delete")
        os.link(outside, root / "evil.db")
    else:
        outside = outside_dir / "victim"
        outside.write_bytes(os.urandom(64 * 1024))
    before, size = digest(outside), outside.stat().st_size
    stop = tmp_path / "stop"
    attacker = subprocess.Popen(
        [sys.executable, str(RACE), "attacker", mode, str(root), str(db), str(outside), str(stop), str(rounds)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        done = subprocess.run([sys.executable, str(RACE), "compactor", str(root), str(db), str(rounds)],
                              capture_output=True, text=True, timeout=HANG_S)
    finally:
        stop.touch()
        acts = attacker.communicate(timeout=HANG_S)[0]
    assert done.returncode == 0, done.stderr
    outcomes: dict[str, int] = json.loads(done.stdout)
    # Then nothing outside the roots changed, and the database is intact
    assert (outside.stat().st_size, digest(outside)) == (size, before), f"escaped: {outcomes}"
    for side in ("-shm", "-journal"):
        leftover = Path(f"{db}{side}")
        if leftover.exists() and leftover.stat().st_ino == outside.stat().st_ino:
            leftover.unlink()
    assert integrity(str(db)) == "ok"
    assert sum(outcomes.values()) == rounds and int(acts) > 0
    return outcomes


@pytest.mark.parametrize("mode", ["shm", "journal", "exchange"])
def test_side_file_races_against_real_compactions_never_escape_the_roots(tmp_path: Path, mode: str) -> None:
    if mode == "exchange" and not exchange_works(str(tmp_path)):
        pytest.skip("this file system cannot exchange two names (renameat2 RENAME_EXCHANGE)")
    race(tmp_path, mode, ROUNDS)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["shm", "journal", "exchange"])
def test_side_file_races_hundreds_of_times_never_escape_the_roots(tmp_path: Path, mode: str) -> None:
    if mode == "exchange" and not exchange_works(str(tmp_path)):
        pytest.skip("this file system cannot exchange two names (renameat2 RENAME_EXCHANGE)")
    outcomes = race(tmp_path, mode, SOAK_ROUNDS)
    print(f"{mode}: {SOAK_ROUNDS} compactions raced: {outcomes}")
