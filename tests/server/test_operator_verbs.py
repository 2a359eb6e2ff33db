"""The operator's verbs in process (issue 14): flush forgets staleness, enqueue --force, explain, /jobs paging."""

from __future__ import annotations

import math
import os
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from compactor.dbfactory import make_bloated_db
from helpers.clocks import FakeClock
from helpers.daemon import HANG_S, wait_for
from helpers.jobs_table import record_of
from server.test_server import FailingCompactor, make_config
from smoosh.compactors.base import Busy
from smoosh.daemon.control.cluster_holds import ClusterHolds
from smoosh.daemon.intake.verdicts import utc_text
from smoosh.store import open_store

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
    wait_for(lambda: record_of(server, key).get("state") == "finished", HANG_S, what="the forced compaction")


def test_a_forced_key_skips_staleness_and_its_crash_backoff(tmp_path: Path, running: Any, dbs: Path) -> None:
    # Given a key whose compaction crashed: it waits out a 100 s backoff on a clock that stands still
    clock = FakeClock()
    compactor = FailingCompactor(RuntimeError("disk I/O error"))
    server = running(make_config(tmp_path), workers=1, clock=clock, compactors=[compactor])
    key = str(dbs / "x.db")
    server.enqueue(key)
    wait_for(lambda: record_of(server, key).get("error_count") == 1, HANG_S, what="the first failure")
    assert record_of(server, key)["state"] == "crashing"
    assert server.enqueue_and_wait([key])[0].outcome == "not_queued"  # stale, and backing off anyway
    # When it is forced
    server.enqueue(key, force=True)
    # Then it runs again at once, no time having passed
    wait_for(lambda: compactor.calls == 2, HANG_S, what="the forced retry")
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
    wait_for(lambda: record_of(server, key).get("state") == "finished", HANG_S, what="the compaction after the resume")


def test_a_forced_key_held_back_by_max_jobs_and_the_concurrency_says_so(tmp_path: Path, running: Any) -> None:
    # Given max_jobs 1 taken by a job no worker runs (no workers: it stays starting)
    server = running(make_config(tmp_path, extra="max_jobs = 1"), workers=0)
    first, second = (str(real(tmp_path) / "dbs" / name) for name in ("first.db", "second.db"))
    for key in (first, second):
        make_bloated_db(key, delete_fraction=0.9)
    assert verdict(server, first)[0] == "queued"
    wait_for(lambda: server.status()["channels"]["ratio_dbs"]["starting"] == 1, HANG_S, what="the first job")
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


# -- explain (DESIGN §11) ---------------------------------------------------------------------------------


def test_explain_of_a_queued_key_gives_its_channel_position_and_what_holds_it_back(
    tmp_path: Path, running: Any
) -> None:
    server = running(make_config(tmp_path, extra=PAUSED), workers=0)
    key = str(real(tmp_path) / "dbs" / "tenant.db")
    make_bloated_db(key, delete_fraction=0.9)
    (v,) = server.enqueue_and_wait([key])
    answer = server.explain(key)
    # The channel keeps the pause's end on the monotonic clock; explain tells it in wall time.
    pause_ends = answer["channels"]["ratio_dbs"]["paused_until"]
    assert time.time() < pause_ends <= time.time() + 3600
    assert (answer["state"], answer["channel"]) == ("queued", "ratio_dbs")
    assert answer["reason"] == (f"queued in channel ratio_dbs at priority {v.priority:g}, position 1; held back: "
                                f"channel ratio_dbs is in its start-up pause until {utc_text(pause_ends)}")
    ratio = answer["channels"]["ratio_dbs"]
    assert (ratio["state"], ratio["place"], ratio["position"], ratio["queued_priority"]) == ("queued", "queue", 1, v.priority)
    assert ratio["thresholds"]["min_size"] == 65536 and ratio["thresholds"]["priority"] == "ratio"
    assert answer["channels"]["upgrade_dbs"]["state"] == "not_queued"
    assert answer["channels"]["upgrade_dbs"]["reason"] == "no upgrade needed"
    assert answer["stale_until"] is not None  # a channel took it just now


def test_explain_below_threshold_uses_the_words_of_enqueue_wait_and_changes_nothing(
    tmp_path: Path, running: Any
) -> None:
    server = running(make_config(tmp_path, extra=PAUSED), workers=0)
    tiny = str(real(tmp_path) / "dbs" / "tiny.db")
    bloated = str(real(tmp_path) / "dbs" / "bloated.db")
    make_bloated_db(tiny, rows=10)
    make_bloated_db(bloated, delete_fraction=0.9)
    # Explained before anything enqueued them: nothing is queued or made stale by it
    answer = server.explain(bloated)
    assert answer["state"] == "not_queued"
    assert answer["reason"].startswith("not queued, though channel ratio_dbs would take it at priority ")
    assert all(ch["waiting"]["size"] == 0 for ch in server.status()["channels"].values())
    assert verdict(server, bloated)[:2] == ("queued", "ratio_dbs")
    explained = server.explain(tiny)
    (v,) = server.enqueue_and_wait([tiny])
    assert explained["reason"] == v.reason
    assert explained["channels"]["ratio_dbs"]["reason"] == f"file {os.path.getsize(tiny)} bytes <= min_size 65536"


