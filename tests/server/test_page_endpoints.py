"""What the operators' page reads, added to the JSON API (DESIGN §12: no second API): a channel's
head (``/queue``), the finished compactions (``/history``), the last hour per minute (``/series``),
and the page's own files. Each over a real HTTP socket on 127.0.0.1, against a server in process
whose clock and compactions the test scripts.
"""

from __future__ import annotations

import http.client
import json
import math
import re
from pathlib import Path
from typing import Any, Iterator

import pytest

from helpers.clocks import FakeClock
from helpers.daemon import HANG_S, wait_for
from server.test_compaction_metrics import ScriptedCompactor
from server.test_server import FailingCompactor, make_config
from smoosh.compactors.base import Busy
from smoosh.daemon.api.http import AdminServer

MINUTE = 60


class Api:
    """Requests to one admin API: ``get(path)`` -> (status, headers, body)."""

    def __init__(self, admin: AdminServer) -> None:
        self.port = int(admin.address.rsplit(":", 1)[1])

    def get(self, path: str, **headers: str) -> tuple[int, Any, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=HANG_S)
        try:
            conn.request("GET", path, headers=headers)
            reply = conn.getresponse()
            return reply.status, reply.headers, reply.read()
        finally:
            conn.close()

    def json(self, path: str) -> tuple[int, Any]:
        status, _headers, body = self.get(path)
        return status, json.loads(body)


@pytest.fixture
def serve(running: Any) -> Iterator[Any]:
    """Start a server (``running``'s arguments) with its admin API on 127.0.0.1: (server, Api)."""
    admins: list[AdminServer] = []

    def start(config: Any, **kw: Any) -> tuple[Any, Api]:
        server = running(config, **kw)
        admin = AdminServer(server, "127.0.0.1:0")
        admin.start()
        admins.append(admin)
        return server, Api(admin)

    yield start
    for admin in admins:
        admin.stop()


# ------------------------------------------------------------------ /queue


def test_the_queue_pages_a_channel_s_waiting_keys_in_the_order_they_would_start(
    tmp_path: Path, serve: Any, dbs: Path,
) -> None:
    # Given a suspended channel holding seven keys of one priority (so they start oldest first), one
    # forced (suspension holds it: it waits at the head)
    server, api = serve(make_config(tmp_path, extra="wait_secs = 3600"), workers=0,
                        compactors=[FailingCompactor(RuntimeError("never run"))])
    keys = [str(dbs / f"k{i}.db") for i in range(7)]
    for key in keys:
        server.enqueue(key)
    wait_for(lambda: server.status()["channels"]["ratio_dbs"]["waiting"]["size"] == 7, HANG_S, what="seven keys queued")
    server.suspend("ratio_dbs")
    server.enqueue(keys[5], force=True)
    wait_for(lambda: api.json("/queue?channel=ratio_dbs&limit=1")[1]["keys"][0]["key"] == keys[5], HANG_S,
             what="the forced key at the head")
    order = [keys[5], *keys[:5], keys[6]]
    # When the operator pages through it three at a time
    pages = [api.json(f"/queue?channel=ratio_dbs&offset={offset}&limit=3") for offset in (0, 3, 6)]
    # Then the pages follow the start order, each numbered, with the total and the next page's offset
    assert [status for status, _ in pages] == [200, 200, 200]
    assert [[row["key"] for row in page["keys"]] for _, page in pages] == [order[0:3], order[3:6], order[6:]]
    assert [[row["position"] for row in page["keys"]] for _, page in pages] == [[1, 2, 3], [4, 5, 6], [7]]
    assert [(page["total"], page["offset"], page["next_offset"]) for _, page in pages] == [(7, 0, 3), (7, 3, 6), (7, 6, None)]
    first = pages[0][1]
    assert first["channel"] == "ratio_dbs"
    assert first["keys"][0] == {"key": keys[5], "priority": "infinity", "place": "queue", "position": 1, "forced": True}
    assert first["keys"][1] == {"key": keys[0], "priority": 10.0, "place": "queue", "position": 2}
    # And with no limit a page is 50 keys at most
    assert len(api.json("/queue?channel=ratio_dbs")[1]["keys"]) == 7


