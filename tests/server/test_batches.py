"""Small databases compacted in batches: one worker slot goes from one database to the next of its
channel, and each database reads exactly as a compaction of its own (issue 48, DESIGN §12).

Real SQLite files, the real compactor and worker, an in-process server on a ``memory:`` store. A
batch is seen from inside (the worker's thread takes the next key in its slot: the run goes on,
the channel's next run is handed to it); everything an operator reads (``/jobs``, the log line,
the metrics, the status) is compared with the same drain without batches.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from compactor.dbfactory import db_stats, integrity, make_bloated_db
from helpers.clocks import FakeClock
from helpers.daemon import HANG_S, wait_for
from helpers.jobs_table import record_of
from helpers.run_gates import Gate, GatedCompactor, gate_end
from smoosh import Server
from smoosh.compactors import SqliteCompactor
from smoosh.compactors.base import CompactionError
from smoosh.config import parse_config
from smoosh.daemon.results import read_rows
from smoosh.daemon.run import batch as batch_module
from smoosh.daemon.run.worker import Worker
from smoosh.jobs import Jobs

CHANNEL = "ratio_dbs"
#: Databases of a drain: each worth compacting, each of its own priority (the order is known).
DELETED = (0.9, 0.85, 0.8, 0.75, 0.7)


def config(tmp_path: Path, *, batch: str = "4MiB", channel: str = "", extra: str = "") -> Any:
    dbs = tmp_path / "dbs"
    dbs.mkdir(exist_ok=True)
    text = f"""[smoosh]
watch =
roots = {dbs}
state_dir = {tmp_path / 'state'}
store = memory:
node = t
wait_secs = 0
staleness = 0
batch_max_size = {batch}
db_channels = {CHANNEL}
{extra}

[smoosh.{CHANNEL}]
min_size = 64KiB
{channel}
"""
    path = tmp_path / "smoosh.ini"
    path.write_text(text)
    return parse_config(text, str(path))


def fleet(dbs: Path, journal_mode: str = "wal") -> list[str]:
    """The drain's databases, highest priority first."""
    keys = []
    for i, deleted in enumerate(DELETED):
        key = str(dbs.resolve() / f"tenant{i}.db")
        make_bloated_db(key, rows=600, delete_fraction=deleted, journal_mode=journal_mode)
        keys.append(key)
    return keys


class Batches:
    """What the test sees of batches from inside: the runs a worker's thread went on with."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.continued: list[str] = []
        #: When the batch's first database's heartbeat was due (monotonic seconds).
        self.first_beat_due: float | None = None
        self.threads: set[str] = set()
        original = Worker._continue_into

        def continue_into(worker: Worker, previous: Any, job: Any, data: Any, handed: Any) -> Any:
            self.continued.append(str(data["key"]))
            if not previous.batched:
                self.first_beat_due = previous.next_update  # the batch's first database's
            return original(worker, previous, job, data, handed)

        monkeypatch.setattr(Worker, "_continue_into", continue_into)


@pytest.fixture
def batches(monkeypatch: pytest.MonkeyPatch) -> Batches:
    return Batches(monkeypatch)


class Recording(GatedCompactor):
    """The real compactor (gated on demand), recording the thread each compaction ran on."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.threads: list[tuple[str, str]] = []

    def compact(self, key: str, ctx: Any) -> Any:
        self.threads.append((key, threading.current_thread().name))
        return super().compact(key, ctx)


def started(tmp_path: Path, cfg: Any, workers: int = 2, **kw: Any) -> tuple[Server, Recording]:
    compactor = Recording(SqliteCompactor(cfg.sqlite, roots=cfg.roots))
    server = Server(cfg, workers=workers, compactors=[compactor], watch_config=False, **kw)
    server.start()
    return server, compactor


