"""Rotation and the fair global cap (DESIGN §5.6): a long chunked compaction makes way.

A real server with one in-process worker and ``max_jobs = 1``: a large database compacts in
a few chunks, each run of it held at its second chunk boundary until the test lets it on, while a small one
waits in another channel for the only slot. Rotation stops the large one at that boundary,
the small one runs, and the large one then finishes from where it stopped (its progress is
in the file).
"""

from __future__ import annotations

from pathlib import Path

from compactor.dbfactory import db_stats, integrity, make_bloated_db
from compactor.gates import GateEachRun
from helpers.chunked import chunk_section, chunked_db
from helpers.clocks import FakeClock
from helpers.daemon import HANG_S, wait_for
from smoosh import Server
from smoosh.compactors import SqliteCompactor
from smoosh.config import parse_config


def config_text(tmp_path: Path, dbs: Path, max_churn: int, chunks: str) -> str:
    return f"""[smoosh]
watch =
roots = {dbs}
state_dir = {tmp_path / 'state'}
store = sqlite:{tmp_path / 'jobs.db'}
node = t
wait_secs = 0
job_timeout = 3s
max_jobs = 1
interval = 1s
max_churn = {max_churn}
db_channels = big_dbs,small_dbs

[smoosh.big_dbs]
priority = ratio
min_size = 16KiB
match = {dbs}/big.db

[smoosh.small_dbs]
priority = ratio
min_size = 16KiB
match = {dbs}/small.db

{chunks}"""


def freelist(path: Path) -> int:
    # Through apsw, the library the server's compactions in this process use: a stdlib
    # connection here could drop their locks when it closes (DESIGN §11).
    return int(db_stats(str(path))["freelist_count"])


def start_two(tmp_path: Path, max_churn: int) -> tuple[Server, Path, Path, FakeClock, GateEachRun]:
    """A server whose big compaction is held at its second chunk boundary (each run until the
    test lets it through) while the small database waits for the only slot."""
    dbs = tmp_path / "dbs"
    dbs.mkdir()
    big, small = dbs / "big.db", dbs / "small.db"
    made = chunked_db(big)
    make_bloated_db(str(small), rows=1000, delete_fraction=0.8)
    config = parse_config(config_text(tmp_path, dbs, max_churn, chunk_section(made)), str(tmp_path / "smoosh.ini"))
    clock = FakeClock(1_800_000_000.0)
    gated = GateEachRun(SqliteCompactor(config.sqlite), at_checkpoint=2)
    server = Server(config, workers=1, watch_config=False, clock=clock, compactors=[gated])
    server.start()
    server.enqueue(str(big))
    assert gated.arrived.acquire(timeout=HANG_S), "big never ran"
    # Past its first chunk boundary: only then can it stop without losing work.
    assert server._worker.status()[0]["suspendable"]  # type: ignore[attr-defined]
    assert server.status()["channels"]["big_dbs"]["active"] == 1
    server.enqueue(str(small))
    wait_for(lambda: server.status()["channels"]["small_dbs"]["waiting"]["size"] == 1, HANG_S, what="small queued")
    server.tick()  # small_dbs asks for the only slot and joins the line
    return server, big, small, clock, gated


def ok_count(server: Server, channel: str) -> int:
    return server.counters.compactions.get((channel, "ok"), 0)


def test_a_long_chunked_compaction_is_rotated_out_for_waiting_work(tmp_path: Path) -> None:
    server, big, small, clock, gated = start_two(tmp_path, max_churn=20)
    try:
        clock.now += 1.5  # big has held the slot longer than `interval`
        server.tick()
        assert server.counters.rotations == 1
        gated.let_one_through()  # on to its chunk boundary, where the rotation stops it
        wait_for(lambda: ok_count(server, "small_dbs") == 1, HANG_S, what="small compacted")
        # The small database ran while the big one was stopped half-way, not after it.
        assert ok_count(server, "big_dbs") == 0
        assert server.counters.rotations >= 1
        assert 0 < freelist(big)
        # Its next run goes on from where the first stopped, to the end
        gated.let_one_through()
        wait_for(lambda: ok_count(server, "big_dbs") == 1, HANG_S, what="big compacted after all")
        assert freelist(big) == 0 and integrity(str(big)) == "ok"
        assert integrity(str(small)) == "ok"
    finally:
        for _ in range(3):
            gated.let_one_through()
        server.stop()


def test_max_churn_zero_turns_rotation_off(tmp_path: Path) -> None:
    server, big, small, clock, gated = start_two(tmp_path, max_churn=0)
    try:
        clock.now += 1.5
        server.tick()
        gated.let_one_through()
        wait_for(lambda: ok_count(server, "small_dbs") == 1, HANG_S, what="small compacted")
        # Without rotation the small database waited for the big one to finish.
        assert ok_count(server, "big_dbs") == 1
        assert server.counters.rotations == 0
    finally:
        for _ in range(3):
            gated.let_one_through()
        server.stop()
