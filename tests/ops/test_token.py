"""Off loopback, every POST needs the bearer token; GETs stay open; no token is a config error."""

from __future__ import annotations

from pathlib import Path

import pytest
from opslib import request, smoosh_cli

from helpers.daemon import Daemon, free_port, write_config

TOKEN = "s3cret-0123456789abcdef"


@pytest.fixture
def open_daemon(tmp_path: Path, daemons: list[Daemon]) -> Daemon:
    port = free_port()
    d = Daemon(write_config(tmp_path, port=port, extra_global=f"http = 0.0.0.0:{port}\ntoken = {TOKEN}"))
    daemons.append(d)
    d.wait_ready()
    return d


@pytest.mark.parametrize("header", [None, "Bearer wrong", f"Basic {TOKEN}", f"Bearer {TOKEN}x", "Bearer"])
def test_a_post_without_the_right_bearer_token_is_401_and_does_nothing(open_daemon: Daemon, header: str | None) -> None:
    headers = {"Authorization": header} if header else {}
    reply = request(open_daemon.url + "/suspend", "POST", {}, headers=headers)
    assert reply.status == 401
    assert reply.json() == {"error": "missing or wrong bearer token"}
    assert reply.headers["WWW-Authenticate"] == "Bearer"
    assert request(open_daemon.url + "/enqueue", "POST", {"keys": []}, headers=headers).status == 401
    assert not any(c["suspended"] for c in request(open_daemon.url + "/status").json()["channels"].values())


def test_the_right_token_is_obeyed_and_gets_stay_open(open_daemon: Daemon) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert request(open_daemon.url + "/status").status == 200
    assert request(open_daemon.url + "/jobs").status == 200
    assert request(open_daemon.url + "/metrics").status == 200
    assert request(open_daemon.url + "/enqueue", "POST", {"keys": []}, headers=auth).status == 202
    assert request(open_daemon.url + "/suspend", "POST", {}, headers=auth).status == 200
    channels = request(open_daemon.url + "/status").json()["channels"]
    assert all(c["suspended"] for c in channels.values())
    assert request(open_daemon.url + "/resume", "POST", None, headers=auth).status == 200
    channels = request(open_daemon.url + "/status").json()["channels"]
    assert not any(c["suspended"] for c in channels.values())


def test_the_cli_sends_the_token_from_smoosh_token(open_daemon: Daemon) -> None:
    denied = smoosh_cli("suspend", "--url", open_daemon.url, "ratio_dbs")
    assert denied.returncode == 1
    assert denied.stderr == f"smoosh: POST {open_daemon.url}/suspend: 401 missing or wrong bearer token\n"
    allowed = smoosh_cli("suspend", "--url", open_daemon.url, "ratio_dbs", env={"SMOOSH_TOKEN": TOKEN})
    assert (allowed.returncode, allowed.stdout) == (0, "suspend: channel ratio_dbs\n")
    assert request(open_daemon.url + "/status").json()["channels"]["ratio_dbs"]["suspended"] is True


def test_an_off_loopback_address_without_a_token_is_refused_by_run_and_config_check(tmp_path: Path) -> None:
    config = write_config(tmp_path, port=free_port(), extra_global="http = 0.0.0.0:5986")
    message = f"{config}: [smoosh] http = '0.0.0.0:5986': binding off loopback needs [smoosh] token"
    check = smoosh_cli("config", "check", "--config", str(config))
    assert check.returncode == 1
    assert check.stderr == f"smoosh: config error: {message}\n"
    run = smoosh_cli("run", "--config", str(config), timeout_s=30)
    assert run.returncode == 1
    assert f"smoosh: config error: {message}" in run.stderr


def test_an_off_loopback_http_option_without_a_token_is_refused(tmp_path: Path) -> None:
    config = write_config(tmp_path, port=free_port())
    run = smoosh_cli("run", "--config", str(config), "--http", "0.0.0.0:5986", timeout_s=30)
    assert run.returncode == 1
    assert "smoosh: config error: --http = '0.0.0.0:5986': binding off loopback needs [smoosh] token" in run.stderr
