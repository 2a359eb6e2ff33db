"""One live daemon per ``node`` name on a shared store (issue 25, DESIGN §10): real `smoosh run`
processes, each on a state_dir of its own, sharing one ``sqlite:`` store under the same node.

Before: the second daemon started, took every running job of the node (the first daemon's
included) as left behind, and refused its database as outside its roots: the first's
database was recorded ``gone`` and never compacted.
"""

from __future__ import annotations

import os
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

    # Then it refuses to start, in one line naming the first's host and PID and the way out
    assert out.returncode == 1
    assert out.stderr.splitlines() == [
        f"smoosh: another smoosh is running as node 'testnode' on this store (host {socket.gethostname()}, "
        f"pid {first.proc.pid}); give each daemon its own node name ([smoosh] node in its config)"
    ]
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
