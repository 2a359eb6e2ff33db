"""The worker with the real job layer (memory and sqlite stores) and real SQLite files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace
from typing import Any, Callable, Iterator

import pytest

from compactor.dbfactory import db_stats, integrity, make_bloated_db, row_count
from compactor.gates import GatedCompactor
from helpers.clocks import FakeClock
from helpers.daemon import HANG_S
from helpers.locks import ChildConnection
from smoosh.daemon.control import control
from smoosh.compactors import SqliteCompactor
from smoosh.jobs import Jobs
from smoosh.store import open_store
from channels.ports import Outcome
from smoosh.daemon.run.worker import Worker
from smoosh.io_budget import DEFAULT_CHUNK_GAP_FACTOR, IoBudget

NODE = "n1"
JOB_TYPE = "smoosh:" + NODE
CHANNEL = "ratio_dbs"
HERE = os.path.dirname(os.path.abspath(__file__))
#: Upper bound for any wait on another thread or process in these tests (seconds).
WAIT_S = HANG_S  # a ceiling on a hang, never a measure of speed


def settings(**kw: Any) -> SimpleNamespace:
    base = {"page_size": None, "auto_vacuum": None, "incremental_chunk_pages": 50, "busy_timeout_s": 0.5}
    base.update(kw)
    return SimpleNamespace(**base)


def wait_until(pred: Callable[[], Any], timeout_s: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError("condition not reached in time")


def start_data(key: str) -> dict[str, Any]:
    return {"channel": CHANNEL, "key": key, "priority": 5.0, "progress": 0.0}


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Any]:
    st = open_store("memory:" if request.param == "memory" else f"sqlite:{tmp_path / 'jobs.db'}")
    yield st
    st.close()


@pytest.fixture
def jobs(store: Any) -> Iterator[Jobs]:
    layer = Jobs(store)
    layer.set_type_timeout(JOB_TYPE, 30)
    yield layer
    layer.close()


@pytest.fixture
def workers(jobs: Jobs, store: Any) -> Iterator[Callable[..., Worker]]:
    made: list[Worker] = []

    def make(compactors: list[Any], **kw: Any) -> Worker:
        kw.setdefault("node", NODE)
        kw.setdefault("accept_timeout_s", 0.1)
        w = Worker(jobs, store, JOB_TYPE, compactors, **kw)
        made.append(w)
        return w

    yield make
    for w in made:
        w.stop(5)


def finished(jobs: Jobs, key: str) -> dict[str, Any]:
    sub = jobs.subscribe(JOB_TYPE, key)
    try:
        if sub.state == "finished":
            return sub.data
        event = sub.wait("finished", timeout=WAIT_S)
    finally:
        sub.close()
    assert event is not None, "job did not finish"
    return event[3]


def test_accepted_job_is_compacted_and_finished_ok(tmp_path, jobs, workers) -> None:
    path = str(tmp_path / "a.db")
    stats = make_bloated_db(path)
    jobs.add(JOB_TYPE, path, start_data(path))
    workers([SqliteCompactor(settings())]).start()
    data = finished(jobs, path)
    assert data["result"] == "ok" and data["error"] is None
    assert data["size_before_bytes"] == stats["file_bytes"]
    assert data["size_after_bytes"] == os.path.getsize(path)
    assert data["reclaimed_bytes"] == data["size_before_bytes"] - data["size_after_bytes"] > 0
    assert isinstance(data["duration_s"], float) and data["progress"] == 1.0
    assert data["channel"] == CHANNEL and data["priority"] == 5.0
    assert integrity(path) == "ok" and row_count(path) == stats["rows"]


def test_a_slot_promised_to_a_compaction_about_to_start_counts_as_compacting(tmp_path, jobs, workers) -> None:
    # (What keeps the daemon's inotify observer quiet from one compaction of a drain to the
    # next: the next one's slot is promised before the last one's run has left.)
    worker = workers([SqliteCompactor(settings())], concurrency=2)
    worker.start()
    # (Its dispatcher holds a slot while it waits to accept a job: no compaction is coming.)
    assert not worker.compacting_any()
    # When the loop promises a slot to a claim it is about to hand over
    assert worker.reserve()
    # Then the worker counts as compacting until the promise is given back
    assert worker.compacting_any()
    worker.unreserve()
    assert not worker.compacting_any()
    # Or until it is taken up and its run has ended
    path = str(tmp_path / "a.db")
    make_bloated_db(path)
    before = os.path.getsize(path)
    assert worker.reserve()
    worker.run_claimed(lambda: (jobs.add_claimed(JOB_TYPE, path, start_data(path)), start_data(path)))
    deadline = time.monotonic() + HANG_S
    while worker.compacting_any() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not worker.compacting_any()
    assert os.path.getsize(path) < before and integrity(path) == "ok"


def test_a_run_frees_its_slot_before_its_end_is_told_and_counts_as_running_until_released(
    tmp_path, jobs, workers
) -> None:
    # (Hearing the end, the daemon's loop starts the next run at once: its claim must find a slot
    # free. The daemon's file watcher then reads its queue in the release: the worker must not
    # stop counting the run meanwhile, or the watcher would take its last writes for news.)
    path = str(tmp_path / "a.db")
    make_bloated_db(path)
    seen: list[tuple[str, str, bool, bool, bool]] = []

    def look(when: str, key: str) -> None:
        promised = worker.reserve()
        if promised:
            worker.unreserve()
        seen.append((when, key, promised, worker.is_running(key), worker.compacting_any()))

    class Listener:
        def run_started(self, key: str, data: dict[str, Any]) -> None:
            pass

        def run_ended(self, key: str, data: dict[str, Any], outcome: Outcome) -> None:
            look("told", key)

        def run_continues(self, key: str, data: dict[str, Any], outcome: Outcome, taken: Any, carrier: Any) -> None:
            self.run_ended(key, data, outcome)  # no batch: the end told, and no next key

        def catch_up(self) -> None:
            pass

    # (Two slots: its dispatcher holds one while it waits to accept a job.)
    worker = workers([SqliteCompactor(settings())], concurrency=2, signals="direct", listener=Listener())
    worker.on_released = lambda key: look("released", key)
    worker.start()
    # When a claimed run ends
    assert worker.reserve()
    worker.run_claimed(lambda: (jobs.add_claimed(JOB_TYPE, path, start_data(path)), start_data(path)))
    deadline = time.monotonic() + HANG_S
    while worker.is_running(path) or len(seen) < 2:
        assert time.monotonic() < deadline, "the run did not end"
        time.sleep(0.01)
    # Then its end was told, then released, each time with its slot free and the key running
    assert seen == [("told", path, True, True, True), ("released", path, True, True, True)]
    # And after the release, the key is not running
    assert not worker.is_running(path) and not worker.compacting_any()


def test_a_stop_waits_for_a_run_being_released(tmp_path, jobs, workers) -> None:
    # (A run's end is told after it leaves its slot: a stop that returned before the release
    # could leave the daemon's loop stopped before the end reached it.)
    path = str(tmp_path / "a.db")
    make_bloated_db(path)
    inside, go_on = threading.Event(), threading.Event()
    worker = workers([SqliteCompactor(settings())], concurrency=2)
    worker.on_released = lambda key: (inside.set(), go_on.wait(HANG_S))
    worker.start()
    # Given a claimed run that ended and is being released
    assert worker.reserve()
    worker.run_claimed(lambda: (jobs.add_claimed(JOB_TYPE, path, start_data(path)), start_data(path)))
    assert inside.wait(HANG_S)
    # When the worker is stopped meanwhile
    stopped: list[bool] = []
    stopper = threading.Thread(target=lambda: stopped.append(worker.stop(HANG_S)))
    stopper.start()
    try:
        # Then the stop waits for the release to end, and then ends cleanly
        stopper.join(0.3)
        assert stopper.is_alive()
        go_on.set()
        stopper.join(HANG_S)
        assert stopped == [True]
    finally:
        go_on.set()
        stopper.join(HANG_S)


def test_a_claimed_path_swapped_for_a_symlink_after_its_check_finishes_gone_and_touches_nothing_outside(
    tmp_path, jobs, workers
) -> None:
    # (A claimed run's path is checked by its claim, the re-check, and not again before the
    # compaction: the compactor's open is what refuses a swap in between.)
    import hashlib

    dbs, outside = tmp_path / "dbs", tmp_path / "outside"
    (dbs / "sub").mkdir(parents=True)
    outside.mkdir()
    path = str(dbs / "sub" / "q.db")
    victim = str(outside / "q.db")
    make_bloated_db(victim)
    digest = hashlib.sha256(open(victim, "rb").read()).hexdigest()
    ended: list[Outcome] = []
    done = threading.Event()

    class Listener:
        def run_started(self, key: str, data: dict[str, Any]) -> None:
            pass

        def run_ended(self, key: str, data: dict[str, Any], outcome: Outcome) -> None:
            ended.append(outcome)
            done.set()

        def run_continues(self, key: str, data: dict[str, Any], outcome: Outcome, taken: Any, carrier: Any) -> None:
            self.run_ended(key, data, outcome)  # no batch: the end told, and no next key

        def catch_up(self) -> None:
            pass

    worker = workers([SqliteCompactor(settings(), roots=[str(dbs)])], roots=lambda: [str(dbs)], concurrency=2,
                     signals="direct", listener=Listener())
    worker.start()

    def claim() -> tuple[Any, dict[str, Any]]:
        # Given a claim that found the path in place, and a directory of it swapped for a
        # symlink to one outside the roots between its check and the compaction
        job = jobs.add_claimed(JOB_TYPE, path, start_data(path))
        os.rmdir(dbs / "sub")
        os.symlink(outside, dbs / "sub")
        return job, start_data(path)

    assert worker.reserve()
    worker.run_claimed(claim)
    # Then the run ends gone, and the outside file is byte for byte what it was
    assert done.wait(HANG_S)
    assert [o.result for o in ended] == ["gone"]
    assert hashlib.sha256(open(victim, "rb").read()).hexdigest() == digest


def test_unclaimed_missing_and_failing_keys_finish_with_their_result(tmp_path, jobs, workers) -> None:
    missing = str(tmp_path / "missing.db")
    jobs.add(JOB_TYPE, "relative.db", start_data("relative.db"))
    jobs.add(JOB_TYPE, missing, start_data(missing))
    workers([SqliteCompactor(settings())]).start()
    unclaimed = finished(jobs, "relative.db")
    assert (unclaimed["result"], unclaimed["error"]) == ("failed", "no compactor claims relative.db")
    assert finished(jobs, missing)["result"] == "gone"


def test_a_queued_path_swapped_for_a_symlink_finishes_gone_and_touches_nothing_outside(
    tmp_path, jobs, workers, caplog
) -> None:
    # Given a queued database inside the roots, replaced by a symlink to one outside them
    import hashlib
    import logging

    dbs, outside = tmp_path / "dbs", tmp_path / "outside"
    dbs.mkdir()
    outside.mkdir()
    victim = str(outside / "victim.db")
    make_bloated_db(victim)
    path = str(dbs / "q.db")
    os.symlink(victim, path)
    digest = hashlib.sha256(open(victim, "rb").read()).hexdigest()
    # When a worker takes the job
    jobs.add(JOB_TYPE, path, start_data(path))
    with caplog.at_level(logging.WARNING):
        workers([SqliteCompactor(settings(), roots=[str(dbs)])]).start()
        data = finished(jobs, path)
    # Then it ends as gone (dropped, not a crash retried with backoff), logged once without a
    # traceback, and the outside file is byte for byte what it was
    assert data["result"] == "gone"
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in warnings] == [
        f"Refused to open the database {path!r}: reaches its file through a symbolic link."
    ]
    assert all(r.exc_info is None for r in warnings)
    assert hashlib.sha256(open(victim, "rb").read()).hexdigest() == digest


def test_exception_in_a_compactor_is_a_failed_result(tmp_path, jobs, workers) -> None:
    path = str(tmp_path / "a.db")
    make_bloated_db(path)

    class Broken(SqliteCompactor):
        def compact(self, key: str, ctx: Any) -> Any:
            raise ValueError("boom")

    jobs.add(JOB_TYPE, path, start_data(path))
    workers([Broken(settings())]).start()
    data = finished(jobs, path)
    assert (data["result"], data["error"]) == ("failed", "ValueError: boom")


def test_busy_database_finishes_busy(tmp_path, jobs, workers) -> None:
    path = str(tmp_path / "a.db")
    make_bloated_db(path)
    # The application holds the write lock from its own process: a lock held through another
    # SQLite library in this process would be invisible to the compactor (DESIGN §11).
    with ChildConnection(path) as app:
        app.execute("BEGIN IMMEDIATE")
        jobs.add(JOB_TYPE, path, start_data(path))
        workers([SqliteCompactor(settings(busy_timeout_s=0.1))]).start()
        assert finished(jobs, path)["result"] == "busy"
        app.execute("ROLLBACK")


def test_heartbeats_publish_progress_while_a_compaction_runs(tmp_path, jobs, workers) -> None:
    path = str(tmp_path / "inc.db")
    make_bloated_db(path, auto_vacuum="incremental")
    gated = GatedCompactor(SqliteCompactor(settings()), at_checkpoint=3)
    jobs.add(JOB_TYPE, path, start_data(path))
    workers([gated], job_timeout_s=0.3).start()
    assert gated.reached.wait(WAIT_S)
    progress = wait_until(lambda: jobs.get_job_data(JOB_TYPE, path)["progress"])
    assert 0 < progress < 1
    assert jobs.get_job_state(JOB_TYPE, path) == "running"
    gated.release.set()
    assert finished(jobs, path)["result"] == "ok"


def test_a_stand_alone_worker_names_itself_in_the_job_by_the_commit_that_accepts_it(tmp_path, jobs, workers) -> None:
    path = str(tmp_path / "inc.db")
    make_bloated_db(path, auto_vacuum="incremental")
    gated = GatedCompactor(SqliteCompactor(settings()), at_checkpoint=1)
    jobs.add(JOB_TYPE, path, start_data(path))
    workers([gated], signals="store", holder="worker-0123", job_timeout_s=30).start()
    assert gated.reached.wait(WAIT_S)
    # Its compaction has begun: a restarting daemon already sees whose job it is and that its
    # worker lives, with no heartbeat of its own sent (the first is due a third of the timeout on).
    data = jobs.get_job_data(JOB_TYPE, path)
    assert (data["holder"], data["worker"]) == ("worker-0123", "process")
    assert isinstance(data["heartbeat_at"], float)
    assert "run_id" not in data  # a heartbeat names the run: none was sent
    gated.release.set()
    assert finished(jobs, path)["result"] == "ok"


def test_held_channel_pauses_an_incremental_compaction_between_chunks(tmp_path, jobs, store, workers) -> None:
    path = str(tmp_path / "inc.db")
    stats = make_bloated_db(path, auto_vacuum="incremental")
    gated = GatedCompactor(SqliteCompactor(settings()), at_checkpoint=2)
    jobs.add(JOB_TYPE, path, start_data(path))
    worker = workers([gated], hold_poll_s=0.02)
    worker.start()
    assert gated.reached.wait(WAIT_S)
    control.set_hold(store, NODE, CHANNEL, True)
    wait_until(lambda: worker.status() and worker.status()[0]["held"])
    gated.entered_checkpoint.clear()
    gated.release.set()
    assert gated.entered_checkpoint.wait(WAIT_S)
    paused_free = db_stats(path)["freelist_count"]
    time.sleep(0.3)  # held: no chunk may run in the meantime
    assert gated.checkpoints_passed == 1
    assert db_stats(path)["freelist_count"] == paused_free < stats["freelist_count"]
    assert jobs.get_job_state(JOB_TYPE, path) == "running"
    control.set_hold(store, NODE, CHANNEL, False)
    assert finished(jobs, path)["result"] == "ok"
    assert db_stats(path)["freelist_count"] == 0 and integrity(path) == "ok"


def test_held_channel_interrupts_a_full_vacuum(tmp_path, jobs, store, workers) -> None:
    path = str(tmp_path / "full.db")
    stats = make_bloated_db(path, rows=4000, row_bytes=200, scattered=True)
    gated = GatedCompactor(SqliteCompactor(settings()), at_progress=True)
    jobs.add(JOB_TYPE, path, start_data(path))
    worker = workers([gated], hold_poll_s=0.02)
    worker.start()
    assert gated.reached.wait(WAIT_S)
    control.set_hold(store, NODE, CHANNEL, True)
    wait_until(lambda: worker.status() and worker.status()[0]["held"])
    gated.release.set()
    data = finished(jobs, path)
    assert data["result"] == "interrupted" and data["reclaimed_bytes"] == 0
    assert os.path.getsize(path) == stats["file_bytes"]
    assert integrity(path) == "ok" and row_count(path) == stats["rows"]


def published_run(jobs: Jobs, key: str, *, suspendable: bool | None = None) -> dict[str, Any]:
    """The job's data once a heartbeat has published the run (run id, start, suspendable).

    A stand-alone worker heartbeats as it starts (before the first chunk boundary, so not yet
    suspendable): ``suspendable`` waits for a heartbeat that says so.
    """
    def published() -> dict[str, Any] | None:
        d = jobs.get_job_data(JOB_TYPE, key)
        if not d.get("run_id") or (suspendable is not None and d.get("suspendable") is not suspendable):
            return None
        return d

    return wait_until(published)


def test_rotation_stops_a_chunked_compaction_at_a_chunk_boundary(tmp_path, jobs, store, workers) -> None:
    path = str(tmp_path / "inc.db")
    stats = make_bloated_db(path, auto_vacuum="incremental")
    gated = GatedCompactor(SqliteCompactor(settings(incremental_chunk_pages=5)), at_checkpoint=3)
    jobs.add(JOB_TYPE, path, start_data(path))
    worker = workers([gated], job_timeout_s=0.3, hold_poll_s=0.02)
    worker.start()
    assert gated.reached.wait(WAIT_S)
    run = published_run(jobs, path, suspendable=True)
    assert run["started_at"] > 0
    control.request_rotation(store, NODE, path, run["run_id"])
    assert jobs.get_job_state(JOB_TYPE, path) == "running"
    # The request is seen while the chunk loop waits at the gate (the run is stopping)
    wait_until(lambda: worker.status()[0]["stopping"])
    gated.release.set()
    data = finished(jobs, path)
    assert (data["result"], data["rotated"]) == ("interrupted", True)
    assert gated.checkpoints_passed == 2  # stopped at the gated boundary: no chunk after it
    left = db_stats(path)["freelist_count"]
    assert 0 < left < stats["freelist_count"]  # two chunks done, kept in the file
    assert integrity(path) == "ok" and row_count(path) == stats["rows"]


def test_rotation_request_for_another_run_is_ignored(tmp_path, jobs, store, workers) -> None:
    path = str(tmp_path / "inc.db")
    make_bloated_db(path, auto_vacuum="incremental")
    gated = GatedCompactor(SqliteCompactor(settings()), at_checkpoint=2)
    jobs.add(JOB_TYPE, path, start_data(path))
    workers([gated], job_timeout_s=0.3, hold_poll_s=0.02).start()
    assert gated.reached.wait(WAIT_S)
    published_run(jobs, path)
    control.request_rotation(store, NODE, path, "a-run-that-died")
    time.sleep(0.1)
    gated.release.set()
    data = finished(jobs, path)
    assert data["result"] == "ok" and "rotated" not in data


def test_rotation_never_stops_a_full_vacuum(tmp_path, jobs, store, workers) -> None:
    path = str(tmp_path / "full.db")
    stats = make_bloated_db(path, rows=4000, row_bytes=200, scattered=True)
    gated = GatedCompactor(SqliteCompactor(settings()), at_progress=True)
    jobs.add(JOB_TYPE, path, start_data(path))
    workers([gated], job_timeout_s=0.3, hold_poll_s=0.02).start()
    assert gated.reached.wait(WAIT_S)
    run = published_run(jobs, path)
    assert run["suspendable"] is False
    control.request_rotation(store, NODE, path, run["run_id"])
    time.sleep(0.1)
    gated.release.set()
    data = finished(jobs, path)
    assert data["result"] == "ok" and os.path.getsize(path) < stats["file_bytes"]


def test_job_context_rotates_only_a_run_that_can_stop_without_losing_work() -> None:
    from smoosh.compactors import Interrupted
    from smoosh.daemon.run.worker import JobContext

    fresh = JobContext()
    assert fresh.rotate() is False  # no chunk boundary passed yet: nothing says it can stop
    vacuum = JobContext()
    vacuum.checkpoint()
    vacuum.on_cancel(lambda: None)
    assert (vacuum.suspendable, vacuum.rotate(), vacuum.stop_reason) == (False, False, None)
    chunked = JobContext()
    chunked.checkpoint()
    assert chunked.suspendable and chunked.rotate() and chunked.rotate()
    with pytest.raises(Interrupted):
        chunked.checkpoint()
    cancelled: list[bool] = []
    chunked.on_cancel(lambda: cancelled.append(True))  # a VACUUM starting now never runs
    assert cancelled == [True]


def test_stop_puts_a_running_job_back_to_pending(tmp_path, jobs, workers) -> None:
    path = str(tmp_path / "inc.db")
    stats = make_bloated_db(path, auto_vacuum="incremental")
    gated = GatedCompactor(SqliteCompactor(settings()), at_checkpoint=2)
    jobs.add(JOB_TYPE, path, start_data(path))
    worker = workers([gated])
    worker.start()
    assert gated.reached.wait(WAIT_S)
    stopper = threading.Thread(target=worker.stop)
    stopper.start()
    wait_until(lambda: worker.status() and worker.status()[0]["stopping"])
    gated.release.set()
    stopper.join(WAIT_S)
    assert not stopper.is_alive()
    assert jobs.get_job_state(JOB_TYPE, path) == "pending"
    assert jobs.get_job_data(JOB_TYPE, path) == start_data(path)
    assert stats["freelist_count"] > db_stats(path)["freelist_count"] > 0
    # the next worker picks it up and finishes the rest
    workers([SqliteCompactor(settings())]).start()
    assert finished(jobs, path)["result"] == "ok"
    assert db_stats(path)["freelist_count"] == 0 and integrity(path) == "ok"


def test_removed_job_is_cancelled_and_not_finished(tmp_path, jobs, workers) -> None:
    path = str(tmp_path / "inc.db")
    make_bloated_db(path, auto_vacuum="incremental")
    gated = GatedCompactor(SqliteCompactor(settings()), at_checkpoint=2)
    jobs.add(JOB_TYPE, path, start_data(path))
    worker = workers([gated], job_timeout_s=0.3)
    worker.start()
    assert gated.reached.wait(WAIT_S)
    jobs.remove(JOB_TYPE, path)
    wait_until(lambda: worker.status() and worker.status()[0]["stopping"])
    gated.release.set()
    wait_until(lambda: not worker.status())
    assert jobs.list_jobs(JOB_TYPE) == []
    assert integrity(path) == "ok"


def test_killed_worker_process_job_is_reenqueued_and_finished_by_another(tmp_path) -> None:
    store_path = str(tmp_path / "jobs.db")
    path = str(tmp_path / "inc.db")
    stats = make_bloated_db(path, auto_vacuum="incremental")
    store = open_store(f"sqlite:{store_path}")
    jobs = Jobs(store)
    marker = str(tmp_path / "stalled")
    proc = None
    worker = None
    try:
        jobs.set_type_timeout(JOB_TYPE, 1)
        jobs.add(JOB_TYPE, path, start_data(path))
        proc = subprocess.Popen([sys.executable, os.path.join(HERE, "worker_proc.py"), store_path, NODE, marker])
        wait_until(lambda: os.path.exists(marker))
        assert jobs.get_job_state(JOB_TYPE, path) == "running"
        proc.kill()
        proc.wait()
        worker = Worker(jobs, store, JOB_TYPE, [SqliteCompactor(settings())], node=NODE, job_timeout_s=1, accept_timeout_s=0.1)
        worker.start()
        data = finished(jobs, path)
        assert data["result"] == "ok"
        assert db_stats(path)["freelist_count"] == 0
        assert integrity(path) == "ok" and row_count(path) == stats["rows"]
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        if worker is not None:
            worker.stop(5)
        jobs.close()
        store.close()


def test_worker_process_runs_jobs_and_stops_cleanly_on_sigterm(tmp_path) -> None:
    store_path = str(tmp_path / "jobs.db")
    path = str(tmp_path / "a.db")
    make_bloated_db(path)
    code = (
        "import dataclasses, sys; from smoosh.config import Config; "
        "from smoosh.daemon.run.worker_process import run_worker_process; "
        f"config = dataclasses.replace(Config.default(), node={NODE!r}, job_timeout_s=2.0, "
        f"store={'sqlite:' + store_path!r}, watch=(), roots=({str(tmp_path)!r},)); "
        "sys.exit(run_worker_process(config, None, 2))"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    store = open_store(f"sqlite:{store_path}")
    jobs = Jobs(store)
    try:
        wait_until(lambda: jobs.get_type_timeout(JOB_TYPE) == 2.0)
        jobs.add(JOB_TYPE, path, start_data(path))
        assert finished(jobs, path)["result"] == "ok"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(HANG_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        jobs.close()
        store.close()


def test_a_worker_process_paces_as_the_daemon_writes_and_goes_back_to_its_default_when_that_gets_old(
    tmp_path, jobs, store, workers
) -> None:
    # The backlog controller runs in the daemon; its pace reaches `smoosh worker` through the
    # store. Given a worker process mid-compaction, pacing as a daemon wrote
    path = str(tmp_path / "inc.db")
    make_bloated_db(path, auto_vacuum="incremental")
    gated = GatedCompactor(SqliteCompactor(settings()), at_checkpoint=2)
    budget = IoBudget(None)
    clock = FakeClock()
    jobs.add(JOB_TYPE, path, start_data(path))
    worker = workers([gated], hold_poll_s=0.02, io_budget=budget, clock=clock)
    worker.start()
    assert gated.reached.wait(WAIT_S)
    assert budget.chunk_gap_factor != 64.0
    store.transact(lambda tr: control.put_pace(tr, NODE, 64.0, clock()))
    wait_until(lambda: budget.chunk_gap_factor == 64.0)
    # When the daemon writes no more (killed) and its last pace grows older than the bound
    clock.advance(control.PACE_MAX_AGE_S + 1)
    # Then the worker paces as it would with no daemon at all, not as the dead one said
    wait_until(lambda: budget.chunk_gap_factor == DEFAULT_CHUNK_GAP_FACTOR)
    gated.release.set()
    assert finished(jobs, path)["result"] == "ok"


def test_the_pace_read_with_the_holds_is_the_nodes_own_and_a_number(store) -> None:
    now = FakeClock.START
    assert control.read_signals(store, NODE, CHANNEL, "/k.db", now=now) == (False, None, None)  # none written yet
    store.transact(lambda tr: control.put_pace(tr, "another node", 2.0, now))
    assert control.read_signals(store, NODE, CHANNEL, "/k.db", now=now)[2] is None
    store.transact(lambda tr: control.put_pace(tr, NODE, 8.5, now))
    assert control.read_signals(store, NODE, CHANNEL, "/k.db", now=now)[2] == 8.5
    for raw in (b"nonsense", b"-4", b"inf", b"\xff", b"-4 1700000000.0", b"nan 1700000000.0", b"8.5 inf",
                b"8.5 nonsense", b"8.5 1700000000.0 1", b"8.5  1700000000.0"):
        store.transact(lambda tr, raw=raw: tr.set(control.pace_key(NODE), raw))
        assert control.read_signals(store, NODE, CHANNEL, "/k.db", now=now)[2] is None, raw


def test_a_pace_counts_only_while_its_wall_time_is_within_the_bound_of_the_readers(store) -> None:
    written = FakeClock.START
    store.transact(lambda tr: control.put_pace(tr, NODE, 8.5, written))

    def pace_at(now: float) -> float | None:
        return control.read_signals(store, NODE, CHANNEL, "/k.db", now=now)[2]

    # Fresh, and still so at the bound: a live daemon writes one every status interval
    assert pace_at(written) == 8.5
    assert pace_at(written + control.STATUS_INTERVAL_S) == 8.5
    assert pace_at(written + control.PACE_MAX_AGE_S) == 8.5
    # Older than the bound: the daemon stopped writing (killed, or cut off from the store)
    assert pace_at(written + control.PACE_MAX_AGE_S + 0.001) is None
    assert pace_at(written + 86_400) is None
    # From the future within the bound (clock skew between hosts), and beyond it (a clock stepped back)
    assert pace_at(written - control.PACE_MAX_AGE_S) == 8.5
    assert pace_at(written - control.PACE_MAX_AGE_S - 0.001) is None
    assert pace_at(written - 86_400) is None


def test_a_pace_in_the_format_without_its_wall_time_counts_as_none(store) -> None:
    # What a daemon from before the stamp wrote: its age cannot be told, so the worker keeps its default
    store.transact(lambda tr: tr.set(control.pace_key(NODE), repr(8.5).encode("ascii")))
    assert control.read_signals(store, NODE, CHANNEL, "/k.db", now=FakeClock.START)[2] is None