def queue_all(server: Server, keys: list[str]) -> None:
    """Every key queued before any starts: the channel is suspended meanwhile."""
    server.suspend(CHANNEL)
    for key in keys:
        server.enqueue(key)
    wait_for(lambda: server.status()["channels"][CHANNEL]["waiting"]["size"] == len(keys), HANG_S,
             what="every key queued")


def idle(server: Server) -> bool:
    ch = server.status()["channels"][CHANNEL]
    return not ch["active"] and not ch["starting"] and server._slots.busy == 0 and not server._scheduler.runs()


def idle_but(server: Server, key: str) -> bool:
    """Whether the run of ``key`` is the only one left."""
    return [run.key for run in server._scheduler.runs()] == [key] and len(server._worker.status()) == 1


def drained(server: Server, keys: list[str]) -> None:
    wait_for(lambda: all(record_of(server, k).get("state") == "finished" for k in keys) and idle(server), HANG_S,
             what="every key compacted")


def as_read(server: Server, keys: list[str], lines: list[logging.LogRecord]) -> dict[str, Any]:
    """What an operator reads of each key (by its file's name): its /jobs row (times left out),
    the words of its log lines, and the metrics' counts."""
    rows, logged = {}, {}
    for key in keys:
        row = dict(record_of(server, key))
        row.pop("last_updated")
        row.pop("key")
        row["history"] = [(h["event"], h["reason"]) for h in row["history"]]
        rows[Path(key).name] = row
        logged[Path(key).name] = [r.getMessage().replace(key, "KEY").split(" in ", 1)[0]
                                  for r in lines if getattr(r, "key", None) == key]
    counts = {k: v for k, v in server.counters.compactions.items() if v}
    return {"rows": rows, "log": logged, "compactions": counts}


def drains(tmp_path: Path, before: Callable[[], None]) -> Iterator[tuple[str, list[str], Server, Recording]]:
    """The same drain of small databases without batches, then with them: each server has queued
    every key (``before`` called first), drained them, and is stopped once the caller has looked."""
    for batch in ("0", "4MiB"):
        base = tmp_path / f"batch-{batch}"
        base.mkdir()
        cfg = config(base, batch=batch)
        keys = fleet(base / "dbs")
        server, compactor = started(base, cfg)
        try:
            before()
            queue_all(server, keys)
            server.resume(CHANNEL)
            drained(server, keys)
            yield batch, keys, server, compactor
        finally:
            server.stop()


def test_small_databases_go_in_one_slot_and_each_reads_as_a_compaction_of_its_own(
    tmp_path: Path, batches: Batches, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="smoosh.daemon.record.outcomes")
    seen: dict[str, dict[str, Any]] = {}
    for batch, keys, server, compactor in drains(tmp_path, caplog.clear):
        # Each database compacted once, in the channel's order
        assert [key for key, _ in compactor.threads] == keys
        assert all(db_stats(k)["freelist_count"] == 0 and integrity(k) == "ok" for k in keys)
        seen[batch] = as_read(server, keys, caplog.records)
        if batch == "0":
            # Without batches, each database has a run of its own from the worker's pool
            assert batches.continued == []
        else:
            # With them, the first run's thread went on with every next database, in its slot
            assert batches.continued == keys[1:]
            assert len({thread for _, thread in compactor.threads}) == 1
    # And /jobs, the log and the metrics read the same, database by database
    assert seen["4MiB"] == seen["0"]
    assert seen["0"]["compactions"] == {(CHANNEL, "ok"): len(DELETED)}
    assert all(lines == ["compacted 'KEY'"] for lines in seen["0"]["log"].values())


class FailingOnce(Recording):
    """The recording compactor, failing the first compaction of one key."""

    def __init__(self, inner: Any, failing: str) -> None:
        super().__init__(inner)
        self.failing: str | None = failing

    def compact(self, key: str, ctx: Any) -> Any:
        if key == self.failing:
            self.failing = None
            self.threads.append((key, threading.current_thread().name))
            raise CompactionError("made to fail once")
        return super().compact(key, ctx)


