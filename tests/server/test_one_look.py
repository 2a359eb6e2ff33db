"""One look at a new key's file (DESIGN §12): from its enqueue to its place in a channel, the
database is opened once, and its sizes, its ``-wal`` and the signature its measurement is
carried with come from that one open, ``fstat`` and header read.

An operator's key (HTTP, the CLI: ``require_file``) is looked at strictly where it is admitted,
and that look goes with it to the examination; a key from the Python API or the watcher is
looked at by its examination. Every system call naming the database or its side files is
counted, on every thread, through a real server and real SQLite files.
"""

from __future__ import annotations

import collections
import os
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest

from compactor.dbfactory import make_bloated_db
from helpers.daemon import wait_for
from server.test_server import make_config
from smoosh.daemon.intake.measurement import signature
from smoosh.errors import InvalidKey

#: Ceiling on the server's threads doing what the test waits for (only bounds a hang).
SETTLE_S = 30.0
_O_PATH = getattr(os, "O_PATH", 0)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[collections.Counter[tuple[str, str]]]:
    """``(call, path)`` -> how often: reads of a file (``open`` without ``O_PATH``), ``stat``,
    ``lstat`` and ``access``, on any thread."""
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    lock = threading.Lock()

    def count(name: str, path: Any) -> None:
        with lock:
            counts[(name, os.fsdecode(path) if isinstance(path, (str, bytes)) else str(path))] += 1

    real_open, real_stat, real_lstat, real_access = os.open, os.stat, os.lstat, os.access

    def opened(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if not flags & _O_PATH:
            count("open", path)
        return real_open(path, flags, *args, **kwargs)

    def stated(path: Any, *args: Any, **kwargs: Any) -> Any:
        count("stat", path)
        return real_stat(path, *args, **kwargs)

    def lstated(path: Any, *args: Any, **kwargs: Any) -> Any:
        count("lstat", path)
        return real_lstat(path, *args, **kwargs)

    def accessed(path: Any, *args: Any, **kwargs: Any) -> Any:
        count("access", path)
        return real_access(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", opened)
    monkeypatch.setattr(os, "stat", stated)
    monkeypatch.setattr(os, "lstat", lstated)
    monkeypatch.setattr(os, "access", accessed)
    yield counts


def _about(counts: collections.Counter[tuple[str, str]], db: Path) -> dict[tuple[str, str], int]:
    """The calls naming ``db`` or its side files, by call and suffix (``""`` for the file itself)."""
    out: dict[tuple[str, str], int] = {}
    for (name, path), n in counts.items():
        if path.startswith(str(db)):
            out[(name, path[len(str(db)):])] = n
    return out


@pytest.mark.parametrize("way", ["an operator's key", "the Python API's"])
def test_a_new_key_is_read_once_from_its_enqueue_to_its_channel(
    tmp_path: Path, running: Any, dbs: Path, calls: collections.Counter[tuple[str, str]], way: str
) -> None:
    db = dbs.resolve() / "tenant.db"
    make_bloated_db(str(db), journal_mode="delete", delete_fraction=0.9)
    # Paused channels: nothing starts (a start's re-check looks at the file again, by design)
    server = running(make_config(tmp_path, extra="wait_secs = 3600"), workers=0)
    calls.clear()

    server.enqueue(str(db), require_file=way == "an operator's key")
    wait_for(lambda: server.counters.enqueue_accepted == 1, SETTLE_S, what="the key queued")

    seen = _about(calls, db)
    assert seen.get(("open", ""), 0) == 1, seen  # one header read
    # its fstat answered the rest; an operator's path is lstat'ed first: only a regular file is opened
    assert seen.get(("lstat", ""), 0) == (1 if way == "an operator's key" else 0), seen
    assert seen.get(("stat", ""), 0) == 0, seen
    for side in ("-wal", "-shm", "-journal"):
        # each side file looked at once at most: by the strict check (an operator's key), or
        # for the -wal alone (a measurement)
        looks = seen.get(("lstat", side), 0) + seen.get(("stat", side), 0) + seen.get(("access", side), 0)
        assert looks <= 1, (side, seen)
    # ... and the measurement it waits with holds while the file is unchanged: the re-check
    # before its start reuses it instead of measuring again
    assert server.intake.measurements[str(db)].signature == signature(str(db))


def test_an_operator_key_naming_a_fifo_is_rejected_without_being_opened(
    tmp_path: Path, running: Any, dbs: Path, calls: collections.Counter[tuple[str, str]]
) -> None:
    # Opening a FIFO is not free of consequence (a writer blocked in its open goes on, then
    # meets a closed pipe): only a regular file is opened to read its header.
    fifo = dbs.resolve() / "pipe.db"
    os.mkfifo(fifo)
    server = running(make_config(tmp_path, extra="wait_secs = 3600"), workers=0)
    calls.clear()
    with pytest.raises(InvalidKey) as info:
        server.enqueue(str(fifo), require_file=True)
    assert info.value.reason == "not a regular file"
    assert _about(calls, fifo).get(("open", ""), 0) == 0
