"""Issue 25: on loopback the admin API takes orders from the operator, not from a web page.

A browser on the same host can reach 127.0.0.1: a page can POST without a CORS preflight
when the body is ``text/plain`` or a form (a "simple request"), and a page whose domain is
re-pointed at 127.0.0.1 (DNS rebinding) can read what it answers. Each test sends the
headers a browser sends, over a real socket, to a real in-process server.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from compactor.dbfactory import make_bloated_db
from helpers.daemon import write_config
from smoosh import Server, load_config
from smoosh.daemon.api.http import AdminServer
from smoosh.daemon.api.requests import host_allowed
from smoosh.errors import ConfigError
from smoosh.config import parse_config

TOKEN = "a-long-random-token-0123456789"
EVIL = "http://evil.example"
MUTATING = (("/enqueue", {"keys": []}), ("/suspend", {}), ("/resume", {}), ("/flush", {}))


@pytest.fixture
def api(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Server, int, Path]]:
    """A server on loopback, with ``token`` set when the test is marked so."""
    token = getattr(request, "param", None)
    extra = "wait_secs = 3600" + (f"\ntoken = {token}" if token else "")
    config = load_config(str(write_config(tmp_path, port=0, extra_global=extra)), cwd=str(tmp_path))
    server = Server(config, workers=0, watch_config=False)
    server.start()
    admin = AdminServer(server, "127.0.0.1:0")
    admin.start()
    try:
        yield server, int(admin.address.rsplit(":", 1)[1]), tmp_path
    finally:
        admin.stop()
        server.stop()


def send(port: int, method: str, path: str, body: Any = None, **headers: str) -> tuple[int, dict]:
    """One request with exactly these headers (underscores become dashes); the status and JSON answer."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        sent = {name.replace("_", "-"): value for name, value in headers.items()}
        sent.setdefault("Host", f"127.0.0.1:{port}")
        raw = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        for name, value in sent.items():
            conn.putheader(name, value)
        conn.putheader("Content-Length", str(len(raw)))
        conn.endheaders(raw)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


@pytest.mark.parametrize("api", [TOKEN], indirect=True)
def test_on_loopback_a_configured_token_is_required_by_every_mutating_request(api: tuple[Server, int, Path]) -> None:
    _server, port, _base = api
    for path, body in MUTATING:
        for auth in (None, f"Bearer {TOKEN}x", "Bearer "):
            headers = {"Content_Type": "application/json", **({"Authorization": auth} if auth else {})}
            assert send(port, "POST", path, body, **headers) == (401, {"error": "missing or wrong bearer token"})
        status, _ = send(port, "POST", path, body, Content_Type="application/json", Authorization=f"Bearer {TOKEN}")
        assert status in (200, 202), path
    assert send(port, "GET", "/status")[0] == 200  # reads stay open: monitoring needs no secret


def test_a_page_s_simple_request_cannot_force_an_enqueue(api: tuple[Server, int, Path]) -> None:
    # fetch("http://127.0.0.1:5986/enqueue", {method: "POST", mode: "no-cors", body: ...}):
    # text/plain, no preflight, an Origin header.
    server, port, base = api
    db = base / "dbs" / "victim.db"
    make_bloated_db(str(db))
    body = {"keys": [str(db)], "force": True}
    status, answer = send(port, "POST", "/enqueue?wait=1", body, Content_Type="text/plain;charset=UTF-8",
                          Origin=EVIL, Sec_Fetch_Site="cross-site", Sec_Fetch_Mode="no-cors")
    assert status == 403
    assert answer == {"error": f"a request from a web page (Origin: {EVIL}) may not change anything; use the "
                               "smoosh command, a client without Origin, or this daemon's own page"}
    # Even a page that sends JSON with a preflight it will never pass: Origin alone is refused.
    assert send(port, "POST", "/suspend", {}, Content_Type="application/json", Origin=EVIL)[0] == 403
    assert server.explain(str(db))["state"] == "not_queued"
    assert not any(ch["suspended"] for ch in server.status()["channels"].values())


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None])
def test_a_post_body_must_be_json(api: tuple[Server, int, Path], content_type: str | None) -> None:
    _server, port, _base = api
    headers = {} if content_type is None else {"Content_Type": content_type}
    status, answer = send(port, "POST", "/suspend", {}, **headers)
    assert status == 415
    assert answer == {"error": "a POST body must be sent as Content-Type: application/json, "
                               f"not {content_type or 'none'}"}
    assert send(port, "POST", "/resume", {}, Content_Type="application/json; charset=utf-8")[0] == 200


