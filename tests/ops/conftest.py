"""Fixtures of the operations tests: subprocess daemons that are always reaped."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from opslib import PausedDaemon, start_paused_daemon  # noqa: E402




@pytest.fixture(scope="session")
def paused(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PausedDaemon]:
    """One paused daemon shared by the read-mostly API and CLI tests (see opslib.PausedDaemon)."""
    p = start_paused_daemon(Path(tmp_path_factory.mktemp("paused")))
    yield p
    if p.daemon.proc.poll() is None:
        p.daemon.kill()