@pytest.mark.parametrize(("query", "status", "error"), [
    ("", 400, "name one channel: /queue?channel=NAME"),
    ("?channel=ratio_dbs&channel=slack_dbs", 400, "name one channel: /queue?channel=NAME"),
    ("?channel=nosuch", 404, "unknown channel 'nosuch'"),
    ("?channel=ratio_dbs&limit=501", 400, "limit must be at most 500, not 501"),
    ("?channel=ratio_dbs&limit=0", 400, "limit must be a whole number of at least 1, not '0'"),
    ("?channel=ratio_dbs&offset=-1", 400, "offset must be a whole number of at least 0, not '-1'"),
    ("?channel=ratio_dbs&state=pending", 400, "unknown parameter 'state': /queue takes channel, offset and limit"),
])
def test_a_queue_query_that_is_wrong_is_refused_naming_what(
    tmp_path: Path, serve: Any, query: str, status: int, error: str,
) -> None:
    _server, api = serve(make_config(tmp_path), workers=0)
    assert api.json("/queue" + query) == (status, {"error": error})


def test_a_channel_that_stays_busy_is_503_and_never_holds_the_request(tmp_path: Path, serve: Any) -> None:
    # Given a channel whose lock some thread holds (a stuck channel)
    server, api = serve(make_config(tmp_path), workers=0)
    channel = server.channels()["ratio_dbs"]
    with channel._lock:
        # When its queue is asked for, then the answer says so instead of waiting
        status, body = api.json("/queue?channel=ratio_dbs")
    assert (status, body) == (503, {"error": "channel 'ratio_dbs' is busy; ask again"})
    assert api.json("/queue?channel=ratio_dbs")[0] == 200


# ------------------------------------------------------------------ /history


def test_the_history_lists_finished_compactions_newest_first_and_filters_them_by_result(
    tmp_path: Path, serve: Any, dbs: Path,
) -> None:
    # Given three compactions: one that reclaims 7,500 bytes in 4 s, one busy, one that fails
    clock = FakeClock()
    compactor = ScriptedCompactor(clock, [(4.0, 10_000, 2_500), Busy("database is locked"),
                                          RuntimeError("disk I/O error")])
    server, api = serve(make_config(tmp_path), workers=1, clock=clock, compactors=[compactor])
    for name in ("a", "b", "c"):
        server.enqueue(str(dbs / f"{name}.db"))
        wait_for(lambda: compactor.calls == "abc".index(name) + 1 and api.json("/history")[1]["total"] == compactor.calls,
                 HANG_S, what=f"{name}.db finished")
        clock.advance(10)
    # When the operator reads the history
    status, body = api.json("/history")
    # Then each compaction is there, newest first, with its result, bytes, duration, error and retry
    assert status == 200
    assert [(row["key"], row["result"]) for row in body["history"]] == [
        (str(dbs / "c.db"), "failed"), (str(dbs / "b.db"), "busy"), (str(dbs / "a.db"), "ok")]
    failed, busy, ok = body["history"]
    assert ok == {"key": str(dbs / "a.db"), "at": FakeClock.START + 4.0, "channel": "ratio_dbs", "result": "ok",
                  "duration_s": 4.0, "size_before_bytes": 10_000, "size_after_bytes": 2_500, "error": None,
                  "reclaimed_bytes": 7_500, "retry_at": None}
    assert failed["error"] == "RuntimeError: disk I/O error" and failed["reclaimed_bytes"] == 0
    assert failed["retry_at"] == failed["at"] + 100.0  # the crash's backoff (backoff_base = 100s)
    assert busy["retry_at"] == busy["at"] + 60.0  # a busy database's retry
    assert (body["total"], body["offset"], body["next_offset"]) == (3, 0, None)
    # And a filter by result keeps only those, and pages them
    assert [row["key"] for row in api.json("/history?result=failed,busy")[1]["history"]] == [
        str(dbs / "c.db"), str(dbs / "b.db")]
    assert [row["result"] for row in api.json("/history?result=ok")[1]["history"]] == ["ok"]
    second = api.json("/history?limit=1&offset=1")[1]
    assert ([row["result"] for row in second["history"]], second["total"], second["next_offset"]) == (["busy"], 3, 2)
    assert api.json("/history?channel=slack_dbs")[1] == {"history": [], "total": 0, "offset": 0, "next_offset": None}


@pytest.mark.parametrize(("query", "error"), [
    ("?result=crashed", "unknown result 'crashed': one of ok, failed, busy, gone, interrupted, replaced, blocked"),
    ("?limit=1000", "limit must be at most 500, not 1000"),
    ("?channel=", "channel must be given once, and not empty"),
    ("?state=failed", "unknown parameter 'state': /history takes result, channel, offset and limit"),
])
def test_a_history_query_that_is_wrong_is_400_naming_what(tmp_path: Path, serve: Any, query: str, error: str) -> None:
    _server, api = serve(make_config(tmp_path), workers=0)
    assert api.json("/history" + query) == (400, {"error": error})


