"""Crash history and backoff: the replication scheduler's vectors, plus smoosh's own rules."""

from __future__ import annotations

import pytest

from smoosh.daemon.history import (
    ADDED,
    BLOCKED,
    BUSY,
    BUSY_RETRY_S,
    CRASHED,
    DROPPED,
    FINISHED,
    NOTHING_TO_DO_REASON,
    STARTED,
    STOPPED,
    Event,
    HistoryTable,
    KeyRecord,
    backoff_s,
    consecutive_crashes,
    decode_record,
    encode_record,
    longest_backoff_s,
)


def crashed(t: float = 0) -> Event:
    return Event(CRASHED, t, "boom")


def started(t: float = 0) -> Event:
    return Event(STARTED, t)


def stopped(t: float = 0) -> Event:
    return Event(STOPPED, t)


def added(t: float = 0) -> Event:
    return Event(ADDED, t)


@pytest.mark.parametrize(
    ("expected", "history"),
    [
        (0, []),
        (0, [added()]),
        (0, [stopped()]),
        (0, [crashed()]),
        (1, [crashed(), added()]),
        (1, [crashed(), crashed()]),
        (1, [crashed(), stopped()]),
        (3, [crashed(), crashed(), crashed(), added()]),
        (2, [crashed(), crashed(), stopped()]),
        (1, [crashed(), started(), added()]),
        (2, [crashed(3), started(2), crashed(1), started(0)]),
        (0, [stopped(3), started(2), crashed(1), started(0)]),
        (1, [crashed(3), started(2), stopped(1), started(0)]),
        (0, [crashed(999), started(0)]),
        (1, [crashed(999), started(998), crashed(997), started(0)]),
    ],
)
def test_consecutive_crashes_match_the_replication_scheduler(expected: int, history: list[Event]) -> None:
    assert consecutive_crashes(history, 120) == expected


@pytest.mark.parametrize(("expected", "history", "threshold"), [
    (0, [crashed(11), started(0)], 10),
    (1, [crashed(10), started(0)], 10),
])
def test_consecutive_crashes_with_a_custom_health_threshold(expected: int, history: list[Event], threshold: float) -> None:
    assert consecutive_crashes(history, threshold) == expected


@pytest.mark.parametrize(("factor", "crashes"), [
    (1, 1), (2, 2), (4, 3), (8, 4), (16, 5), (32, 6), (64, 7), (128, 8), (256, 9), (512, 10), (1024, 11), (1024, 12),
])
def test_backoff_doubles_per_crash_and_caps_at_two_to_the_tenth(factor: int, crashes: int) -> None:
    assert backoff_s(crashes, 30.0) == factor * 30.0


def test_no_crash_means_no_backoff() -> None:
    assert backoff_s(0, 30.0) == 0.0


def test_crash_loop_backs_off_30_then_60_then_120_seconds() -> None:
    table = HistoryTable(backoff_base_s=30.0, health_threshold_s=120.0)
    now = 1000.0
    waits = []
    table.record("/db", ADDED, now)
    for _ in range(3):
        table.record("/db", STARTED, now)
        rec = table.record("/db", CRASHED, now + 1, reason="disk I/O error")
        waits.append(rec.retry_at - (now + 1))
        now = rec.retry_at
    assert waits == [30.0, 60.0, 120.0]
    assert rec.state == "crashing"
    assert rec.error_count == 3
    assert rec.last_error == "disk I/O error"


def test_a_crash_after_a_long_healthy_run_starts_the_backoff_again() -> None:
    table = HistoryTable(backoff_base_s=30.0, health_threshold_s=120.0)
    table.record("/db", STARTED, 0)
    table.record("/db", CRASHED, 1)
    table.record("/db", STARTED, 31)
    rec = table.record("/db", CRASHED, 31 + 500)
    assert rec.retry_at == 531 + 30.0


def test_due_returns_keys_whose_backoff_ended_once() -> None:
    table = HistoryTable(backoff_base_s=30.0)
    table.record("/a", STARTED, 0)
    table.record("/a", CRASHED, 1)
    assert table.waiting_retry("/a")
    assert table.due(30.9) == []
    assert table.due(31.0) == ["/a"]
    assert table.due(100.0) == []
    assert not table.waiting_retry("/a")


def test_busy_database_is_retried_after_60_seconds_without_counting_a_crash() -> None:
    table = HistoryTable()
    rec = table.record("/db", BUSY, 10.0, reason="database is locked")
    assert rec.retry_at == 10.0 + BUSY_RETRY_S
    assert rec.error_count == 0
    assert rec.state == "pending"


def test_history_keeps_the_newest_max_history_events() -> None:
    table = HistoryTable(max_history=3)
    for t in range(10):
        table.record("/db", ADDED, float(t))
    rec = table.get("/db")
    assert [e.at for e in rec.events] == [9.0, 8.0, 7.0]


