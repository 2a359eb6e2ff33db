"""A claimed run's finish rides on the next claim's commit (smoosh/daemon/run/finishes.py).

Real job layer over the memory and SQLite stores; the hold-off is stepped with an injected
clock. What is asserted is what the store shows: a finished run's job is gone after the
commit that carried it, never before, and no finish is lost when that commit fails.
"""

from __future__ import annotations

import threading
from typing import Any, Iterator

import pytest

from compactor.dbfactory import make_bloated_db
from helpers.clocks import FakeClock
from helpers.daemon import HANG_S, wait_for
from server.test_server import make_config
from smoosh import Server
from smoosh.daemon.run.finishes import BATCH_ROW_WAIT_S, FINISH_MERGE_WAIT_S, DeferredFinishes
from smoosh.jobs import Jobs, NotFound
from smoosh.store import open_store

JOB_TYPE = "smoosh:n1"


@pytest.fixture(params=["memory", "sqlite"])
def jobs(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Jobs]:
    store = open_store("memory:" if request.param == "memory" else f"sqlite:{tmp_path / 'jobs.db'}")
    layer = Jobs(store)
    layer.set_type_timeout(JOB_TYPE, 30)
    yield layer
    layer.close()
    store.close()


def state(jobs: Jobs, key: str) -> str | None:
    try:
        return jobs.get_job(JOB_TYPE, key).state
    except NotFound:
        return None


def claimed(jobs: Jobs, key: str) -> Any:
    return jobs.add_claimed(JOB_TYPE, key, {"key": key})


def test_the_next_claim_commits_the_finish_with_its_own_job(jobs: Jobs) -> None:
    clock = FakeClock(100.0)
    finishes = DeferredFinishes(jobs, clock=clock)
    # Given a run that ended: its finish waits, its job still running in the store
    finishes.add("/db/a", claimed(jobs, "/db/a"))
    assert state(jobs, "/db/a") == "running"
    # When the next run of the channel is claimed
    job_b = finishes.transact("/db/b", lambda tr: jobs.add_claimed(JOB_TYPE, "/db/b", {"key": "/db/b"}, tx=tr))
    # Then the one commit added b and finished and removed a
    assert state(jobs, "/db/a") is None
    assert state(jobs, "/db/b") == "running" and job_b.id == "/db/b"
    assert finishes.waiting() == 0


def test_a_finish_no_claim_takes_is_committed_once_it_has_waited(jobs: Jobs) -> None:
    clock = FakeClock(100.0)
    finishes = DeferredFinishes(jobs, clock=clock)
    finishes.add("/db/a", claimed(jobs, "/db/a"))
    # Not due yet: the idle thread is told when to look again, and nothing is written
    assert finishes.flush_if_due() == pytest.approx(FINISH_MERGE_WAIT_S)
    assert state(jobs, "/db/a") == "running"
    clock.advance(FINISH_MERGE_WAIT_S)
    assert finishes.flush_if_due() is None
    assert state(jobs, "/db/a") is None
    assert finishes.flush_if_due() is None  # nothing waits: nothing to look at again


def test_a_failed_claim_leaves_the_finish_waiting_and_a_stop_commits_it(jobs: Jobs) -> None:
    finishes = DeferredFinishes(jobs, clock=FakeClock(100.0))
    finishes.add("/db/a", claimed(jobs, "/db/a"))

    def failing(tr: Any) -> None:
        raise ValueError("the claim failed")

    with pytest.raises(ValueError, match="the claim failed"):
        finishes.transact("/db/b", failing)
    # Nothing of that transaction was written, and the finish was not lost
    assert state(jobs, "/db/a") == "running"
    assert finishes.waiting() == 1
    finishes.flush()
    assert state(jobs, "/db/a") is None


def test_a_job_removed_meanwhile_does_not_fail_the_claim_that_carries_its_finish(jobs: Jobs) -> None:
    finishes = DeferredFinishes(jobs, clock=FakeClock(100.0))
    finishes.add("/db/a", claimed(jobs, "/db/a"))
    jobs.remove(JOB_TYPE, "/db/a")  # e.g. with its crash record, by the scheduler
    finishes.transact("/db/b", lambda tr: jobs.add_claimed(JOB_TYPE, "/db/b", {"key": "/db/b"}, tx=tr))
    assert state(jobs, "/db/a") is None and state(jobs, "/db/b") == "running"


def test_a_claim_of_the_same_key_waits_for_the_commit_carrying_its_last_finish(jobs: Jobs) -> None:
    finishes = DeferredFinishes(jobs)
    finishes.add("/db/a", claimed(jobs, "/db/a"))
    inside, release = threading.Event(), threading.Event()
    seen: list[str | None] = []

    def slow_claim(tr: Any) -> None:
        inside.set()
        assert release.wait(HANG_S)

    # One thread's claim (of another key) carries a's finish and is still committing
    first = threading.Thread(target=lambda: finishes.transact("/db/b", slow_claim))
    first.start()
    assert inside.wait(HANG_S)

    def claim_a_again(tr: Any) -> None:
        seen.append(state(jobs, "/db/a"))  # outside the transaction: what is committed now

    second = threading.Thread(target=lambda: finishes.transact("/db/a", claim_a_again))
    second.start()
    second.join(0.2)  # a short look: it must still be waiting for the first commit
    assert second.is_alive() and seen == []
    release.set()
    first.join(10)
    second.join(10)
    # The claim of a ran only once the old run of a was finished and removed
    assert seen == [None]


