"""Fixtures of the server tests: a directory for databases, and servers started on demand."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from smoosh import Server


@pytest.fixture
def dbs(tmp_path: Path) -> Path:
    path = tmp_path / "dbs"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Any]:
    """Start servers on demand; every one is stopped at the end."""
    servers: list[Server] = []

    def start(config: Any, **kw: Any) -> Server:
        kw.setdefault("watch_config", False)
        server = Server(config, **kw)
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
