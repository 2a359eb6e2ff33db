"""The server in process: validation, routing, staleness, backoff, suspension, live config."""

from __future__ import annotations

import logging
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from helpers.clocks import FakeClock
from helpers.daemon import HANG_S, config_text, wait_for
from helpers.jobs_table import record_of, state_of
from compactor.dbfactory import integrity, make_bloated_db
from smoosh import InvalidKey
from smoosh.compactors.base import Busy, CompactionResult, Sizes
from smoosh.config import parse_config
from smoosh.errors import ConfigError
from smoosh.errors import UnknownChannel


def make_config(tmp_path: Path, extra: str = "", channels: str = "", roots: Path | None = None) -> Any:
    """A parsed config on tmp_path; ``extra`` lines (``key = value``) replace the [smoosh] defaults."""
    dbs = tmp_path / "dbs"
    state = tmp_path / "state"
    dbs.mkdir(exist_ok=True)
    state.mkdir(exist_ok=True)
    settings = {
        "watch": "",
        "roots": str(roots or dbs),
        "state_dir": str(state),
        "store": "memory:",
        "node": "t",
        "wait_secs": "0",
        "staleness": "5",
        "backoff_base": "100s",
    }
    text = config_text(settings, extra_global=extra, channels=channels)
    path = tmp_path / "smoosh.ini"
    path.write_text(text)
    return parse_config(text, str(path))


def test_keys_that_cannot_be_compacted_are_rejected_with_their_reason(tmp_path: Path, running: Any, dbs: Path) -> None:
    server = running(make_config(tmp_path), workers=0)
    cases = {
        "relative/path.db": "not an absolute path",
        "/etc/passwd": "outside roots",
        f"{dbs}-sibling/a.db": "outside roots",  # shares the root's name as a prefix
        f"{dbs}/a\x00b.db": "contains a NUL byte",
        "/" + "x" * 5000: "longer than 4096 bytes",
        "": "empty key",
    }
    for key, reason in cases.items():
        with pytest.raises(InvalidKey) as e:
            server.enqueue(key)
        assert reason in e.value.reason


def test_smooshs_own_state_is_never_a_key(tmp_path: Path, running: Any) -> None:
    state = tmp_path / "state"
    config = make_config(tmp_path, roots=tmp_path)
    server = running(config, workers=0)
    with pytest.raises(InvalidKey) as e:
        server.enqueue(str(state / "ratio_dbs.smooshq"))
    assert e.value.reason == "smoosh's own file"