def test_a_rebound_host_name_cannot_read_the_status_table(api: tuple[Server, int, Path]) -> None:
    # evil.example resolved to 127.0.0.1 a moment after the page loaded: same origin to the
    # browser, but the request still names evil.example in Host.
    server, port, base = api
    db = base / "dbs" / "secret-tenant.db"
    make_bloated_db(str(db))
    for path in ("/status", "/jobs", "/metrics", f"/explain?key={db}"):
        status, answer = send(port, "GET", path, Host=f"rebind.evil.example:{port}")
        assert status == 403
        assert answer == {"error": f"Host 'rebind.evil.example:{port}' is not this daemon's address: use its IP "
                                   "address, localhost or this machine's name"}
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"[::1]:{port}", f"LOCALHOST.:{port}",
                 f"{socket.gethostname()}:{port}"):
        assert send(port, "GET", "/status", Host=host)[0] == 200, host


def test_the_host_rule() -> None:
    names = frozenset({"localhost", "db-host"})
    allowed = [None, "localhost", "localhost:5986", "127.0.0.1:5986", "10.1.2.3", "[::1]:5986", "[fe80::1]", "DB-HOST"]
    refused = ["evil.example", "localhost.evil.example:5986", "[::1]x", "[::1", "127.0.0.1.nip.io:80", ""]
    assert all(host_allowed(h, names) for h in allowed)
    assert not any(host_allowed(h, names) for h in refused)


