"""One owner per key across restarts, as an operator meets it: real `smoosh run` processes,
real files, SIGTERM and kill -9, a second daemon on the same state_dir, a database written
without pause (DESIGN §5.1 "One owner per key", §10)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from compactor.dbfactory import db_stats, integrity, make_bloated_db, row_count
from faults.faultlib import processes, start_daemon, start_worker
from helpers.chunked import STALLED_AFTER_FIRST_CHUNK, chunk_section, chunked_db
from helpers.daemon import HANG_S, Daemon, free_port, wait_for, write_config
from smoosh.daemon.control.instance_lock import InstanceLock

__all__ = ["processes"]  # fixture

NODE_TYPE = "smoosh:testnode"
BUSY_WRITER = str(Path(__file__).parent.parent / "helpers" / "busy_writer.py")
#: A worker process whose compaction stops at its second chunk boundary until a file appears.
GATED_WORKER = str(Path(__file__).parent.parent / "compactor" / "worker_proc.py")


# ---------------------------------------------------------------- reading what the daemon left


def store_jobs(config: Path) -> dict[str, tuple[str, dict[str, Any]]]:
    """Every job of the node in the job store, read from the store itself: ``{key: (state, data)}``."""
    from smoosh.jobs import Jobs
    from smoosh.store import open_store

    with open_store(f"sqlite:{config.parent / 'state' / 'jobs.db'}") as store:
        jobs = Jobs(store, monitors=False)
        try:
            return {str(job_id): (state, data) for _type, job_id, state, data in jobs.list_jobs(NODE_TYPE)}
        finally:
            jobs.close()


def mid_compaction(config: Path, key: Path, below: float = 0.8) -> bool:
    """Whether the key's job runs and its last heartbeat reported progress in (0, ``below``)."""
    state, data = store_jobs(config).get(str(key), (None, {}))
    progress = float(data.get("progress") or 0.0)
    return state == "running" and 0 < progress < below


def job(d: Daemon, key: Path) -> dict[str, Any]:
    return {j["key"]: j for j in d.get("/jobs")["jobs"]}.get(str(key), {})


def channel(d: Daemon, name: str = "ratio_dbs") -> dict[str, Any]:
    return d.get("/status")["channels"][name]


def active(d: Daemon) -> dict[str, Any] | None:
    """ratio_dbs's status once it counts a run active, else None."""
    status = channel(d)
    return status if status["active"] == 1 else None


# ---------------------------------------------------------------- 1, 2: stopped mid-compaction


def paused_restart_holds_the_key_then_resume_finishes_it(
    daemons: list[Daemon], tmp_path: Path, port: int, db: Path, made: dict[str, Any]
) -> None:
    """Then (shared by the SIGTERM and kill -9 tests): restarted with its channels paused, the
    daemon holds the key at the top of its channel and runs nothing; resumed, it compacts it.

    The restarted daemon watches nothing (``roots`` only): its start-up scan would re-price the
    key and move it down from infinity, a bug of its own
    (tests/server/test_ownership.py::test_a_key_taken_back_at_infinity_stays_at_the_top_when_the_scan_finds_it).
    """
    rows = made["rows"]
    assert integrity(str(db)) == "ok"
    assert row_count(str(db)) == rows
    at_stop = db_stats(str(db))
    assert 0 < at_stop["freelist_count"] < made["freelist_count"]  # stopped in its middle
    # The same chunks, and no I/O budget: nothing stalls the compaction once resumed.
    paused = write_config(tmp_path, port=port, channels=chunk_section(made),
                          extra_global=f"wait_secs = 3600\nwatch =\nroots = {tmp_path / 'dbs'}")
    d2 = start_daemon(daemons, paused)

    status = channel(d2)
    assert (status["paused"], status["active"], status["starting"]) == (True, 0, 0)
    assert status["waiting"]["size"] == 1
    assert status["waiting"]["max"] == "infinity"
    assert str(db) not in store_jobs(paused)  # one owner: the channel, not a job
    assert job(d2, db).get("state") != "running"
    time.sleep(1.0)  # the only sleep: nothing may happen while the channel is paused
    assert db_stats(str(db)) == at_stop
    assert channel(d2)["active"] == 0
    assert str(db) not in store_jobs(paused)

    code, _ = d2.post("/resume", {"channel": "ratio_dbs"})
    assert code == 200
    wait_for(lambda: job(d2, db).get("state") == "finished", HANG_S, what="the compaction after resume", daemon=d2)
    after = db_stats(str(db))
    assert after["freelist_count"] == 0
    assert after["file_bytes"] < at_stop["file_bytes"]
    assert integrity(str(db)) == "ok"
    assert row_count(str(db)) == rows
    wait_for(lambda: str(db) not in store_jobs(paused), HANG_S, what="the finished job to leave the store", daemon=d2)
    assert d2.stop() == 0


