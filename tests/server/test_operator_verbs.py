"""The operator's verbs in process (issue 14): flush forgets staleness, enqueue --force, explain, /jobs paging."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from compactor.dbfactory import make_bloated_db
from helpers.daemon import wait_for
from server.test_server import FailingCompactor, FakeClock, make_config

#: Channels stay in their start-up pause: what is queued stays queued.
PAUSED = "wait_secs = 3600"


def real(path: Path) -> Path:
    return Path(os.path.realpath(path))


def verdict(server: Any, key: str) -> tuple[str, str | None, str | None]:
    (v,) = server.enqueue_and_wait([key])
    return v.outcome, v.channel, v.reason


def test_a_flushed_key_enqueued_again_at_once_is_queued_not_stale(tmp_path: Path, running: Any) -> None:
    # Given a bloated database queued in its (paused) channel, fresh in the staleness table
    server = running(make_config(tmp_path, extra=PAUSED), workers=0)
    key = str(real(tmp_path) / "dbs" / "tenant.db")
    make_bloated_db(key, delete_fraction=0.9)
    assert verdict(server, key)[:2] == ("queued", "ratio_dbs")
    assert verdict(server, key)[0] == "not_queued"  # stale: the throttle works
    # When the operator flushes its channel
    assert server.flush("ratio_dbs") == 1
    # Then the key, enqueued again right away, is queued again rather than dropped as stale
    assert verdict(server, key)[:2] == ("queued", "ratio_dbs")
    assert server.channels()["ratio_dbs"].status()["waiting"]["size"] == 1


def test_a_flush_of_another_channel_keeps_the_staleness_of_keys_it_did_not_drop(
    tmp_path: Path, running: Any
) -> None:
    server = running(make_config(tmp_path, extra=PAUSED), workers=0)
    key = str(real(tmp_path) / "dbs" / "tenant.db")
    make_bloated_db(key, delete_fraction=0.9)
    assert verdict(server, key)[:2] == ("queued", "ratio_dbs")
    assert server.flush("slack_dbs") == 0
    outcome, _, reason = verdict(server, key)
    assert outcome == "not_queued" and reason is not None and reason.startswith("stale until ")


# -- enqueue --force (DESIGN §11) ---------------------------------------------------------------------


def record_of(server: Any, key: str) -> dict[str, Any]:
    return {j["key"]: j for j in server.jobs_table()}.get(key, {})


def test_a_forced_database_below_every_threshold_is_compacted_during_the_start_up_pause(
    tmp_path: Path, running: Any
) -> None:
    # Given a channel still in its start-up pause, and a database too small for any channel
    server = running(make_config(tmp_path, extra=PAUSED), workers=1)
    key = str(real(tmp_path) / "dbs" / "tiny.db")
    make_bloated_db(key, rows=10)
    outcome, _, reason = verdict(server, key)
    assert outcome == "not_queued" and reason is not None and reason.startswith("below every channel's threshold")
    # When it is forced
    (v,) = server.enqueue_and_wait([key], force=True)
    # Then it is queued in the first channel that is not an upgrade channel, at the top, and compacted now
    assert (v.outcome, v.channel, v.priority, v.reason) == ("queued", "ratio_dbs", math.inf, "forced")
    wait_for(lambda: record_of(server, key).get("state") == "finished", 20, what="the forced compaction")


def test_a_forced_key_skips_staleness_and_its_crash_backoff(tmp_path: Path, running: Any, dbs: Path) -> None:
    # Given a key whose compaction crashed: it waits out a 100 s backoff on a clock that stands still
    clock = FakeClock()
    compactor = FailingCompactor(RuntimeError("disk I/O error"))
    server = running(make_config(tmp_path), workers=1, clock=clock, compactors=[compactor])
    key = str(dbs / "x.db")
    server.enqueue(key)
    wait_for(lambda: record_of(server, key).get("error_count") == 1, 20, what="the first failure")
    assert record_of(server, key)["state"] == "crashing"
    assert server.enqueue_and_wait([key])[0].outcome == "not_queued"  # stale, and backing off anyway
    # When it is forced
    server.enqueue(key, force=True)
    # Then it runs again at once, no time having passed
    wait_for(lambda: compactor.calls == 2, 20, what="the forced retry")
    assert clock() == FakeClock()()


def test_a_forced_key_still_waits_for_a_resume_and_says_so(tmp_path: Path, running: Any) -> None:
    server = running(make_config(tmp_path), workers=1)
    key = str(real(tmp_path) / "dbs" / "tenant.db")
    make_bloated_db(key, delete_fraction=0.9)
    server.suspend("ratio_dbs")
    (v,) = server.enqueue_and_wait([key], force=True)
    assert (v.outcome, v.channel) == ("queued", "ratio_dbs")
    assert v.reason == "forced; held back: channel ratio_dbs is suspended (it starts when resumed)"
    server.tick()
    assert record_of(server, key)["state"] == "pending"
    server.resume("ratio_dbs")
    wait_for(lambda: record_of(server, key).get("state") == "finished", 20, what="the compaction after the resume")


def test_a_forced_key_held_back_by_max_jobs_and_the_concurrency_says_so(tmp_path: Path, running: Any) -> None:
    # Given max_jobs 1 taken by a job no worker runs (no workers: it stays starting)
    server = running(make_config(tmp_path, extra="max_jobs = 1"), workers=0)
    first, second = (str(real(tmp_path) / "dbs" / name) for name in ("first.db", "second.db"))
    for key in (first, second):
        make_bloated_db(key, delete_fraction=0.9)
    assert verdict(server, first)[0] == "queued"
    wait_for(lambda: server.status()["channels"]["ratio_dbs"]["starting"] == 1, 10, what="the first job")
    (v,) = server.enqueue_and_wait([second], force=True)
    assert v.reason == ("forced; held back: channel ratio_dbs is at its concurrency (1 running); "
                        "all 1 max_jobs slots are busy")


def test_force_keeps_the_roots_and_the_ignore_list(tmp_path: Path, running: Any) -> None:
    dbs = real(tmp_path) / "dbs"
    ignored = str(dbs / "ignored.db")
    server = running(make_config(tmp_path, channels=f"[smoosh.ignore]\n{ignored} = true\n"), workers=0)
    make_bloated_db(ignored, delete_fraction=0.9)
    outside = str(real(tmp_path) / "outside.db")
    make_bloated_db(outside, delete_fraction=0.9)
    results = server.enqueue_and_wait([outside, ignored], force=True)
    assert [(v.outcome, v.reason) for v in results] == [
        ("rejected", f"outside roots ({dbs})"), ("not_queued", "ignored ([smoosh.ignore])"),
    ]
