"""A run's slots are freed whatever ends it, at every state it can be in (issue 45, DESIGN §10).

Each case holds one run of a real server at one state of its life, ends it one way, and then
asks what a wedged channel would fail: every channel back to ACTIVE 0 and STARTING 0, the
``max_jobs`` gate at 0, the scheduler following no run, and the next key compacted.

The states (``helpers.run_gates``): ``starting`` (its job added for any worker: this process's
only one is busy with another channel's run), ``claimed`` (this process's worker took it and
re-checks its priority), ``running`` (in its compaction), ``finishing`` (compacted, its end not
yet told to the server's loop). Each also as a batch's second database (issue 48: handed at the
end of the run before it to that run's thread, in its slot): in its claim, its compaction, its end
(a batch's database is never ``starting``: it waits in its channel until it is handed over). The ends: a finish, a crash (a corrupt database: its VACUUM
fails), a backoff (an application holds the write lock: busy), live edits (an upgrade target,
which reconfigures the compactor; ``max_jobs``; the run's channel removed and added again), a
reload of the edited file, a clean stop followed by a restart; and a take-over at start of what
a daemon that died left in the store, at each state.

Real SQLite files, the real compactor and worker, a real job store (``memory:``, shared by the
servers that follow each other); the gates only hold a thread where it would have been.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from compactor.dbfactory import make_bloated_db, make_corrupt_db
from helpers.clocks import FakeClock
from helpers.daemon import HANG_S, wait_for
from helpers.jobs_table import record_of
from helpers.locks import ChildConnection
from helpers.run_gates import Gate, GatedCompactor, gate_end, gate_recheck
from server.test_server import make_config
from smoosh import Server
from smoosh.compactors import load_compactors
from smoosh.config import parse_config
from smoosh.jobs import Jobs
from smoosh.store import open_store
from smoosh.store.base import Store

STATES = ("starting", "claimed", "running", "finishing")
NODE_TYPE = "smoosh:t"  # make_config's node


@dataclass
class Case:
    """One server and what the test holds of it."""

    tmp_path: Path
    dbs: Path
    store: Store
    server: Server
    gated: GatedCompactor
    servers: list[Server]
    kind: str = ""  # the kind of database the run under test compacts
    batch: bool = False  # the run under test is a batch's second database

    def restart(self) -> None:
        """A new server on the same store and state_dir (the previous one stopped)."""
        self.server, self.gated = start_server(self.tmp_path, self.store)
        self.servers.append(self.server)


def config_text(tmp_path: Path, sqlite: str = "", extra: str = "min_jobs = 4") -> Any:
    """The test's config, parsed: two runs at once in ratio_dbs and slack_dbs, a busy timeout of
    0 (a locked database is busy at once), and ``sqlite`` and ``extra`` ([smoosh]) lines. The
    backlog controller keeps every ``max_jobs`` slot (``min_jobs``): the slots it lets run must
    not depend on when it last looked."""
    base = make_config(tmp_path, extra=extra)
    head = Path(base.path).read_text().split("[smoosh.ratio_dbs]")[0]
    text = head + (
        "[smoosh.ratio_dbs]\nmin_size = 64KiB\nconcurrency = 2\n\n"
        "[smoosh.slack_dbs]\nmin_size = 64KiB\nmin_priority = 64KiB\nconcurrency = 2\n\n"
        "[smoosh.sqlite]\nbusy_timeout = 0\n" + sqlite)
    Path(base.path).write_text(text)
    return parse_config(text, base.path)


def start_server(tmp_path: Path, store: Store, config: Any = None) -> tuple[Server, GatedCompactor]:
    """A server with two worker slots: one its worker claims runs into at their start, one its
    dispatcher accepts jobs into (a job added for any worker)."""
    config = config or config_text(tmp_path)
    gated = GatedCompactor(load_compactors(config.sqlite, roots=config.roots)[0])
    server = Server(config, store=store, workers=2, compactors=[gated], watch_config=False)
    server.start()
    return server, gated


@pytest.fixture
def case(tmp_path: Path, dbs: Path) -> Iterator[Case]:
    store = open_store("memory:")
    server, gated = start_server(tmp_path, store)
    servers = [server]
    yield Case(tmp_path, dbs, store, server, gated, servers)
    for s in servers:
        s.stop()
    store.close()


def database(dbs: Path, name: str, kind: str) -> str:
    """A real database of ``kind``: ``ratio`` (whole free pages: ratio_dbs takes it), ``slack``
    (half-empty pages: slack_dbs), ``corrupt`` (slack_dbs, and its VACUUM fails)."""
    key = str(dbs.resolve() / name)
    if kind == "corrupt":
        make_corrupt_db(key)
    else:
        make_bloated_db(key, rows=2000, delete_fraction=0.9 if kind == "ratio" else 0.5, scattered=kind == "slack")
    return key


def in_flight(server: Server) -> dict[str, tuple[int, int]]:
    return {name: (ch["active"], ch["starting"]) for name, ch in server.status()["channels"].items()
            if ch["active"] or ch["starting"]}


def idle(server: Server) -> bool:
    """No run anywhere: no channel's, no global slot, none followed, none in /status."""
    status = server.status()["channels"]
    return (not in_flight(server) and server._slots.busy == 0 and not server._scheduler.runs()
            and not any(ch["runs"] for ch in status.values()))