def compaction_under_way(tmp_path: Path, daemons: list[Daemon]) -> tuple[int, Path, Path, dict[str, Any], Daemon]:
    """A daemon stalled after the first chunk of an incremental compaction (helpers.chunked):
    ``(port, config, db, the database as made, daemon)``."""
    port = free_port()
    db = tmp_path / "dbs" / "big.db"
    db.parent.mkdir()
    made = chunked_db(db)
    config = write_config(tmp_path, port=port, channels=chunk_section(made), extra_global=STALLED_AFTER_FIRST_CHUNK)
    d = start_daemon(daemons, config)
    wait_for(lambda: mid_compaction(config, db), HANG_S, what="the compaction to be under way", daemon=d)
    return port, config, db, made, d


def test_sigterm_mid_compaction_hands_the_key_back_to_its_channel_at_the_top(
    tmp_path: Path, daemons: list[Daemon]
) -> None:
    # Given an incremental compaction under way
    port, config, db, made, d1 = compaction_under_way(tmp_path, daemons)
    # When the daemon is stopped cleanly
    assert d1.stop() == 0
    # Then its job no longer runs (a pending job may be left behind: a bug of the clean stop,
    # test_ownership.py::test_a_clean_stop_leaves_no_job_of_an_interrupted_key_in_the_store) ...
    assert store_jobs(config).get(str(db), ("none",))[0] != "running"
    paused_restart_holds_the_key_then_resume_finishes_it(daemons, tmp_path, port, db, made)


def test_kill_9_mid_compaction_leaves_a_job_the_restart_takes_back_into_its_channel(
    tmp_path: Path, daemons: list[Daemon]
) -> None:
    # Given an incremental compaction under way
    port, config, db, made, d1 = compaction_under_way(tmp_path, daemons)
    # When the daemon is killed with SIGKILL
    d1.kill()
    # Then its job is left running in the store, run by the daemon's own worker ...
    state, data = store_jobs(config)[str(db)]
    assert state == "running"
    assert data["worker"] == "daemon"
    # ... which the restart takes back into the channel before any worker runs
    paused_restart_holds_the_key_then_resume_finishes_it(daemons, tmp_path, port, db, made)


# ---------------------------------------------------------------- 3: a job a worker process runs


def test_a_restarted_daemon_follows_the_job_a_worker_process_is_running(
    tmp_path: Path, daemons: list[Daemon], processes: list[subprocess.Popen]
) -> None:
    # Given a job a separate worker process is running, stopped at its second chunk boundary
    # until the test lets it go (the daemon runs no worker of its own)
    db = tmp_path / "dbs" / "big.db"
    db.parent.mkdir()
    rows = chunked_db(db)["rows"]
    config = write_config(tmp_path, port=free_port())
    d1 = start_daemon(daemons, config, "--workers", "0")
    marker, release = tmp_path / "stalled", tmp_path / "release"
    processes.append(subprocess.Popen([sys.executable, GATED_WORKER, str(tmp_path / "state" / "jobs.db"), "testnode",
                                       str(marker), str(release)]))
    wait_for(marker.exists, HANG_S, what="the worker to stop at its gate", daemon=d1)
    wait_for(lambda: mid_compaction(config, db, below=1.0), HANG_S, what="the worker's progress in the store", daemon=d1)
    # When the daemon restarts meanwhile
    assert d1.stop() == 0
    assert store_jobs(config)[str(db)][0] == "running"  # the worker went on
    d2 = start_daemon(daemons, config, "--workers", "0")
    # Then the restarted daemon follows it: counted active in its channel, not queued again
    status = wait_for(lambda: active(d2), HANG_S, what="the job counted active", daemon=d2)
    assert (status["starting"], status["waiting"]["size"]) == (0, 0)
    assert store_jobs(config)[str(db)][0] == "running"
    # ... and records its end when the worker finishes it
    release.touch()
    wait_for(lambda: job(d2, db).get("state") == "finished", HANG_S, what="the followed job's end", daemon=d2)
    assert job(d2, db)["history"][0]["event"] == "finished"
    wait_for(lambda: str(db) not in store_jobs(config), HANG_S, what="the finished job to leave the store", daemon=d2)
    assert channel(d2)["active"] == 0
    assert integrity(str(db)) == "ok"
    assert row_count(str(db)) == rows


# ---------------------------------------------------------------- 4: one daemon per state_dir


def run_second_daemon(config: Path) -> subprocess.CompletedProcess[str]:
    """`smoosh run` as an operator starts it (default log level), run to its exit.

    One that waited for what holds the state_dir or the port would not exit while the holder
    lives: the ceiling (HANG_S) fails it, and no time is asserted.
    """
    env = {k: v for k, v in os.environ.items() if k != "SMOOSH_LOG_LEVEL"}
    return subprocess.run([sys.executable, "-m", "smoosh", "run", "--config", str(config)],
                          capture_output=True, text=True, timeout=HANG_S, env=env, cwd=str(config.parent), check=False)


