"""A corrupt job store: one line naming the way forward, and ``smoosh run --reset-store`` taking it (issue 18).

The store is a real one (jobs written through the job layer), then damaged the way a disk
fault damages a file: every b-tree page after the first has its header overwritten.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from helpers.daemon import Daemon, free_port, write_config
from opslib import smoosh_cli
from smoosh.daemon.control.store_reset import corruption, open_job_store, set_aside
from smoosh.errors import CorruptStore

MESSAGE = (
    "smoosh: the job store {path} is corrupt ({reason}); run 'smoosh run --reset-store' to move it aside"
    " (renamed jobs.db.corrupt-<unix seconds>, never deleted) and start with an empty store"
)


def make_corrupt_store(path: Path) -> bytes:
    """A real job store with 200 jobs, then every page after the first damaged; its bytes."""
    from smoosh.jobs import Jobs
    from smoosh.store import open_store

    with open_store(f"sqlite:{path}") as store:
        jobs = Jobs(store, monitors=False)
        jobs.set_type_timeout("t", 30)
        for i in range(200):
            jobs.add("t", f"job{i}", {"x": "y" * 200})
        jobs.close()
    data = bytearray(path.read_bytes())
    page_size = int.from_bytes(data[16:18], "big")
    for offset in range(page_size, len(data), page_size):
        data[offset:offset + 8] = b"\xff" * 8
    path.write_bytes(bytes(data))
    for suffix in ("-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    return bytes(data)




def test_a_corrupt_store_stops_the_daemon_with_one_line_naming_the_flag(tmp_path: Path) -> None:
    # Given a config whose job store is damaged
    config = write_config(tmp_path, port=free_port())
    store = tmp_path / "state" / "jobs.db"
    make_corrupt_store(store)
    reason = corruption(str(store))
    assert reason is not None and "\n" not in reason
    # When the daemon starts on it
    done = smoosh_cli("run", "--config", str(config), env={"SMOOSH_LOG_LEVEL": "ERROR"})
    # Then it exits 1 with one line that names the file, SQLite's words and the flag
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [MESSAGE.format(path=store, reason=reason)]
    assert "Traceback" not in done.stderr
    assert not list(store.parent.glob("jobs.db.corrupt-*"))  # nothing moved without the flag


def test_reset_store_moves_the_corrupt_store_aside_and_starts_empty(tmp_path: Path, daemons: list[Daemon]) -> None:
    # Given a damaged job store
    config = write_config(tmp_path, port=free_port())
    store = tmp_path / "state" / "jobs.db"
    damaged = make_corrupt_store(store)
    # When the daemon starts with --reset-store
    d = Daemon(config, args=("--reset-store",))
    daemons.append(d)
    d.wait_ready()
    # Then it serves, on a new, healthy store, with no jobs
    assert d.get("/jobs") == {"jobs": [], "total": 0, "offset": 0, "next_offset": None}
    assert corruption(str(store)) is None
    # And the damaged file was renamed with the time, byte for byte, not deleted
    aside = [p for p in store.parent.iterdir() if re.fullmatch(r"jobs\.db\.corrupt-\d+", p.name)]
    assert len(aside) == 1 and aside[0].read_bytes() == damaged
    assert d.stop() == 0
    log = d.log_path.read_text()
    assert f"WARNING smoosh.daemon.control.store_reset: The job store {store} was corrupt" in log
    assert f"moved it aside to {aside[0]} and started with an empty store." in log


def test_reset_store_leaves_a_healthy_store_alone(tmp_path: Path) -> None:
    # Given a healthy store
    path = tmp_path / "jobs.db"
    open_job_store(f"sqlite:{path}").close()
    before = path.read_bytes()
    # When it is opened with the reset flag, twice
    for _ in range(2):
        open_job_store(f"sqlite:{path}", reset=True).close()
    # Then nothing was moved
    assert sorted(p.name for p in tmp_path.iterdir() if "corrupt" in p.name) == []
    assert path.read_bytes()[:100] == before[:100]


def test_a_set_aside_never_overwrites_an_earlier_one(tmp_path: Path) -> None:
    # Given a store set aside at one instant, and a second damaged store at the same instant
    path = tmp_path / "jobs.db"
    first = make_corrupt_store(path)
    Path(str(path) + "-wal").write_bytes(b"wal of the first")
    moved = set_aside(str(path), 1_700_000_000.9)
    second = make_corrupt_store(path)
    # When it is set aside too
    moved_again = set_aside(str(path), 1_700_000_000.2)
    # Then both are kept, each with its side files
    assert moved == f"{path}.corrupt-1700000000"
    assert moved_again == f"{path}.corrupt-1700000000-1"
    assert Path(moved).read_bytes() == first and Path(moved_again).read_bytes() == second
    assert Path(moved + "-wal").read_bytes() == b"wal of the first"
    assert not path.exists() and not Path(str(path) + "-wal").exists()


def test_without_the_flag_the_corrupt_store_is_a_corrupt_store_error(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    make_corrupt_store(path)
    with pytest.raises(CorruptStore) as caught:
        open_job_store(f"sqlite:{path}")
    assert caught.value.path == os.path.abspath(path)
    assert str(caught.value) == MESSAGE.format(path=path, reason=caught.value.reason)[len("smoosh: "):]