def back_to_idle_and_the_next_key_compacts(c: Case) -> None:
    wait_for(lambda: idle(c.server), HANG_S, what=f"every run's slots back (in flight: {in_flight(c.server)})")
    key = database(c.dbs, "next.db", "ratio")
    c.server.enqueue(key)
    wait_for(lambda: record_of(c.server, key).get("state") == "finished", HANG_S, what="the next key's compaction")
    wait_for(lambda: idle(c.server), HANG_S, what="the next key's run to end")


def same_channel_kind(kind: str) -> str:
    """A database of the channel a database of ``kind`` goes to, that compacts: ``ratio`` or ``slack``."""
    return "slack" if kind == "corrupt" else kind


def channel_of(kind: str) -> str:
    return "slack_dbs" if kind in ("slack", "corrupt") else "ratio_dbs"


def hold_in_batch(c: Case, key: str, state: str) -> list[Gate]:
    """Start ``key``'s run as a batch's second database and hold it at ``state``; the gates to open.

    The batch's first database ends while ``key`` waits in the channel (the channel's second
    place taken by a blocker held in its compaction): the channel starts ``key`` within that end,
    and the first one's thread takes it.
    """
    server = c.server
    kind = same_channel_kind(c.kind)
    first, blocker = database(c.dbs, "first.db", kind), database(c.dbs, "blocker.db", kind)
    first_end, blocked = gate_end(server, first), c.gated.hold(blocker)
    server.enqueue(first)
    first_end.wait_entered()
    server.enqueue(blocker)
    blocked.wait_entered()
    server.enqueue(key)
    wait_for(lambda: key in dict(server.channels()[channel_of(c.kind)].waiting()), HANG_S, what="the key queued")
    gate = gate_at(c, key, state)
    first_end.release()
    gate.wait_entered()
    return [gate, blocked]


def gate_at(c: Case, key: str, state: str) -> Gate:
    """The gate that holds ``key``'s run at ``state`` (claimed, running or finishing)."""
    if state == "claimed":
        return gate_recheck(c.server, key)
    if state == "running":
        return c.gated.hold(key)
    return gate_end(c.server, key)


