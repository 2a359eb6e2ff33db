"""Work per request is bounded in time, not only in size (issue 45, DESIGN §10).

Ten ``POST /enqueue`` of 10,000 keys under a 250-deep directory, each within every limit, held
every handler thread for 40 s: ``/status`` was blind all that time, and nothing was logged.
Now ``POST /enqueue`` runs in a lane that never takes the last handler threads, its admission
has a deadline (the keys left are named, with ``Retry-After``), and one that waited too long
for a thread is refused whole (503). Real sockets on 127.0.0.1; the deadlines run on a clock
the test steps (the API's ``clock=``); every other wait is for something that happens, under
a ceiling that only bounds a hang.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from helpers.clocks import FakeClock
from helpers.daemon import HANG_S, Daemon, free_port, wait_for, write_config
from smoosh import Server
from smoosh.daemon.api.http import RETRY_AFTER_S
from smoosh.daemon.intake.admission import NOT_EXAMINED
from smoosh.errors import InvalidKey
from smoosh.paths import SQLITE_MAX_PATH_BYTES

HTTP_LOGGER = "smoosh.daemon.api.http"




def call(address: tuple[str, int], method: str, path: str, body: Any = None,
         timeout_s: float = HANG_S) -> tuple[int, dict[str, str], Any]:
    """One request on a fresh connection: status, headers, JSON body."""
    conn = http.client.HTTPConnection(*address, timeout=timeout_s)
    try:
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, path, data, {"Content-Type": "application/json"} if data is not None else {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), json.loads(response.read())
    finally:
        conn.close()


class HeldEnqueue:
    """``Server.enqueue`` held inside until released, counting the requests inside at once."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.inside = 0
        self.most_inside = 0
        self.keys: list[str] = []

    def __call__(self, key: str, **_kw: Any) -> None:
        with self.lock:
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
            self.keys.append(key)
        self.release.wait(HANG_S)
        with self.lock:
            self.inside -= 1