def test_a_finished_compaction_writes_one_info_line_with_its_duration_and_sizes(
    tmp_path: Path, running: Any, dbs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = dbs / "tenant.db"
    make_bloated_db(str(db), rows=4000, delete_fraction=0.9)
    before = db.stat().st_size
    server = running(make_config(tmp_path), workers=1)
    with caplog.at_level(logging.INFO):
        caplog.clear()

        def about_db() -> list[str]:
            return [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO and repr(str(db)) in r.getMessage()]

        server.enqueue(str(db))
        # The line is written on the loop thread as it hears the end, which may come after the
        # job reads "finished": wait for both (a busy machine showed the gap).
        wait_for(lambda: state_of(server, str(db)) == "finished" and bool(about_db()), HANG_S,
                 what="the compaction to finish and write its line")
        lines = about_db()
    after = db.stat().st_size
    assert len(lines) == 1, lines
    match = re.fullmatch(rf"compacted {re.escape(repr(str(db)))} in \w+ in (\d+\.\d\d) s: "
                         rf"(\d+) -> (\d+) bytes, reclaimed (\d+) bytes", lines[0])
    assert match is not None, lines[0]
    assert (int(match[2]), int(match[3]), int(match[4])) == (before, after, before - after)


def test_keys_restored_from_a_checkpoint_count_in_the_reclaimable_bytes(
    tmp_path: Path, running: Any, dbs: Path
) -> None:
    # Given a bloated database queued (nothing runs: no worker) when the daemon stops
    db = dbs / "tenant.db"
    make_bloated_db(str(db), rows=4000, delete_fraction=0.9)
    config = make_config(tmp_path)
    first = running(config, workers=0)
    first.enqueue(str(db))
    wait_for(lambda: first.status()["reclaimable_bytes"] > 0, HANG_S, what="the key to be queued and measured")
    queued_bytes = first.status()["reclaimable_bytes"]
    first.stop()
    # When a new daemon restores it from the checkpoint (it measured nothing itself)
    second = running(config, workers=0)
    # Then the status table counts it again once it has been sized, not 0 B
    wait_for(lambda: second.status()["reclaimable_bytes"] == queued_bytes, HANG_S, what="the restored key to be sized")


def test_symlink_out_of_roots_is_refused(tmp_path: Path, running: Any, dbs: Path) -> None:
    outside = tmp_path / "outside.db"
    make_bloated_db(str(outside))
    (dbs / "link.db").symlink_to(outside)
    server = running(make_config(tmp_path), workers=0)
    with pytest.raises(InvalidKey) as e:
        server.enqueue(str(dbs / "link.db"))
    assert "outside roots" in e.value.reason


def test_bloated_database_enqueued_through_the_api_is_compacted(tmp_path: Path, running: Any, dbs: Path) -> None:
    db = dbs / "tenant.db"
    make_bloated_db(str(db), rows=4000, delete_fraction=0.9)
    before = db.stat().st_size
    server = running(make_config(tmp_path), workers=1)
    server.enqueue(str(db))

    def finished() -> bool:
        jobs = {j["key"]: j for j in server.jobs_table()}
        return jobs.get(str(db), {}).get("state") == "finished"

    wait_for(finished, HANG_S, what="the compaction to finish")
    assert db.stat().st_size < before / 3
    assert integrity(str(db)) == "ok"  # through apsw, as the server in this process opens it
    history = {j["key"]: j for j in server.jobs_table()}[str(db)]["history"]
    assert [e["event"] for e in history][:1] == ["finished"]
    assert history[0]["reason"].startswith("reclaimed ")


def test_a_key_accepted_recently_is_dropped_on_the_hot_path(tmp_path: Path, running: Any, dbs: Path) -> None:
    db = dbs / "a.db"
    make_bloated_db(str(db))
    server = running(make_config(tmp_path), workers=0, dry_run=True)
    server.enqueue(str(db))
    wait_for(lambda: server.status()["channels"]["ratio_dbs"]["waiting"]["size"] == 1, HANG_S, what="queued")
    examined = server.counters.enqueue_examined
    for _ in range(100):
        server.enqueue(str(db))
    assert server.counters.enqueue_stale == 100
    assert server.counters.enqueue_examined == examined


def test_channels_are_offered_a_key_in_the_order_the_operator_wrote(tmp_path: Path, running: Any, dbs: Path) -> None:
    db = dbs / "a.db"
    make_bloated_db(str(db))
    config = make_config(tmp_path, extra="db_channels = slack_dbs, ratio_dbs")
    server = running(config, workers=0, dry_run=True)
    server.enqueue(str(db))
    wait_for(lambda: server.status()["channels"]["slack_dbs"]["waiting"]["size"] == 1, HANG_S, what="queued in slack_dbs")
    status = server.status()
    assert status["channels"]["ratio_dbs"]["waiting"]["size"] == 0
    assert status["channels"]["slack_dbs"]["would_run"][0][0] == str(db)
    assert status["dry_run"] is True
    assert status["reclaimable_bytes"] > 0


def test_ignored_databases_are_never_queued(tmp_path: Path, running: Any, dbs: Path) -> None:
    kept, ignored = dbs / "kept.db", dbs / "skip-me.db"
    make_bloated_db(str(kept))
    make_bloated_db(str(ignored))
    config = make_config(tmp_path, channels=f"[smoosh.ignore]\n{dbs}/skip-* = true\n")
    server = running(config, workers=0, dry_run=True)
    server.enqueue(str(ignored))
    server.enqueue(str(kept))
    wait_for(lambda: server.status()["channels"]["ratio_dbs"]["waiting"]["size"] == 1, HANG_S, what="kept queued")
    assert [k for k, _ in server.status()["channels"]["ratio_dbs"]["would_run"]] == [str(kept)]


def test_a_match_pattern_gives_part_of_the_fleet_its_own_channel(tmp_path: Path, running: Any, dbs: Path) -> None:
    (dbs / "big").mkdir()
    big, small = dbs / "big" / "a.db", dbs / "b.db"
    make_bloated_db(str(big))
    make_bloated_db(str(small))
    config = make_config(
        tmp_path,
        extra="db_channels = big_dbs, ratio_dbs",
        channels=f"[smoosh.big_dbs]\npriority = ratio\nmin_size = 64KiB\nmatch = {dbs}/big/*\n",
    )
    server = running(config, workers=0, dry_run=True)
    server.enqueue(str(big))
    server.enqueue(str(small))
    wait_for(lambda: server.status()["channels"]["ratio_dbs"]["waiting"]["size"] == 1, HANG_S, what="small queued")
    wait_for(lambda: server.status()["channels"]["big_dbs"]["waiting"]["size"] == 1, HANG_S, what="big queued")
    assert server.status()["channels"]["big_dbs"]["would_run"][0][0] == str(big)


def test_a_missing_database_is_accepted_but_queued_nowhere(tmp_path: Path, running: Any, dbs: Path) -> None:
    server = running(make_config(tmp_path), workers=0, dry_run=True)
    server.enqueue(str(dbs / "not-there.db"))
    wait_for(lambda: server.counters.enqueue_examined >= 1, HANG_S, what="examined")
    assert all(ch["waiting"]["size"] == 0 for ch in server.status()["channels"].values())


class FailingCompactor:
    """Claims every absolute path; always fails (or reports busy) when compacting."""

    name = "failing"

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.calls = 0

    def claims(self, key: str) -> bool:
        return key.startswith("/")

    def sizes(self, key: str, *, exact: bool = False) -> Sizes | None:
        return Sizes(file_bytes=10 * 1024 * 1024, active_bytes=1024 * 1024)

    def exact_size_due(self, key: str) -> bool:
        return False

    def needs_upgrade(self, key: str) -> bool:
        return False

    def cleanup_priority(self, key: str) -> float:
        return 0.0

    def compact(self, key: str, ctx: Any) -> CompactionResult:
        self.calls += 1
        raise self.error


def test_a_compaction_that_keeps_failing_backs_off_exponentially(tmp_path: Path, running: Any, dbs: Path) -> None:
    clock = FakeClock()
    compactor = FailingCompactor(RuntimeError("disk I/O error"))
    server = running(make_config(tmp_path), workers=1, clock=clock, compactors=[compactor])
    key = str(dbs / "x.db")
    server.enqueue(key)

    waits = []
    for attempt in range(1, 4):
        wait_for(lambda: record_of(server, key).get("error_count") == attempt, HANG_S, what=f"failure {attempt}")
        rec = record_of(server, key)
        assert rec["state"] == "crashing"
        assert rec["last_error"] == "RuntimeError: disk I/O error"
        waits.append(rec["retry_at"] - rec["last_updated"])
        clock.advance(waits[-1] - 1)
        server.tick(clock())
        assert record_of(server, key)["error_count"] == attempt  # not retried before its time
        clock.advance(1)
        server.tick(clock())
    assert waits == [100.0, 200.0, 400.0]
    assert compactor.calls == 3


def test_a_busy_database_is_retried_and_not_counted_as_a_crash(tmp_path: Path, running: Any, dbs: Path) -> None:
    clock = FakeClock()
    compactor = FailingCompactor(Busy("database is locked"))
    server = running(make_config(tmp_path), workers=1, clock=clock, compactors=[compactor])
    key = str(dbs / "x.db")
    server.enqueue(key)
    wait_for(lambda: compactor.calls == 1 and record_of(server, key).get("retry_at"),
             HANG_S, what="the busy result")
    rec = {j["key"]: j for j in server.jobs_table()}[key]
    assert rec["error_count"] == 0
    assert rec["retry_at"] - rec["last_updated"] == 60.0
    clock.advance(59)
    server.tick(clock())
    assert compactor.calls == 1  # not retried before its time
    clock.advance(2)
    server.tick(clock())
    wait_for(lambda: compactor.calls == 2, HANG_S, what="the retry after 60 s")


def test_operator_suspension_survives_a_restart(tmp_path: Path, running: Any) -> None:
    config = make_config(tmp_path)
    first = running(config, workers=0)
    first.suspend()
    assert all(ch["suspended"] for ch in first.status()["channels"].values())
    first.stop()
    second = running(config, workers=0)
    assert all(ch["suspended"] for ch in second.status()["channels"].values())
    second.resume("ratio_dbs")
    status = second.status()["channels"]
    assert not status["ratio_dbs"]["suspended"]
    assert status["slack_dbs"]["suspended"]


def test_unknown_channel_is_an_error(tmp_path: Path, running: Any) -> None:
    server = running(make_config(tmp_path), workers=0)
    with pytest.raises(UnknownChannel):
        server.suspend("nope")


def test_a_channel_added_to_the_config_appears_and_a_removed_one_is_checkpointed(
    tmp_path: Path, running: Any, dbs: Path
) -> None:
    db = dbs / "a.db"
    make_bloated_db(str(db))
    server = running(make_config(tmp_path), workers=0, dry_run=True)
    server.enqueue(str(db))
    wait_for(lambda: server.status()["channels"]["ratio_dbs"]["waiting"]["size"] == 1, HANG_S, what="queued")
    server.apply_config(make_config(tmp_path, extra="db_channels = slack_dbs, extra_dbs"))
    names = set(server.status()["channels"])
    assert names == {"slack_dbs", "extra_dbs", "index_cleanup"}
    assert (tmp_path / "state" / "ratio_dbs.smooshq").exists()


def test_an_invalid_config_edit_is_rejected_whole_and_shown(tmp_path: Path, running: Any) -> None:
    server = running(make_config(tmp_path), workers=0)
    before = server.config
    server._on_config_change(ConfigError("smoosh.ini: [smoosh.ratio_dbs] capacity = '0': must be an integer >= 1"))
    assert server.config is before
    assert server.status()["config_error"] == "smoosh.ini: [smoosh.ratio_dbs] capacity = '0': must be an integer >= 1"
    server.apply_config(make_config(tmp_path))
    assert server.status()["config_error"] is None


class CountingCompactor(FailingCompactor):
    """Always looks bloated (as a database whose rows cannot fill its pages does) and succeeds."""

    def __init__(self) -> None:
        super().__init__(RuntimeError("unused"))
        self.file_bytes = 10 * 1024 * 1024

    def sizes(self, key: str, *, exact: bool = False) -> Sizes | None:
        return Sizes(file_bytes=self.file_bytes, active_bytes=self.file_bytes // 4)

    def compact(self, key: str, ctx: Any) -> CompactionResult:
        self.calls += 1
        return CompactionResult(size_before_bytes=self.file_bytes, size_after_bytes=self.file_bytes)


def test_a_compacted_file_that_has_not_grown_is_not_compacted_again(tmp_path: Path, running: Any, dbs: Path) -> None:
    clock = FakeClock()
    compactor = CountingCompactor()
    config = make_config(tmp_path, extra="staleness = 0\nexact_size_interval = 1h")
    server = running(config, workers=1, clock=clock, compactors=[compactor])
    key = str(dbs / "x.db")
    server.enqueue(key)
    wait_for(lambda: state_of(server, key) == "finished", HANG_S,
             what="the first compaction")
    for _ in range(3):
        examined = server.counters.enqueue_examined
        server.enqueue(key)
        wait_for(lambda: server.counters.enqueue_examined > examined, HANG_S, what="a re-examination")
    assert compactor.calls == 1
    assert all(ch["waiting"]["size"] == 0 for ch in server.status()["channels"].values())
    compactor.file_bytes += 4096  # the file grew: there may be something new to reclaim
    server.enqueue(key)
    wait_for(lambda: compactor.calls == 2, HANG_S, what="a compaction of the grown file")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the death is the point
def test_a_channel_that_crashes_is_restarted_from_its_checkpoint(tmp_path: Path, running: Any, dbs: Path) -> None:
    db = dbs / "a.db"
    make_bloated_db(str(db))
    server = running(make_config(tmp_path), workers=0, dry_run=True)
    server.enqueue(str(db))
    wait_for(lambda: [k for k, _ in server.channels()["ratio_dbs"].waiting()] == [str(db)], HANG_S, what="the key queued")
    crashed = server.channels()["ratio_dbs"]

    def die(now: float) -> None:
        raise SystemExit  # a BaseException: even that must not end the server's loop

    crashed.tick = die  # type: ignore[method-assign]
    server.wake("ratio_dbs")
    server.tick()
    restarted = server.channels()["ratio_dbs"]
    assert restarted is not crashed
    assert [k for k, _ in restarted.waiting()] == [str(db)]
    assert (tmp_path / "state" / "ratio_dbs.smooshq").exists()
    server.suspend("ratio_dbs")  # the registry answers for the channel at once: no 404 window
    assert restarted.status()["suspended"]


def test_status_answers_at_once_while_a_channel_is_stuck(tmp_path: Path, running: Any, dbs: Path) -> None:
    db = dbs / "a.db"
    make_bloated_db(str(db))
    server = running(make_config(tmp_path), workers=0, dry_run=True)
    server.enqueue(str(db))
    wait_for(lambda: server.status()["channels"]["ratio_dbs"]["reclaimable_bytes"] > 0, HANG_S, what="the estimate")
    before = server.status()["channels"]["ratio_dbs"]
    stuck = server.channels()["ratio_dbs"]
    answers: list[Any] = []
    with stuck._lock:  # the channel is stuck holding its lock, for as long as the test says
        asker = threading.Thread(target=lambda: answers.append(server.status()), daemon=True)
        asker.start()
        asker.join(HANG_S)
        # Answered while the lock is still held: status never waits for a channel's lock
        assert not asker.is_alive(), "status waited for the stuck channel"
    during = answers[0]["channels"]["ratio_dbs"]
    assert during["reclaimable_bytes"] == before["reclaimable_bytes"]
    assert during["would_run"] == before["would_run"]


class ExactOnlyCompactor(FailingCompactor):
    """Compact by its cheap estimate, bloated by its exact size (fragmented pages)."""

    def __init__(self) -> None:
        super().__init__(RuntimeError("unused"))
        self.exact_threads: list[str] = []

    def sizes(self, key: str, *, exact: bool = False) -> Sizes | None:
        if exact:
            self.exact_threads.append(threading.current_thread().name)
            return Sizes(file_bytes=10 * 1024 * 1024, active_bytes=1024 * 1024)
        return Sizes(file_bytes=10 * 1024 * 1024, active_bytes=10 * 1024 * 1024)

    def exact_size_due(self, key: str) -> bool:
        return True


def test_a_key_that_qualifies_only_on_its_exact_size_is_measured_off_the_examine_thread(
    tmp_path: Path, running: Any, dbs: Path
) -> None:
    compactor = ExactOnlyCompactor()
    server = running(make_config(tmp_path), workers=0, compactors=[compactor], dry_run=True)  # queue only
    keys = [str(dbs / f"x{i}.db") for i in range(20)]
    for key in keys:
        server.enqueue(key)
    wait_for(lambda: server.status()["channels"]["ratio_dbs"]["waiting"]["size"] == 20, HANG_S, what="all queued")
    assert len(compactor.exact_threads) == 20
    assert all(name.startswith("smoosh-measure") for name in compactor.exact_threads)
    assert server.status()["scan"]["examining"] == 0


def test_keys_wait_to_be_examined_while_a_batch_is_admitted_and_no_longer(
    tmp_path: Path, running: Any, dbs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import smoosh.daemon.intake.admission as admission_module

    # A caller admitting a batch (POST /enqueue) has the GIL to itself: its file checks are
    # system calls, each of which would otherwise wait for an examination's Python to yield.
    monkeypatch.setattr(admission_module, "ADMISSION_PAUSE_MAX_S", 30.0)
    db = dbs / "a.db"
    make_bloated_db(str(db))
    server = running(make_config(tmp_path), workers=0, dry_run=True)
    with server.intake.admitting():
        server.enqueue(str(db), require_file=True)
        time.sleep(0.3)  # what an examination takes, many times over
        assert server.counters.enqueue_examined == 0
    wait_for(lambda: server.status()["channels"]["ratio_dbs"]["waiting"]["size"] == 1, HANG_S, what="queued after the batch")
    assert server.counters.enqueue_examined == 1


def test_a_stream_of_batches_does_not_starve_the_examination(
    tmp_path: Path, running: Any, dbs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class CountingEvent(threading.Event):
        """The admission gate's "no batch being admitted" event, counting the waits that ran out."""

        def __init__(self) -> None:
            super().__init__()
            self.ran_out = 0

        def wait(self, timeout: float | None = None) -> bool:
            got = super().wait(timeout)
            self.ran_out += not got
            return got

    paths = []
    for i in range(5):
        paths.append(str(dbs / f"k{i}.db"))
        make_bloated_db(paths[-1])
    server = running(make_config(tmp_path), workers=0, dry_run=True)
    admitted = CountingEvent()
    admitted.set()
    monkeypatch.setattr(server.intake._gate, "_admitted", admitted)
    with server.intake.admitting():  # one spell of admission that never ends
        for path in paths:
            server.enqueue(path, require_file=True)
        wait_for(lambda: server.status()["channels"]["ratio_dbs"]["waiting"]["size"] == 5, HANG_S, what="all queued meanwhile")
    # Then the examination waited out the spell once (its one thread, the first key), not once per key
    assert admitted.ran_out == 1


def test_the_examination_lets_go_of_the_gil_between_keys(
    tmp_path: Path, running: Any, dbs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import smoosh.daemon.intake.admission as admission_module

    # A key measured from its admission's look is examined in Python alone, without a system
    # call: the threads bringing the next batch in must not wait for the switch interval.
    yields: list[str] = []
    monkeypatch.setattr(admission_module, "_yield", lambda: yields.append(threading.current_thread().name))
    paths = []
    for i in range(3):
        paths.append(str(dbs / f"y{i}.db"))
        make_bloated_db(paths[-1])
    server = running(make_config(tmp_path), workers=0, dry_run=True)
    for path in paths:
        server.enqueue(path, require_file=True)
    wait_for(lambda: server.counters.enqueue_examined == 3, HANG_S, what="all examined")
    assert len(yields) == 3 and all(name.startswith("smoosh-examine") for name in yields)
