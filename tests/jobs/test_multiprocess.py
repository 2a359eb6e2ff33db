"""Several real worker processes on one SQLite store file: every job runs exactly once, and a
worker killed with SIGKILL mid-job has its job re-enqueued after the type timeout and
finished by another process."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from smoosh.jobs import Jobs
from smoosh.store import open_store
from helpers.daemon import HANG_S

WORKER = str(Path(__file__).with_name("mp_worker.py"))
#: Bound on every wait for a subprocess (seconds).
PROCESS_WAIT_S = HANG_S  # a ceiling on a hang, never a measure of speed


def start_worker(db: Path, job_type: str, out_dir: Path, mode: str, accept_timeout_s: float, max_jobs: int = 0) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, WORKER, str(db), job_type, str(out_dir), mode, str(accept_timeout_s), str(max_jobs)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def finish_worker(proc: subprocess.Popen[bytes]) -> None:
    try:
        _, err = proc.communicate(timeout=PROCESS_WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("worker did not finish in time")
    assert proc.returncode == 0, err.decode(errors="replace")


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "jobs.db"


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    d = tmp_path / "out"
    d.mkdir()
    return d


def test_workers_in_several_processes_run_every_job_exactly_once(db: Path, out_dir: Path) -> None:
    store = open_store(f"sqlite:{db}")
    jobs = Jobs(store, monitors=False)
    try:
        jobs.set_type_timeout("mp", 30)
        ids = [f"job{i:03}" for i in range(30)]
        workers = [start_worker(db, "mp", out_dir, "drain", 2.0) for _ in range(3)]
        for job_id in ids:
            jobs.add("mp", job_id, {"n": job_id})
        for proc in workers:
            finish_worker(proc)
        runs = collections.Counter()
        for log in out_dir.glob("*.log"):
            runs.update(log.read_text().split())
        assert runs == collections.Counter(ids)  # each job accepted exactly once
        states = {job_id: state for _, job_id, state, _ in jobs.list_jobs("mp")}
        assert states == {job_id: "finished" for job_id in ids}
        assert all(jobs.get_job_data("mp", job_id)["n"] == job_id for job_id in ids)
    finally:
        jobs.close()
        store.close()


def test_job_of_a_killed_worker_is_requeued_and_finished_elsewhere(db: Path, out_dir: Path) -> None:
    store = open_store(f"sqlite:{db}")
    jobs = Jobs(store, monitors=False)
    hung = None
    try:
        jobs.set_type_timeout("mp", 1)
        jobs.add("mp", "victim", {"n": 1})
        hung = start_worker(db, "mp", out_dir, "hang", 10.0)
        marker = out_dir / f"hang.{hung.pid}"
        deadline = time.monotonic() + PROCESS_WAIT_S
        while not marker.exists():
            assert time.monotonic() < deadline, "the worker never accepted the job"
            assert hung.poll() is None, hung.communicate()[1].decode(errors="replace")
            time.sleep(0.02)
        assert marker.read_text() == "victim"
        assert jobs.get_job_state("mp", "victim") == "running"
        os.kill(hung.pid, signal.SIGKILL)  # mid-job: after accept, before finish
        hung.wait(PROCESS_WAIT_S)

        rescuer = start_worker(db, "mp", out_dir, "drain", 8.0, max_jobs=1)
        finish_worker(rescuer)
        info = jobs.get_job("mp", "victim")
        assert info.state == "finished"
        assert info.data == {"n": 1, "by": rescuer.pid}
    finally:
        if hung is not None and hung.poll() is None:
            hung.kill()
            hung.wait()
        jobs.close()
        store.close()
