"""kill -9 of `smoosh worker` processes mid-compaction, at random moments, over several databases.

The daemon runs no workers of its own (``--workers 0``); two `smoosh worker` processes share
the jobs. Whenever some job is mid-way (progress read from the job store itself), after a
random extra delay both workers are killed with SIGKILL (so the one holding the job surely
dies mid-compaction) and two fresh ones started. After each round: every job was finished
by a later worker, every database passes ``PRAGMA integrity_check``, holds all its rows, and
shrank.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

import pytest

from compactor.dbfactory import make_bloated_db, row_count
from faults.faultlib import damaged, processes, start_daemon, start_worker
from helpers.daemon import HANG_S, Daemon, free_port, wait_for, write_config
from smoosh.jobs import Jobs
from smoosh.store import open_store

__all__ = ["processes"]  # fixture

#: Kills (each of every worker, with at least one job mid-compaction) in `make test` / `make soak`.
TRIALS = 2
SOAK_TRIALS = 50
#: Databases per round and kills per round (a round ends when every job is finished).
DATABASES_PER_ROUND = 4
KILLS_PER_ROUND = 3
#: Worker processes alive at a time.
WORKERS = 2
#: Rows per database: with one-page incremental chunks each compaction is about 430 commits,
#: hundreds of moments for a kill to hit (what it hits is random; any moment is a valid trial).
ROWS = 5000
SEED = int(os.environ.get("SMOOSH_FAULT_SEED", str(time.time_ns() % 1_000_000)))
JOB_TYPE = "smoosh:testnode"


def running_progress(jobs: Jobs) -> dict[str, float]:
    """Running jobs' progress, read from the job store (no daemon in between)."""
    return {key: float((data or {}).get("progress") or 0.0)
            for _t, key, state, data in jobs.list_jobs(JOB_TYPE) if state == "running"}


def history(d: Daemon) -> dict[str, dict[str, Any]]:
    return {j["key"]: j for j in d.get("/jobs")["jobs"]}


def run_trials(base: Path, daemons: list[Daemon], processes: list, kills: int) -> None:
    rng = random.Random(SEED)
    config = write_config(base, port=free_port(), channels="[smoosh.sqlite]\nincremental_chunk_pages = 1\n")
    # Workers started after the round's last kill take larger chunks: one page at a time
    # only makes a compaction slow enough to be killed in the middle.
    finishing = write_config(base, port=free_port(), name="finishing.ini",
                             channels="[smoosh.sqlite]\nincremental_chunk_pages = 256\n")
    d = start_daemon(daemons, config, "--workers", "0")
    store = open_store(f"sqlite:{base / 'state' / 'jobs.db'}")
    jobs = Jobs(store, monitors=False)
    workers = [start_worker(processes, config) for _ in range(WORKERS)]
    done_kills = 0
    round_no = 0
    try:
        while done_kills < kills:
            where = f"round {round_no} (SMOOSH_FAULT_SEED={SEED})"
            if round_no:  # the previous round's finishing workers: slow ones again, to be killed
                for w in workers:
                    w.terminate()
                for w in workers:
                    w.wait(HANG_S)
                workers = [start_worker(processes, config) for _ in range(WORKERS)]
            dbs = [base / "dbs" / f"r{round_no}-{i}.db" for i in range(DATABASES_PER_ROUND)]
            rows = {}
            for db in dbs:
                make_bloated_db(str(db), rows=ROWS, delete_fraction=0.8, auto_vacuum="incremental")
                rows[db] = row_count(str(db))
            sizes = {db: db.stat().st_size for db in dbs}
            round_kills = min(KILLS_PER_ROUND, kills - done_kills)
            for kill_no in range(round_kills):
                # A running job of this round: a worker has accepted it and is compacting (its
                # progress reaches the store only with the heartbeat, every job_timeout / 3).
                wait_for(lambda: any(0 <= p < 0.9 for k, p in running_progress(jobs).items() if k in map(str, dbs)),
                         HANG_S, what=f"{where}: a job mid-compaction", daemon=d, every_s=0.02)
                time.sleep(rng.uniform(0.05, 0.4))
                for w in workers:
                    w.kill()
                for w in workers:
                    w.wait(10)
                done_kills += 1
                assert damaged(dbs) == {}, f"{where}: damaged by kill -9 of the workers"
                last = kill_no == round_kills - 1
                workers = [start_worker(processes, finishing if last else config) for _ in range(WORKERS)]
            wait_for(lambda: all(history(d).get(str(db), {}).get("state") == "finished" for db in dbs), 2 * HANG_S,
                     what=f"{where}: every job finished by the later workers", daemon=d)
            assert damaged(dbs) == {}, where
            for db in dbs:
                assert row_count(str(db)) == rows[db], f"{where}: rows lost in {db}"
                assert db.stat().st_size < sizes[db], f"{where}: {db} did not shrink"
            round_no += 1
    finally:
        jobs.close()
        store.close()
    assert d.proc.poll() is None, "the daemon died"


def test_kill_9_of_workers_mid_compaction_leaves_every_job_finished_by_another(
    tmp_path: Path, daemons: list[Daemon], processes: list
) -> None:
    run_trials(tmp_path, daemons, processes, TRIALS)


@pytest.mark.slow
def test_kill_9_of_workers_mid_compaction_leaves_every_job_finished_by_another_soak(
    tmp_path: Path, daemons: list[Daemon], processes: list
) -> None:
    run_trials(tmp_path, daemons, processes, SOAK_TRIALS)