def hold(c: Case, key: str, state: str, start: Callable[[], None] | None = None) -> list[Gate]:
    """Start ``key``'s run (``start``: by enqueueing it) and hold it at ``state``; the gates to
    open to let it go on."""
    if c.batch:
        return hold_in_batch(c, key, state)
    server = c.server
    start = start or (lambda: server.enqueue(key))
    if state == "starting":
        # Both of this process's worker slots go to runs of the other channel, held in their
        # compactions: the key's job is added for any worker, and waits.
        kind = "ratio" if c.kind == "corrupt" else "slack"
        gates = []
        for name in ("blocker1.db", "blocker2.db"):
            blocker = database(c.dbs, name, kind)
            gate = c.gated.hold(blocker)
            server.enqueue(blocker)
            gate.wait_entered()
            gates.append(gate)
        start()
        wait_for(lambda: sum(ch["starting"] for ch in server.status()["channels"].values()) == 1, HANG_S,
                 what="the key's run waiting for a worker")
        return gates
    gate = gate_at(c, key, state)
    start()
    gate.wait_entered()
    return [gate]


#: The state ``/status`` shows a run held at each of the test's states: a run this process's worker
#: took is ``claimed`` until its claim's commit. A batch's database after its first runs under the
#: batch's job, with no commit of its own: it is ``running`` from the hand-over, its re-check included.
SHOWN = {"starting": "starting", "claimed": "claimed", "running": "running", "finishing": "running"}
SHOWN_IN_BATCH = {**SHOWN, "claimed": "running"}


def held(c: Case, key: str, state: str, start: Callable[[], None] | None = None) -> list[Gate]:
    """:func:`hold`, and the run shown at that state in ``/status`` (it holds its slots now)."""
    gates = hold(c, key, state, start)

    def shown() -> tuple[list[str], int]:
        runs = [run["state"] for ch in c.server.status()["channels"].values() for run in ch["runs"] if run["key"] == key]
        return runs, c.server._slots.busy

    # (A second channel's start of the key, refused, gives its slot back within a loop iteration.)
    if c.batch:
        expected = ([SHOWN_IN_BATCH[state]], 2)  # the blocker holds the other slot
    else:
        expected = ([SHOWN[state]], 3 if state == "starting" else 1)
    wait_for(lambda: shown() == expected, HANG_S, what=f"the run shown {expected} (now {shown()})")
    return gates


def make_key(c: Case, kind: str) -> str:
    """The database of the run under test."""
    c.kind = kind
    return database(c.dbs, "tenant.db", kind)


def release(gates: list[Gate]) -> None:
    for gate in gates:
        gate.release()


# -- the ends ------------------------------------------------------------------------------------


def end_finish(c: Case, state: str) -> None:
    key = make_key(c, "ratio")
    release(held(c, key, state))
    wait_for(lambda: record_of(c.server, key).get("state") == "finished", HANG_S, what="the run's finish")


def end_crash(c: Case, state: str) -> None:
    key = make_key(c, "corrupt")
    release(held(c, key, state))
    wait_for(lambda: record_of(c.server, key).get("state") == "crashing", HANG_S, what="the run's crash")
    assert c.server.crashing_jobs() == {"slack_dbs": 1}


def end_backoff(c: Case, state: str) -> None:
    key = make_key(c, "ratio")
    with ChildConnection(key) as app:
        app.execute("BEGIN IMMEDIATE")  # the application holds the write lock: the compaction is busy
        release(held(c, key, state))
        wait_for(lambda: record_of(c.server, key).get("busy_count") == 1, HANG_S, what="the busy result")
        app.execute("ROLLBACK")
    assert c.server.status()["channels"]["ratio_dbs"]["deferred"] == 1


def edited(c: Case, edit: str) -> Any:
    """The config with one live edit."""
    if edit == "targets":
        return config_text(c.tmp_path, "auto_vacuum = incremental\n")
    if edit == "slots":
        return config_text(c.tmp_path, extra="max_jobs = 3\nmin_jobs = 3\njob_timeout = 20s")
    return config_text(c.tmp_path, extra="min_jobs = 4\ndb_channels = upgrade_dbs,slack_dbs")  # ratio_dbs removed