# ------------------------------------------------------------------ /series


def test_the_series_holds_the_last_hour_per_minute_from_what_the_daemon_counts(
    tmp_path: Path, serve: Any, dbs: Path,
) -> None:
    # Given a server on a clock at the start of a minute, whose start-up status summed the fleet
    clock = FakeClock(math.floor(FakeClock.START / MINUTE) * MINUTE)
    compactor = ScriptedCompactor(clock, [(5.0, 10_000, 2_500), RuntimeError("disk I/O error")])
    server, api = serve(make_config(tmp_path), workers=1, clock=clock, compactors=[compactor])
    start = clock()
    # When one compaction succeeds and, two minutes later, one fails
    server.enqueue(str(dbs / "a.db"))
    wait_for(lambda: server.counters.compactions.get(("ratio_dbs", "ok")) == 1, HANG_S, what="the success counted")
    clock.advance(2 * MINUTE)
    server.enqueue(str(dbs / "b.db"))
    wait_for(lambda: server.counters.compactions.get(("ratio_dbs", "failed")) == 1, HANG_S, what="the failure counted")
    status, series = api.json("/series")
    # Then the last sixty minutes are there, oldest first, the current one last
    assert status == 200
    assert series["bucket_s"] == MINUTE and series["now"] == clock()
    buckets = series["buckets"]
    assert len(buckets) == 60
    assert [b["at"] for b in buckets] == [start + (m - 57) * MINUTE for m in range(60)]
    # And each compaction is in the minute it ended, with its result and the bytes it gave back
    first, second = buckets[57], buckets[59]
    assert first["reclaimed_bytes"] == 7_500 and first["compactions"]["ok"] == 1
    assert second["reclaimed_bytes"] == 0 and second["compactions"] == {
        "ok": 0, "failed": 1, "busy": 0, "gone": 0, "interrupted": 0, "replaced": 0, "blocked": 0}
    # And the fleet's reclaimable bytes as the status record summed them at start
    assert isinstance(first["reclaimable_bytes"], int)
    assert buckets[0]["reclaimable_bytes"] is None and buckets[0]["compactions"]["ok"] == 0
    # And an hour later they have left the series
    clock.advance(60 * MINUTE)
    later = api.json("/series")[1]["buckets"]
    assert all(b["reclaimed_bytes"] == 0 and not any(b["compactions"].values()) for b in later)


# ------------------------------------------------------------------ the page's files


def test_the_page_is_served_at_the_root_with_its_own_files_and_headers_that_keep_it_to_itself(
    tmp_path: Path, serve: Any,
) -> None:
    _server, api = serve(make_config(tmp_path), workers=0)
    status, headers, body = api.get("/")
    assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    csp = headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp and "connect-src 'self'" in csp
    assert headers["X-Frame-Options"] == "DENY" and headers["X-Content-Type-Options"] == "nosniff"
    # Every file the page names is served, with its type, and nothing from elsewhere is named
    names = re.findall(r'(?:src|href)="([^"]+)"', body.decode())
    assert sorted(names) == ["#main", "/ui/page.css", "/ui/page.js", "data:,"]
    types = {"/ui/page.css": "text/css; charset=utf-8", "/ui/page.js": "text/javascript; charset=utf-8"}
    for name, content_type in types.items():
        status, headers, file_body = api.get(name)
        assert (status, headers["Content-Type"]) == (200, content_type)
        assert file_body and headers["Cache-Control"] == "no-cache"
        # A browser that holds the same copy gets 304 and no body
        again = api.get(name, **{"If-None-Match": headers["ETag"]})
        assert (again[0], again[2]) == (304, b"")
    # And only those names: nothing else under /ui/ reaches the file system
    for path in ("/ui/", "/ui/index.html", "/ui/../http.py", "/ui/%2e%2e/page.py", "/ui/page.js/x", "/ui/PAGE.JS"):
        status, _headers, body = api.get(path)
        assert status == 404, path
        assert json.loads(body) == {"error": f"no such file of the page: {path}"}


def test_a_rebound_host_cannot_load_the_page(tmp_path: Path, serve: Any) -> None:
    _server, api = serve(make_config(tmp_path), workers=0)
    for path in ("/", "/ui/page.js", "/queue?channel=ratio_dbs", "/history", "/series"):
        assert api.get(path, Host=f"rebind.evil.example:{api.port}")[0] == 403, path