def test_a_database_that_fails_inside_a_batch_is_retried_after_its_backoff(tmp_path: Path, batches: Batches) -> None:
    # Given a batch whose second database fails once (a crash backoff of a second)
    cfg = config(tmp_path, extra="backoff_base = 1s")
    keys = fleet(tmp_path / "dbs")
    compactor = FailingOnce(SqliteCompactor(cfg.sqlite, roots=cfg.roots), failing=keys[1])
    server = Server(cfg, workers=2, compactors=[compactor], watch_config=False)
    server.start()
    try:
        queue_all(server, keys)
        server.resume(CHANNEL)
        # Then the batch goes on past it, and once its backoff is over it is compacted too (the
        # batch's end set no timer of its own: the backoff's must still be set)
        drained(server, keys)
        assert [key for key, _ in compactor.threads].count(keys[1]) == 2
        assert [e["event"] for e in record_of(server, keys[1])["history"]][:2] == ["finished", "started"]
        assert all(integrity(k) == "ok" for k in keys)
    finally:
        server.stop()


def test_a_database_above_batch_max_size_gets_a_job_of_its_own(tmp_path: Path, batches: Batches) -> None:
    cfg = config(tmp_path, batch="64KiB")  # every database of the fleet is larger
    keys = fleet(tmp_path / "dbs")
    server, _ = started(tmp_path, cfg)
    try:
        queue_all(server, keys)
        server.resume(CHANNEL)
        drained(server, keys)
    finally:
        server.stop()
    assert batches.continued == []


def between_databases(tmp_path: Path, batches: Batches, stop: Callable[[Server], None], **kw: Any) -> tuple[Server, list[str]]:
    """A batch whose first database's end is held back while ``stop(server)`` runs; then let go."""
    cfg = config(tmp_path, channel=kw.pop("channel", ""))
    keys = fleet(tmp_path / "dbs", journal_mode="delete")
    server, _ = started(tmp_path, cfg, **kw)
    gate = gate_end(server, keys[0])
    queue_all(server, keys)
    server.resume(CHANNEL)
    gate.wait_entered()  # the first database is compacted; its end not told yet
    stop(server)
    gate.release()
    wait_for(lambda: record_of(server, keys[0]).get("state") == "finished" and idle(server), HANG_S,
             what="the first database's end, and no run after it")
    return server, keys


def test_a_hold_ends_a_batch_between_two_databases(tmp_path: Path, batches: Batches) -> None:
    # Given a batch whose channel is suspended as its first database ends
    server, keys = between_databases(tmp_path, batches, lambda s: s.suspend(CHANNEL))
    try:
        # Then the first database is compacted, and the batch goes on with none: they all wait
        assert record_of(server, keys[0])["history"][0]["event"] == "finished"
        assert [key for key, _ in server.channels()[CHANNEL].waiting()] == keys[1:]
        assert batches.continued == [] and not server._worker.status()
        # And once resumed, the rest is compacted
        server.resume(CHANNEL)
        drained(server, keys)
    finally:
        server.stop()


def at(hour: int, minute: int = 0) -> float:
    return dt.datetime(2026, 11, 23, hour, minute, tzinfo=dt.timezone.utc).timestamp()


def test_a_strict_window_ends_a_batch_between_two_databases(tmp_path: Path, batches: Batches) -> None:
    clock = FakeClock(at(2, 59))
    # Given a batch in a channel whose strict window closes as its first database ends
    server, keys = between_databases(
        tmp_path, batches, lambda s: clock.set(at(3, 0)), clock=clock,
        channel="from = 01:00\nto = 03:00\nstrict_window = true")
    try:
        # Then the batch goes on with none: they all wait for the window
        assert server.status()["channels"][CHANNEL]["in_window"] is False
        assert [key for key, _ in server.channels()[CHANNEL].waiting()] == keys[1:]
        assert batches.continued == [] and not server._worker.status()
        # And in the next window, the rest is compacted
        clock.set(at(1, 0) + 24 * 3600)
        for channel in server.channels().values():
            channel.check_window(clock())
        drained(server, keys)
    finally:
        server.stop()


