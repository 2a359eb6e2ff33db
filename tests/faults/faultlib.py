"""Shared pieces of the fault tests: daemons, a writer process, integrity and checkpoint reads.

Import as ``from faults.faultlib import ...`` (``tests/`` is on sys.path, see tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

import helpers.daemon
from helpers.daemon import Daemon, free_port, write_config
from persist import read_checkpoint
from smoosh.daemon.results import read_rows
from smoosh.store import open_store

#: Whether this run is `make soak` (SMOOSH_SOAK=1).
SOAK = os.environ.get("SMOOSH_SOAK") == "1"

WRITER = str(Path(__file__).with_name("db_writer.py"))


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen]]:
    """Helper processes a test started (writers, workers, lock holders); killed at the end."""
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGCONT)
            except ProcessLookupError:
                pass
            p.kill()
        p.wait(10)


def start_daemon(daemons: list[Daemon], config: Path, *args: str) -> Daemon:
    d = Daemon(config, args=args)
    daemons.append(d)
    d.wait_ready()
    return d


def start_writer(processes: list[subprocess.Popen], directory: Path, count: int, seed: int) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, WRITER, str(directory), str(count), str(seed)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    processes.append(p)
    return p


def start_worker(processes: list[subprocess.Popen], config: Path) -> subprocess.Popen:
    p = helpers.daemon.start_worker(config)
    processes.append(p)
    return p


def integrity(path: Path | str) -> str:
    """``PRAGMA integrity_check`` of a database, read-only ("ok" when intact)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10, isolation_level=None)
    try:
        return "\n".join(row[0] for row in conn.execute("PRAGMA integrity_check").fetchall())
    finally:
        conn.close()


def damaged(paths: list[Path]) -> dict[str, str]:
    """The databases among ``paths`` that fail their integrity check, with the report."""
    bad = {}
    for path in paths:
        if path.exists():
            try:
                result = integrity(path)
            except sqlite3.Error as e:  # "file is not a database", "malformed": damage too
                result = f"{type(e).__name__}: {e}"
            if result != "ok":
                bad[str(path)] = result
    return bad


def checkpoints(state_dir: Path) -> dict[str, dict[str, float]]:
    """Every channel's checkpoint in ``state_dir``, read with persist.read_checkpoint."""
    return {Path(p).name: read_checkpoint(p) for p in sorted(glob.glob(str(state_dir / "*.smooshq")))}


def corrupt_files(state_dir: Path) -> list[str]:
    """Checkpoints a daemon found damaged and moved aside."""
    return sorted(glob.glob(str(state_dir / "*.corrupt-*")))


def queued_keys(ckpts: dict[str, dict[str, float]]) -> set[str]:
    return {key for mapping in ckpts.values() for key in mapping}


@contextlib.contextmanager
def tmpfs_on(directory: Path, options: str, *, without_root: str = "") -> Iterator[Path]:
    """A tmpfs mounted on ``directory`` (``mount -o OPTIONS``) while the block runs, unmounted after.

    Skips the test where it cannot be mounted: mounting needs root (``without_root`` adds what
    covers the case then).
    """
    if os.geteuid() != 0:
        pytest.skip(f"mounting a tmpfs needs root{f' ({without_root})' if without_root else ''}")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(directory)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False)


def fill(directory: Path) -> Path:
    """Write a filler file until the file system is full; its path (remove it to make room)."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    return filler


def patient_config(tmp_path: Path) -> Path:
    """A daemon's config over ``tmp_path/dbs`` (no watch) whose compactions wait up to a minute for
    a quiet moment: a test's application transaction holds a compaction until the test lets go."""
    return write_config(tmp_path, port=free_port(), extra_global=f"watch =\nroots = {tmp_path / 'dbs'}",
                        channels="[smoosh.sqlite]\nbusy_timeout = 60s\n")


def finished_in_store(state: Path, node: str) -> set[str]:
    """Keys whose finish the store holds (their durable history rows), read as any process can."""
    store = open_store(f"sqlite:{state / 'jobs.db'}")
    try:
        return set(store.transact(lambda tr: read_rows(tr.snapshot, node)))
    finally:
        store.close()