def test_explain_rejects_with_the_words_of_enqueue_wait(tmp_path: Path, running: Any) -> None:
    server = running(make_config(tmp_path), workers=0)
    dbs = real(tmp_path) / "dbs"
    (dbs / "random.db").write_bytes(os.urandom(4096))
    keys = [str(dbs / "missing.db"), str(dbs / "random.db"), str(real(tmp_path) / "elsewhere.db"), "relative.db"]
    verdicts = server.enqueue_and_wait(keys)
    answers = [server.explain(key) for key in keys]
    assert [a["state"] for a in answers] == ["rejected"] * 4
    assert [a["reason"] for a in answers] == [v.reason for v in verdicts]
    assert answers[0]["reason"] == "no such file" and answers[3]["reason"] == "not an absolute path"


def test_explain_of_a_crashing_key_gives_its_backoff_and_crashes(tmp_path: Path, running: Any, dbs: Path) -> None:
    clock = FakeClock()
    compactor = FailingCompactor(RuntimeError("disk I/O error"))
    server = running(make_config(tmp_path), workers=1, clock=clock, compactors=[compactor])
    key = str(dbs / "x.db")
    (dbs / "x.db").touch()  # the compactor double reads nothing, but explain checks the file is there
    server.enqueue(key)
    wait_for(lambda: server.explain(key)["state"] == "crashing", HANG_S, what="the first failure")
    answer = server.explain(key)
    retry_at = clock() + 100  # backoff_base 100 s, one crash
    assert answer["crashes"] == {"consecutive": 1, "error_count": 1, "last_error": "RuntimeError: disk I/O error",
                                 "retry_at": retry_at}
    assert answer["channels"]["ratio_dbs"]["not_before"] == retry_at
    assert answer["reason"] == (f"crashing: waits out its crash backoff in channel ratio_dbs until {utc_text(retry_at)} "
                                "(1 consecutive crash(es); last error: RuntimeError: disk I/O error)")


def test_explain_gives_a_closed_window_and_its_next_opening(tmp_path: Path, running: Any) -> None:
    # Given a channel whose one-minute window is closed at the test's clock (03:30 UTC)
    clock = FakeClock(datetime(2024, 5, 17, 3, 30, tzinfo=timezone.utc).timestamp())
    config = make_config(tmp_path, extra="db_channels = night_dbs",
                         channels="[smoosh.night_dbs]\nmin_size = 64KiB\nfrom = 23:00\nto = 23:01\n")
    server = running(config, workers=0, clock=clock)
    key = str(real(tmp_path) / "dbs" / "tenant.db")
    make_bloated_db(key, delete_fraction=0.9)
    assert verdict(server, key)[:2] == ("queued", "night_dbs")
    night = server.explain(key)["channels"]["night_dbs"]
    opens = datetime(2024, 5, 17, 23, 0, tzinfo=timezone.utc).timestamp()
    assert (night["window"], night["in_window"], night["next_open"]) == ("23:00-23:01 UTC", False, opens)
    assert night["holds"] == [f"channel night_dbs is outside its window 23:00-23:01 UTC (it opens at {utc_text(opens)})"]


# -- /jobs paging ------------------------------------------------------------------------------------------


def test_the_jobs_table_pages_by_state_limit_and_offset(tmp_path: Path, running: Any, dbs: Path) -> None:
    # Given three queued keys (paused: they stay pending) and one that crashed
    clock = FakeClock()
    compactor = FailingCompactor(RuntimeError("disk I/O error"))
    server = running(make_config(tmp_path), workers=1, clock=clock, compactors=[compactor])
    crashing = str(dbs / "crash.db")
    server.enqueue(crashing)
    wait_for(lambda: record_of(server, crashing).get("state") == "crashing", HANG_S, what="the crash")
    server.suspend()
    pending = [str(dbs / f"p{i}.db") for i in range(3)]
    for key in pending:
        clock.advance(1)
        server.enqueue(key)
        wait_for(lambda: record_of(server, key).get("state") == "pending", HANG_S, what="the key queued")
    # Then state filters, and limit and offset page the most recent first
    rows, total = server.jobs_page(states=frozenset({"pending"}), limit=2)
    assert ([r["key"] for r in rows], total) == (pending[::-1][:2], 3)
    rows, total = server.jobs_page(states=frozenset({"pending"}), limit=2, offset=2)
    assert ([r["key"] for r in rows], total) == ([pending[0]], 3)
    rows, total = server.jobs_page(states=frozenset({"crashing", "finished"}))
    assert ([r["key"] for r in rows], total) == ([crashing], 1)