def test_a_second_daemon_on_the_same_state_dir_exits_at_once_naming_the_holder(
    tmp_path: Path, daemons: list[Daemon]
) -> None:
    config = write_config(tmp_path, port=free_port())
    first = start_daemon(daemons, config)
    out = run_second_daemon(config)
    assert out.returncode == 1
    lock = tmp_path / "state" / "smoosh.lock"
    expected = f"smoosh: another smoosh is running on this state_dir: {lock} is locked by pid {first.proc.pid}"
    assert expected in out.stderr.splitlines()
    assert "Traceback" not in out.stderr
    assert first.proc.poll() is None
    assert first.get("/status")["node"] == "testnode"
    assert first.stop() == 0


def test_a_second_daemon_prints_exactly_one_line(tmp_path: Path, daemons: list[Daemon]) -> None:
    config = write_config(tmp_path, port=free_port())
    first = start_daemon(daemons, config)
    out = run_second_daemon(config)
    lock = tmp_path / "state" / "smoosh.lock"
    assert out.stderr.splitlines() == [
        f"smoosh: another smoosh is running on this state_dir: {lock} is locked by pid {first.proc.pid}"
    ]
    assert out.stdout == ""


def test_a_taken_admin_port_is_one_line_naming_the_address(tmp_path: Path) -> None:
    # Given something else listening on the port the config names
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = write_config(tmp_path, port=port)
        # When smoosh runs on it
        out = run_second_daemon(config)
    # Then it says so in one line, before starting anything, and leaves its state_dir free
    assert out.returncode == 1
    assert out.stderr.splitlines() == [f"smoosh: cannot listen on 127.0.0.1:{port} for the admin API: Address already in use"]
    lock = InstanceLock(str(tmp_path / "state"))
    lock.acquire()
    lock.release()


# ---------------------------------------------------------------- 5: a database never quiet


def test_a_database_committed_to_every_5_ms_is_still_compacted(
    tmp_path: Path, daemons: list[Daemon], processes: list[subprocess.Popen]
) -> None:
    # Given a daemon whose debounce waits at most recheck_interval for a key under a steady
    # stream of events, and a bloated database an application commits to every ~5 ms
    d = start_daemon(daemons, write_config(tmp_path, port=free_port(), extra_global="recheck_interval = 2s"))
    db = tmp_path / "dbs" / "busy.db"
    built = tmp_path / "busy.db"
    stats = make_bloated_db(str(built), rows=2000, delete_fraction=0.8)  # full VACUUM: auto_vacuum none
    os.rename(built, db)
    writer = subprocess.Popen([sys.executable, BUSY_WRITER, str(db), "0.005", "5"],
                              stdout=subprocess.PIPE, text=True)
    processes.append(writer)
    assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
    # Then it is examined within recheck_interval of its first event and compacted
    wait_for(lambda: job(d, db).get("state") == "finished", HANG_S, what="the compaction of the busy database", daemon=d)
    history = job(d, db)["history"]
    assert history[0]["event"] == "finished" and history[0]["reason"].startswith("reclaimed ")
    # (the new database came out of its -wal while the application wrote: the bytes are back)
    assert int(history[0]["reason"].split()[1]) > stats["file_bytes"] / 2
    metrics = urllib.request.urlopen(d.url + "/metrics", timeout=10).read().decode()
    assert re.search(r'smoosh_compactions_total\{channel="ratio_dbs",result="ok"\} 1(\.0)?\b', metrics), metrics
    # ... and the application, which goes on writing for a second after it, never noticed
    time.sleep(1.0)
    writer.send_signal(signal.SIGTERM)
    report = json.loads(writer.communicate(timeout=10)[0].strip().splitlines()[-1])
    assert report["errors"] == []
    assert report["commits"] > 20  # it really was writing (about 200 commits a second when idle)
    assert db.stat().st_size < stats["file_bytes"] / 2
    assert integrity(str(db)) == "ok"


# ---------------------------------------------------------------- 11: one address parser


def test_http_localhost_port_0_is_accepted_by_the_check_and_served_by_run(tmp_path: Path) -> None:
    config = write_config(tmp_path, port=free_port())
    config.write_text(re.sub(r"(?m)^http = .*$", "http = LOCALHOST:0", config.read_text()))
    check = subprocess.run([sys.executable, "-m", "smoosh", "config", "check", "--config", str(config)],
                           capture_output=True, text=True, timeout=30, check=False)
    assert check.returncode == 0, check.stderr
    log_path = tmp_path / "run.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "smoosh", "run", "--config", str(config)],
                                stdout=log, stderr=subprocess.STDOUT, cwd=str(tmp_path))
    try:
        def serving() -> str | None:
            assert proc.poll() is None, f"smoosh run exited with {proc.returncode}:\n{log_path.read_text()}"
            m = re.search(r"admin API on (http://\S+)", log_path.read_text())
            return m.group(1) if m else None

        url = wait_for(serving, HANG_S, what="the admin API")
        assert re.fullmatch(r"http://127\.0\.0\.1:[1-9][0-9]*", url)  # an ephemeral port on loopback
        with urllib.request.urlopen(url + "/status", timeout=10) as r:
            assert json.loads(r.read())["node"] == "testnode"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(HANG_S) == 0