def test_status_is_answered_while_every_enqueue_thread_is_held(
    admin_factory: Any, server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an API of four handler threads (two kept for light requests), whose enqueues are
    # held until the test says so
    _admin, address = admin_factory(request_timeout_s=HANG_S, max_threads=4, clock=FakeClock())
    held = HeldEnqueue()
    monkeypatch.setattr(server, "enqueue", held)
    answers: list[int] = []
    posts = [threading.Thread(target=lambda i=i: answers.append(
        call(address, "POST", "/enqueue", {"keys": [f"/k{i}"]})[0])) for i in range(5)]
    for t in posts:
        t.start()
    try:
        # When five floods are in, two of them being answered (the rest wait their turn)
        wait_for(lambda: held.inside == 2, HANG_S, what="two enqueues being answered")
        # Then GET /status, /metrics and /jobs are answered all the same, on the threads kept for them
        assert call(address, "GET", "/status")[0] == 200
        assert call(address, "GET", "/jobs")[0] == 200
        assert held.inside == 2
    finally:
        held.release.set()
        for t in posts:
            t.join(HANG_S)
    # ... and every flood is answered in its turn, never more than the heavy lane at once
    assert answers == [202] * 5
    assert held.most_inside == 2


def test_an_enqueue_past_its_deadline_is_cut_and_names_the_keys_not_examined(
    admin_factory: Any, server: Server, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Given an API whose enqueues may take 5 s of its clock, and keys that cost 1 s each
    clock = FakeClock()
    admin, address = admin_factory(request_timeout_s=HANG_S, clock=clock, request_work_s=5.0)
    enqueued: list[str] = []

    def slow_enqueue(key: str, **_kw: Any) -> None:
        enqueued.append(key)
        clock.advance(1.0)

    monkeypatch.setattr(server, "enqueue", slow_enqueue)
    cut_before = server.counters.http_cut["cut"]
    caplog.set_level(logging.WARNING, logger=HTTP_LOGGER)
    keys = [f"/srv/k{i}.db" for i in range(8)]
    # When a request of eight keys comes
    status, headers, body = call(address, "POST", "/enqueue", {"keys": keys})
    # Then the first five are enqueued, and the answer names the three left: from which index,
    # how many, why, and when to send them again
    assert status == 202
    assert enqueued == keys[:5]
    assert body == {"accepted": 5, "rejected": [],
                    "not_examined": {"count": 3, "from_index": 5, "reason": NOT_EXAMINED}}
    assert headers["Retry-After"] == str(RETRY_AFTER_S)
    # ... it is counted, and logged once, with its size
    assert server.counters.http_cut["cut"] == cut_before + 1
    lines = [r.getMessage() for r in caplog.records if r.name == HTTP_LOGGER and "cut at its" in r.getMessage()]
    size = len(json.dumps({"keys": keys}).encode())
    assert lines == [f"POST /enqueue from 127.0.0.1: 8 keys ({size} bytes) cut at its 5 s deadline after 5; "
                     f"3 not examined (from index 5; answered with Retry-After: {RETRY_AFTER_S})."]
    assert admin.request_work_s == 5.0


def test_a_waited_enqueue_past_its_deadline_says_not_examined_for_each_key_left(
    admin_factory: Any, server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    _admin, address = admin_factory(request_timeout_s=HANG_S, clock=clock, request_work_s=2.0)

    def slow_enqueue(key: str, **kw: Any) -> None:
        clock.advance(1.0)
        raise InvalidKey(key, "no such file")

    monkeypatch.setattr(server.intake, "enqueue", slow_enqueue)
    status, headers, body = call(address, "POST", "/enqueue?wait=1", {"keys": ["/a", "/b", "/c"]})
    assert status == 200 and headers["Retry-After"] == str(RETRY_AFTER_S)
    assert [(r["key"], r["outcome"], r["reason"]) for r in body["results"]] == [
        ("/a", "rejected", "no such file"), ("/b", "rejected", "no such file"), ("/c", "not_queued", NOT_EXAMINED)]


def test_an_enqueue_that_waited_too_long_for_a_thread_is_refused_whole_with_503(
    admin_factory: Any, server: Server, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Given an API with room for one enqueue at a time, held inside
    clock = FakeClock()
    admin, address = admin_factory(request_timeout_s=HANG_S, max_threads=2, clock=clock, shed_after_s=10.0)
    held = HeldEnqueue()
    monkeypatch.setattr(server, "enqueue", held)
    caplog.set_level(logging.WARNING, logger=HTTP_LOGGER)
    shed_before = server.counters.http_cut["shed"]
    first: list[int] = []
    t = threading.Thread(target=lambda: first.append(call(address, "POST", "/enqueue", {"keys": ["/first"]})[0]))
    t.start()
    try:
        wait_for(lambda: held.inside == 1, HANG_S, what="the first enqueue being answered")
        # When a second one waits for the thread longer than it may (11 s of the API's clock)
        second: list[tuple[int, dict[str, str], Any]] = []
        t2 = threading.Thread(target=lambda: second.append(call(address, "POST", "/enqueue", {"keys": ["/second"]})))
        t2.start()
        wait_for(lambda: admin._httpd._handled_open == 2, HANG_S, what="the second request in, waiting")
        clock.advance(11.0)
    finally:
        held.release.set()
    t.join(HANG_S)
    t2.join(HANG_S)
    # Then it is refused unexamined, 503 with Retry-After, and nothing of it was enqueued
    status, headers, body = second[0]
    assert status == 503 and headers["Retry-After"] == str(RETRY_AFTER_S)
    assert body["error"].startswith("the admin API is busy: this request waited 11.0 s for a handler and was "
                                    "not examined; nothing was enqueued")
    assert held.keys == ["/first"] and first == [202]
    assert server.counters.http_cut["shed"] == shed_before + 1
    size = len(json.dumps({"keys": ["/second"]}).encode())
    assert [r.getMessage() for r in caplog.records if "shed unexamined" in r.getMessage()] == [
        f"POST /enqueue from 127.0.0.1 ({size} bytes) shed unexamined: it waited 11.0 s for a handler (the admin "
        f"API is busy); answered 503 with Retry-After: {RETRY_AFTER_S}."]


#: Floods of the issue's trial: requests at once, keys each, components of their directory.
FLOODS, FLOOD_KEYS, FLOOD_DEPTH = 10, 10_000, 250
#: How long one GET /status may take while the floods run: a bound on a hang (the floods held
#: it 40 s before), far above the second it takes, never a measure of speed.
STATUS_BOUND_S = 15.0


def deep_keys(dbs: Path) -> dict[str, Any]:
    """A request of FLOOD_KEYS missing files in a directory FLOOD_DEPTH components deep under ``dbs``
    (its keys within the 256-component limit wherever the test's temporary directory lies), or as
    deep as SQLite's path limit lets a key be (a longer one is refused on its length alone, the
    cheapest refusal): each key is resolved through the deep chain, the dearest path."""
    longest = SQLITE_MAX_PATH_BYTES - len("-journal") - len(f"/k{FLOOD_KEYS - 1}.db")
    levels = min(FLOOD_DEPTH - (len(dbs.parts) - 1), (longest - len(str(dbs))) // 2)
    deep = str(dbs) + "/d" * levels
    os.makedirs(deep, exist_ok=True)
    return {"keys": [f"{deep}/k{i}.db" for i in range(FLOOD_KEYS)]}


def flood_while_asking_status(address: tuple[str, int], body: dict[str, Any]) -> tuple[list[int], list[Any]]:
    """FLOODS clients POST ``body`` at once while GET /status is asked again and again until all are answered.

    Returns:
        The /status codes, and each flood's (status, headers, answer).
    """
    answers: list[tuple[int, dict[str, str], Any]] = []
    floods = [threading.Thread(target=lambda: answers.append(call(address, "POST", "/enqueue", body)))
              for _ in range(FLOODS)]
    for t in floods:
        t.start()
    statuses = []
    while any(t.is_alive() for t in floods) or not statuses:
        statuses.append(call(address, "GET", "/status", timeout_s=STATUS_BOUND_S)[0])
    for t in floods:
        t.join(HANG_S)
    return statuses, answers


def assert_each_flood_answered_clearly(answers: list[Any]) -> int:
    """Each flood's keys rejected ("no such file"), those its deadline left named with Retry-After,
    or the whole request refused with 503; returns how many were cut."""
    assert len(answers) == FLOODS
    cut = 0
    for status, headers, answer in answers:
        if status == 503:
            assert headers["Retry-After"] == str(RETRY_AFTER_S)
            continue
        assert status == 202
        left = answer.get("not_examined")
        examined = FLOOD_KEYS - (left["count"] if left else 0)
        assert answer["accepted"] == 0 and len(answer["rejected"]) == examined
        assert {r["reason"] for r in answer["rejected"]} == {"no such file"}
        if left:
            cut += 1
            assert left["from_index"] == examined and headers["Retry-After"] == str(RETRY_AFTER_S)
    return cut


def test_status_answers_while_ten_floods_of_expensive_keys_run_and_each_flood_is_answered(
    admin_factory: Any, server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    # Given the admin API (its enqueues given 1 s each: the flood's shape, in less of the suite's time)
    _admin, address = admin_factory(request_work_s=1.0)
    body = deep_keys(Path(server.config.roots[0]))
    caplog.set_level(logging.WARNING, logger=HTTP_LOGGER)
    # When ten clients each POST 10,000 keys at once, Then GET /status is answered throughout
    statuses, answers = flood_while_asking_status(address, body)
    assert set(statuses) == {200}
    # ... and every flood gets a clear answer, each cut one logged once with its size
    cut = assert_each_flood_answered_clearly(answers)
    assert sum(" cut at its " in r.getMessage() for r in caplog.records) == cut


@pytest.mark.slow
def test_status_answers_while_ten_floods_run_against_a_real_daemon(tmp_path: Path, daemons: list[Daemon]) -> None:
    # The same against `smoosh run` with its own deadline
    config = write_config(tmp_path, port=free_port())
    body = deep_keys(tmp_path / "dbs")
    d = Daemon(config)
    daemons.append(d)
    d.wait_ready()
    statuses, answers = flood_while_asking_status(("127.0.0.1", d.port), body)
    assert set(statuses) == {200}
    cut = assert_each_flood_answered_clearly(answers)
    assert d.stop() == 0
    assert sum(" cut at its " in line for line in d.log_path.read_text().splitlines()) == cut
