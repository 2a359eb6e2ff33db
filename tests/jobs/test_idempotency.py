"""Every job operation gives the same result whether a "may have committed" error came before
or after its commit (fabric2's transaction ids), and the ids do not accumulate.

Every test works under a fresh prefix, cleared before and after, on every store: on a
cluster a test on the default prefix would sweep a live deployment's transaction ids.
"""

from __future__ import annotations

import random
from typing import Any, Iterator

import pytest
from helpers.clocks import FakeClock
from helpers.fdb_variants import FDB_KINDS, FdbVariant, fresh_tuple_prefix, skip_without_cluster

from smoosh.jobs import JobHalted, Jobs, NotFound
from smoosh.jobs.model import Job
from smoosh.jobs.txids import TX_ID_TTL_S, TxIds, count_tx_ids, sweep_expired
from smoosh.store.errors import StoreError
from smoosh.store.faulty import FaultyStore

from jobs_testlib import open_kind

T = "t"
MAYBE_COMMITTED = [1021, 1031, 1039]


@pytest.fixture
def prefix() -> bytes:
    return fresh_tuple_prefix()


@pytest.fixture(params=["memory", "sqlite", "fdb", "fdb-standin"])
def fstore(request: pytest.FixtureRequest, tmp_path: Any, prefix: bytes) -> Iterator[FaultyStore]:
    """A store that fails only where a test says so (:meth:`FaultyStore.inject`); the prefix cleared before and after."""
    skip_without_cluster(request.param)
    fdb = FdbVariant(request.param, prefix) if request.param in FDB_KINDS else None
    store = FaultyStore(open_kind(request.param, tmp_path, fdb=fdb), seed=0, rate=0.0, max_retry_delay_s=0.001)
    store.transact(lambda tr: tr.clear_range_startswith(prefix))
    yield store
    store.transact(lambda tr: tr.clear_range_startswith(prefix))
    store.close()
    if fdb is not None:
        fdb.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_000_000.0)


@pytest.fixture
def layer(fstore: FaultyStore, clock: FakeClock, prefix: bytes) -> Iterator[Jobs]:
    jobs = Jobs(fstore, prefix=prefix, clock=clock, monitors=False, rng=random.Random(3))
    jobs.set_type_timeout(T, 30)
    yield jobs
    jobs.close()


def _running(jobs: Jobs) -> list[str]:
    return sorted(info.id for info in jobs.iter_jobs(T) if info.state == "running")


@pytest.mark.parametrize("code", MAYBE_COMMITTED)
@pytest.mark.parametrize("after_commit", [True, False], ids=["after-commit", "before-commit"])
def test_accept_returns_the_job_it_took_and_takes_only_one(layer: Jobs, fstore: FaultyStore, code: int, after_commit: bool) -> None:
    # Given two pending jobs
    for job_id in ("a", "b"):
        layer.add(T, job_id, {"id": job_id})
    # When the accept's commit fails with a may-have-committed error
    fstore.inject(code, after_commit=after_commit)
    job, data = layer.accept(T, timeout=0)
    # Then exactly one job runs, it is the one returned, and its lock is the worker's
    assert _running(layer) == [job.id]
    assert data == {"id": job.id}
    assert layer.pending_count(T) == 1
    assert layer.update(job).lock == job.lock
    assert layer.txids.replays == (1 if after_commit else 0)


@pytest.mark.parametrize("code", MAYBE_COMMITTED)
def test_add_remove_update_finish_resubmit_answer_as_if_no_error_came(layer: Jobs, fstore: FaultyStore, code: int) -> None:
    fstore.inject(code, after_commit=True)
    layer.add(T, "a", {"n": 1})
    assert layer.get_job_state(T, "a") == "pending" and layer.pending_count(T) == 1

    job, _ = layer.accept(T, timeout=0)
    fstore.inject(code, after_commit=True)
    updated = layer.update(job, {"n": 2})  # no JobHalted: the replay returns the first answer
    assert updated == Job(T, "a", job.lock, False)
    assert layer.get_job_data(T, "a") == {"n": 2}

    fstore.inject(code, after_commit=True)
    again = layer.resubmit(updated)
    assert again.resubmitted

    fstore.inject(code, after_commit=True)
    layer.finish(again)  # resubmitted while running: back to pending, exactly once
    assert layer.get_job_state(T, "a") == "pending" and layer.pending_count(T) == 1

    fstore.inject(code, after_commit=True)
    layer.remove(T, "a")  # no NotFound for the job this very call removed
    with pytest.raises(NotFound):
        layer.get_job_state(T, "a")
    assert layer.txids.replays == 5


