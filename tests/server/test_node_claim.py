"""One live daemon per node name on a store, and a take-over at start that removes only what is
provably dead (issue 25, DESIGN §10): servers started in process on a store that already holds
a node's status record and a running job, as another daemon or a worker left them."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from helpers.clocks import FakeClock
from helpers.daemon import wait_for
from server.test_server import make_config
from smoosh import Server
from smoosh.daemon.control import control
from smoosh.daemon.control.node_claim import Identity, NodeInUse, provably_dead, running_here
from smoosh.daemon.record.status import STALE_AFTER_S, put_node_status, read_node_record
from smoosh.jobs import Jobs
from smoosh.store import open_store
from smoosh.store.base import Store

NODE = "t"
JOB_TYPE = f"smoosh:{NODE}"
RATIO = "ratio_dbs"
STARTUP_LOGGER = "smoosh.daemon.run.startup"


@pytest.fixture
def store() -> Iterator[Store]:
    st = open_store("memory:")
    yield st
    st.close()


def a_dead_pid() -> int:
    """The PID of a process that has ended (the kernel hands PIDs out in order: not soon again)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(30)
    return child.pid


def other_daemon(*, pid: int, state_dir: str = "/srv/elsewhere/state") -> Identity:
    """Another daemon's identity on this machine (its own instance and state_dir)."""
    return dataclasses.replace(Identity.of_this_process(), pid=pid, state_dir=state_dir, started=None, since=None)


def write_record(store: Store, who: Identity, at: float, *, stopped: bool = False) -> None:
    def body(tr: Any) -> None:
        put_node_status(tr, NODE, {"channels": {}, "reclaimable_bytes": 0}, at, process=who)

    store.transact(body)
    if stopped:
        from smoosh.daemon.record.status import mark_stopped

        mark_stopped(store, NODE, who, timeout_s=5)


def running_job(store: Store, key: str, clock: FakeClock, **fields: Any) -> None:
    """A job of ``key`` accepted by some worker, whose heartbeat wrote ``fields`` into its data."""
    jobs = Jobs(store, monitors=False, clock=clock)
    try:
        jobs.set_type_timeout(JOB_TYPE, 30)
        jobs.add(JOB_TYPE, key, {"channel": RATIO, "key": key, "priority": 2.0, "progress": 0.0, "run": 4242})
        job, data = jobs.accept(JOB_TYPE, timeout=5)
        jobs.update(job, {**data, "progress": 0.3, **fields})
    finally:
        jobs.close()


def job_state(store: Store, key: str) -> str | None:
    jobs = Jobs(store, monitors=False)
    try:
        found = {str(job_id): state for _t, job_id, state, _d in jobs.list_jobs(JOB_TYPE)}
    finally:
        jobs.close()
    return found.get(key)


def start(tmp_path: Path, store: Store, clock: FakeClock) -> Server:
    """A server of node t, its channels paused at start (what it took back stays in sight)."""
    server = Server(make_config(tmp_path, extra="wait_secs = 3600"), store=store, workers=0, clock=clock,
                    watch_config=False)
    server.start()
    return server


# ---------------------------------------------------------------- the take-over at start