# -- the daemon: a drain leaves no job behind --------------------------------------------------


def test_a_drained_fleet_leaves_no_job_in_the_store_idle_or_stopped(tmp_path: Any) -> None:
    config = make_config(tmp_path, extra=f"store = sqlite:{tmp_path / 'state' / 'jobs.db'}\nstaleness = 0")
    keys = []
    for i in range(6):
        path = tmp_path / "dbs" / f"t{i}.db"
        make_bloated_db(str(path), delete_fraction=0.8)
        keys.append(str(path))
    for stop_at_once in (False, True):
        server = Server(config, workers=1, watch_config=False)
        server.start()
        try:
            for key in keys:
                server.enqueue(key, force=True)

            def compacted() -> int:
                return sum(n for (_, result), n in server.counters.compactions.items() if result == "ok")

            wait_for(lambda: compacted() >= len(keys), HANG_S, what="the fleet compacted")
            if not stop_at_once:
                # Idle: the last run's finish is committed on its own within the hold-off
                wait_for(lambda: server.jobs.list_jobs() == [], HANG_S, what="every job finished and removed")
        finally:
            server.stop()
        if stop_at_once:
            # Stopped right after the last run ended: the stop committed what waited
            reopened = open_store(f"sqlite:{tmp_path / 'state' / 'jobs.db'}")
            layer = Jobs(reopened)
            try:
                assert layer.list_jobs() == []
            finally:
                layer.close()
                reopened.close()
        # The second round forces the same files again (compact now, but forced runs run).


def test_a_finished_runs_history_row_rides_on_the_commit_that_finishes_its_job(jobs: Jobs) -> None:
    # Durable history costs no extra commit (DESIGN §12): the row is written with the finish.
    from smoosh.daemon.results import Result, ResultLog, read_rows

    clock = FakeClock(100.0)
    finishes = DeferredFinishes(jobs, clock=clock)
    log = ResultLog("n1")
    # Given a run that ended, its history row handed to the finish that waits
    write = log.write_for("/db/a", Result(100.0, "ratio_dbs", "ok", 0.5, 1000, 100))
    finishes.add("/db/a", claimed(jobs, "/db/a"), write)
    assert jobs.store.transact(lambda tr: read_rows(tr.snapshot, "n1")) == {}
    # When the next claim commits
    finishes.transact("/db/b", lambda tr: jobs.add_claimed(JOB_TYPE, "/db/b", {"key": "/db/b"}, tx=tr))
    # Then that one commit finished the job and wrote the row
    assert state(jobs, "/db/a") is None
    rows = jobs.store.transact(lambda tr: read_rows(tr.snapshot, "n1"))
    assert [(r.result, r.size_before_bytes, r.size_after_bytes) for r in rows["/db/a"]] == [("ok", 1000, 100)]


def row(store_key: bytes) -> Any:
    """A history row's write (what a batch's database leaves with no job to finish)."""
    return lambda tr: tr.set(store_key, b"row")


def read(jobs: Jobs, store_key: bytes) -> bytes | None:
    return jobs.store.transact(lambda tr: tr.get(store_key))


def test_a_batchs_rows_wait_a_second_for_a_commit_and_a_jobs_finish_five_milliseconds(jobs: Jobs) -> None:
    clock = FakeClock(100.0)
    finishes = DeferredFinishes(jobs, clock=clock)
    # Given the history rows of a batch's first databases, with no job of their own to finish
    finishes.add("/db/a", None, row(b"row-a"))
    clock.advance(0.3)
    finishes.add("/db/b", None, row(b"row-b"))
    # Then they wait for a commit to carry them up to BATCH_ROW_WAIT_S from the oldest, not FINISH_MERGE_WAIT_S
    assert finishes.flush_if_due() == pytest.approx(BATCH_ROW_WAIT_S - 0.3)
    assert finishes.flush_rows_if_due() == pytest.approx(100.0 + BATCH_ROW_WAIT_S)
    assert finishes.rows_due_at() == pytest.approx(100.0 + BATCH_ROW_WAIT_S)
    assert read(jobs, b"row-a") is None
    # When the batch's job ends (a job's finish waits): FINISH_MERGE_WAIT_S from then counts
    finishes.add("/db/a", claimed(jobs, "/db/a"))
    assert finishes.flush_if_due() == pytest.approx(FINISH_MERGE_WAIT_S)
    clock.advance(FINISH_MERGE_WAIT_S)
    # Then one commit writes the rows and finishes the job
    assert finishes.flush_if_due() is None
    assert (read(jobs, b"row-a"), read(jobs, b"row-b"), state(jobs, "/db/a")) == (b"row", b"row", None)
    assert finishes.waiting() == 0 and finishes.rows_due_at() is None


def test_a_batch_waiting_long_gets_its_rows_committed_after_a_second(jobs: Jobs) -> None:
    clock = FakeClock(100.0)
    finishes = DeferredFinishes(jobs, clock=clock)
    # Given a batch's rows, the batch stuck on a database (its job running, no commit coming)
    finishes.add("/db/a", None, row(b"row-a"))
    clock.advance(BATCH_ROW_WAIT_S - 0.01)
    assert finishes.flush_rows_if_due() is not None and read(jobs, b"row-a") is None
    # When a second has passed (the worker's heartbeat thread looks)
    clock.advance(0.01)
    # Then the rows are committed, and nothing waits
    assert finishes.flush_rows_if_due() is None
    assert read(jobs, b"row-a") == b"row" and finishes.waiting() == 0
