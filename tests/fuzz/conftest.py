"""A real in-process smoosh Server (no workers) shared by the HTTP and key fuzz suites, and an
idle server with admin APIs made by the tests themselves (the abuse and time-bound suites)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from compactor.dbfactory import make_bloated_db
from helpers.daemon import write_config
from smoosh import Server, load_config
from smoosh.daemon.api.http import AdminServer


@dataclass
class Target:
    """The server under fuzz and the file layout around it."""

    server: Server
    host: str
    port: int
    base: Path
    root: Path      # the only configured root (``base/dbs``)
    outside: Path   # a directory beside the root, holding a real database


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    base = tmp_path_factory.mktemp("fuzz-server")
    # wait_secs is long so nothing fuzzed ever starts (no workers run anyway).
    config = load_config(str(write_config(base, port=0, extra_global="wait_secs = 3600")), cwd=str(base))
    root = base / "dbs"
    outside = base / "outside"
    outside.mkdir()
    make_bloated_db(str(outside / "secret.db"), rows=200)
    make_bloated_db(str(root / "inside.db"), rows=200)
    (root / "sub").mkdir()
    # Symlinks a key may try to escape through, and one that stays inside.
    os.symlink(outside, root / "escape")
    os.symlink(outside / "secret.db", root / "secret-link.db")
    os.symlink("/", root / "slash")
    os.symlink(root / "sub", root / "sub-link")
    os.symlink(root / "loop", root / "loop")
    server = Server(config, workers=0, watch_config=False)
    server.start()
    admin = AdminServer(server, "127.0.0.1:0")
    admin.start()
    host, port = admin.address.rsplit(":", 1)
    try:
        yield Target(server, host, int(port), base, root, outside)
    finally:
        admin.stop()
        server.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """An idle server (no workers, channels paused an hour) for the admin APIs of a module's tests."""
    base = tmp_path_factory.mktemp("http")
    config = load_config(str(write_config(base, port=0, extra_global="wait_secs = 3600")), cwd=str(base))
    s = Server(config, workers=0, watch_config=False)
    s.start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def admin_factory(server: Server) -> Iterator[Any]:
    """``make(**kw) -> (AdminServer, (host, port))``: an admin API over ``server`` on a free port,
    started with the options the test gives; stopped at teardown."""
    started: list[AdminServer] = []

    def make(**kw: Any) -> tuple[AdminServer, tuple[str, int]]:
        admin = AdminServer(server, "127.0.0.1:0", **kw)
        admin.start()
        started.append(admin)
        host, port = admin.address.rsplit(":", 1)
        return admin, (host, int(port))

    yield make
    for admin in started:
        admin.stop()