def test_only_the_newest_finished_keys_are_remembered() -> None:
    table = HistoryTable(max_finished=2)
    for i in range(4):
        table.record(f"/db{i}", FINISHED, float(i))
    table.record("/running", STARTED, 10.0)
    assert sorted(r.key for r in table.records()) == ["/db2", "/db3", "/running"]


def test_to_json_has_the_jobs_endpoint_shape() -> None:
    table = HistoryTable()
    table.record("/db", ADDED, 1.0, channel="ratio_dbs")
    table.record("/db", STARTED, 2.0)
    body = table.get("/db").to_json()
    assert set(body) >= {"key", "channel", "state", "progress", "error_count", "last_error", "last_updated", "history"}
    assert body["history"][0] == {"event": "started", "at": 2.0, "reason": None}
    assert body["channel"] == "ratio_dbs"


def test_crashing_keys_are_counted_per_channel_until_their_backoff_ends() -> None:
    table = HistoryTable(backoff_base_s=30.0)
    table.record("/a", STARTED, 0, channel="ratio_dbs")
    table.record("/a", CRASHED, 1, channel="ratio_dbs", reason="boom")  # retry at 31
    table.record("/b", STARTED, 0, channel="slack_dbs")
    table.record("/b", BLOCKED, 1, channel="slack_dbs", reason="blocked: a reader pins the WAL")  # retry at 31
    table.record("/c", BUSY, 1, channel="ratio_dbs")  # busy is not a crash
    table.restore(KeyRecord("/d", channel="ratio_dbs", state="crashing", retry_at=100.0))  # from the store
    assert table.crashing(30.9) == {"ratio_dbs": 2, "slack_dbs": 1}
    assert table.crashing(31.0) == {"ratio_dbs": 1}
    table.record("/d", STARTED, 50, channel="ratio_dbs")  # retried early (forced): no longer backing off
    assert table.crashing(50) == {}
    table.record("/a", STARTED, 60, channel="ratio_dbs")
    table.record("/a", CRASHED, 61, channel="ratio_dbs", reason="boom")
    assert table.crashing(61) == {"ratio_dbs": 1}
    table.forget("/a")
    assert table.crashing(61) == {}


@pytest.mark.parametrize("key", ["/db", "cleanup:/db"])
def test_a_blocked_key_is_not_called_crashing_its_result_is_blocked(key: str) -> None:
    # Given a key (a database's or its cleanup key) whose run ended blocked (a reader pins the WAL)
    table = HistoryTable(backoff_base_s=30.0)
    table.record(key, STARTED, 0, channel="index_cleanup")
    rec = table.record(key, BLOCKED, 1, channel="index_cleanup", reason="blocked: a reader holds the WAL")
    # Then /jobs shows it waiting (queued) out its backoff with the result blocked, never crashing
    body = rec.to_json()
    assert (body["state"], body["result"], body["retry_at"]) == ("pending", "blocked", 31.0)
    assert body["last_error"] == "blocked: a reader holds the WAL"
    # ... still counted by smoosh_crashing_jobs (failed or blocked, not yet due again), as documented
    assert table.crashing(30.9) == {"index_cleanup": 1}
    # ... queued again meanwhile, it stays so
    assert table.record(key, ADDED, 5, channel="index_cleanup").to_json()["result"] == "blocked"
    assert table.crashing(30.9) == {"index_cleanup": 1}
    # ... and a record an earlier smoosh stored as crashing reads back as what it is
    stored = decode_record(key, encode_record(KeyRecord(key, "index_cleanup", "crashing", retry_at=31.0,
                                                        events=rec.events.copy())))
    assert stored is not None
    table.restore(stored, now=1.0, mono=1.0)
    assert (table.get(key).state, table.get(key).result) == ("pending", "blocked")
    assert table.crashing(30.9) == {"index_cleanup": 1}


def test_the_result_of_a_key_is_its_last_run_in_the_result_vocabulary() -> None:
    table = HistoryTable()
    assert table.record("/a", ADDED, 0, channel="c").result is None
    assert table.record("/a", CRASHED, 1, reason="boom").result == "failed"
    assert table.record("/a", BUSY, 2).result == "busy"
    assert table.record("/a", FINISHED, 3, reason="reclaimed 5 bytes").result == "ok"
    assert table.record("/a", FINISHED, 4, reason="database gone").result == "gone"
    assert table.record("/a", STOPPED, 5).result == "interrupted"
    assert table.record("/a", STARTED, 6).result == "interrupted"  # a start is no end