@pytest.mark.parametrize("token", ["x", "fifteen-bytes-!", "ünïcødé-7"])
def test_a_token_shorter_than_16_bytes_is_a_config_error_that_does_not_print_it(tmp_path: Path, token: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(f"[smoosh]\ntoken = {token}\n", "/etc/smoosh.ini", cwd=str(tmp_path))
    n = len(token.encode())
    assert str(info.value) == (f"/etc/smoosh.ini: [smoosh] token = '<{n} bytes, not shown>': a token must be at "
                               "least 16 bytes: a long random string")
    assert token not in str(info.value) and info.value.key == "token"
    assert parse_config("[smoosh]\ntoken = sixteen-bytes-ok\n", "/etc/smoosh.ini", cwd=str(tmp_path)).token


def _until(check: Any, what: str) -> None:
    """Wait for ``check()``; the ceiling only bounds a hang (the loop thread always gets there)."""
    deadline = time.monotonic() + 30
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def test_shed_connections_are_counted_and_logged_once_per_interval(
    api: tuple[Server, int, Path], caplog: pytest.LogCaptureFixture
) -> None:
    server, port, _base = api
    admin = AdminServer(server, "127.0.0.1:0", max_connections=2, request_timeout_s=30.0)
    admin.start()
    address = ("127.0.0.1", int(admin.address.rsplit(":", 1)[1]))
    idle: list[socket.socket] = []
    try:
        with caplog.at_level(logging.WARNING, logger="smoosh.daemon.api.http_conns"):
            idle.append(socket.create_connection(address, timeout=5))
            _until(lambda: admin.open_connections == 1, "1 connection open")
            for _ in range(2):
                # Given idle clients holding both connections, when an operator asks for /status
                idle.append(socket.create_connection(address, timeout=5))
                _until(lambda: admin.open_connections == 2, "2 connections open")
                conn = http.client.HTTPConnection(*address, timeout=10)
                conn.request("GET", "/status", headers={"Connection": "close"})
                assert conn.getresponse().status == 200
                conn.close()
                # The answered connection is closed by the server; one idle client is left.
                _until(lambda: admin.open_connections == 1, "the answered connection closed")
        # Then each made the longest-waiting idle client go: counted, and said once
        assert server.counters.http_shed == {"full": 0, "evicted": 2}
        lines = [r.getMessage() for r in caplog.records if "shed" in r.getMessage()]
        assert lines == ["The admin API shed connections (2 at most stay open): 0 closed at once with every open "
                         "connection answering or waiting to be answered, 1 idle or slow ones closed to admit new ones."]
    finally:
        for sock in idle:
            sock.close()
        admin.stop()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    assert 'smoosh_http_connections_shed_total{reason="evicted"} 2.0' in text
    assert 'smoosh_http_connections_shed_total{reason="full"} 0.0' in text


# ------------------------------------------------------------------ the daemon's own page (issue 49)


def test_the_daemon_s_own_page_may_act_and_a_page_anywhere_else_may_not(api: tuple[Server, int, Path]) -> None:
    # What Chromium sends for the page's fetch("/suspend", {method: "POST", ...}): its own origin,
    # which is exactly the address the request goes to.
    server, port, _base = api
    own = {"Content_Type": "application/json", "Sec_Fetch_Site": "same-origin", "Sec_Fetch_Mode": "cors"}
    for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
        status, answer = send(port, "POST", "/suspend", {"channel": "ratio_dbs"}, Host=host, Origin=f"http://{host}", **own)
        assert (status, answer) == (200, {"ok": True, "action": "suspend", "channel": "ratio_dbs"}), host
        assert server.status()["channels"]["ratio_dbs"]["suspended"] is True
        assert send(port, "POST", "/resume", {}, Host=host, Origin=f"http://{host}", **own)[0] == 200
    # A browser that sends no Sec-Fetch-Site (an older one) is judged by Origin alone
    assert send(port, "POST", "/flush", {}, Content_Type="application/json", Origin=f"http://127.0.0.1:{port}")[0] == 200
    # Every other origin is refused, and changes nothing: another site, another port of this host,
    # the other scheme's default port, a sandboxed page or a file, and the page's own origin
    # sent cross-site (a form or a redirect from elsewhere)
    foreign = [
        {"Origin": EVIL, "Sec_Fetch_Site": "cross-site"},
        {"Origin": f"http://127.0.0.1:{port + 1}", "Sec_Fetch_Site": "same-site"},
        {"Origin": "http://127.0.0.1", "Sec_Fetch_Site": "same-site"},
        {"Origin": "null", "Sec_Fetch_Site": "cross-site"},
        {"Origin": f"http://localhost:{port}"},  # Host says 127.0.0.1: loaded from another address
        {"Origin": f"http://127.0.0.1:{port}", "Sec_Fetch_Site": "cross-site"},
        {"Origin": f"http://127.0.0.1:{port}.evil.example"},
    ]
    for headers in foreign:
        status, answer = send(port, "POST", "/suspend", {}, Content_Type="application/json", **headers)
        assert status == 403, headers
        assert answer["error"].startswith(f"a request from a web page (Origin: {headers['Origin']}) may not change anything")
    # And a rebound name whose Origin and Host agree is stopped by the Host rule first
    rebound = f"rebind.evil.example:{port}"
    assert send(port, "POST", "/suspend", {}, Content_Type="application/json", Host=rebound, Origin=f"http://{rebound}",
                Sec_Fetch_Site="same-origin")[0] == 403
    assert not any(ch["suspended"] for ch in server.status()["channels"].values())


@pytest.mark.parametrize("api", [TOKEN], indirect=True)
def test_the_daemon_s_own_page_still_needs_the_token_once_one_is_set(api: tuple[Server, int, Path]) -> None:
    server, port, _base = api
    own = {"Content_Type": "application/json", "Origin": f"http://127.0.0.1:{port}", "Sec_Fetch_Site": "same-origin"}
    assert send(port, "POST", "/suspend", {}, **own) == (401, {"error": "missing or wrong bearer token"})
    assert send(port, "POST", "/suspend", {}, Authorization=f"Bearer {TOKEN}", **own)[0] == 200
    assert all(ch["suspended"] for ch in server.status()["channels"].values())
