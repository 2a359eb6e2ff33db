"""One live daemon per ``node`` name on a shared store (issue 25, DESIGN §10): real `smoosh run`
processes, each on a state_dir of its own, sharing one ``sqlite:`` store under the same node.

Before: the second daemon started, took every running job of the node (the first daemon's
included) as left behind, and refused its database as outside its roots: the first's
database was recorded ``gone`` and never compacted.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from compactor.dbfactory import integrity, make_bloated_db
from helpers.daemon import Daemon, free_port, wait_for, write_config

NODE_TYPE = "smoosh:testnode"
#: One-page incremental chunks: a compaction slow enough to be caught in its middle.
ONE_PAGE_CHUNKS = "[smoosh.sqlite]\nincremental_chunk_pages = 1\n"


def config_in(base: Path, store: Path, *, channels: str = "") -> Path:
    """A daemon's config on ``base`` (its own watch directory and state_dir), on the shared ``store``."""
    base.mkdir(exist_ok=True)
    return write_config(base, port=free_port(), channels=channels, extra_global=f"store = sqlite:{store}")


def store_jobs(store: Path) -> dict[str, tuple[str, dict[str, Any]]]:
    """Every job of the node, read from the store itself: ``{key: (state, data)}``."""
    from smoosh.jobs import Jobs
    from smoosh.store import open_store

    with open_store(f"sqlite:{store}") as opened:
        jobs = Jobs(opened, monitors=False)
        try:
            return {str(job_id): (state, data) for _type, job_id, state, data in jobs.list_jobs(NODE_TYPE)}
        finally:
            jobs.close()


def job(d: Daemon, key: Path) -> dict[str, Any]:
    return {j["key"]: j for j in d.get("/jobs")["jobs"]}.get(str(key), {})


def run_daemon_to_its_end(config: Path) -> subprocess.CompletedProcess[str]:
    """`smoosh run` as an operator starts it (default log level); it must end by itself."""
    env = {k: v for k, v in os.environ.items() if k != "SMOOSH_LOG_LEVEL"}
    return subprocess.run([sys.executable, "-m", "smoosh", "run", "--config", str(config)],
                          capture_output=True, text=True, timeout=30, env=env, cwd=str(config.parent), check=False)


def test_a_second_daemon_of_the_same_node_refuses_to_start_and_the_first_keeps_its_job(
    tmp_path: Path, daemons: list[Daemon]
) -> None:
    # Given a daemon of node testnode in the middle of a compaction, on a shared store
    store = tmp_path / "jobs.db"
    first_config = config_in(tmp_path / "first", store, channels=ONE_PAGE_CHUNKS)
    db = tmp_path / "first" / "dbs" / "big.db"
    rows = make_bloated_db(str(db), rows=30000, delete_fraction=0.8, auto_vacuum="incremental")["rows"]
    first = Daemon(first_config)
    daemons.append(first)
    first.wait_ready()

    def running_with_a_heartbeat() -> bool:
        state, data = store_jobs(store).get(str(db), ("none", {}))
        return state == "running" and "heartbeat_at" in data and float(data.get("progress") or 0) < 0.8

    wait_for(running_with_a_heartbeat, 30, what="the first daemon's compaction under way", daemon=first, every_s=0.02)

    # When a second daemon, given the same node (the host name by default) and the same store
    # but a state_dir and a directory of its own, is started
    out = run_daemon_to_its_end(config_in(tmp_path / "second", store))

    # Then it refuses to start, in one line naming the first's host, PID, start and heartbeat, and the way out
    assert out.returncode == 1
    (line,) = out.stderr.splitlines()
    assert re.fullmatch(
        re.escape(f"smoosh: another smoosh is running as node 'testnode' on this store (host {socket.gethostname()}, "
                  f"pid {first.proc.pid}, since ") + r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ, last heartbeat \d+ s ago"
        + re.escape("); give each daemon its own node name ([smoosh] node in its config)"), line), line
    assert out.stdout == ""
    # ... and the first daemon's job was left alone: still running, and compacted to its end
    assert store_jobs(store)[str(db)][0] == "running"
    wait_for(lambda: job(first, db).get("state") == "finished", 60, what="the first daemon's compaction", daemon=first)
    assert job(first, db)["history"][0]["event"] == "finished"
    assert integrity(str(db)) == "ok"
    assert rows > 0
    assert first.stop() == 0