def test_a_running_job_a_live_worker_heartbeats_survives_a_daemon_start(
    tmp_path: Path, store: Store, dbs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a job another daemon's in-process worker runs, its heartbeat a second old
    clock = FakeClock()
    key = str(dbs / "x.db")
    running_job(store, key, clock, worker="daemon", holder="a-live-daemon", heartbeat_at=clock() - 1)
    caplog.set_level(logging.INFO, logger=STARTUP_LOGGER)
    # When this node's daemon starts
    server = start(tmp_path, store, clock)
    try:
        # Then the job is followed, not removed: it runs on, and its channel counts it active
        # (once the job's state, read on the scheduler's thread, reaches the server's loop)
        assert job_state(store, key) == "running"
        wait_for(lambda: server.status()["channels"][RATIO]["active"] == 1, 10, what="the job counted active")
        assert server.channels()[RATIO].waiting() == []
        assert f"following {key!r}, which a worker elsewhere is compacting for channel {RATIO}" in caplog.messages
    finally:
        server.stop()


@pytest.mark.parametrize("fields", [
    pytest.param({"worker": "daemon", "heartbeat_at": FakeClock.START - 31}, id="heartbeat-expired"),
    pytest.param({"worker": "process", "heartbeat_at": FakeClock.START - 31}, id="worker-heartbeat-expired"),
    pytest.param({}, id="never-heartbeated-nor-named"),
])
def test_a_running_job_whose_holder_is_provably_dead_is_taken_back(
    tmp_path: Path, store: Store, dbs: Path, fields: dict[str, Any]
) -> None:
    clock = FakeClock()
    key = str(dbs / "x.db")
    running_job(store, key, clock, **fields)
    server = start(tmp_path, store, clock)
    try:
        assert job_state(store, key) is None
        assert server.channels()[RATIO].waiting() == [(key, math.inf)]
    finally:
        server.stop()


def test_the_jobs_of_the_previous_daemon_found_dead_are_taken_back_though_their_heartbeat_is_fresh(
    tmp_path: Path, store: Store, dbs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Given the record of this node's previous daemon, a second old, whose process is gone
    # (a kill -9), and the job it was running, heartbeated a second ago
    clock = FakeClock()
    dead = other_daemon(pid=a_dead_pid())
    write_record(store, dead, clock() - 1)
    key = str(dbs / "x.db")
    running_job(store, key, clock, worker="daemon", holder=dead.instance, heartbeat_at=clock() - 1)
    caplog.set_level(logging.INFO)
    # When the node starts again
    server = start(tmp_path, store, clock)
    try:
        # Then it says whose jobs it takes back and why, and takes the job back at the top
        assert (f"node {NODE!r} was last served by host {dead.host}, pid {dead.pid}, which is gone "
                f"(its process {dead.pid} is gone): its running jobs are taken back") in caplog.messages
        assert job_state(store, key) is None
        assert server.channels()[RATIO].waiting() == [(key, math.inf)]
        # ... and the record names this daemon now
        record = read_node_record(store.create_transaction(), NODE)
        assert record is not None and record["process"]["pid"] == os.getpid()
    finally:
        server.stop()
    record = read_node_record(store.create_transaction(), NODE)
    assert record is not None and record["stopped"] is True


def a_live_process_here() -> Identity:
    """This test's parent process, as another daemon on this host would name itself: its real start time."""
    from smoosh.daemon.control.node_claim import _start_ticks

    ticks = _start_ticks(os.getppid())
    if ticks is None:
        pytest.skip("needs /proc to tell a process's start time")
    return dataclasses.replace(Identity.of_this_process(), pid=os.getppid(), instance="parent",
                               state_dir="/srv/parent/state", started=ticks)


@pytest.mark.parametrize(("who", "heartbeat_age_s", "taken_back"), [
    pytest.param("alive-here", 31 + 3600, False, id="alive-here-heartbeat-an-hour-late"),
    pytest.param("dead-here", 1, True, id="gone-here-heartbeat-fresh"),
    pytest.param("recycled-here", 1, True, id="pid-recycled-here-heartbeat-fresh"),
    pytest.param("other-host", 31, True, id="other-host-heartbeat-expired"),
    pytest.param("other-host", 1, False, id="other-host-heartbeat-fresh"),
])
def test_a_running_jobs_holder_on_this_host_is_judged_by_its_process_not_its_heartbeat(
    tmp_path: Path, store: Store, dbs: Path, who: str, heartbeat_age_s: float, taken_back: bool
) -> None:
    # Given a job whose holder names its host, PID and start time (a smoosh worker's, or a
    # daemon's in-process worker's), and a heartbeat of the given age
    clock = FakeClock()
    holder = a_live_process_here()
    if who == "dead-here":
        holder = dataclasses.replace(holder, pid=a_dead_pid())
    elif who == "recycled-here":
        holder = dataclasses.replace(holder, started=holder.started + 1)  # type: ignore[operator]
    elif who == "other-host":
        holder = dataclasses.replace(holder, host="another-host", machine="another-boot")
    key = str(dbs / "x.db")
    running_job(store, key, clock, worker="process", holder=holder.holder, heartbeat_at=clock() - heartbeat_age_s)
    # When this node's daemon starts
    server = start(tmp_path, store, clock)
    try:
        # Then on this host the process decides (stopped is not dead; gone or recycled is), and
        # across hosts the heartbeat does
        if taken_back:
            assert job_state(store, key) is None
            assert server.channels()[RATIO].waiting() == [(key, math.inf)]
        else:
            assert job_state(store, key) == "running"
            assert server.channels()[RATIO].waiting() == []
    finally:
        server.stop()


def test_a_daemon_refuses_a_node_whose_daemon_is_alive_on_this_host_however_late_its_record(
    tmp_path: Path, store: Store
) -> None:
    # Given the record of node t written by a daemon that lives on this host (this test's parent
    # stands for it) but stopped writing an hour ago: SIGSTOP, a debugger, a frozen cgroup
    clock = FakeClock()
    stopped = dataclasses.replace(a_live_process_here(), since=clock() - 7200)
    write_record(store, stopped, clock() - 3600)
    server = Server(make_config(tmp_path), store=store, workers=0, clock=clock, watch_config=False)
    # When a daemon of node t starts, Then it refuses, naming it, its start and its late heartbeat
    with pytest.raises(NodeInUse) as refused:
        server.start()
    from smoosh.daemon.intake.verdicts import utc_text

    assert str(refused.value) == (
        f"another smoosh is running as node {NODE!r} on this store (host {stopped.host}, pid {stopped.pid}, "
        f"since {utc_text(clock() - 7200)}, last heartbeat 3600 s ago: late, but its process is alive on this host "
        "(stopped or stalled, not dead), so it is not taken over); give each daemon its own node name "
        "([smoosh] node in its config)"
    )
    assert refused.value.late and refused.value.pid == stopped.pid
    record = read_node_record(store.create_transaction(), NODE)
    assert record is not None and record["process"]["instance"] == stopped.instance


def test_a_holders_name_carries_its_host_pid_and_start_and_reads_back() -> None:
    ours = Identity.of_this_process("/srv/a/state")
    back = Identity.from_holder(ours.holder)
    assert back is not None
    assert (back.instance, back.host, back.pid, back.started, back.machine) == (
        ours.instance, ours.host, ours.pid, ours.started, ours.machine)
    unknown = dataclasses.replace(ours, started=None, machine=None)
    assert Identity.from_holder(unknown.holder) == dataclasses.replace(unknown, state_dir=None, since=None)
    # An older smoosh's bare instance id, or anything else, says nothing of a process
    for text in ("0123456789abcdef", "worker-0123", "a/b/c/d", "i/h/not-a-pid/1/m", None, 42):
        assert Identity.from_holder(text) is None


# ---------------------------------------------------------------- one live daemon per node


def test_a_daemon_refuses_to_start_while_another_live_process_serves_its_node(
    tmp_path: Path, store: Store, dbs: Path
) -> None:
    # Given a fresh record of node t written by a live daemon of another process on this host
    # (this test's parent process stands for it), and the job that daemon runs
    clock = FakeClock()
    live = other_daemon(pid=os.getppid())
    write_record(store, live, clock() - 2)
    key = str(dbs / "x.db")
    running_job(store, key, clock, worker="daemon", holder=live.instance, heartbeat_at=clock() - 1)
    server = Server(make_config(tmp_path), store=store, workers=0, clock=clock, watch_config=False)
    # When a daemon of node t starts on the same store, Then it refuses, naming the other one
    with pytest.raises(NodeInUse) as refused:
        server.start()
    assert str(refused.value) == (
        f"another smoosh is running as node {NODE!r} on this store (host {live.host}, pid {live.pid}, "
        f"since an unknown time, last heartbeat 2 s ago); give each daemon its own node name ([smoosh] node in its config)"
    )
    # ... having taken nothing: the job runs on, the record is the other's, the state_dir is free
    assert job_state(store, key) == "running"
    record = read_node_record(store.create_transaction(), NODE)
    assert record is not None and record["process"]["instance"] == live.instance
    again = start(tmp_path, open_store("memory:"), clock)  # the state_dir's lock was given back
    again.stop()


@pytest.mark.parametrize(("how", "age_s"), [("stopped", 1.0), ("stale", STALE_AFTER_S + 1)])
def test_a_record_of_a_daemon_that_stopped_or_went_silent_does_not_hold_the_node(
    tmp_path: Path, store: Store, how: str, age_s: float
) -> None:
    clock = FakeClock()
    gone = dataclasses.replace(other_daemon(pid=os.getppid()), host="another-host")
    write_record(store, gone, clock() - age_s, stopped=how == "stopped")
    server = start(tmp_path, store, clock)
    server.stop()


# ---------------------------------------------------------------- who is provably dead


def test_stopped_is_not_dead_on_this_host_and_across_hosts_the_heartbeat_decides() -> None:
    ours = Identity.of_this_process("/srv/a/state")
    alive_here = a_live_process_here()
    late = {"age_s": STALE_AFTER_S * 100, "stale_after_s": STALE_AFTER_S, "stopped": False}
    # This host: a process still there with the start time its record names lives, however late
    assert provably_dead(alive_here, ours, **late) is None
    # ... its PID gone, or another process's now, is dead at once, however fresh its record
    fresh = {"age_s": 1.0, "stale_after_s": STALE_AFTER_S, "stopped": False}
    gone = dataclasses.replace(alive_here, pid=a_dead_pid())
    assert provably_dead(gone, ours, **fresh) == f"its process {gone.pid} is gone"
    # Another machine (another boot, or another host): only the heartbeat can tell
    rebooted = dataclasses.replace(alive_here, machine="another-boot/pid:[1]")
    assert provably_dead(rebooted, ours, **late) == f"its status record is {STALE_AFTER_S * 100:.0f} s old"
    assert provably_dead(rebooted, ours, **fresh) is None


def test_provably_dead_tells_a_live_daemon_from_a_dead_one() -> None:
    ours = Identity.of_this_process("/srv/a/state")
    alive_elsewhere = dataclasses.replace(ours, host="other-host", instance="x", machine="m2")
    fresh = {"age_s": 1.0, "stale_after_s": STALE_AFTER_S, "stopped": False}
    # Another host, a fresh record: nothing here can prove it dead.
    assert provably_dead(alive_elsewhere, ours, **fresh) is None
    assert provably_dead(alive_elsewhere, ours, age_s=STALE_AFTER_S + 1, stale_after_s=STALE_AFTER_S,
                         stopped=False) == f"its status record is {STALE_AFTER_S + 1:.0f} s old"
    assert provably_dead(alive_elsewhere, ours, age_s=1.0, stale_after_s=STALE_AFTER_S,
                         stopped=True) == "it stopped cleanly"
    # This machine: a live PID that started when the record says is alive; a recycled one is not.
    parent = dataclasses.replace(ours, pid=os.getppid(), instance="p", state_dir="/srv/b/state", started=None)
    assert provably_dead(parent, ours, **fresh) is None
    from smoosh.daemon.control.node_claim import _start_ticks

    ticks = _start_ticks(os.getppid())
    if ticks is not None:
        assert provably_dead(dataclasses.replace(parent, started=ticks), ours, **fresh) is None
        assert provably_dead(dataclasses.replace(parent, started=ticks + 1), ours, **fresh) == (
            f"its PID {os.getppid()} belongs to another process now")
    # This process under another instance: alive only while a server of this process runs as it.
    earlier = dataclasses.replace(ours, instance="earlier", state_dir="/srv/c/state")
    assert provably_dead(earlier, ours, **fresh) == "it was an earlier start of this process"
    running_here.add("earlier")
    try:
        assert provably_dead(earlier, ours, **fresh) is None
    finally:
        running_here.discard("earlier")
    # The same state_dir on this machine: its lock, which this daemon holds, proves it.
    assert provably_dead(dataclasses.replace(parent, state_dir=ours.state_dir), ours, **fresh) == (
        "it ran on this state_dir, whose lock this daemon holds")


def test_the_daemon_writes_its_pace_beside_its_status_record_for_its_worker_processes(
    tmp_path: Path, store: Store
) -> None:
    clock = FakeClock()
    server = start(tmp_path, store, clock)
    try:
        def pace(now: float) -> float | None:
            return control.read_signals(store, NODE, RATIO, "/k.db", now=now)[2]

        wait_for(lambda: pace(clock()) is not None, 30, what="the pace written")
        assert pace(clock()) == server.controller.last.chunk_gap_factor
        # Stamped with the daemon's wall time: read long after, it is a dead daemon's, not a pace
        assert pace(clock() + control.PACE_MAX_AGE_S + 1) is None
    finally:
        server.stop()


def test_a_daemon_that_stops_cleanly_takes_its_pace_out_of_the_store(tmp_path: Path, store: Store) -> None:
    # Given a daemon whose pace its worker processes read
    clock = FakeClock()
    server = start(tmp_path, store, clock)
    try:
        wait_for(lambda: store.transact(lambda tr: tr.get(control.pace_key(NODE))) is not None, 30,
                 what="the pace written")
    finally:
        # When it stops cleanly
        server.stop()
    # Then its pace is gone at once: the workers go back to their default at their next poll
    assert store.transact(lambda tr: tr.get(control.pace_key(NODE))) is None