class JobWrites(list[tuple[str, str]]):
    """The job layer's writes of the runs' jobs as the store gets them, in order: (what, job id)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        super().__init__()
        add_claimed, finish_and_remove = Jobs.add_claimed, Jobs.finish_and_remove

        def claimed(jobs: Jobs, job_type: Any, job_id: str, data: Any, *, tx: Any = None) -> Any:
            self.append(("claim", job_id))
            return add_claimed(jobs, job_type, job_id, data, tx=tx)

        def finished(jobs: Jobs, job: Any, *, tx: Any = None) -> bool:
            self.append(("finish", str(job.id)))
            return finish_and_remove(jobs, job, tx=tx)

        monkeypatch.setattr(Jobs, "add_claimed", claimed)
        monkeypatch.setattr(Jobs, "finish_and_remove", finished)


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> JobWrites:
    return JobWrites(monkeypatch)


def stored_results(server: Server) -> dict[str, list[str]]:
    """Each key's durable history rows in the job store (results, newest first)."""
    rows = server._store.transact(lambda tr: read_rows(tr.snapshot, "t"))
    return {key: [r.result for r in results] for key, results in rows.items()}


def test_a_batch_is_one_claim_and_one_finish_in_the_job_store(
    tmp_path: Path, batches: Batches, writes: JobWrites,
) -> None:
    # Given a drain of small databases
    for batch, keys, server, _ in drains(tmp_path, writes.clear):
        # When the store has heard every end
        wait_for(lambda: set(stored_results(server)) == set(keys), HANG_S,
                 what="every database's history row in the store")
        wait_for(lambda: ("finish", keys[0]) in writes, HANG_S, what="the first job's finish")
        # Then each database has its durable history row, and no job is left
        assert stored_results(server) == {key: ["ok"] for key in keys}
        assert server._scheduler.jobs.list_jobs(server._scheduler.job_type) == []
        if batch == "0":
            # ... a job claimed and finished for each database without batches
            assert sorted(writes) == sorted([("claim", k) for k in keys] + [("finish", k) for k in keys])
        else:
            # ... and one for the whole batch with them: the first database's, which the others ran under
            assert batches.continued == keys[1:]
            assert writes == [("claim", keys[0]), ("finish", keys[0])]


def bloat_again(key: str) -> None:
    """``key`` worth compacting again, above every other database of the drain."""
    make_bloated_db(key, rows=600, delete_fraction=0.95)


@contextlib.contextmanager
def third_held(
    tmp_path: Path, channel: str = "", workers: int = 2,
) -> Iterator[tuple[Server, Recording, list[str], Gate]]:
    """A drain of small databases whose batch compacts its third one (under the first one's job),
    held at a gate: the server, its compactor, the keys and the gate; the server stopped after."""
    cfg = config(tmp_path, channel=channel)
    keys = fleet(tmp_path / "dbs")
    server, compactor = started(tmp_path, cfg, workers=workers)
    gate = compactor.hold(keys[2])
    try:
        queue_all(server, keys)
        server.resume(CHANNEL)
        gate.wait_entered()
        yield server, compactor, keys, gate
    finally:
        gate.release()
        server.stop()


