"""The instance lock of a ``state_dir`` fails closed (issue 25): a daemon that cannot take it does
not start; one that can, on a full disk, holds it.

``state_dir`` is a real tmpfs filled to the last block and inode (mounting needs root: skipped
otherwise). Before, a daemon that could not create the lock file logged "nothing stops a second
daemon on it" and went on.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from faults.faultlib import fill, start_daemon, tmpfs_on
from helpers.daemon import Daemon, free_port, write_config


@pytest.fixture
def full_state_dir(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path/state``: a tiny tmpfs (the test fills it with :func:`use_up`)."""
    state = tmp_path / "state"
    state.mkdir()
    with tmpfs_on(state, "size=64k,nr_inodes=16"):
        yield state


def use_up(directory: Path) -> None:
    """Use up the file system's blocks, then its inodes."""
    fill(directory)
    for i in range(10_000):
        try:
            (directory / f"inode-{i}").touch()
        except OSError:
            return
    raise AssertionError("the file system never ran out of inodes")


def config_beside(tmp_path: Path) -> Path:
    """A daemon's config whose store lies outside the full state_dir."""
    (tmp_path / "store").mkdir(exist_ok=True)
    return write_config(tmp_path, port=free_port(), extra_global=f"store = sqlite:{tmp_path / 'store' / 'jobs.db'}")


def run_to_its_end(config: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SMOOSH_LOG_LEVEL"}
    return subprocess.run([sys.executable, "-m", "smoosh", "run", "--config", str(config)],
                          capture_output=True, text=True, timeout=30, env=env, cwd=str(config.parent), check=False)


def test_a_lock_file_that_cannot_be_created_stops_the_start_in_one_line(tmp_path: Path, full_state_dir: Path) -> None:
    # Given a state_dir on a full file system, with no lock file yet
    config = config_beside(tmp_path)
    use_up(full_state_dir)
    # When smoosh runs on it
    out = run_to_its_end(config)
    # Then it does not start, and says why in one line
    assert out.returncode == 1
    lock = full_state_dir / "smoosh.lock"
    assert out.stderr.splitlines() == [
        f"smoosh: cannot lock {lock}: No space left on device; refusing to start without it "
        "(it keeps a second daemon off this state_dir)"
    ]
    assert not lock.exists()


def test_a_full_state_dir_whose_lock_file_exists_is_locked_and_a_second_daemon_is_refused(
    tmp_path: Path, full_state_dir: Path, daemons: list[Daemon]
) -> None:
    # Given a state_dir whose lock file a previous run left (with its PID), then filled up
    config = config_beside(tmp_path)
    (full_state_dir / "smoosh.lock").write_text("4242\n")
    use_up(full_state_dir)
    # When smoosh runs on it, it holds the lock (its queues are only not checkpointed) ...
    first = start_daemon(daemons, config)
    assert "queues will not be checkpointed" in first.log()
    # ... and a second daemon on the same state_dir is refused, naming the first
    out = run_to_its_end(config)
    assert out.returncode == 1
    assert out.stderr.splitlines() == [
        f"smoosh: another smoosh is running on this state_dir: {full_state_dir / 'smoosh.lock'} "
        f"is locked by pid {first.proc.pid}"
    ]
    assert first.proc.poll() is None
    assert first.stop() == 0
