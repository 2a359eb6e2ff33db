"""The admin API driven over real sockets against a `smoosh run` subprocess (DESIGN §4.2)."""

from __future__ import annotations

import json

import pytest
from opslib import PausedDaemon, request

CHANNEL_FIELDS = {"active", "starting", "waiting", "paused", "suspended", "in_window", "reclaimable_bytes"}


def test_status_has_the_pinned_shape_and_prints_an_infinite_priority_as_the_string_infinity(paused: PausedDaemon) -> None:
    reply = request(paused.url + "/status")
    assert reply.status == 200
    assert reply.headers["Content-Type"] == "application/json"
    assert b"Infinity" not in reply.body
    body = reply.json()
    assert body["node"] == "testnode"
    assert set(body["channels"]) == {"upgrade_dbs", "ratio_dbs", "slack_dbs", "index_cleanup"}
    for name, channel in body["channels"].items():
        assert CHANNEL_FIELDS <= set(channel), name
        assert set(channel["waiting"]) == {"size", "min", "max"}
        assert isinstance(channel["reclaimable_bytes"], int)
        assert channel["paused"] is True and channel["in_window"] is True
    ratio = body["channels"]["ratio_dbs"]
    assert ratio["waiting"]["size"] == 3
    assert ratio["waiting"]["max"] == "infinity"
    assert isinstance(ratio["waiting"]["min"], (int, float)) and ratio["waiting"]["min"] > 0
    assert ratio["reclaimable_bytes"] > 0  # fresh.db's sizes are known: 90 % of it is dead
    assert body["reclaimable_bytes"] == sum(c["reclaimable_bytes"] for c in body["channels"].values())
    assert body["dry_run"] is False
    assert body["config_error"] is None


def test_jobs_lists_each_key_with_state_progress_errors_and_history(paused: PausedDaemon) -> None:
    reply = request(paused.url + "/jobs")
    assert reply.status == 200
    jobs = reply.json()["jobs"]
    by_key = {j["key"]: j for j in jobs}
    fresh = by_key[paused.fresh]
    assert {"key", "channel", "state", "progress", "error_count", "last_error", "last_updated", "history"} <= set(fresh)
    assert fresh["channel"] == "ratio_dbs"
    assert fresh["state"] == "pending"
    assert fresh["progress"] == 0.0 and fresh["error_count"] == 0 and fresh["last_error"] is None
    assert [e["event"] for e in fresh["history"]] == ["added"]
    assert set(fresh["history"][0]) == {"event", "at", "reason"}


@pytest.mark.parametrize("action", ["suspend", "resume", "flush"])
def test_an_unknown_channel_is_404_naming_it(paused: PausedDaemon, action: str) -> None:
    reply = request(f"{paused.url}/{action}", "POST", {"channel": "nosuch"})
    assert reply.status == 404
    assert reply.json() == {"error": "unknown channel 'nosuch'"}


def test_suspend_and_resume_show_in_the_status_read_right_after_the_answer(paused: PausedDaemon) -> None:
    reply = request(paused.url + "/suspend", "POST", {"channel": "upgrade_dbs"})
    assert (reply.status, reply.json()) == (200, {"ok": True, "action": "suspend", "channel": "upgrade_dbs"})
    status = request(paused.url + "/status").json()["channels"]
    assert status["upgrade_dbs"]["suspended"] is True
    assert status["ratio_dbs"]["suspended"] is False
    assert request(paused.url + "/resume", "POST", {"channel": "upgrade_dbs"}).status == 200
    assert request(paused.url + "/status").json()["channels"]["upgrade_dbs"]["suspended"] is False


def test_flush_empties_the_queue_before_answering(paused: PausedDaemon) -> None:
    assert request(paused.url + "/status").json()["channels"]["slack_dbs"]["waiting"]["size"] == 1
    reply = request(paused.url + "/flush", "POST", {"channel": "slack_dbs"})
    assert (reply.status, reply.json()) == (200, {"ok": True, "action": "flush", "channel": "slack_dbs", "dropped": 1})
    waiting = request(paused.url + "/status").json()["channels"]["slack_dbs"]["waiting"]
    assert waiting == {"size": 0, "min": 0, "max": 0}


@pytest.mark.parametrize(
    ("path", "raw", "error"),
    [
        ("/enqueue", b"{not json", "body is not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
        ("/enqueue", b"\xff\xfe", "body is not valid JSON: 'utf-8' codec can't decode byte 0xff in position 0: invalid start byte"),
        ("/enqueue", b"[]", "body must be a JSON object"),
        ("/enqueue", b"{}", "body lacks 'keys'"),
        ("/enqueue", b'{"keys": "/a.db"}', "'keys' must be a list of strings"),
        ("/enqueue", b'{"keys": ["/a.db", 7]}', "'keys'[1] is not a string"),
        ("/enqueue", json.dumps({"keys": ["/x"] * 10_001}).encode(), "'keys' holds 10001 keys; at most 10000"),
        ("/enqueue", json.dumps({"keys": ["/" + "a" * 4096]}).encode(), "'keys'[0] is longer than 4096 bytes"),
        ("/suspend", b'{"channel": 5}', "'channel' must be a string"),
        ("/flush", b'"ratio_dbs"', "body must be a JSON object"),
    ],
)
def test_bad_bodies_are_400_with_the_exact_reason_and_change_nothing(paused: PausedDaemon, path: str, raw: bytes, error: str) -> None:
    before = request(paused.url + "/status").json()
    reply = request(paused.url + path, "POST", raw=raw, headers={"Content-Type": "application/json"})
    assert reply.status == 400
    assert reply.json() == {"error": error}
    after = request(paused.url + "/status").json()
    assert after["channels"]["ratio_dbs"]["waiting"] == before["channels"]["ratio_dbs"]["waiting"]


def test_wrong_methods_and_unknown_paths_are_refused(paused: PausedDaemon) -> None:
    assert request(paused.url + "/enqueue").status == 405
    assert request(paused.url + "/status", "POST", {}).status == 405
    reply = request(paused.url + "/nope")
    assert (reply.status, reply.json()) == (404, {"error": "no such endpoint: /nope"})