def test_a_batch_handed_its_own_first_database_again_ends_its_job_and_claims_one_for_it(
    tmp_path: Path, batches: Batches, writes: JobWrites,
) -> None:
    # Given a batch compacting its third database under the first one's job
    with third_held(tmp_path) as (server, compactor, keys, gate):
        # When the first database is queued again, at the head of the channel
        bloat_again(keys[0])
        server.enqueue(keys[0])
        wait_for(lambda: [k for k, _ in server.channels()[CHANNEL].waiting()][:1] == [keys[0]], HANG_S,
                 what="the first database queued again")
        gate.release()
        drained(server, keys)
        wait_for(lambda: stored_results(server).get(keys[0]) == ["ok", "ok"], HANG_S,
                 what="both compactions of the first database in the store")
        # Then the batch goes on with it, in a job of its own, claimed once the batch's job was finished
        assert [key for key, _ in compactor.threads] == [keys[0], keys[1], keys[2], keys[0], keys[3], keys[4]]
        assert batches.continued == [keys[1], keys[2], keys[0], keys[3], keys[4]]
        wait_for(lambda: len(writes) == 4, HANG_S, what="the second job's finish")
        assert writes == [("claim", keys[0]), ("finish", keys[0])] * 2
        assert stored_results(server) == {keys[0]: ["ok", "ok"], **{key: ["ok"] for key in keys[1:]}}
        assert server._scheduler.jobs.list_jobs(server._scheduler.job_type) == []
        assert all(integrity(k) == "ok" and db_stats(k)["freelist_count"] == 0 for k in keys)


