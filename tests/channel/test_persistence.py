"""Checkpoints: periodic and final writes, restore, corruption, refused keys, flush, failures.

Writes happen on the checkpointer's own thread; the tests wait for it with ``join_checkpoint``
(bounded), never with a sleep.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from channel_testlib import NAME, T0, Journal, MakeChannel, RecordingHost, Settings

import channels.checkpointer as checkpointer_module
from persist import read_checkpoint, write_checkpoint

INTERVAL_S = 180.0


def _path(state_dir: Path, name: str = NAME) -> Path:
    return state_dir / f"{name}.smooshq"


def test_close_checkpoints_waiting_keys_and_in_flight_keys_at_infinity(make_channel: MakeChannel, tmp_path: Path) -> None:
    h = make_channel(settings=Settings(concurrency=2), state_dir=tmp_path)
    h.channel.enqueue("/db/a", 5.0)
    h.channel.enqueue("/db/b", 3.0)
    h.channel.enqueue("/db/c", 2.0)
    h.tick()
    h.running("/db/a")  # one active, one starting
    del h.journal[:]
    in_flight = h.channel.close()
    assert sorted(in_flight) == ["/db/a", "/db/b"]
    assert list(read_checkpoint(_path(tmp_path)).items()) == [("/db/b", math.inf), ("/db/a", math.inf), ("/db/c", 2.0)]
    # Closing hands the in-flight runs to their workers: the global slots are given back,
    # and the channel leaves the slot line.
    assert h.journal == [("release_slot",), ("release_slot",), ("withdraw",)]
    assert h.host.slots == 0
    assert h.status()["starting"] == 0 and h.status()["active"] == 0


def test_close_without_checkpoint_writes_nothing(make_channel: MakeChannel, tmp_path: Path) -> None:
    h = make_channel(state_dir=tmp_path, settings=Settings(concurrency=0))
    h.channel.enqueue("/db/a", 5.0)
    assert h.channel.close(checkpoint=False) == []
    assert not _path(tmp_path).exists()


def test_restored_in_flight_key_starts_first(make_channel: MakeChannel, tmp_path: Path) -> None:
    write_checkpoint(_path(tmp_path), {"/db/low": 2.0, "/db/crashed": math.inf, "/db/mid": 4.0})
    h = make_channel(state_dir=tmp_path)
    assert h.channel.waiting() == [("/db/crashed", math.inf), ("/db/mid", 4.0), ("/db/low", 2.0)]
    h.tick()
    assert h.started() == ["/db/crashed"]


def test_restored_queue_is_truncated_to_capacity_keeping_the_highest(make_channel: MakeChannel, tmp_path: Path, caplog: Any) -> None:
    write_checkpoint(_path(tmp_path), {f"/db/{i}": float(i) for i in range(10)} | {"/db/tie": 8.0})
    with caplog.at_level(logging.INFO, logger=f"channels.channel.{NAME}"):
        h = make_channel(state_dir=tmp_path, settings=Settings(capacity=3, concurrency=0), checkpoint_interval_s=INTERVAL_S)
    assert h.channel.waiting() == [("/db/9", 9.0), ("/db/8", 8.0), ("/db/tie", 8.0)]
    assert h.status()["waiting"] == {"size": 3, "min": 8.0, "max": 9.0}
    assert [r.getMessage() for r in caplog.records] == [
        f"Channel ratio_dbs: restored 3 key(s) from {str(_path(tmp_path))!r} (8 dropped over capacity)."
    ]
    # The file no longer matches the queue: the next checkpoint rewrites it.
    assert h.tick() == T0 + INTERVAL_S
    h.tick(INTERVAL_S)
    assert h.channel.join_checkpoint(5)
    assert list(read_checkpoint(_path(tmp_path))) == ["/db/9", "/db/8", "/db/tie"]


def test_restored_order_keeps_first_in_first_out_among_equals(make_channel: MakeChannel, tmp_path: Path) -> None:
    h = make_channel(state_dir=tmp_path, settings=Settings(concurrency=0))
    for key in ["/db/z", "/db/a", "/db/m"]:
        h.channel.enqueue(key, 1.0)
    h.channel.close()
    h2 = make_channel(state_dir=tmp_path, settings=Settings(concurrency=0))
    assert [k for k, _ in h2.channel.waiting()] == ["/db/z", "/db/a", "/db/m"]
    assert h2.tick() is None  # the file holds exactly this queue: nothing to write


def test_restored_key_already_compacted_is_dropped_without_starting(make_channel: MakeChannel, tmp_path: Path) -> None:
    # Upstream t_ignore_checkpoint_resume_if_compacted_already: the job finished while the
    # daemon was down, so the scheduler's re-check says 0 and no job is ever added.
    write_checkpoint(_path(tmp_path), {"/db/a": math.inf})
    h = make_channel(state_dir=tmp_path)
    h.tick()
    h.drop("/db/a", "its priority is now 0 (compacted or gone)", priority=0)
    assert h.channel.keys() == set()
    assert h.host.outcomes == []
    assert h.host.slots == 0


def test_restored_key_the_host_refuses_is_dropped_and_the_file_rewritten(make_channel: MakeChannel, tmp_path: Path, caplog: Any) -> None:
    # A checkpoint is a file anyone with access to state_dir could have written: restored
    # keys are validated like new ones.
    write_checkpoint(_path(tmp_path), {"/etc/shadow": math.inf, "/db/a": 5.0, "../../x": 3.0})
    host = RecordingHost(Journal())
    host.refused = {"/etc/shadow", "../../x"}
    with caplog.at_level(logging.INFO, logger=f"channels.channel.{NAME}"):
        h = make_channel(state_dir=tmp_path, host=host, settings=Settings(concurrency=0), checkpoint_interval_s=INTERVAL_S)
    assert host.calls("admits") == [("admits", "/etc/shadow"), ("admits", "/db/a"), ("admits", "../../x")]
    assert h.channel.waiting() == [("/db/a", 5.0)]
    assert [r.getMessage() for r in caplog.records] == [
        f"Channel ratio_dbs: restored 1 key(s) from {str(_path(tmp_path))!r} (0 dropped over capacity)."
    ]
    assert h.tick() == T0 + INTERVAL_S
    h.tick(INTERVAL_S)
    assert h.channel.join_checkpoint(5)
    assert read_checkpoint(_path(tmp_path)) == {"/db/a": 5.0}


def test_corrupt_checkpoint_is_moved_aside_and_the_channel_starts_empty(make_channel: MakeChannel, tmp_path: Path, caplog: Any) -> None:
    path = _path(tmp_path)
    path.write_bytes(b"SMOOSHQ\x00 this is not a checkpoint")
    h = make_channel(state_dir=tmp_path)
    assert h.channel.waiting() == []
    assert not path.exists()
    aside = tmp_path / f"ratio_dbs.smooshq.corrupt-{int(T0)}"
    assert aside.read_bytes() == b"SMOOSHQ\x00 this is not a checkpoint"
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    message = record.getMessage()
    assert message.startswith(f"Channel ratio_dbs: checkpoint {str(path)!r} is corrupt (")
    assert message.endswith(f"); moved it to {str(aside)!r} and starting empty.")
    # The channel works normally afterwards.
    h.channel.enqueue("/db/a", 1.0)
    h.tick()
    assert h.started() == ["/db/a"]


def test_zero_length_checkpoint_is_corrupt_too(make_channel: MakeChannel, tmp_path: Path) -> None:
    _path(tmp_path).write_bytes(b"")
    h = make_channel(state_dir=tmp_path)
    assert h.channel.waiting() == []
    assert (tmp_path / f"ratio_dbs.smooshq.corrupt-{int(T0)}").exists()


def test_checkpoint_is_written_every_interval_off_the_loop(make_channel: MakeChannel, tmp_path: Path) -> None:
    h = make_channel(state_dir=tmp_path, settings=Settings(concurrency=0), checkpoint_interval_s=INTERVAL_S)
    h.channel.enqueue("/db/a", 5.0)
    assert h.tick(INTERVAL_S - 1) == T0 + INTERVAL_S
    assert h.channel.join_checkpoint(5)
    assert not _path(tmp_path).exists()
    h.tick(1)
    assert h.channel.join_checkpoint(5)
    assert read_checkpoint(_path(tmp_path)) == {"/db/a": 5.0}
    h.channel.enqueue("/db/b", 6.0)
    h.tick(INTERVAL_S)
    assert h.channel.join_checkpoint(5)
    assert read_checkpoint(_path(tmp_path)) == {"/db/b": 6.0, "/db/a": 5.0}


def test_unchanged_queue_is_not_rewritten(make_channel: MakeChannel, tmp_path: Path, monkeypatch: Any) -> None:
    writes: list[dict[str, float]] = []

    def counting_write(path: str, mapping: dict[str, float]) -> None:
        writes.append(dict(mapping))
        write_checkpoint(path, mapping)

    monkeypatch.setattr(checkpointer_module, "write_checkpoint", counting_write)
    h = make_channel(state_dir=tmp_path, settings=Settings(concurrency=0), checkpoint_interval_s=INTERVAL_S)
    h.channel.enqueue("/db/a", 5.0)
    for _ in range(3):
        h.tick(INTERVAL_S)
        assert h.channel.join_checkpoint(5)
    assert writes == [{"/db/a": 5.0}]
    # Nothing changed since the write: no checkpoint is due, so the owner need not tick.
    assert h.channel.next_due() is None


def test_checkpoint_is_due_only_when_the_queue_changed(make_channel: MakeChannel, tmp_path: Path) -> None:
    h = make_channel(state_dir=tmp_path, settings=Settings(concurrency=0), checkpoint_interval_s=INTERVAL_S)
    assert h.tick() is None  # empty, no file: nothing to write
    h.channel.enqueue("/db/a", 5.0)
    assert h.channel.next_due() == T0 + INTERVAL_S
    h.tick(INTERVAL_S)
    assert h.channel.join_checkpoint(5)
    assert h.channel.next_due() is None
    h.channel.enqueue("/db/b", 1.0)
    assert h.channel.next_due() == T0 + 2 * INTERVAL_S


def test_set_checkpoint_interval_brings_the_next_checkpoint_forward(make_channel: MakeChannel, tmp_path: Path) -> None:
    h = make_channel(state_dir=tmp_path, settings=Settings(concurrency=0), checkpoint_interval_s=INTERVAL_S)
    h.channel.enqueue("/db/a", 5.0)
    h.tick(10)
    h.channel.set_checkpoint_interval(20.0, h.now)
    assert h.channel.next_due() == T0 + 30  # at most one new interval from now
    h.tick(20)
    assert h.channel.join_checkpoint(5)
    assert read_checkpoint(_path(tmp_path)) == {"/db/a": 5.0}
    # A longer interval never pushes a due checkpoint back.
    h.channel.enqueue("/db/b", 6.0)
    h.channel.set_checkpoint_interval(3600.0, h.now)
    assert h.channel.next_due() == T0 + 50
    h.tick(20)
    assert h.channel.join_checkpoint(5)
    assert read_checkpoint(_path(tmp_path)) == {"/db/b": 6.0, "/db/a": 5.0}
    h.channel.enqueue("/db/c", 7.0)
    assert h.channel.next_due() == T0 + 50 + 3600


def test_a_second_checkpoint_never_starts_while_one_runs(make_channel: MakeChannel, tmp_path: Path, monkeypatch: Any) -> None:
    release = threading.Event()
    writes: list[dict[str, float]] = []

    def slow_write(path: str, mapping: dict[str, float]) -> None:
        writes.append(dict(mapping))
        release.wait(10)
        write_checkpoint(path, mapping)

    monkeypatch.setattr(checkpointer_module, "write_checkpoint", slow_write)
    h = make_channel(state_dir=tmp_path, settings=Settings(concurrency=0), checkpoint_interval_s=INTERVAL_S)
    h.channel.enqueue("/db/a", 5.0)
    h.tick(INTERVAL_S)
    h.channel.enqueue("/db/b", 6.0)
    h.tick(INTERVAL_S)  # the first write is still running: skipped
    # The loop was not blocked by the write: it keeps ticking and queueing.
    assert h.channel.enqueue("/db/c", 7.0)
    release.set()
    assert h.channel.join_checkpoint(5)
    assert writes == [{"/db/a": 5.0}]
    h.tick(INTERVAL_S)
    assert h.channel.join_checkpoint(5)
    assert len(writes) == 2
    assert read_checkpoint(_path(tmp_path)) == {"/db/c": 7.0, "/db/b": 6.0, "/db/a": 5.0}


def test_failed_checkpoint_is_counted_and_the_channel_goes_on(make_channel: MakeChannel, tmp_path: Path, monkeypatch: Any) -> None:
    def broken_write(path: str, mapping: dict[str, float]) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpointer_module, "write_checkpoint", broken_write)
    h = make_channel(state_dir=tmp_path, checkpoint_interval_s=INTERVAL_S)
    h.channel.enqueue("/db/a", 5.0)
    h.channel.enqueue("/db/b", 4.0)
    h.tick(INTERVAL_S)
    assert h.channel.join_checkpoint(5)
    assert h.status()["checkpoint_errors"] == 1
    assert h.started() == ["/db/a"]
    # Still failing: each attempt is counted (the state is still unwritten, so still due).
    assert h.channel.next_due() == T0 + 2 * INTERVAL_S
    h.tick(INTERVAL_S)
    assert h.channel.join_checkpoint(5)
    assert h.status()["checkpoint_errors"] == 2
    assert h.channel.close() == ["/db/a"]  # never raises
    assert h.status()["checkpoint_errors"] == 3


def test_checkpoint_into_a_vanished_state_dir_is_counted(make_channel: MakeChannel, tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    h = make_channel(state_dir=state_dir, settings=Settings(concurrency=1), checkpoint_interval_s=INTERVAL_S)
    h.channel.enqueue("/db/a", 5.0)
    state_dir.rmdir()
    h.tick(INTERVAL_S)
    assert h.channel.join_checkpoint(5)
    assert h.status()["checkpoint_errors"] == 1
    assert h.started() == ["/db/a"]  # the channel goes on


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores directory permissions")
def test_checkpoint_into_a_read_only_state_dir_is_counted(make_channel: MakeChannel, tmp_path: Path) -> None:
    h = make_channel(state_dir=tmp_path, settings=Settings(concurrency=0), checkpoint_interval_s=INTERVAL_S)
    h.channel.enqueue("/db/a", 5.0)
    tmp_path.chmod(0o500)
    try:
        h.tick(INTERVAL_S)
        assert h.channel.join_checkpoint(5)
        assert h.status()["checkpoint_errors"] == 1
    finally:
        tmp_path.chmod(0o700)


def test_flush_deletes_the_checkpoint_and_keeps_running_jobs(make_channel: MakeChannel, tmp_path: Path) -> None:
    h = make_channel(state_dir=tmp_path, checkpoint_interval_s=INTERVAL_S)
    for key, priority in [("/db/a", 5.0), ("/db/b", 4.0), ("/db/c", 3.0)]:
        h.channel.enqueue(key, priority)
    h.tick()
    h.running("/db/a")
    h.tick(INTERVAL_S)
    assert h.channel.join_checkpoint(5)
    assert _path(tmp_path).exists()
    h.channel.flush()
    assert not _path(tmp_path).exists()
    assert h.channel.waiting() == []
    assert h.status()["active"] == 1
    h.end("/db/a")
    assert h.host.results() == {"/db/a": "ok"}


def test_persistence_off_touches_no_file(make_channel: MakeChannel, tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    h = make_channel(state_dir=None, checkpoint_interval_s=1.0)
    h.channel.enqueue("/db/a", 5.0)
    for _ in range(3):
        h.tick(1)
    assert h.channel.next_due() is None
    h.channel.flush()
    h.channel.close()
    assert os.listdir(tmp_path) == []
