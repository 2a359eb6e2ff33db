"""A randomized multi-threaded workload under injected faults: no job lost, none accepted twice,
none left locked, every retry bounded.

Several worker threads add, accept, update, finish, resubmit, re-add and remove jobs on one
layer over ``faulty:`` (a fifth of the write commits fail, half of them after really
committing). Each worker adds and removes only its own ids (so a model of which ids exist can
be kept in call order), but accepts whatever is pending. A registry of who holds which job
catches a job handed to two workers; a JobHalted for a job nobody removed catches an accept
or finish that was applied twice. `make test` runs a short version on memory:, `make soak`
long ones on memory: and sqlite: with several seeds.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from smoosh.jobs import JobHalted, Jobs, NotFound
from smoosh.jobs.model import Job
from smoosh.jobs.txids import count_tx_ids
from smoosh.store import open_store
from smoosh.store.faulty import FaultyStore

T = "work"
#: Retry limit of the store loop (the default): a call that needed this many would give up.
RETRY_LIMIT = 100


@dataclass
class Shared:
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: job id -> (worker, lock, removes of the id that had returned when its accept began).
    holders: dict[str, tuple[int, str, int]] = field(default_factory=dict)
    #: job ids whose holder has called finish: from its commit on, another worker may
    #: legitimately take the job (it was resubmitted) before the call returns.
    finishing: set[str] = field(default_factory=set)
    #: Removes begun, and removes returned, per job id. A run can end early (JobHalted) or
    #: pass to another worker only through a remove that committed after the accept that
    #: started it, i.e. one that had not returned when that accept began: then more removes
    #: have begun than had returned at that moment.
    removes_begun: dict[str, int] = field(default_factory=dict)
    removes_done: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    accepted: int = 0
    finished: int = 0


def _worker(jobs: Jobs, shared: Shared, me: int, ops: int, seed: int, exists: dict[str, bool]) -> None:
    rng = random.Random(seed)
    mine = [f"w{me}-{i}" for i in range(12)]
    held: list[Job] = []

    removals_at_accept: dict[str, int] = {}

    def drop(job: Job, halted: bool) -> None:
        held.remove(job)
        with shared.lock:
            hold = shared.holders.get(job.id)
            if hold is not None and hold[:2] == (me, job.lock):
                del shared.holders[job.id]
                shared.finishing.discard(job.id)
            if halted and shared.removes_begun.get(job.id, 0) <= removals_at_accept[job.lock]:
                shared.violations.append(f"worker {me}: JobHalted for {job.id}, which nobody removed")

    def finish(job: Job) -> None:
        with shared.lock:
            hold = shared.holders.get(job.id)
            if hold is not None and hold[:2] == (me, job.lock):
                shared.finishing.add(job.id)
        jobs.finish(job)
        with shared.lock:
            shared.finished += 1
        drop(job, halted=False)

    for _ in range(ops):
        op = rng.choice(["add", "add", "accept", "accept", "update", "finish", "finish", "resubmit", "remove"])
        if op == "add":
            job_id = rng.choice(mine)
            jobs.add(T, job_id, {"by": me})
            exists[job_id] = True
        elif op == "accept":
            with shared.lock:
                before = dict(shared.removes_done)
            try:
                job, _ = jobs.accept(T, timeout=0)
            except NotFound:
                continue
            removals_at_accept[job.lock] = before.get(job.id, 0)
            with shared.lock:
                shared.accepted += 1
                other = shared.holders.get(job.id)
                if other is not None and job.id in shared.finishing:
                    shared.finishing.discard(job.id)
                elif other is not None and shared.removes_begun.get(job.id, 0) <= min(other[2], before.get(job.id, 0)):
                    # Two runs of one job can only coexist if a remove committed between
                    # the two accepts; either of them may be the older, stale one.
                    shared.violations.append(
                        f"{job.id} accepted by worker {me} (lock {job.lock}) while worker {other[0]} holds it (lock {other[1]})"
                    )
                shared.holders[job.id] = (me, job.lock, before.get(job.id, 0))
            held.append(job)
        elif op == "remove":
            job_id = rng.choice(mine)
            with shared.lock:
                shared.removes_begun[job_id] = shared.removes_begun.get(job_id, 0) + 1
            try:
                jobs.remove(T, job_id)
            except NotFound:
                if exists.get(job_id):
                    with shared.lock:
                        shared.violations.append(f"remove of {job_id}: NotFound, but it was added")
                continue
            finally:
                with shared.lock:
                    shared.removes_done[job_id] = shared.removes_done.get(job_id, 0) + 1
            if not exists.get(job_id):
                with shared.lock:
                    shared.violations.append(f"remove of {job_id} succeeded, but it was never added or already removed")
            exists[job_id] = False
        elif held:
            job = rng.choice(held)
            try:
                if op == "update":
                    held[held.index(job)] = jobs.update(job, {"by": me, "beat": rng.random()})
                elif op == "resubmit":
                    held[held.index(job)] = jobs.resubmit(job)
                else:
                    finish(job)
            except JobHalted:
                drop(job, halted=True)
            except NotFound:  # resubmit of a job its owner removed meanwhile
                drop(job, halted=True)
    for job in list(held):  # a worker finishes what it holds before it stops
        try:
            finish(job)
        except JobHalted:
            drop(job, halted=True)


def run_workload(store: FaultyStore, *, workers: int, ops: int, seed: int) -> Shared:
    """Run the workload, drain the queue, and check the invariants; returns the tallies."""
    jobs = Jobs(store, monitors=False, rng=random.Random(seed))
    jobs.set_type_timeout(T, 3600)
    shared = Shared()
    exists: list[dict[str, bool]] = [{} for _ in range(workers)]
    errors: list[BaseException] = []

    def guarded(me: int) -> None:
        try:
            _worker(jobs, shared, me, ops, seed * 1000 + me, exists[me])
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert shared.violations == []

    # Drain: everything still pending runs once more and finishes.
    while True:
        try:
            job, _ = jobs.accept(T, timeout=0)
        except NotFound:
            break
        jobs.finish(job)
    store.enabled = False  # read the outcome without faults
    expected = {job_id for per_worker in exists for job_id, present in per_worker.items() if present}
    states = {info.id: info.state for info in jobs.iter_jobs(T)}
    # No job lost, none invented:
    assert set(states) == expected
    # None left locked, none pending: every job ran to the end.
    assert {s for s in states.values()} <= {"finished"}
    assert jobs.get_active_job_ids(T) == []
    # Every retry bounded:
    stats = store.retry_stats.snapshot()
    assert stats["gave_up"] == 0
    assert stats["max_retries"] < RETRY_LIMIT
    jobs.close()
    assert count_tx_ids(store, jobs.keys) == 0
    return shared


def _faulty(url: str, seed: int) -> FaultyStore:
    return FaultyStore(open_store(url), seed=seed, rate=0.2, max_retry_delay_s=0.002)


def test_threads_under_faults_lose_no_job_and_never_share_one() -> None:
    # The bounded run of `make test`: 4 threads x 150 operations on memory:, one seed.
    store = _faulty("memory:", seed=1)
    shared = run_workload(store, workers=4, ops=150, seed=1)
    assert shared.accepted > 50
    assert sum(store.faults.after_commit.values()) > 5  # faults after real commits did happen
    store.close()


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2, 10))
@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_soak_threads_under_faults_lose_no_job_and_never_share_one(kind: str, seed: int, tmp_path: Path) -> None:
    # `make soak`: 6 threads x 3,000 operations, eight seeds, on memory: and sqlite:.
    url = "memory:" if kind == "memory" else f"sqlite:{tmp_path / 'jobs.db'}"
    store = _faulty(url, seed)
    shared = run_workload(store, workers=6, ops=3000, seed=seed)
    stats = store.retry_stats.snapshot()
    print(
        f"\n{kind} seed {seed}: {shared.accepted} accepts, {shared.finished} finishes, "
        f"{store.faults.total()} faults ({sum(store.faults.after_commit.values())} after commit), "
        f"{stats['retries']} retries, max {stats['max_retries']} in one call"
    )
    store.close()