def test_a_claim_of_a_batch_jobs_key_waits_for_the_batch_to_end(
    tmp_path: Path, batches: Batches, writes: JobWrites, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    # Given two batches, one of which compacts the third database under its first one's job
    # (three slots: the channel's two runs are claimed here, and a third claims the key again)
    with third_held(tmp_path, channel="concurrency = 2", workers=3) as (server, compactor, keys, gate):
        [carrier] = [r.carrier for r in server._worker._running if r.key == keys[2]]
        assert carrier is not None and carrier.key in keys[:2]
        first = carrier.key
        wait_for(lambda: len(compactor.threads) == len(keys) and idle_but(server, keys[2]), HANG_S,
                 what="the other batch's end")
        # When that first database is queued again, and its channel starts it in its other slot
        bloat_again(first)
        server.enqueue(first)
        wait_for(lambda: server._worker._carriers[first].wanted, HANG_S, what="the claim waiting for the batch")
        # Then nothing compacts it while the batch goes on under its job
        assert [key for key, _ in compactor.threads].count(first) == 1
        # And once the batch's database is done, the batch ends and the key is claimed in a job of its own
        gate.release()
        wait_for(lambda: [key for key, _ in compactor.threads].count(first) == 2 and idle(server), HANG_S,
                 what="the second compaction")
        wait_for(lambda: stored_results(server).get(first) == ["ok", "ok"], HANG_S,
                 what="both compactions in the store")
        # (the batch's job finished before the key's own job was claimed)
        wait_for(lambda: [what for what, key in writes if key == first] == ["claim", "finish"] * 2, HANG_S,
                 what="the key's jobs claimed and finished in turn")
        assert record_of(server, first)["history"][0]["event"] == "finished"
        assert not [r for r in caplog.records if "following its job" in r.getMessage()]
        assert server._scheduler.jobs.list_jobs(server._scheduler.job_type) == []
        assert all(integrity(k) == "ok" for k in keys)


def test_a_batch_keeps_its_jobs_heartbeats_and_says_which_database_it_compacts(
    tmp_path: Path, batches: Batches,
) -> None:
    # Given a batch compacting its third database under the first one's job
    with third_held(tmp_path) as (server, compactor, keys, gate):
        worker = server._worker
        [running] = [r for r in worker._running if r.key == keys[2]]
        scheduler = server._scheduler
        first = scheduler.jobs.get_job_data(scheduler.job_type, keys[0])
        # Then its heartbeats keep the schedule the batch's job began with (restarted at each
        # database, a batch of databases each shorter than a beat would never send one)
        assert running.carrier is not None and running.carrier.key == keys[0]
        assert running.next_update == batches.first_beat_due
        # ... and a heartbeat keeps the job the first database's, saying which one it compacts now
        worker._heartbeat._send_heartbeat(running)
        beat = scheduler.jobs.get_job_data(scheduler.job_type, keys[0])
        assert (beat["key"], beat["run"], beat["compacting"]) == (keys[0], first["run"], keys[2])
        assert scheduler.jobs.get_job_state(scheduler.job_type, keys[0]) == "running"
        gate.release()
        drained(server, keys)
        wait_for(lambda: scheduler.jobs.list_jobs(scheduler.job_type) == [], HANG_S, what="the batch's job finished")


def test_a_batch_whose_job_is_removed_ends_after_halting_the_database_it_compacts(
    tmp_path: Path, batches: Batches,
) -> None:
    # Given a batch compacting its third database under the first one's job
    with third_held(tmp_path) as (server, compactor, keys, gate):
        worker, scheduler = server._worker, server._scheduler
        [running] = [r for r in worker._running if r.key == keys[2]]
        # When the job is removed from the store (an operator's `jobs` tooling), and its heartbeat finds it gone
        scheduler.jobs.remove(scheduler.job_type, keys[0])
        worker._heartbeat._send_heartbeat(running)
        # Then the database it compacted ends as a halted run, with nothing of the batch's left
        wait_for(lambda: record_of(server, keys[2]).get("state") == "crashing", HANG_S,
                 what="the halted database's end")
        assert "job halted" in (record_of(server, keys[2]).get("last_error") or "")
        assert worker.carriers() == []
        # ... the databases before it stay compacted, and those after it are compacted by a new run
        wait_for(lambda: all(record_of(server, k).get("state") == "finished" for k in keys[:2] + keys[3:])
                 and idle(server), HANG_S, what="the rest of the drain")
        assert [key for key, _ in compactor.threads].count(keys[0]) == 1
        # (a halted run writes no durable row, batch or not: its job is no longer its own)
        wait_for(lambda: stored_results(server) == {k: ["ok"] for k in keys[:2] + keys[3:]}, HANG_S,
                 what="the compacted databases' results in the store")
        assert scheduler.jobs.list_jobs(scheduler.job_type) == []
        assert all(integrity(k) == "ok" for k in keys)


def test_a_claim_of_a_batch_jobs_key_goes_back_to_its_channel_while_the_batch_is_slow_to_end(
    tmp_path: Path, batches: Batches, writes: JobWrites, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(batch_module, "CARRIER_WAIT_S", 0.05)  # a batch's database that waits long
    # Given two batches, one of which compacts the third database under its first one's job, held
    with third_held(tmp_path, channel="concurrency = 2", workers=3) as (server, compactor, keys, gate):
        [carrier] = [r.carrier for r in server._worker._running if r.key == keys[2]]
        assert carrier is not None
        first = carrier.key
        wait_for(lambda: len(compactor.threads) == len(keys) and idle_but(server, keys[2]), HANG_S,
                 what="the other batch's end")
        # When that first database is queued again, and its channel starts it while the batch is held
        bloat_again(first)
        server.enqueue(first)
        # Then its claim gives up waiting and the key goes back to its channel, again and again
        wait_for(lambda: sum(1 for h in record_of(server, first)["history"]
                             if h["event"] == "dropped" and "queued again" in (h["reason"] or "")) >= 2, HANG_S,
                 what="the key queued again while the batch runs")
        assert [key for key, _ in compactor.threads].count(first) == 1
        assert writes.count(("claim", first)) == 1  # (its first only: none while the batch's job runs)
        # And once the batch's database is done, the key is claimed in a job of its own and compacted
        gate.release()
        wait_for(lambda: [key for key, _ in compactor.threads].count(first) == 2 and idle(server), HANG_S,
                 what="the second compaction")
        wait_for(lambda: [what for what, key in writes if key == first] == ["claim", "finish"] * 2, HANG_S,
                 what="the key's jobs claimed and finished in turn")
        assert record_of(server, first)["state"] == "finished"
        assert not [r for r in caplog.records if "following its job" in r.getMessage()]
        assert server._scheduler.jobs.list_jobs(server._scheduler.job_type) == []
