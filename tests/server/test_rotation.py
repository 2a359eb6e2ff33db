"""Rotation and the fair global cap (DESIGN §5.6): a long chunked compaction makes way.

A real server with one in-process worker and ``max_jobs = 1``: a large database compacts in
one-page chunks while a small one waits in another channel for the only slot. Rotation
stops the large one at a chunk boundary, the small one runs, and the large one then finishes
from where it stopped (its progress is in the file).
"""

from __future__ import annotations

from pathlib import Path

from compactor.dbfactory import db_stats, integrity, make_bloated_db
from helpers.daemon import wait_for
from helpers.slow import SlowChunks
from smoosh import Server
from smoosh.config import parse_config
from helpers.clocks import FakeClock


def config_text(tmp_path: Path, dbs: Path, max_churn: int) -> str:
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

[smoosh.sqlite]
incremental_chunk_pages = 1
"""


def freelist(path: Path) -> int:
    # Through apsw, the library the server's compactions in this process use: a stdlib
    # connection here could drop their locks when it closes (DESIGN §11).
    return int(db_stats(str(path))["freelist_count"])


def start_two(tmp_path: Path, max_churn: int) -> tuple[Server, Path, Path, FakeClock]:
    dbs = tmp_path / "dbs"
    dbs.mkdir()
    big, small = dbs / "big.db", dbs / "small.db"
    make_bloated_db(str(big), rows=3000, delete_fraction=0.8, auto_vacuum="incremental")
    make_bloated_db(str(small), rows=1000, delete_fraction=0.8)
    config = parse_config(config_text(tmp_path, dbs, max_churn), str(tmp_path / "smoosh.ini"))
    clock = FakeClock(1_800_000_000.0)
    server = Server(config, workers=1, watch_config=False, clock=clock,
                    compactors=[SlowChunks(config.sqlite, pause_s=0.002)])
    server.start()
    server.enqueue(str(big))
    wait_for(lambda: server.status()["channels"]["big_dbs"]["active"] == 1, 15, what="big running")
    # Past its first chunk boundary: only then can it stop without losing work.
    wait_for(lambda: server._worker.status()[0]["suspendable"], 15, what="big past a chunk")  # type: ignore[attr-defined]
    server.enqueue(str(small))
    wait_for(lambda: server.status()["channels"]["small_dbs"]["waiting"]["size"] == 1, 15, what="small queued")
    server.tick()  # small_dbs asks for the only slot and joins the line
    return server, big, small, clock


def ok_count(server: Server, channel: str) -> int:
    return server.counters.compactions.get((channel, "ok"), 0)


def test_a_long_chunked_compaction_is_rotated_out_for_waiting_work(tmp_path: Path) -> None:
    server, big, small, clock = start_two(tmp_path, max_churn=20)
    try:
        clock.now += 1.5  # big has held the slot longer than `interval`
        server.tick()
        assert server.counters.rotations == 1
        wait_for(lambda: ok_count(server, "small_dbs") == 1, 30, what="small compacted")
        # The small database ran while the big one was stopped half-way, not after it.
        assert ok_count(server, "big_dbs") == 0
        assert server.counters.rotations >= 1
        assert 0 < freelist(big)
        wait_for(lambda: ok_count(server, "big_dbs") == 1, 60, what="big compacted after all")
        assert freelist(big) == 0 and integrity(str(big)) == "ok"
        assert integrity(str(small)) == "ok"
    finally:
        server.stop()


def test_max_churn_zero_turns_rotation_off(tmp_path: Path) -> None:
    server, big, small, clock = start_two(tmp_path, max_churn=0)
    try:
        clock.now += 1.5
        server.tick()
        wait_for(lambda: ok_count(server, "small_dbs") == 1, 60, what="small compacted")
        # Without rotation the small database waited for the big one to finish.
        assert ok_count(server, "big_dbs") == 1
        assert server.counters.rotations == 0
    finally:
        server.stop()
