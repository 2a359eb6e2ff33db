"""kill -9 of a process in the middle of checkpoint writes never leaves a torn checkpoint."""

from __future__ import annotations

import os
import random
import runpy
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from persist.checkpoint import read_checkpoint, remove_stale_temp_files

CHILD = Path(__file__).with_name("crash_writer.py")
_child = runpy.run_path(str(CHILD))
mapping_for = _child["mapping_for"]
GENERATION_KEY = _child["GENERATION_KEY"]

#: Generations per trial: each trial's child starts at trial * this, so they never collide.
GENERATIONS_PER_TRIAL = 1_000_000


def run_trials(path: Path, trials: int, seed: int) -> list[int]:
    rnd = random.Random(seed)
    seen: list[int] = []
    newest = -1
    for trial in range(trials):
        child = subprocess.Popen(
            [sys.executable, str(CHILD), str(path), str(trial * GENERATIONS_PER_TRIAL)],
            stdout=subprocess.PIPE,
        )
        try:
            assert child.stdout is not None
            assert child.stdout.readline() == b"ready\n"
            time.sleep(rnd.uniform(0.0, 0.08))
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
            if child.stdout is not None:
                child.stdout.close()
        assert child.returncode == -signal.SIGKILL
        mapping = read_checkpoint(path)  # must never raise CorruptCheckpoint
        if not mapping:
            assert newest == -1, "a checkpoint disappeared after one was complete"
            continue
        generation = mapping[GENERATION_KEY]
        assert mapping == mapping_for(generation)
        assert generation >= newest, "an older checkpoint came back"
        newest = generation
        seen.append(generation)
    return seen


def check_run(tmp_path: Path, trials: int, seed: int) -> None:
    path = tmp_path / "ratio_dbs.smooshq"
    seen = run_trials(path, trials, seed)
    # The kills must have hit a writer that had written something, most of the time.
    assert len(seen) >= trials // 2
    # Stray temp files are allowed; they are never read and can be cleaned at start-up.
    remove_stale_temp_files(path)
    assert [n for n in os.listdir(tmp_path) if n.endswith(".tmp")] == []
    assert read_checkpoint(path) == mapping_for(seen[-1])


def test_kill_9_during_writes_leaves_a_complete_checkpoint(tmp_path: Path) -> None:
    check_run(tmp_path, trials=20, seed=1)


@pytest.mark.slow
def test_kill_9_during_writes_leaves_a_complete_checkpoint_soak(tmp_path: Path) -> None:
    check_run(tmp_path, trials=200, seed=2)
