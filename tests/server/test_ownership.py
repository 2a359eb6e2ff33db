"""One owner per key, in process: what a restart restores, what the roots refuse, what the status
table says, and who owns the channel registry (DESIGN §5.1 "One owner per key", §5.6, §10).

Servers run in this process with an injected clock (``FakeClock``) and are stepped with
``server.tick()``; the real SQLite compactor opens user databases through apsw, so this
process reads them only through ``compactor.dbfactory``.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import queue
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from compactor.dbfactory import integrity, make_bloated_db
from helpers.chunked import STALLED_AFTER_FIRST_CHUNK, chunk_section, chunked_db
from helpers.clocks import FakeClock
from helpers.daemon import HANG_S, wait_for
from helpers.jobs_table import record_of
from server.test_server import FailingCompactor, make_config

import channels.channel as channel_module
from persist import read_checkpoint, write_checkpoint
from smoosh import Server
from smoosh.compactors.sqlite import SqliteCompactor
from smoosh.errors import UnknownChannel
from smoosh.jobs import Jobs
from smoosh.store import open_store


RATIO = "ratio_dbs"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def warnings_naming(caplog: pytest.LogCaptureFixture, key: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and key in r.getMessage()]


def ratio(server: Server) -> dict[str, Any]:
    return server.status()["channels"][RATIO]


def finished(server: Server, key: str) -> bool:
    return record_of(server, key).get("state") == "finished"


def holds(server: Server) -> tuple[int, int, int]:
    """What ratio_dbs holds: ``(waiting, starting, active)``."""
    s = ratio(server)
    return s["waiting"]["size"], s["starting"], s["active"]


def in_any_channel(server: Server, key: str) -> bool:
    return any(key in channel.keys() for channel in server.channels().values())  # noqa: SIM118 (a Channel)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A SQLite file outside the roots, bloated enough that any channel would take it."""
    victim = tmp_path / "outside" / "victim.db"
    victim.parent.mkdir()
    make_bloated_db(str(victim), delete_fraction=0.9)
    return victim


# ---------------------------------------------------------------- 6: forged checkpoints


@pytest.mark.parametrize("forged", ["outside path", "symlink to outside"])
def test_a_forged_checkpoint_key_is_dropped_and_the_file_it_names_left_alone(
    tmp_path: Path, running: Any, dbs: Path, outside: Path, caplog: pytest.LogCaptureFixture, forged: str
) -> None:
    # Given a checkpoint naming a legitimate database and, above it, a file outside the roots
    legit = dbs / "legit.db"
    make_bloated_db(str(legit), delete_fraction=0.9)
    if forged == "outside path":
        key, reason = str(outside), f"outside roots ({dbs})"
    else:
        (dbs / "link.db").symlink_to(outside)
        key, reason = str(dbs / "link.db"), "it is not canonical (a symbolic link, or a relative part)"
    config = make_config(tmp_path)
    checkpoint = tmp_path / "state" / f"{RATIO}.smooshq"
    write_checkpoint(str(checkpoint), {key: math.inf, str(legit): 10.0})
    before = sha256(outside)
    caplog.set_level(logging.INFO)
    # When a server starts on it
    server = running(config, workers=1, clock=FakeClock())
    # Then the forged key is dropped with one warning, and only the legitimate one is compacted
    wait_for(lambda: finished(server, str(legit)), HANG_S, what="the legitimate key's compaction")
    assert warnings_naming(caplog, key) == [f"dropped {key!r} restored from disk: {reason}"]
    assert key not in {j["key"] for j in server.jobs_table()}
    assert integrity(str(legit)) == "ok"
    server.stop()
    assert sha256(outside) == before
    assert key not in read_checkpoint(str(checkpoint))


# ---------------------------------------------------------------- 7: a path swapped while queued


