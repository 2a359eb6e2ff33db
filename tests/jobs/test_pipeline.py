"""Claims overlapped (``smoosh.jobs.pipeline``, issue 50): one consumer, several claims in flight.

On every store: every job is claimed once and finished; the pipeline holds at most ``depth``
jobs however slow its consumer; closing it gives back the jobs it claimed and never handed
over. On the stand-in for FoundationDB with a round trip's latency set, its claims wait on
the network together (the stand-in counts the round trips in flight), where one worker's
claims one after the other never do: what makes one worker's rate on a cluster more than a
few round trips' worth.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
from jobs_testlib import T1

from helpers.daemon import HANG_S, wait_for
from helpers.fdb_standin import Binding
from smoosh.jobs import JobHalted, Jobs
from smoosh.jobs.pipeline import ClaimPipeline
from smoosh.store.fdb import FdbStore

#: A wait that must end with nothing (a claim the pipeline must not make): a short one.
QUIET_S = 0.2


def add(jobs: Jobs, n: int) -> list[str]:
    ids = [f"job-{i:03d}" for i in range(n)]

    def body(tr: Any) -> None:
        for job_id in ids:
            jobs.add(T1, job_id, {"n": job_id}, tx=tr)

    jobs.transact(body)
    return ids


def test_every_job_is_claimed_once_and_finished(jobs: Jobs) -> None:
    ids = add(jobs, 30)
    seen = []
    with ClaimPipeline(jobs, T1, depth=4) as pipe:
        for _ in ids:
            got = pipe.take(timeout=HANG_S)
            assert got is not None
            job, data = got
            seen.append(job.id)
            pipe.finish(job, {**data, "done": True})
        pipe.flush(timeout=HANG_S)
    assert sorted(seen) == ids
    assert {job_id: (state, data.get("done")) for _t, job_id, state, data in jobs.list_jobs(T1)} == {
        job_id: ("finished", True) for job_id in ids}


def test_a_slow_consumer_holds_no_more_than_depth_jobs_and_closing_gives_back_the_ones_never_taken(jobs: Jobs) -> None:
    ids = add(jobs, 10)
    pipe = ClaimPipeline(jobs, T1, depth=3)
    try:
        taken = pipe.take(timeout=HANG_S)
        assert taken is not None
        # the pipeline claims up to its depth, and no further while nothing is finished
        wait_for(lambda: len(jobs.get_active_job_ids(T1)) == 3, HANG_S, what="three jobs claimed")
        assert pipe.take(timeout=QUIET_S) is not None and pipe.take(timeout=QUIET_S) is not None
        assert pipe.take(timeout=QUIET_S) is None
        assert len(jobs.get_active_job_ids(T1)) == 3
    finally:
        pipe.close()
    # the three it handed over stay its consumer's to finish; nothing else is held
    assert len(jobs.get_active_job_ids(T1)) == 3
    states = [state for _t, _i, state, _d in jobs.list_jobs(T1)]
    assert states.count("pending") == len(ids) - 3


def test_a_job_claimed_but_never_taken_is_pending_again_after_a_close(jobs: Jobs) -> None:
    add(jobs, 2)
    pipe = ClaimPipeline(jobs, T1, depth=2)
    wait_for(lambda: len(jobs.get_active_job_ids(T1)) == 2, HANG_S, what="both jobs claimed")
    pipe.close()
    assert sorted(state for _t, _i, state, _d in jobs.list_jobs(T1)) == ["pending", "pending"]
    assert pipe.take(timeout=0) is None


def test_a_job_removed_while_it_ran_fails_its_own_finish_and_no_other(jobs: Jobs) -> None:
    add(jobs, 3)
    with ClaimPipeline(jobs, T1, depth=3) as pipe:
        taken = [pipe.take(timeout=HANG_S) for _ in range(3)]
        assert all(t is not None for t in taken)
        gone = taken[1][0]  # type: ignore[index]
        jobs.remove(T1, gone.id)
        futures = [pipe.finish(job, data) for job, data in taken]  # type: ignore[misc]
        with pytest.raises(JobHalted):
            pipe.flush(timeout=HANG_S)
        assert isinstance(futures[1].exception(), JobHalted)
        assert futures[0].exception() is None and futures[2].exception() is None
    assert sorted(state for _t, _i, state, _d in jobs.list_jobs(T1)) == ["finished", "finished"]


def run_on_standin(latency_s: float, work: Callable[[Jobs], None]) -> int:
    """``work`` on a job layer over the stand-in, each round trip ``latency_s``; the most round trips in flight at once."""
    binding = Binding()
    store = FdbStore(None, url="fdb:stand-in", binding=binding)
    jobs = Jobs(store, monitors=False)
    try:
        jobs.set_type_timeout(T1, 30)
        add(jobs, 12)
        binding.cluster.latency_s = latency_s
        binding.cluster.most_in_flight = 0
        work(jobs)
        return binding.cluster.most_in_flight
    finally:
        jobs.close()
        store.close()
        binding.cluster.close()


def test_on_a_cluster_with_latency_the_pipelines_claims_wait_on_the_network_together() -> None:
    def serial(jobs: Jobs) -> None:
        for _ in range(6):
            job, data = jobs.accept(T1, timeout=HANG_S)
            jobs.finish(job, data)

    def pipelined(jobs: Jobs) -> None:
        with ClaimPipeline(jobs, T1, depth=4) as pipe:
            for _ in range(6):
                got = pipe.take(timeout=HANG_S)
                assert got is not None
                pipe.finish(*got)
            pipe.flush(timeout=HANG_S)

    assert run_on_standin(0.02, serial) == 1
    assert run_on_standin(0.02, pipelined) >= 2