def end_live_edit(edit: str) -> Callable[[Case, str], None]:
    def end(c: Case, state: str) -> None:
        key = make_key(c, "ratio")
        gates = held(c, key, state)
        # A run whose claim has not committed compacts nothing yet: the table counts it starting
        # (a batch's database has no claim commit of its own: active from the hand-over).
        waiting_commit = state == "starting" or (state == "claimed" and not c.batch)
        assert in_flight(c.server)["ratio_dbs"] == ((c.batch, 1) if waiting_commit else (1 + c.batch, 0))
        c.server.apply_config(edited(c, edit))
        if edit == "channels":
            assert "ratio_dbs" not in c.server.channels()
            c.server.apply_config(config_text(c.tmp_path))  # and added back
        release(gates)
        wait_for(lambda: record_of(c.server, key).get("state") == "finished", HANG_S, what="the run's finish")

    return end


def end_second_channel(c: Case, state: str) -> None:
    """The trial's wedge at every state: a key waiting in two channels, started by both."""
    server = c.server
    key = make_key(c, "ratio")

    def waits_in(name: str) -> bool:
        return key in dict(server.channels()[name].waiting())

    def start() -> None:
        # Both channels held by their operator while the key comes to wait in each: in ratio_dbs,
        # then in upgrade_dbs once a live edit of auto_vacuum makes it want the key too
        for name in ("upgrade_dbs", "ratio_dbs"):
            server.suspend(name)
        server.enqueue(key)
        wait_for(lambda: waits_in("ratio_dbs"), HANG_S, what="the key queued in ratio_dbs")
        server.apply_config(edited(c, "targets"))
        server.enqueue(key)
        wait_for(lambda: waits_in("upgrade_dbs"), HANG_S, what="the key queued in upgrade_dbs too")
        server.resume()  # both start it: upgrade_dbs first, ratio_dbs's start refused

    release(held(c, key, state, start))
    wait_for(lambda: record_of(server, key).get("state") == "finished", HANG_S, what="the run's finish")
    assert record_of(server, key)["channel"] == "upgrade_dbs"


def end_reload(c: Case, state: str) -> None:
    key = make_key(c, "ratio")
    gates = held(c, key, state)
    config_text(c.tmp_path, "auto_vacuum = incremental\n")  # the file edited (as SIGHUP would find it)
    c.server.reload_config()
    assert c.server.config.sqlite.auto_vacuum is not None
    release(gates)
    wait_for(lambda: record_of(c.server, key).get("state") == "finished", HANG_S, what="the run's finish")


def end_stop(c: Case, state: str) -> None:
    key = make_key(c, "ratio")
    gates = held(c, key, state)
    stopper = threading.Thread(target=c.server.stop)
    stopper.start()
    wait_for(lambda: c.server._host.stopping, HANG_S, what="the stop under way")
    release(gates)  # a run held at a gate goes on, and finds the stop
    stopper.join(HANG_S)
    assert not stopper.is_alive()
    c.restart()
    # The key is compacted after the restart (taken back, or its end heard before the stop)
    wait_for(lambda: record_of(c.server, key).get("state") == "finished", HANG_S,
             what="the key's run after the restart")


ENDS: dict[str, Callable[[Case, str], None]] = {
    "finish": end_finish,
    "crash": end_crash,
    "backoff": end_backoff,
    "live-edit-targets": end_live_edit("targets"),
    "live-edit-slots": end_live_edit("slots"),
    "live-edit-channels": end_live_edit("channels"),
    "second-channel": end_second_channel,
    "reload": end_reload,
    "stop": end_stop,
}


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("end", list(ENDS))
def test_a_run_ended_any_way_at_any_state_frees_its_slots(
    case: Case, end: str, state: str, caplog: pytest.LogCaptureFixture,
) -> None:
    ENDS[end](case, state)
    back_to_idle_and_the_next_key_compacts(case)
    # Freed by construction: the run audit, the net under it, never had to repair anything
    assert [r.getMessage() for r in caplog.records if r.name == "smoosh.daemon.host.run_audit"] == []