def test_a_compacted_key_whose_later_run_finds_nothing_to_do_still_reads_finished_ok() -> None:
    # Given a database smoosh compacted, queued again by a later event
    table = HistoryTable()
    table.record("/a", STARTED, 0, channel="c")
    table.record("/a", FINISHED, 1, reason="reclaimed 5 bytes")
    table.record("/a", ADDED, 2, channel="c")
    # When its run's re-check finds nothing to reclaim
    rec = table.record("/a", DROPPED, 3, reason=NOTHING_TO_DO_REASON)
    # Then its work reads done, with its compaction's result, and the look is in its history
    assert (rec.state, rec.result, rec.progress) == ("finished", "ok", 1.0)
    assert [e["event"] for e in rec.to_json()["history"]][:2] == ["dropped", "added"]
    assert table.record("/a", DROPPED, 4, reason=NOTHING_TO_DO_REASON).state == "finished"


@pytest.mark.parametrize("before, reason, state, result", [
    (None, NOTHING_TO_DO_REASON, "dropped", None),  # never compacted here: nothing was done
    (CRASHED, NOTHING_TO_DO_REASON, "dropped", "failed"),  # its last compaction failed
    (FINISHED, "it is already being compacted by channel upgrade_dbs", "dropped", None),  # not a look
])
def test_a_drop_is_dropped_unless_it_only_found_a_compacted_key_with_nothing_to_do(
    before: str | None, reason: str, state: str, result: str | None,
) -> None:
    table = HistoryTable()
    table.record("/a", ADDED, 0, channel="c")
    if before is not None:
        table.record("/a", before, 1, reason="boom" if before == CRASHED else "reclaimed 5 bytes")
    rec = table.record("/a", DROPPED, 2, reason=reason)
    assert (rec.state, rec.result) == (state, result)


def test_a_crashing_key_queued_again_during_its_backoff_stays_crashing() -> None:
    table = HistoryTable(backoff_base_s=30.0)
    table.record("/a", STARTED, 0, channel="ratio_dbs")
    table.record("/a", CRASHED, 1, channel="ratio_dbs", reason="boom")
    assert table.record("/a", ADDED, 2, channel="ratio_dbs").state == "crashing"
    assert table.crashing(2) == {"ratio_dbs": 1}


def test_a_pinned_wal_is_remembered_from_its_first_block_through_the_store_until_it_is_emptied() -> None:
    from smoosh.compactors.sqlite_wal import pinned_reason
    from smoosh.daemon.history import WAL_PINNED_REASON

    # (the history knows a pinned WAL by the compactor's own words)
    pinned = "blocked: " + pinned_reason("/srv/t.db", readers=[])
    assert pinned.startswith(WAL_PINNED_REASON)
    table = HistoryTable(backoff_base_s=30.0)
    key = "cleanup:/srv/t.db"
    # Given a key blocked twice by a reader pinning its WAL, and once for another reason
    table.record(key, BLOCKED, 10.0, channel="index_cleanup", reason=pinned, mono=110.0)
    table.record(key, BLOCKED, 50.0, channel="index_cleanup", reason=pinned, mono=150.0)
    table.record(key, BUSY, 60.0, channel="index_cleanup", mono=160.0)
    # Then it is pinned since the first block, in both clocks
    assert (table.get(key).pinned_since, table.pinned()) == (10.0, {key: 110.0})
    # ... and a restart reads the moment back, its age counted on the new monotonic clock
    stored = decode_record(key, encode_record(table.get(key)))
    assert stored is not None and stored.pinned_since == 10.0
    again = HistoryTable()
    again.restore(stored, now=1010.0, mono=5.0)
    assert again.pinned() == {key: 5.0 - 1000.0}
    # ... until the log is emptied (a finished run)
    again.record(key, FINISHED, 1020.0, reason="reclaimed 5 bytes", mono=15.0)
    assert again.pinned() == {} and again.get(key).pinned_since is None
    # A block for another reason pins nothing
    assert table.record("/other.db", BLOCKED, 1.0, reason="blocked: read-only").pinned_since is None


# ------------------------------------------------------------------ two clocks (issue 25)

DAY_S = 86_400.0
WALL = 1_700_000_000.0
MONO = 500.0


def test_a_retry_waits_on_the_monotonic_clock_and_its_wall_time_follows_a_step() -> None:
    # Given a crash at WALL + 1 (monotonic MONO + 1) with a 30 s backoff
    table = HistoryTable(backoff_base_s=30.0)
    table.record("/a", STARTED, WALL, channel="ratio_dbs", mono=MONO)
    rec = table.record("/a", CRASHED, WALL + 1, channel="ratio_dbs", reason="boom", mono=MONO + 1)
    assert (rec.retry_at, rec.retry_mono) == (WALL + 31, MONO + 31)
    # When the wall clock steps back a day 10 s later
    table.wall_stepped(WALL + 10 - DAY_S, MONO + 10)
    # Then the wait still ends 30 s after the crash on the monotonic clock, and /jobs shows
    # the retry at the wall time it will happen at on the stepped clock
    assert table.crashing(MONO + 30.9) == {"ratio_dbs": 1} and table.crashing(MONO + 31) == {}
    assert table.get("/a").to_json()["retry_at"] == WALL + 31 - DAY_S
    assert table.due(MONO + 30.9) == [] and table.due(MONO + 31) == ["/a"]


