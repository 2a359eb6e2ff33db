"""The admin API under abuse: trickling clients, idle crowds, more requests than threads (issue 18).

Real sockets on 127.0.0.1 against a real in-process Server's admin API. Request deadlines run
on a clock the test steps (the API's ``clock=``), so a slow machine moves no deadline; every
other wait is for something that happens, under a ceiling (``HANG_S``) that only bounds a
hang.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from typing import Any

import pytest

from helpers.clocks import FakeClock
from helpers.daemon import HANG_S, wait_for
from smoosh import Server
from smoosh.daemon.api.http import AdminServer

#: The request timeout these tests give the API, in seconds of its (stepped) clock.
SHORT_TIMEOUT_S = 1.0




def get_status(address: tuple[str, int], timeout_s: float = HANG_S) -> int:
    """One GET /status on a fresh connection: its status code."""
    conn = http.client.HTTPConnection(*address, timeout=timeout_s)
    try:
        conn.request("GET", "/status")
        response = conn.getresponse()
        json.loads(response.read())
        return response.status
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
    # Given an API whose requests must arrive within SHORT_TIMEOUT_S of its clock
    clock = FakeClock()
    admin, address = admin_factory(request_timeout_s=SHORT_TIMEOUT_S, clock=clock)
    request = b"GET /status HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 100
    t0 = clock.now
    with socket.create_connection(address, timeout=HANG_S) as sock:
        # (the deadline runs from the server's accept, which comes after the kernel's)
        wait_for(lambda: admin.open_connections == 1, HANG_S, what="the connection accepted")
        # When a client sends one byte every 0.1 s, steadily, faster than any per-read timeout
        for i, byte in enumerate(request):
            if i * 0.1 >= SHORT_TIMEOUT_S:
                break
            clock.set(t0 + i * 0.1)
            sock.sendall(bytes([byte]))
            # Then it stays open while the request is not yet overdue ...
            assert not closed_by_server(sock)
        # ... and is closed, without an answer, once the whole request is
        clock.set(t0 + SHORT_TIMEOUT_S)
        assert _wait_closed(sock)


def test_an_idle_keep_alive_connection_is_closed_after_the_timeout(admin_factory: Any) -> None:
    clock = FakeClock()
    admin, address = admin_factory(request_timeout_s=SHORT_TIMEOUT_S, clock=clock)
    conn = http.client.HTTPConnection(*address, timeout=HANG_S)
    try:
        # Given a connection that was answered once and kept alive
        conn.request("GET", "/status")
        response = conn.getresponse()
        assert response.status == 200 and not response.will_close
        response.read()
        assert conn.sock is not None
        sock = conn.sock
        # (its deadline is set as the handler hands it back, just after the answer went out)
        wait_for(lambda: requests_in(admin) == 0, HANG_S, what="the connection handed back")
        # When it then sends nothing until past the timeout
        clock.advance(SHORT_TIMEOUT_S * 0.9)
        assert not closed_by_server(sock)
        clock.advance(SHORT_TIMEOUT_S * 0.2)
        # Then the server closes it
        assert _wait_closed(sock)
        assert admin.open_connections == 0
    finally:
        conn.close()


def test_status_is_answered_with_a_thousand_idle_connections_open(admin_factory: Any) -> None:
    # Given a thousand connections open at once, half idle, half stalled mid-header, on an API
    # whose request timeout never comes during the test (its clock does not move)
    admin, address = admin_factory(request_timeout_s=30.0, clock=FakeClock())
    threads_before = threading.active_count()
    idle: list[socket.socket] = []
    try:
        for i in range(1000):
            sock = socket.create_connection(address, timeout=HANG_S)
            if i % 2:
                sock.sendall(b"GET /status HTTP/1.1\r\nHost: localhost\r\nX-Stalled: ")
            idle.append(sock)
        wait_for(lambda: admin.open_connections == 1000, HANG_S, what="a thousand connections open")
        # When an operator asks for /status, again and again
        statuses = [get_status(address) for _ in range(20)]
        # Then every one is answered though no idle connection ever closes (were they holding
        # the handler threads, none would be), none holds a thread, and none was dropped
        assert statuses == [200] * 20
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
    _admin, address = admin_factory(request_timeout_s=HANG_S, max_threads=2, clock=FakeClock())
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
        release.wait(HANG_S)
        with lock:
            inside -= 1
        return real_status()

    monkeypatch.setattr(server, "status", held_status)
    results: list[int] = []

    def ask() -> None:
        results.append(get_status(address))

    # When six clients ask at once
    clients = [threading.Thread(target=ask) for _ in range(6)]
    for t in clients:
        t.start()
    wait_for(lambda: inside >= 2, HANG_S, what="two requests being answered")
    time.sleep(0.3)  # room for a third handler to enter, were there one
    # Then two are being answered and the rest wait their turn
    with lock:
        assert inside == 2
    release.set()
    for t in clients:
        t.join(HANG_S)
    assert results == [200] * 6
    assert most_inside == 2


def test_past_the_connection_limit_the_longest_waiting_connection_makes_room(admin_factory: Any) -> None:
    # Given an API that holds at most ten connections, all taken by idle clients
    admin, address = admin_factory(request_timeout_s=30.0, max_connections=10, clock=FakeClock())
    idle = [socket.create_connection(address, timeout=HANG_S) for _ in range(10)]
    try:
        wait_for(lambda: admin.open_connections == 10, HANG_S, what="ten connections open")
        # When an operator connects for /status
        status = get_status(address)
        # Then it is answered, and the oldest idle connection was closed to make room
        assert status == 200
        assert _wait_closed(idle[0])
        assert not closed_by_server(idle[-1])
    finally:
        for sock in idle:
            sock.close()


def requests_in(admin: AdminServer) -> int:
    """Connections whose whole request is in: being answered, or waiting for a handler thread.

    The connection loop's own count (nothing public tells a connection still sending its
    request from one whose request is in).
    """
    return admin._httpd._handled_open


def _wait_closed(sock: socket.socket, timeout_s: float = HANG_S) -> bool:
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
    admin, address = admin_factory(request_timeout_s=HANG_S, max_threads=1, max_connections=2, clock=FakeClock())
    release = threading.Event()
    real_status = server.status
    monkeypatch.setattr(server, "status", lambda: (release.wait(HANG_S), real_status())[1])
    clients = [threading.Thread(target=get_status, args=(address,)) for _ in range(2)]
    for t in clients:
        t.start()
    try:
        # Both requests are in, not merely both connections open: a connection still sending
        # is the longest-waiting one, which a new client would rightly push out
        wait_for(lambda: requests_in(admin) == 2, HANG_S, what="both requests in")
        # When a third client connects
        with socket.create_connection(address, timeout=HANG_S) as sock:
            try:
                sock.sendall(b"GET /status HTTP/1.1\r\nHost: localhost\r\n\r\n")
            except ConnectionError:
                pass  # closed before the request went out: shed all the same
            # Then it is closed at once, without an answer, and nothing else is disturbed
            assert _wait_closed(sock)
        assert admin.open_connections == 2
    finally:
        release.set()
        for t in clients:
            t.join(HANG_S)