@pytest.mark.parametrize("swap", ["the file", "a directory of its path"])
def test_a_queued_key_whose_path_becomes_a_symlink_out_of_the_roots_touches_nothing_outside(
    tmp_path: Path, running: Any, dbs: Path, outside: Path, caplog: pytest.LogCaptureFixture, swap: str
) -> None:
    # Given a key queued while its channel is suspended
    (dbs / "sub").mkdir()
    db = dbs / "sub" / "victim.db"  # the outside file's name: a swapped directory leads to it
    make_bloated_db(str(db), delete_fraction=0.9)
    key = str(db)
    before = sha256(outside)
    server = running(make_config(tmp_path), workers=1, clock=FakeClock())
    server.suspend(RATIO)
    server.enqueue(key)
    wait_for(lambda: ratio(server)["waiting"]["size"] == 1, HANG_S, what="the key queued")
    # When its path is swapped for a symlink that leads outside the roots, and the channel resumes
    if swap == "the file":
        os.remove(db)
        db.symlink_to(outside)
    else:
        os.rename(dbs / "sub", tmp_path / "sub-moved")
        (dbs / "sub").symlink_to(outside.parent)
    caplog.set_level(logging.INFO)
    server.resume(RATIO)
    # Then the key leaves its channel without anything outside being opened
    wait_for(lambda: holds(server) == (0, 0, 0), HANG_S, what="the key to leave its channel")
    assert record_of(server, key).get("state") != "running"
    assert not in_any_channel(server, key)
    assert [job_id for _t, job_id, _s, _d in server.jobs.list_jobs()] == []
    assert warnings_naming(caplog, key) == [
        f"Refused to open the database {key!r}: reaches its file through a symbolic link."
    ]
    server.stop()
    assert sha256(outside) == before


# ---------------------------------------------------------------- 8: crash memory across a restart


def test_a_crashing_key_keeps_its_error_count_and_retry_time_across_a_restart(tmp_path: Path, dbs: Path) -> None:
    # Given a key whose compaction crashed once (backoff 100 s), on a store that outlives the server
    clock = FakeClock()
    config = make_config(tmp_path, extra=f"store = sqlite:{tmp_path / 'state' / 'jobs.db'}")
    key = str(dbs / "x.db")
    first_compactor = FailingCompactor(RuntimeError("disk I/O error"))
    first = Server(config, workers=1, clock=clock, watch_config=False, compactors=[first_compactor])
    first.start()
    try:
        first.enqueue(key)
        wait_for(lambda: record_of(first, key).get("error_count") == 1, HANG_S, what="the first crash")
        crashed = record_of(first, key)
    finally:
        first.stop()
    assert crashed["state"] == "crashing" and crashed["retry_at"] == clock() + 100
    # When a new server starts on the same store and state_dir
    compactor = FailingCompactor(RuntimeError("disk I/O error"))
    second = Server(config, workers=1, clock=clock, watch_config=False, compactors=[compactor])
    second.start()
    try:
        # Then /jobs still shows it crashing, with its count and retry time ...
        rec = record_of(second, key)
        assert (rec["state"], rec["error_count"], rec["retry_at"], rec["last_error"]) == (
            "crashing", 1, crashed["retry_at"], "RuntimeError: disk I/O error")
        # ... it waits in its channel, deferred, holding no slot ...
        status = ratio(second)
        assert (status["deferred"], status["active"], status["starting"]) == (1, 0, 0)
        assert [k for k, _ in second.channels()[RATIO].waiting()] == [key]
        # ... and it is not retried before its time
        clock.advance(crashed["retry_at"] - clock() - 1)
        second.tick(clock())
        time.sleep(0.3)  # bounded: nothing may start
        assert compactor.calls == 0
        assert ratio(second)["deferred"] == 1
        clock.advance(2)
        second.tick(clock())
        wait_for(lambda: compactor.calls == 1, HANG_S, what="the retry after the backoff")
        wait_for(lambda: record_of(second, key).get("error_count") == 2, HANG_S, what="the second crash recorded")
    finally:
        second.stop()


# ---------------------------------------------------------------- 9: the status table during a drain


