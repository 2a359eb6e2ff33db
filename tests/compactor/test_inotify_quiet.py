"""A VACUUM's writes reach an inotify watch of the database's directory as a few merged runs.

When the page cache cannot hold the rewrite, SQLite spills one page to the database file for
each page it journals, the writes alternate between the file and its ``-journal``, and the
kernel (which merges only identical consecutive events) queues one event per page: a large
database with small pages overflowed the watcher's queue, losing the application's events
with smoosh's own. A raw inotify reader in this process sees exactly what the watcher's
kernel queue receives.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import select
import struct
import sys
import threading

import pytest

from compactor.contexts import RecordingContext
from compactor.dbfactory import integrity, make_bloated_db
from compactor.test_sqlite_compactor import settings
from smoosh.compactors import SqliteCompactor

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")

IN_MODIFY = 0x2
_EVENT = struct.Struct("iIII")


class InotifyReader:
    """Reads every event of one directory watch, in order, on a thread (stops on ``close``)."""

    def __init__(self, directory: str) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK)
        assert self.fd >= 0
        assert libc.inotify_add_watch(self.fd, os.fsencode(directory), IN_MODIFY) >= 0
        self.names: list[str] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while True:
            ready, _, _ = select.select([self.fd], [], [], 0.05)
            if not ready:
                if self._done.is_set():
                    return
                continue
            buf = os.read(self.fd, 1 << 16)
            i = 0
            while i < len(buf):
                _wd, _mask, _cookie, length = _EVENT.unpack_from(buf, i)
                self.names.append(buf[i + 16:i + 16 + length].rstrip(b"\0").decode())
                i += 16 + length

    def close(self) -> list[str]:
        self._done.set()
        self._thread.join(10)
        os.close(self.fd)
        return self.names


def test_a_vacuum_writes_its_journal_then_its_file_not_page_by_page_in_turn(tmp_path) -> None:
    # Given a database with small pages whose live data (~5 MB) is larger than SQLite's
    # default page cache (2 MB) but within the compaction's cache cap
    path = str(tmp_path / "small-pages.db")
    make_bloated_db(path, rows=2500, row_bytes=4000, delete_fraction=0.5, journal_mode="delete", page_size=512)
    reader = InotifyReader(str(tmp_path))
    # When smoosh compacts it with a full VACUUM
    result = SqliteCompactor(settings()).compact(path, RecordingContext())
    names = reader.close()
    # Then its writes came as a handful of runs per file, which the kernel merges when its
    # reader lags, instead of one alternation per page
    assert result.size_after_bytes < result.size_before_bytes
    assert integrity(path) == "ok"
    assert names.count("small-pages.db") > 1000  # it did write page by page
    runs = [name for name, _ in itertools.groupby(names)]
    assert len(runs) <= 10, f"{len(runs)} alternations between the file and its journal"
