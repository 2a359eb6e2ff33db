"""The daemon starts its start-up scan's helper process first thing in ``Server.start`` and
hands it to the scan (see ``tests/watcher/test_scan_ahead.py`` for the helper itself): a start
that fails kills it, and a daemon that watches nothing starts none.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from helpers.daemon import wait_for
from server.test_server import make_config
from smoosh.daemon.watch import scan_helper as helper_module
from smoosh.errors import SmooshError
from watcher.test_watcher import make_db

#: Ceiling on the start-up scan of one file (only bounds a hang).
HANG_S = 30.0


class _Spawned:
    """Records the helpers the server starts ahead."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def __call__(self) -> subprocess.Popen[bytes]:
        proc = helper_module.spawn_helper()
        self.procs.append(proc)
        return proc


def test_the_servers_start_up_scan_runs_in_the_helper_it_started_first(
    tmp_path: Path, running: Any, dbs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_db(dbs / "a.db")
    spawned = _Spawned()
    monkeypatch.setattr("smoosh.daemon.server.spawn_helper", spawned)
    server = running(make_config(tmp_path, extra=f"watch = {dbs}"), workers=0)
    wait_for(lambda: server.status()["scan"]["scans_completed"] >= 1, HANG_S, what="the start-up scan")
    assert len(spawned.procs) == 1
    assert spawned.procs[0].returncode == 0  # it walked the tree and ended
    assert server.status()["scan"]["databases_found"] == 1


def test_a_server_that_fails_to_start_leaves_no_helper_behind(
    tmp_path: Path, dbs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from smoosh.daemon.server import Server

    spawned = _Spawned()
    monkeypatch.setattr("smoosh.daemon.server.spawn_helper", spawned)

    def refuse(self: Server) -> None:
        raise SmooshError("another daemon runs this node")

    monkeypatch.setattr(Server, "claim_node", refuse)
    server = Server(make_config(tmp_path, extra=f"watch = {dbs}"), workers=0, watch_config=False)
    with pytest.raises(SmooshError, match="another daemon runs this node"):
        server.start()
    assert len(spawned.procs) == 1
    assert spawned.procs[0].returncode is not None  # killed and reaped, not waiting on a pipe


def test_a_server_watching_nothing_starts_no_helper(
    tmp_path: Path, running: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    spawned = _Spawned()
    monkeypatch.setattr("smoosh.daemon.server.spawn_helper", spawned)
    running(make_config(tmp_path), workers=0)
    assert spawned.procs == []