def test_without_the_id_a_replayed_remove_would_raise_not_found(layer: Jobs, fstore: FaultyStore) -> None:
    # The hazard itself, shown with a bare retry loop: the body runs again after its commit.
    layer.add(T, "a", {})
    fstore.inject(1021, after_commit=True)
    with pytest.raises(NotFound):
        fstore.transact(lambda tr: layer.remove(T, "a", tx=tr))


def test_finish_after_a_real_commit_does_not_raise_job_halted(layer: Jobs, fstore: FaultyStore) -> None:
    layer.add(T, "a", {})
    job, _ = layer.accept(T, timeout=0)
    fstore.inject(1021, after_commit=True, times=3)  # three attempts in a row commit and "fail"
    layer.finish(job, {"result": "ok"})
    assert layer.get_job_state(T, "a") == "finished"
    with pytest.raises(JobHalted):
        layer.finish(job)  # a second, separate finish is still refused


def test_transact_returns_the_remembered_result_of_a_committed_attempt(layer: Jobs, fstore: FaultyStore) -> None:
    layer.add(T, "a", {})
    job, _ = layer.accept(T, timeout=0)
    runs = []

    def body(tr: Any) -> tuple[Job, str]:
        runs.append(1)
        return layer.update(job, {"step": len(runs)}, tx=tr), "done"

    fstore.inject(1031, after_commit=True)
    result = layer.transact(body)
    assert result == (Job(T, "a", job.lock, False), "done")
    assert len(runs) == 1
    assert layer.get_job_data(T, "a") == {"step": 1}


def test_transact_with_a_result_it_cannot_remember_reports_commit_unknown(layer: Jobs, fstore: FaultyStore) -> None:
    marker = object()
    assert layer.transact(lambda tr: (layer.add(T, "a", {}, tx=tr), marker)[1]) is marker
    fstore.inject(1021, after_commit=True)
    with pytest.raises(StoreError) as e:
        layer.transact(lambda tr: (layer.add(T, "b", {}, tx=tr), marker)[1])
    assert e.value.code == 1021 and "could not be remembered" in str(e.value)
    assert layer.get_job_state(T, "b") == "pending"  # it did commit, once


def test_read_only_calls_write_no_transaction_id(layer: Jobs) -> None:
    layer.add(T, "a", {}, scheduled_time=5)
    before = count_tx_ids(layer.store, layer.keys)
    layer.add(T, "a", {}, scheduled_time=5)  # unchanged pending job: no writes at all
    layer.get_job_state(T, "a")
    layer.pending_count(T)
    assert count_tx_ids(layer.store, layer.keys) == before


def test_transaction_ids_do_not_accumulate(layer: Jobs) -> None:
    for i in range(300):
        layer.add(T, f"j{i}", {})
        job, _ = layer.accept(T, timeout=0)
        layer.finish(job)
    # Each write clears the ids of the calls before it: only the last call's id remains.
    assert count_tx_ids(layer.store, layer.keys) <= 1
    assert layer.txids.pending_clears() <= 1
    layer.close()
    assert count_tx_ids(layer.store, layer.keys) == 0


def test_ids_of_a_process_that_died_are_swept_after_their_ttl(fstore: FaultyStore, clock: FakeClock, prefix: bytes) -> None:
    jobs = Jobs(fstore, prefix=prefix, clock=clock, monitors=False)
    jobs.set_type_timeout(T, 30)
    for i in range(5):  # five processes that each die right after one call
        TxIds(fstore, jobs.keys, clock=clock).run(lambda tr, i=i: tr.set(jobs.keys.data(T, f"x{i}"), b""))
    assert count_tx_ids(fstore, jobs.keys) == 6  # theirs and the layer's last call's
    clock.now += TX_ID_TTL_S - 1
    sweep_expired(fstore, jobs.keys, clock())
    assert count_tx_ids(fstore, jobs.keys) == 6  # not yet: a retry loop could still read them
    clock.now += 2
    jobs.add(T, "fresh", {})  # an id issued now survives the sweep
    sweep_expired(fstore, jobs.keys, clock())
    assert count_tx_ids(fstore, jobs.keys) == 1
    jobs.close()


def test_activity_monitor_sweeps_expired_ids_on_its_check(fstore: FaultyStore, clock: FakeClock, prefix: bytes) -> None:
    from smoosh.jobs.monitor import ActivityMonitor

    jobs = Jobs(fstore, prefix=prefix, clock=clock, monitors=False)
    jobs.set_type_timeout(T, 30)
    dead = TxIds(fstore, jobs.keys, clock=clock)
    dead.run(lambda tr: tr.set(jobs.keys.data(T, "x"), b""))
    monitor = ActivityMonitor(fstore, jobs.keys, T, clock=clock, rng=random.Random(1))
    clock.now += TX_ID_TTL_S + 1
    monitor.check_activity()
    assert count_tx_ids(fstore, jobs.keys) == 0
    jobs.close()
