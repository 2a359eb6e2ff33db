"""sd_notify over a real AF_UNIX datagram socket, from the module and from a `smoosh run` subprocess."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from helpers.daemon import Daemon, free_port, write_config
from smoosh.cli import systemd

UNIT = Path(__file__).resolve().parents[2] / "conf" / "smoosh.service"


@pytest.fixture
def notify_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A bound datagram socket named by $NOTIFY_SOCKET (a short path: sun_path holds 108 bytes)."""
    path = f"/tmp/smoosh-notify-{uuid.uuid4().hex[:12]}.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(5)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    yield sock
    sock.close()
    os.unlink(path)


def receive(sock: socket.socket) -> str:
    return sock.recv(4096).decode()


def test_every_call_is_a_quiet_no_op_without_notify_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert systemd.ready() is False
    assert systemd.watchdog_ping() is False
    assert systemd.status("x") is False


def test_messages_reach_a_socket_in_the_file_system(notify_socket: socket.socket) -> None:
    assert systemd.ready() is True
    assert receive(notify_socket) == "READY=1"
    assert systemd.status("3 active,\n12 waiting") is True
    assert receive(notify_socket) == "STATUS=3 active, 12 waiting"
    assert systemd.watchdog_ping() is True
    assert receive(notify_socket) == "WATCHDOG=1"
    assert systemd.stopping() is True
    assert receive(notify_socket) == "STOPPING=1"
    assert systemd.reloading() is True
    first, second = receive(notify_socket).split("\n")
    assert first == "RELOADING=1" and second.startswith("MONOTONIC_USEC=") and int(second.split("=")[1]) > 0


def test_an_at_sign_means_the_abstract_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"smoosh-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert systemd.ready() is True
        assert receive(sock) == "READY=1"


def test_a_socket_nobody_listens_on_is_reported_not_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone.sock"))
    assert systemd.ready() is False


@pytest.mark.parametrize(
    ("usec", "pid", "expected"),
    [(None, None, None), ("30000000", None, 30.0), ("0", None, None), ("soon", None, None),
     ("2000000", "self", 2.0), ("2000000", "1", None)],
)
def test_the_watchdog_interval_comes_from_watchdog_usec_for_this_process(
    monkeypatch: pytest.MonkeyPatch, usec: str | None, pid: str | None, expected: float | None,
) -> None:
    for name, value in (("WATCHDOG_USEC", usec), ("WATCHDOG_PID", str(os.getpid()) if pid == "self" else pid)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert systemd.watchdog_interval_s() == expected


def test_the_daemon_reports_ready_status_watchdog_and_stopping(
    tmp_path: Path, notify_socket: socket.socket, daemons: list[Daemon],
) -> None:
    env = {"NOTIFY_SOCKET": os.environ["NOTIFY_SOCKET"], "WATCHDOG_USEC": "400000"}
    d = Daemon(write_config(tmp_path, port=free_port()), env=env)
    daemons.append(d)
    messages: list[str] = []
    deadline = time.monotonic() + 20
    while messages.count("WATCHDOG=1") < 3 and time.monotonic() < deadline:
        try:
            messages.append(receive(notify_socket))
        except socket.timeout:
            break
    assert "READY=1" in messages, d.log()
    assert messages.count("WATCHDOG=1") >= 3, messages
    statuses = [m for m in messages if m.startswith("STATUS=")]
    assert statuses and statuses[0] == "STATUS=0 active, 0 starting, 0 waiting"
    # Ready only once the admin API serves.
    assert d.get("/status")["node"] == "testnode"
    assert d.stop() == 0
    rest = []
    notify_socket.settimeout(0.5)
    try:
        while True:
            rest.append(receive(notify_socket))
    except socket.timeout:
        pass
    assert "STOPPING=1" in rest


def test_sighup_reloads_and_tells_systemd(tmp_path: Path, notify_socket: socket.socket, daemons: list[Daemon]) -> None:
    d = Daemon(write_config(tmp_path, port=free_port()), env={"NOTIFY_SOCKET": os.environ["NOTIFY_SOCKET"]})
    daemons.append(d)
    d.wait_ready()
    while receive(notify_socket) != "READY=1":
        pass
    d.proc.send_signal(signal.SIGHUP)
    lifecycle = []
    while len(lifecycle) < 2:
        message = receive(notify_socket)
        if not message.startswith(("STATUS=", "WATCHDOG=")):
            lifecycle.append(message.split("\n")[0])
    assert lifecycle == ["RELOADING=1", "READY=1"]
    assert d.stop() == 0


def test_the_unit_file_declares_the_notify_protocol_and_hardening() -> None:
    text = UNIT.read_text()
    settings = {}
    for line in text.splitlines():
        if line and not line.startswith(("#", "[")) and "=" in line:
            key, value = line.split("=", 1)
            settings.setdefault(key, value)
    assert settings["Type"] == "notify" and settings["NotifyAccess"] == "main"
    assert settings["WatchdogSec"] == "30" and settings["Restart"] == "on-failure"
    assert settings["ExecStart"].endswith("smoosh run --config /etc/smoosh/smoosh.ini")
    assert settings["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert settings["StateDirectory"] == "smoosh" and settings["TimeoutStopSec"] == "30"
    assert settings["ProtectSystem"] == "strict" and settings["NoNewPrivileges"] == "true"
    assert "/var/lib/smoosh" in settings["ReadWritePaths"].split()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_accepts_the_unit(tmp_path: Path) -> None:
    # verify checks that ExecStart exists: point it at a real executable for the check.
    unit = tmp_path / "smoosh.service"
    unit.write_text(UNIT.read_text().replace("/opt/smoosh/venv/bin/smoosh", "/bin/true"))
    out = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stderr == "", out.stderr
