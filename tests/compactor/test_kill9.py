"""kill -9 of a process in the middle of compact(): the database always passes integrity_check."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time

import pytest

from compactor.dbfactory import integrity, make_bloated_db, row_count

HERE = os.path.dirname(os.path.abspath(__file__))

#: (journal_mode, auto_vacuum of the file, page_size target, auto_vacuum target) per scenario.
SCENARIOS = [
    ("wal", "none", "-", "-"),  # full VACUUM, WAL
    ("delete", "none", "-", "-"),  # full VACUUM, rollback journal
    ("wal", "incremental", "-", "-"),  # incremental chunks
    ("wal", "none", "8192", "-"),  # page size upgrade: DELETE, VACUUM, back to WAL
    ("delete", "none", "-", "incremental"),  # auto_vacuum upgrade
]


def run_trials(tmp_path, trials: int, seed: int) -> int:
    """Returns how many kills landed before the compaction said "done"."""
    rng = random.Random(seed)
    mid = 0
    for i in range(trials):
        journal_mode, auto_vacuum, page_size, av_target = SCENARIOS[i % len(SCENARIOS)]
        path = str(tmp_path / f"k{i}.db")
        stats = make_bloated_db(path, rows=12000, row_bytes=500, journal_mode=journal_mode,
                                auto_vacuum=auto_vacuum, scattered=bool(i % 2))
        proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "compact_proc.py"), path, page_size, av_target],
            stdout=subprocess.PIPE, text=True,
        )
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "go"
            time.sleep(rng.uniform(0, 0.025))  # compactions here take ~20 ms
            proc.kill()
            out = proc.stdout.read()
        finally:
            proc.wait()
            proc.stdout.close()  # type: ignore[union-attr]
        if "done" not in out:
            mid += 1
        assert integrity(path) == "ok", f"trial {i} ({SCENARIOS[i % len(SCENARIOS)]})"
        assert row_count(path) == stats["rows"]
        for suffix in ("", "-wal", "-shm", "-journal"):
            if os.path.exists(path + suffix):
                os.remove(path + suffix)
    return mid


def test_kill9_at_random_moments_never_corrupts_a_database(tmp_path) -> None:
    mid = run_trials(tmp_path, trials=10, seed=1)
    assert mid >= 3  # most kills must land inside a compaction, or the test proves little


@pytest.mark.slow
def test_kill9_at_random_moments_never_corrupts_a_database_soak(tmp_path) -> None:
    run_trials(tmp_path, trials=100, seed=int(time.time()))