class EntryGate:
    """The real SQLite compactor, each compaction held at its start until the test lets it go."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.entered: queue.Queue[str] = queue.Queue()
        self.go = threading.Semaphore(0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def compact(self, key: str, ctx: Any) -> Any:
        self.entered.put(key)
        if not self.go.acquire(timeout=HANG_S):
            raise RuntimeError("the test never opened the gate")
        return self.inner.compact(key, ctx)


def test_the_status_table_tells_the_truth_while_a_channel_drains(tmp_path: Path, running: Any, dbs: Path) -> None:
    # Given ten small bloated databases queued in a suspended channel of concurrency 1
    keys = []
    for i in range(10):
        db = dbs / f"t{i}.db"
        make_bloated_db(str(db), rows=300, delete_fraction=0.8)
        keys.append(str(db))
    config = make_config(tmp_path)
    gate = EntryGate(SqliteCompactor(config.sqlite))
    server = running(config, workers=1, clock=FakeClock(), compactors=[gate])
    server.suspend(RATIO)
    for key in keys:
        server.enqueue(key)
    wait_for(lambda: ratio(server)["waiting"]["size"] == 10, HANG_S, what="all ten queued")
    # When it drains them one by one
    samples: list[tuple[float, int, int]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            s = ratio(server)
            samples.append((time.monotonic(), s["active"], s["starting"]))
            time.sleep(0.001)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    server.resume(RATIO)
    compacted = []
    try:
        for _ in keys:
            compacted.append(gate.entered.get(timeout=HANG_S))
            # Then while a compaction runs the channel shows it active, and nothing starting
            wait_for(lambda: holds(server)[1:] == (0, 1), HANG_S, what="the running compaction counted active",
                     every_s=0.002)
            during = set()
            for _ in range(10):  # ~50 ms of a compaction held at its start
                during.add(holds(server)[1:])
                time.sleep(0.005)
            assert during == {(0, 1)}  # starting 0, active 1
            gate.go.release()
        wait_for(lambda: all(finished(server, k) for k in keys), HANG_S, what="the drain to finish")
    finally:
        done.set()
        sampler.join(5)
        for _ in range(10):
            gate.go.release()
    assert sorted(compacted) == sorted(keys)
    # ... and between two compactions "starting" never lasts longer than a moment
    longest, since = 0.0, None
    for at, active, starting in samples:
        if (active, starting) == (0, 1):
            since = at if since is None else since
            longest = max(longest, at - since)
        else:
            since = None
    assert longest < 0.2, f"the channel showed 'active 0, starting 1' for {longest:.3f} s"
    assert holds(server) == (0, 0, 0)


# ---------------------------------------------------------------- 10: the registry race of the old design


class Fake(FailingCompactor):
    """Every absolute path is a bloated database; nothing runs (the server is a dry run)."""

    def __init__(self) -> None:
        super().__init__(RuntimeError("unused"))


class BuiltChannels:
    """Records every channel the server builds (``monkeypatch`` its ``Channel`` with :attr:`cls`).

    ``violations`` lists every moment two channels of one name were open at once (two writers
    of one checkpoint file); ``on_build(name)`` runs as each channel is being built.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.open: dict[str, list[Any]] = {}
        self.violations: list[str] = []
        self.builds = 0
        self.on_build: Any = lambda name: None
        built = self

        class Recorded(channel_module.Channel):
            def __init__(self, name: str, *args: Any, **kwargs: Any) -> None:
                built.on_build(name)
                super().__init__(name, *args, **kwargs)
                with built.lock:
                    built.builds += 1
                    if built.open.get(name):
                        built.violations.append(f"a second channel {name} opened while one was open")
                    built.open.setdefault(name, []).append(self)

            def close(self, checkpoint: bool = True) -> list[str]:
                with built.lock:
                    if self in built.open.get(self.name, []):
                        built.open[self.name].remove(self)
                return super().close(checkpoint=checkpoint)

        self.cls = Recorded

    def open_now(self) -> dict[str, list[Any]]:
        with self.lock:
            return {name: list(chans) for name, chans in self.open.items() if chans}


