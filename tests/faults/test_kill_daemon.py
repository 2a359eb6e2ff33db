"""kill -9 of `smoosh run` at random moments while a writer keeps creating and bloating databases.

Each trial: a daemon runs (checkpoint every second; half the trials with ``wait_secs = 0`` so
compactions run and get killed mid-way, half with a long wait so keys pile up in the queues);
after a random delay the daemon and the writer are killed with SIGKILL. Then:

* every checkpoint file reads back (persist.read_checkpoint, no CorruptCheckpoint);
* every database and the job store pass ``PRAGMA integrity_check``;
* a restarted daemon loads without moving any checkpoint aside (no ``.corrupt-`` file), and
  after its clean stop its checkpoints still hold every key of the last checkpoint before
  the kill (with a long ``wait_secs`` nothing starts, so nothing may have left the queues).

State carries over from trial to trial, as on a machine that keeps crashing.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from faults.faultlib import (
    SOAK, checkpoints, corrupt_files, damaged, processes, queued_keys, start_daemon, start_writer,
)
from helpers.daemon import HANG_S, Daemon, free_port, wait_for, write_config

__all__ = ["processes"]  # fixture

#: Kill trials in `make test` and in `make soak`.
TRIALS = 3
SOAK_TRIALS = 50
#: Databases the writer keeps creating and bloating.
DATABASES = 40 if SOAK else 24
#: Range of seconds the daemon runs before it is killed.
RUN_S = (0.5, 2.5)
#: Seed of the trial choices (set SMOOSH_FAULT_SEED to replay a failure).
SEED = int(os.environ.get("SMOOSH_FAULT_SEED", str(time.time_ns() % 1_000_000)))


def configure(base: Path, port: int, wait_s: int) -> Path:
    return write_config(base, port=port, extra_global=f"wait_secs = {wait_s}\nstaleness = 0")


def run_trials(base: Path, daemons: list[Daemon], processes: list, trials: int) -> None:
    rng = random.Random(SEED)
    port = free_port()
    dbs = base / "dbs"
    state = base / "state"
    configure(base, port, 0)
    keys_checked = 0
    for trial in range(trials):
        where = f"trial {trial} (SMOOSH_FAULT_SEED={SEED})"
        wait_s = rng.choice([0, 3600])
        run_s = rng.uniform(*RUN_S)
        # Random choices can leave every trial with an empty checkpoint (compacted at once, or
        # killed before the first write): the last one then counts, killed once one is written.
        must_count = trial == trials - 1 and keys_checked == 0
        if must_count:
            wait_s = 3600
        config = configure(base, port, wait_s)
        writer = start_writer(processes, dbs, DATABASES, SEED + trial)
        d1 = start_daemon(daemons, config)
        if must_count:
            wait_for(lambda: queued_keys(checkpoints(state)), HANG_S, what=f"{where}: a checkpoint with keys", daemon=d1)
        else:
            time.sleep(run_s)  # a random moment: what the kill may hit is the point
        # The writer dies too (SQLite is crash-safe for it): no new events and no lock left
        # held by a paused process while the files are checked.
        writer.kill()
        d1.kill()
        writer.wait(HANG_S)

        # The last checkpoint before the kill: it must read, whatever instant the kill hit.
        last = checkpoints(state)
        databases = sorted(dbs.glob("*.db"))
        assert damaged(databases + [state / "jobs.db"]) == {}, f"{where}: damaged after kill -9"

        d2 = start_daemon(daemons, configure(base, port, 3600))
        assert corrupt_files(state) == [], f"{where}: a checkpoint was found corrupt at restart\n{d2.log()[-3000:]}"
        assert d2.stop() == 0, f"{where}: clean stop failed\n{d2.log()[-3000:]}"
        kept = queued_keys(checkpoints(state))
        keys_checked += len(queued_keys(last))
        lost = queued_keys(last) - kept
        assert not lost, f"{where}: keys of the last checkpoint lost across the kill: {sorted(lost)[:10]}\n{d2.log()[-3000:]}"
        assert damaged(databases + [state / "jobs.db"]) == {}, f"{where}: damaged after the restart"
    assert corrupt_files(state) == []
    assert keys_checked > 0, "no trial killed a daemon with a non-empty checkpoint: the test checked nothing"


def test_kill_9_of_the_daemon_loses_no_queued_key_and_damages_nothing(
    tmp_path: Path, daemons: list[Daemon], processes: list
) -> None:
    run_trials(tmp_path, daemons, processes, TRIALS)


@pytest.mark.slow
def test_kill_9_of_the_daemon_loses_no_queued_key_and_damages_nothing_soak(
    tmp_path: Path, daemons: list[Daemon], processes: list
) -> None:
    run_trials(tmp_path, daemons, processes, SOAK_TRIALS)
