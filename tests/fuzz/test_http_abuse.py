"""The admin API under abuse: trickling clients, idle crowds, more requests than threads (issue 18).

Real sockets on 127.0.0.1 against a real in-process Server's admin API; each test gives the
API a short request timeout of its own, so none waits long.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from typing import Any, Iterator

import pytest

from helpers.daemon import write_config
from smoosh import Server, load_config
from smoosh.daemon.api.http import AdminServer

#: The request timeout these tests give the API, in seconds.
SHORT_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("http-abuse")
    config = load_config(str(write_config(base, port=0, extra_global="wait_secs = 3600")), cwd=str(base))
    s = Server(config, workers=0, watch_config=False)
    s.start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def admin_factory(server: Server) -> Iterator[Any]:
    started: list[AdminServer] = []

    def make(**kw: Any) -> tuple[AdminServer, tuple[str, int]]:
        admin = AdminServer(server, "127.0.0.1:0", **kw)
        admin.start()
        started.append(admin)
        host, port = admin.address.rsplit(":", 1)
        return admin, (host, int(port))

    yield make
    for admin in started:
        admin.stop()


def get_status(address: tuple[str, int], timeout_s: float = 5.0) -> tuple[int, float]:
    """One GET /status on a fresh connection: its status code and how long it took."""
    t0 = time.monotonic()
    conn = http.client.HTTPConnection(*address, timeout=timeout_s)
    try:
        conn.request("GET", "/status")
        response = conn.getresponse()
        json.loads(response.read())
        return response.status, time.monotonic() - t0
    finally:
        conn.close()


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has closed ``sock`` (EOF or reset), without blocking."""
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionError:
        return True
    finally:
        sock.setblocking(True)


def test_a_client_trickling_one_byte_at_a_time_is_closed_at_the_request_timeout(admin_factory: Any) -> None:
    # Given an API whose requests must arrive within SHORT_TIMEOUT_S
    _admin, address = admin_factory(request_timeout_s=SHORT_TIMEOUT_S)
    request = b"GET /status HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100
    t0 = time.monotonic()
    closed_after = None
    with socket.create_connection(address, timeout=5) as sock:
        # When a client sends one byte at a time, steadily, faster than any per-read timeout
        for byte in request:
            try:
                sock.sendall(bytes([byte]))
            except ConnectionError:
                closed_after = time.monotonic() - t0
                break
            if closed_by_server(sock):
                closed_after = time.monotonic() - t0
                break
            time.sleep(0.1)
    # Then the server closes it once the whole request is overdue, without an answer
    assert closed_after is not None, "the trickling connection was never closed"
    assert SHORT_TIMEOUT_S * 0.9 <= closed_after < SHORT_TIMEOUT_S + 1.0


def test_an_idle_keep_alive_connection_is_closed_after_the_timeout(admin_factory: Any) -> None:
    admin, address = admin_factory(request_timeout_s=SHORT_TIMEOUT_S)
    conn = http.client.HTTPConnection(*address, timeout=5)
    try:
        # Given a connection that was answered once and kept alive
        conn.request("GET", "/status")
        response = conn.getresponse()
        assert response.status == 200 and not response.will_close
        response.read()
        assert conn.sock is not None
        sock = conn.sock
        # When it then sends nothing
        deadline = time.monotonic() + SHORT_TIMEOUT_S + 2.0
        while not closed_by_server(sock) and time.monotonic() < deadline:
            time.sleep(0.05)
        # Then the server closes it
        assert closed_by_server(sock)
        assert admin.open_connections == 0
    finally:
        conn.close()


