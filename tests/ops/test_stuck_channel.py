"""A stuck channel never delays the status table: /status, /metrics and `smoosh status` still answer."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Iterator

import pytest
from opslib import request, smoosh_cli

from helpers.daemon import HANG_S, write_config


@pytest.fixture
def server(tmp_path: Path) -> Iterator[object]:
    from smoosh.config import load_config
    from smoosh.daemon.api.http import AdminServer
    from smoosh.daemon.server import Server

    config = load_config(str(write_config(tmp_path, port=0, extra_global="watch =")))
    s = Server(config, workers=0, watch_config=False)
    s.start()
    admin = AdminServer(s, "127.0.0.1:0")
    admin.start()
    s.admin = admin  # type: ignore[attr-defined]
    yield s
    admin.stop()
    s.stop()


def hold_lock(lock: threading.Lock) -> tuple[threading.Event, threading.Thread]:
    """Grab ``lock`` from another thread (as a channel stuck mid-iteration would) until released."""
    held, release = threading.Event(), threading.Event()

    def run() -> None:
        with lock:
            held.set()
            release.wait(2 * HANG_S)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert held.wait(HANG_S)
    return release, thread


def test_status_answers_while_a_channel_is_stuck(server: object) -> None:
    url = f"http://{server.admin.address}"  # type: ignore[attr-defined]
    channel = server.channels()["ratio_dbs"]  # type: ignore[attr-defined]
    # The lock is held until the test ends: an answer that needed it would never come
    release, thread = hold_lock(channel._lock)
    try:
        reply = request(url + "/status", timeout_s=HANG_S)
        assert reply.status == 200
        assert "ratio_dbs" in reply.json()["channels"]
        assert request(url + "/metrics", timeout_s=HANG_S).status == 200
        out = smoosh_cli("status", "--url", url, timeout_s=HANG_S)
        assert out.returncode == 0, out.stderr
        assert "ratio_dbs" in out.stdout
    finally:
        release.set()
        thread.join(5)