@pytest.mark.parametrize(
    ("wall_now", "left_s"),
    [
        (WALL, 100.0),  # no step while it was down: the 100 s left
        (WALL + 40, 60.0),  # 40 s passed (or a step forward: the two look alike)
        (WALL - DAY_S, longest_backoff_s(30.0)),  # stepped back a day: capped at the longest backoff
    ],
)
def test_a_retry_time_read_from_the_store_leaves_its_wait_on_the_monotonic_clock(
    wall_now: float, left_s: float,
) -> None:
    table = HistoryTable(backoff_base_s=30.0)
    table.restore(KeyRecord("/a", channel="ratio_dbs", state="crashing", retry_at=WALL + 100), now=wall_now, mono=MONO)
    assert table.get("/a").retry_mono == MONO + left_s
    assert table.crashing(MONO + left_s - 0.1) == {"ratio_dbs": 1} and table.crashing(MONO + left_s) == {}


# ------------------------------------------------------------------ starvation (issue 16)


def busy_run(table: HistoryTable, key: str, at: float, channel: str = "ratio_dbs") -> str:
    """One run that ends busy, as the server records it; the key's state afterwards."""
    table.record(key, STARTED, at, channel=channel)
    return table.record(key, BUSY, at + 1, channel=channel, reason="database is locked").state


def test_more_than_busy_retries_busy_results_in_a_row_is_starved_until_a_success() -> None:
    table = HistoryTable(busy_retries=3)
    states = [busy_run(table, "/db", 100.0 * i) for i in range(5)]
    assert states == ["pending", "pending", "pending", "starved", "starved"]
    rec = table.get("/db")
    assert (rec.busy_count, rec.starved_since) == (5, 301.0)  # since its 4th busy result
    assert table.starved() == {"ratio_dbs": 1}
    # while it is retried it runs, and it is still counted as starved
    table.record("/db", STARTED, 600.0)
    assert table.get("/db").state == "running" and table.starved() == {"ratio_dbs": 1}
    # a success ends the row
    table.record("/db", FINISHED, 601.0, reason="reclaimed 10 bytes")
    assert (table.get("/db").busy_count, table.get("/db").starved_since) == (0, None)
    assert table.starved() == {}
    assert busy_run(table, "/db", 700.0) == "pending"


@pytest.mark.parametrize("other", [CRASHED, DROPPED])
def test_any_other_end_of_a_run_ends_the_row_of_busy_results(other: str) -> None:
    table = HistoryTable(busy_retries=2)
    for i in range(3):
        busy_run(table, "/db", 100.0 * i)
    assert table.get("/db").state == "starved"
    table.record("/db", other, 400.0, reason="boom")
    assert table.starved() == {}
    assert [busy_run(table, "/db", 500.0 + 100 * i) for i in range(3)] == ["pending", "pending", "starved"]


def test_busy_retries_zero_never_starves_and_a_live_change_applies_at_the_next_result() -> None:
    table = HistoryTable(busy_retries=0)
    assert {busy_run(table, "/db", 100.0 * i) for i in range(30)} == {"pending"}
    table.configure(max_history=20, health_threshold_s=120.0, backoff_base_s=30.0, busy_retries=5)
    assert busy_run(table, "/db", 5000.0) == "starved"


def test_a_starved_key_waiting_in_its_channel_stays_starved_when_its_events_queue_it_again() -> None:
    table = HistoryTable(busy_retries=1)
    busy_run(table, "/db", 0.0)
    busy_run(table, "/db", 100.0)
    table.record("/db", ADDED, 150.0, channel="ratio_dbs")
    assert table.get("/db").state == "starved"


def test_the_busy_count_goes_to_the_store_and_back() -> None:
    table = HistoryTable(busy_retries=2)
    for i in range(4):
        busy_run(table, "/db", 100.0 * i)
    rec = decode_record("/db", encode_record(table.snapshot("/db")))
    assert rec is not None
    assert (rec.state, rec.busy_count, rec.starved_since) == ("starved", 4, 201.0)
    after_restart = HistoryTable(busy_retries=2)
    after_restart.restore(rec)
    assert after_restart.starved() == {"ratio_dbs": 1}
    assert after_restart.get("/db").to_json()["busy_count"] == 4