def test_status_stays_fast_with_a_thousand_idle_connections_open(admin_factory: Any) -> None:
    # Given a thousand connections open at once: half idle, half stalled mid-header
    admin, address = admin_factory(request_timeout_s=30.0)
    threads_before = threading.active_count()
    idle: list[socket.socket] = []
    try:
        for i in range(1000):
            sock = socket.create_connection(address, timeout=5)
            if i % 2:
                sock.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\nX-Stalled: ")
            idle.append(sock)
        deadline = time.monotonic() + 5
        while admin.open_connections < 1000 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert admin.open_connections == 1000
        # When an operator asks for /status, again and again
        timings = []
        for _ in range(20):
            status, took_s = get_status(address)
            assert status == 200
            timings.append(took_s)
        # Then every answer is fast, no idle connection holds a thread, and none was dropped
        assert max(timings) < 0.5, timings
        assert threading.active_count() - threads_before <= 2
        assert admin.open_connections >= 1000
        assert not any(closed_by_server(s) for s in idle[:50])
    finally:
        for sock in idle:
            sock.close()


def test_no_more_requests_are_answered_at_once_than_there_are_handler_threads(
    admin_factory: Any, server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an API with two handler threads, whose /status is held until the test says so
    _admin, address = admin_factory(request_timeout_s=5.0, max_threads=2)
    release = threading.Event()
    inside = 0
    most_inside = 0
    lock = threading.Lock()
    real_status = server.status

    def held_status() -> Any:
        nonlocal inside, most_inside
        with lock:
            inside += 1
            most_inside = max(most_inside, inside)
        release.wait(5)
        with lock:
            inside -= 1
        return real_status()

    monkeypatch.setattr(server, "status", held_status)
    results: list[int] = []

    def ask() -> None:
        results.append(get_status(address, timeout_s=8)[0])

    # When six clients ask at once
    clients = [threading.Thread(target=ask) for _ in range(6)]
    for t in clients:
        t.start()
    deadline = time.monotonic() + 5
    while inside < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # room for a third handler to enter, were there one
    # Then two are being answered and the rest wait their turn
    with lock:
        assert inside == 2
    release.set()
    for t in clients:
        t.join(8)
    assert results == [200] * 6
    assert most_inside == 2


def test_past_the_connection_limit_the_longest_waiting_connection_makes_room(admin_factory: Any) -> None:
    # Given an API that holds at most ten connections, all taken by idle clients
    admin, address = admin_factory(request_timeout_s=30.0, max_connections=10)
    idle = [socket.create_connection(address, timeout=5) for _ in range(10)]
    try:
        deadline = time.monotonic() + 5
        while admin.open_connections < 10 and time.monotonic() < deadline:
            time.sleep(0.01)
        # When an operator connects for /status
        status, _took = get_status(address)
        # Then it is answered, and the oldest idle connection was closed to make room
        assert status == 200
        assert _wait_closed(idle[0])
        assert not closed_by_server(idle[-1])
    finally:
        for sock in idle:
            sock.close()


def _wait_closed(sock: socket.socket, timeout_s: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if closed_by_server(sock):
            return True
        time.sleep(0.02)
    return False


def test_when_every_open_connection_has_a_request_in_a_new_one_is_shed(
    admin_factory: Any, server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an API of two connections and one handler thread, both connections with a whole
    # request in (one being answered, held; one waiting for the thread)
    admin, address = admin_factory(request_timeout_s=5.0, max_threads=1, max_connections=2)
    release = threading.Event()
    real_status = server.status
    monkeypatch.setattr(server, "status", lambda: (release.wait(5), real_status())[1])
    clients = [threading.Thread(target=get_status, args=(address, 8)) for _ in range(2)]
    for t in clients:
        t.start()
    deadline = time.monotonic() + 5
    while admin.open_connections < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        # When a third client connects
        with socket.create_connection(address, timeout=5) as sock:
            try:
                sock.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
            except ConnectionError:
                pass  # closed before the request went out: shed all the same
            # Then it is closed at once, without an answer, and nothing else is disturbed
            assert _wait_closed(sock)
        assert admin.open_connections == 2
    finally:
        release.set()
        for t in clients:
            t.join(8)