@pytest.mark.parametrize("same_state_dir", [True, False], ids=["same-state_dir", "other-state_dir"])
def test_a_restart_right_after_a_kill_9_starts_at_once(
    tmp_path: Path, daemons: list[Daemon], same_state_dir: bool
) -> None:
    # Given a daemon of node testnode killed with SIGKILL: its status record is seconds old,
    # far from stale, and says nothing of its death
    store = tmp_path / "jobs.db"
    first_config = config_in(tmp_path / "first", store)
    first = Daemon(first_config)
    daemons.append(first)
    first.wait_ready()
    killed_pid = first.proc.pid
    first.kill()

    # When the node is started again at once (on the same state_dir, or on another one)
    again_config = first_config if same_state_dir else config_in(tmp_path / "again", store)
    again = Daemon(again_config)
    daemons.append(again)
    again.wait_ready()

    # Then it starts without waiting for the record to go stale: the dead one is proven dead
    proof = ("it ran on this state_dir, whose lock this daemon holds" if same_state_dir
             else f"its process {killed_pid} is gone")
    assert (f"node 'testnode' was last served by host {socket.gethostname()}, pid {killed_pid}, which is gone "
            f"({proof}): its running jobs are taken back") in again.log()
    assert again.get("/status")["node"] == "testnode"
    # ... and a clean stop marks the record: the next start says nothing of the one before
    assert again.stop() == 0
    third = Daemon(again_config)
    daemons.append(third)
    third.wait_ready()
    assert "was last served by" not in third.log()
    assert third.stop() == 0


def age_status_record(store: Path, node: str, age_s: float) -> bool:
    """Make ``node``'s status record ``age_s`` old, as a daemon stopped that long leaves it; False
    when the store's write lock is held (a daemon stopped in the middle of a commit)."""
    import time

    from smoosh.daemon.control.node_claim import Identity
    from smoosh.daemon.record.status import put_node_status, read_node_record
    from smoosh.store import StoreError
    from smoosh.store.sqlite import SqliteStore

    opened = SqliteStore(str(store), busy_timeout_s=0.2)
    try:
        def body(tr: Any) -> None:
            record = read_node_record(tr, node)
            assert record is not None, "no status record yet"
            put_node_status(tr, node, record, time.time() - age_s, process=Identity.from_record(record["process"]))

        opened.transact(body, timeout_s=1.0)
        return True
    except StoreError:
        return False
    finally:
        opened.close()


def test_a_stopped_daemon_is_not_taken_over_however_late_its_heartbeat_until_it_is_killed(
    tmp_path: Path, daemons: list[Daemon]
) -> None:
    # Given a daemon of node testnode in the middle of a compaction, on a shared store
    store = tmp_path / "jobs.db"
    first_config = config_in(tmp_path / "first", store, channels=ONE_PAGE_CHUNKS)
    db = tmp_path / "first" / "dbs" / "big.db"
    make_bloated_db(str(db), rows=30000, delete_fraction=0.8, auto_vacuum="incremental")
    first = Daemon(first_config)
    daemons.append(first)
    first.wait_ready()

    def running_with_a_heartbeat() -> bool:
        state, data = store_jobs(store).get(str(db), ("none", {}))
        return state == "running" and "heartbeat_at" in data and float(data.get("progress") or 0) < 0.8

    wait_for(running_with_a_heartbeat, 30, what="the first daemon's compaction under way", daemon=first, every_s=0.02)

    # When it is stopped (SIGSTOP) past its heartbeat deadline: its status record aged a
    # minute, as a minute stopped leaves it (it may have stopped inside a commit: then it
    # runs a moment more and is stopped again)
    def stopped_with_an_old_record() -> bool:
        os.kill(first.proc.pid, signal.SIGSTOP)
        if age_status_record(store, "testnode", 60.0):
            return True
        os.kill(first.proc.pid, signal.SIGCONT)
        return False

    try:
        wait_for(stopped_with_an_old_record, 30, what="the first daemon stopped outside a commit", daemon=first,
                 every_s=0.1)
        # ... and a second daemon of the same node, on a state_dir of its own, watching the same
        # databases, is started
        (tmp_path / "second").mkdir()
        second_config = write_config(tmp_path / "second", port=free_port(),
                                     extra_global=f"store = sqlite:{store}\nwatch = {tmp_path / 'first' / 'dbs'}")
        out = run_daemon_to_its_end(second_config)
        # Then it refuses, in one line naming the stopped one: alive on this host, however late
        assert out.returncode == 1, out.stderr
        (line,) = out.stderr.splitlines()
        assert line.startswith(f"smoosh: another smoosh is running as node 'testnode' on this store "
                               f"(host {socket.gethostname()}, pid {first.proc.pid}, since "), line
        assert re.search(r", last heartbeat (\d+) s ago: late, but its process is alive on this host \(stopped or "
                         r"stalled, not dead\), so it is not taken over\); give each daemon its own node name", line), line
        # ... and took nothing: the stopped daemon's job is still running, its record still its own
        assert store_jobs(store)[str(db)][0] == "running"
    finally:
        # When the stopped daemon is killed
        first.kill()
    second = Daemon(second_config)
    daemons.append(second)
    second.wait_ready()
    # Then the second starts and takes over: the dead one's job back in its channel
    assert (f"node 'testnode' was last served by host {socket.gethostname()}, pid {first.proc.pid}, which is gone "
            f"(its process {first.proc.pid} is gone): its running jobs are taken back") in second.log()
    assert f"took back the job of {str(db)!r} into channel ratio_dbs" in second.log()
    # ... and compacts it to its end
    wait_for(lambda: job(second, db).get("state") == "finished", 60, what="the taken-over compaction", daemon=second)
    assert integrity(str(db)) == "ok"
    assert second.stop() == 0