@pytest.mark.parametrize("state", ("claimed", "running", "finishing"))
@pytest.mark.parametrize("end", [end for end in ENDS if end != "second-channel"])
def test_a_batchs_database_ended_any_way_at_any_state_frees_its_slots(
    case: Case, end: str, state: str, caplog: pytest.LogCaptureFixture,
) -> None:
    # (A key waiting in two channels is one channel's start refused at its submit: no batch's.)
    case.batch = True
    ENDS[end](case, state)
    case.batch = False  # the next key compacts on its own
    back_to_idle_and_the_next_key_compacts(case)
    assert [r.getMessage() for r in caplog.records if r.name == "smoosh.daemon.host.run_audit"] == []


# -- the take-over at start ------------------------------------------------------------------------


def left_behind(store: Store, key: str, state: str) -> tuple[Jobs, Any] | None:
    """The job a daemon that died with ``key``'s run at ``state`` left in the store.

    ``following``: a live worker elsewhere runs it (the new daemon follows it); the job layer
    it runs it with and its job are returned, so the test can finish it as that worker.
    """
    clock = FakeClock(time.time())
    jobs = Jobs(store, monitors=False, clock=clock)
    jobs.set_type_timeout(NODE_TYPE, 30)
    data = {"channel": "ratio_dbs", "key": key, "priority": 2.0, "progress": 0.0, "run": 4242}
    jobs.add(NODE_TYPE, key, data)
    if state == "starting":
        jobs.close()
        return None
    job, data = jobs.accept(NODE_TYPE, timeout=5)
    if state == "claimed":  # accepted, never heartbeated nor named: the dead daemon's own
        jobs.close()
        return None
    if state == "running":  # its heartbeat expired
        jobs.update(job, {**data, "progress": 0.3, "worker": "daemon", "holder": "gone", "heartbeat_at": clock() - 31})
        jobs.close()
        return None
    if state == "finishing":  # finished, its removal never written
        jobs.finish(job, {**data, "result": "ok"})
        jobs.close()
        return None
    job = jobs.update(job, {**data, "progress": 0.3, "worker": "process", "holder": "alive", "heartbeat_at": clock()})
    return jobs, job


@pytest.mark.parametrize("state", (*STATES, "following"))
def test_a_run_left_by_a_daemon_that_died_frees_its_slots_after_the_take_over(
    tmp_path: Path, dbs: Path, state: str,
) -> None:
    store = open_store("memory:")
    key = database(dbs, "tenant.db", "ratio")
    elsewhere = left_behind(store, key, state)
    server, gated = start_server(tmp_path, store)
    try:
        c = Case(tmp_path, dbs, store, server, gated, [server])
        if elsewhere is not None:
            # Followed: its channel counts it until the worker elsewhere finishes it
            wait_for(lambda: in_flight(server) == {"ratio_dbs": (1, 0)}, HANG_S, what="the run followed")
            jobs, job = elsewhere
            jobs.finish(job, {"channel": "ratio_dbs", "key": key, "run": 4242, "result": "ok",
                              "size_before_bytes": 10, "size_after_bytes": 5})
            jobs.close()
        elif state != "finishing":
            # Taken back: queued at the top and compacted here
            wait_for(lambda: record_of(server, key).get("state") == "finished", HANG_S, what="the key taken back")
        back_to_idle_and_the_next_key_compacts(c)
    finally:
        server.stop()
        store.close()


def test_a_compaction_thread_that_fails_outside_its_compaction_still_ends_its_run(case: Case) -> None:
    # Given the worker's step around the compaction raises (a bug there, not the database)
    worker = case.server._worker
    compact = worker._compact
    calls = []

    def broken(running: Any, started: float) -> Any:
        if not calls:
            calls.append(running.key)
            raise RuntimeError("the I/O class could not be set")
        return compact(running, started)

    worker._compact = broken
    key = make_key(case, "ratio")
    case.server.enqueue(key)
    # Then its channel hears the run ended failed (with a backoff), and nothing stays held
    wait_for(lambda: record_of(case.server, key).get("state") == "crashing", HANG_S, what="the failed end heard")
    assert record_of(case.server, key)["last_error"] == (
        "the compaction's thread failed: RuntimeError: the I/O class could not be set")
    back_to_idle_and_the_next_key_compacts(case)