def test_reloads_crashes_and_operator_calls_at_once_keep_one_channel_per_name(
    tmp_path: Path, running: Any, dbs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every channel the server builds is recorded: at most one may be open per name at any time.
    built = BuiltChannels()
    monkeypatch.setattr("smoosh.daemon.server.Channel", built.cls)
    without = make_config(tmp_path)
    extra = "[smoosh.extra_dbs]\nmin_size = 64KiB\n"
    with_extra = make_config(tmp_path, extra="db_channels = upgrade_dbs, ratio_dbs, slack_dbs, extra_dbs", channels=extra)
    server = running(without, workers=0, dry_run=True, compactors=[Fake()])
    keys = [str(dbs / f"k{i}.db") for i in range(20)]
    for key in keys:
        server.enqueue(key)
    wait_for(lambda: ratio(server)["waiting"]["size"] == 20, HANG_S, what="the keys queued")

    errors: list[BaseException] = []
    stop = threading.Event()
    counts = {"reloads": 0, "crashes": 0, "operator": 0}

    def guarded(fn: Any) -> Any:
        def run() -> None:
            try:
                while not stop.is_set():
                    fn()
            except BaseException as e:  # noqa: BLE001 - every escape is a failure
                errors.append(e)
        return threading.Thread(target=run, daemon=True)

    def reload() -> None:
        server.apply_config(with_extra if counts["reloads"] % 2 == 0 else without)
        counts["reloads"] += 1

    rng = random.Random(7)

    def die(now: float) -> float | None:
        raise RuntimeError("channel crashed on purpose")

    def crash() -> None:
        name = rng.choice([RATIO, "slack_dbs", "extra_dbs"])
        channel = server.channels().get(name)
        if channel is not None:
            channel.tick = die
            server.wake(name)
            counts["crashes"] += 1
        time.sleep(0.003)

    def operate() -> None:
        name = rng.choice([RATIO, "slack_dbs"])
        try:
            server.suspend(name)
            server.resume(name)
        except UnknownChannel as e:
            raise AssertionError(f"a configured channel was unknown: {e}") from e
        counts["operator"] += 1

    def observe() -> None:
        server.status()  # a reader on another thread, as GET /status is
        time.sleep(0.001)

    threads = [guarded(fn) for fn in (reload, crash, operate, observe)]
    logging.getLogger("smoosh.daemon.server").disabled = True  # a crash logs a traceback each time
    try:
        for t in threads:
            t.start()
        # Until each has happened often enough (however long that takes here), not for 2 s
        wait_for(lambda: errors or (min(counts["reloads"], counts["crashes"], counts["operator"]) > 10
                                    and built.builds > 20), HANG_S, what="enough reloads, crashes and operator calls")
        stop.set()
        for t in threads:
            t.join(HANG_S)
    finally:
        logging.getLogger("smoosh.daemon.server").disabled = False
    assert errors == []
    assert built.violations == []
    assert counts["reloads"] > 10 and counts["crashes"] > 10 and counts["operator"] > 10, counts
    assert built.builds > 20  # channels were really closed and rebuilt, by reloads and by crashes
    # At the end: every configured channel exists once, and it is the one open channel of its name
    server.apply_config(without)
    registry = server.channels()
    assert set(registry) == set(server.config.channels)
    assert built.open_now() == {name: [ch] for name, ch in registry.items()}
    # ... every checkpoint reads back whole, and the queue lost nothing
    assert sorted(k for k, _ in registry[RATIO].waiting()) == sorted(keys)
    state = tmp_path / "state"
    assert [p.name for p in state.iterdir() if ".corrupt-" in p.name] == []
    server.stop()
    for path in state.glob("*.smooshq"):
        read_checkpoint(str(path))
    assert sorted(read_checkpoint(str(state / f"{RATIO}.smooshq"))) == sorted(keys)


# ---------------------------------------------------------------- bugs found on the way


def test_a_clean_stop_leaves_no_job_of_an_interrupted_key_in_the_store(
    tmp_path: Path, dbs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Given an incremental compaction under way, stalled after its first chunk (helpers.chunked)
    db = dbs / "big.db"
    made = chunked_db(db)
    key = str(db)
    store_path = tmp_path / "state" / "jobs.db"
    config = make_config(tmp_path, extra=f"store = sqlite:{store_path}\n{STALLED_AFTER_FIRST_CHUNK}",
                         channels=chunk_section(made))
    server = Server(config, workers=1, clock=FakeClock(), watch_config=False)
    server.start()
    try:
        server.enqueue(key)
        wait_for(lambda: record_of(server, key).get("progress", 0) > 0, HANG_S, what="the compaction under way")
        caplog.set_level(logging.DEBUG, logger="channels.channel")
        # The window between the worker's stop and the channels' close is a few microseconds
        # wide; hold it open for up to a second, long enough for the loop to act in it.
        worker = server._worker
        stop_worker = worker.stop
        restarted = f"Channel {RATIO}: starting {key!r} at priority inf."

        def stop_then_linger(timeout_s: float) -> bool:
            stopped = stop_worker(timeout_s=timeout_s)
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline and restarted not in caplog.messages:
                time.sleep(0.01)
            return stopped

        worker.stop = stop_then_linger
    finally:
        # When the server stops cleanly
        server.stop()
    # Then the key is the channel's alone: checkpointed at the top, and no job of it in the store
    assert read_checkpoint(str(tmp_path / "state" / f"{RATIO}.smooshq")) == {key: math.inf}
    with open_store(f"sqlite:{store_path}") as store:
        jobs = Jobs(store, monitors=False)
        try:
            left = [(state, data.get("channel")) for _t, job_id, state, data in jobs.list_jobs() if job_id == key]
        finally:
            jobs.close()
    assert left == []
    assert integrity(key) == "ok"


def scanned(server: Server) -> bool:
    """The start-up scan is done and what it found has been examined."""
    scan = server.status()["scan"]
    return scan.get("scans_completed", 0) >= 1 and scan.get("examining") == 0


def test_a_key_taken_back_at_infinity_stays_at_the_top_when_the_scan_finds_it(
    tmp_path: Path, running: Any, dbs: Path
) -> None:
    # Given the checkpoint a clean stop mid-compaction leaves (its key at infinity)
    config = make_config(tmp_path, extra=f"watch = {dbs}\nwait_secs = 3600")
    db = dbs / "big.db"
    make_bloated_db(str(db), delete_fraction=0.8)
    write_checkpoint(str(tmp_path / "state" / f"{RATIO}.smooshq"), {str(db): math.inf})
    # When the daemon starts again, paused, watching the directory of the database
    server = running(config, workers=1, clock=FakeClock())
    wait_for(lambda: scanned(server), HANG_S, what="the start-up scan examined")
    # Then the key is still at the top of its channel
    assert server.channels()[RATIO].waiting() == [(str(db), math.inf)]


def test_a_channel_restarted_after_a_crash_never_leaves_the_registry(
    tmp_path: Path, running: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a running server whose registry a reader on another thread looks at
    built = BuiltChannels()
    monkeypatch.setattr("smoosh.daemon.server.Channel", built.cls)
    server = running(make_config(tmp_path), workers=0, dry_run=True, compactors=[Fake()])
    seen: list[set[str]] = []
    built.on_build = lambda name: seen.append(set(server.channels()))
    crashed = server.channels()[RATIO]

    def die(now: float) -> float | None:
        raise RuntimeError("channel crashed on purpose")

    # When a channel crashes and is restarted from its checkpoint
    crashed.tick = die
    server.wake(RATIO)
    server.tick()
    assert server.channels()[RATIO] is not crashed
    # Then every registry a reader could see while it was replaced still had a channel of that name
    assert seen and all(RATIO in names for names in seen)


def test_a_key_dropped_at_its_start_is_not_shown_pending(tmp_path: Path, running: Any, dbs: Path) -> None:
    # Given a key queued in a suspended channel, whose database is then deleted
    db = dbs / "a.db"
    make_bloated_db(str(db), delete_fraction=0.9)
    server = running(make_config(tmp_path), workers=1, clock=FakeClock())
    server.suspend(RATIO)
    server.enqueue(str(db))
    wait_for(lambda: ratio(server)["waiting"]["size"] == 1, HANG_S, what="the key queued")
    os.remove(db)
    # When the channel resumes and drops it at its start
    server.resume(RATIO)
    wait_for(lambda: holds(server) == (0, 0, 0), HANG_S, what="the key dropped")
    # Then /jobs does not show it waiting for a compaction that will never come
    assert record_of(server, str(db)).get("state") != "pending"