def test_a_cluster_hold_still_holds_a_forced_key_and_explain_names_it(tmp_path: Path, running: Any) -> None:
    # Given a cluster hold on every channel of this node, set in the store the server uses
    store = open_store("memory:")
    ClusterHolds(store).hold("t", None, by="ops@admin", at=1_700_000_000.0)
    server = running(make_config(tmp_path), store=store, workers=1)
    key = str(real(tmp_path) / "dbs" / "tenant.db")
    make_bloated_db(key, delete_fraction=0.9)
    # When a key is forced
    (v,) = server.enqueue_and_wait([key], force=True)
    # Then it waits, and both the result and explain say why
    held = "channel ratio_dbs is held by a cluster hold set by ops@admin (it starts when `smoosh resume --store` clears it)"
    assert (v.outcome, v.reason) == ("queued", f"forced; held back: {held}")
    assert server.explain(key)["channels"]["ratio_dbs"]["holds"] == [held]
    assert server.jobs.list_jobs() == []


def test_explain_of_a_starved_key_gives_its_busy_count(tmp_path: Path, running: Any, dbs: Path) -> None:
    # Given a database busy on every try, and busy_retries 1: the second busy result starves it
    clock = FakeClock()
    compactor = FailingCompactor(Busy("database is locked"))
    server = running(make_config(tmp_path, extra="busy_retries = 1"), workers=1, clock=clock, compactors=[compactor])
    key = str(dbs / "x.db")
    (dbs / "x.db").touch()
    server.enqueue(key)
    wait_for(lambda: compactor.calls == 1 and record_of(server, key).get("retry_at"), HANG_S, what="the first busy")
    clock.advance(61)
    server.tick(clock())
    wait_for(lambda: record_of(server, key).get("state") == "starved", HANG_S, what="the second busy")
    answer = server.explain(key)
    assert (answer["state"], answer["channel"], answer["busy"]) == (
        "starved", "ratio_dbs", {"count": 2, "starved_since": clock()})
    assert answer["reason"].startswith("starved in channel ratio_dbs: its database was busy more than busy_retries "
                                       "times in a row, next try at ")


def test_explain_after_a_restart_calls_a_key_in_crash_backoff_crashing_with_its_not_before_and_count(
    tmp_path: Path, running: Any, dbs: Path
) -> None:
    # Given a key whose compaction crashed, on a store that survives the daemon
    clock = FakeClock()
    store = f"sqlite:{tmp_path / 'state' / 'jobs.db'}"
    config = make_config(tmp_path, extra=f"store = {store}")
    compactor = FailingCompactor(RuntimeError("disk I/O error"))
    first = running(config, workers=1, clock=clock, compactors=[compactor])
    key = str(dbs / "x.db")
    (dbs / "x.db").touch()
    first.enqueue(key)
    wait_for(lambda: first.explain(key)["state"] == "crashing", HANG_S, what="the first failure")
    retry_at = clock() + 100  # backoff_base 100 s, one crash
    first.stop()
    # When the daemon starts again and the key comes in again (a scan, an event, an operator)
    again = running(config, workers=1, clock=clock, compactors=[FailingCompactor(RuntimeError("disk I/O error"))])
    again.enqueue(key)
    wait_for(lambda: again.explain(key)["channels"]["ratio_dbs"]["place"] == "deferred", HANG_S,
             what="the key deferred in its channel")
    # Then explain calls it crashing, waiting out its crash backoff, with its not-before time and
    # count, not "busy"; and /jobs agrees
    answer = again.explain(key)
    assert answer["state"] == "crashing"
    assert answer["reason"] == (f"crashing: waits out its crash backoff in channel ratio_dbs until "
                                f"{utc_text(retry_at)} (1 consecutive crash(es); last error: RuntimeError: disk I/O error)")
    assert record_of(again, key)["state"] == "crashing"


def test_explain_of_a_blocked_key_says_blocked_and_its_backoff_not_crashing_nor_busy(
    tmp_path: Path, running: Any, dbs: Path
) -> None:
    from smoosh.compactors.base import Blocked

    clock = FakeClock()
    server = running(make_config(tmp_path), workers=1, clock=clock,
                     compactors=[FailingCompactor(Blocked("a reader holds the WAL: 4096 bytes"))])
    key = str(dbs / "x.db")
    (dbs / "x.db").touch()
    server.enqueue(key)
    wait_for(lambda: record_of(server, key).get("retry_at"), HANG_S, what="the block")
    retry_at = clock() + 100  # backoff_base 100 s, backed off like one crash
    answer = server.explain(key)
    assert (answer["state"], answer["result"]) == ("queued", "blocked")
    assert answer["reason"] == (f"queued in channel ratio_dbs, blocked: waits out its backoff until {utc_text(retry_at)} "
                                "(last error: blocked: a reader holds the WAL: 4096 bytes)")
    row = record_of(server, key)
    assert (row["state"], row["result"]) == ("pending", "blocked")
