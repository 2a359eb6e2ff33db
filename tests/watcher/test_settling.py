"""Issue 25: a file still being written is not compacted by a scan, and temporary names never are.

A start-up scan reports what it finds without the debounce, so a database half copied into a
watched directory was compacted mid-copy. Now the scan tells a database written within
``SETTLE_S`` (or with a ``-journal`` beside it) apart, and the watcher hands it on as a file
event: examined only once it has been quiet. Names a file has while it is written and renamed
into place (``*.tmp``, ``*.part``, ...) are not keys at all.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from compactor.dbfactory import make_bloated_db
from smoosh.daemon.watch.scan import SETTLE_S, resolve_watch, walk, watch_roots
from smoosh.daemon.intake.keys import check_key
from smoosh.errors import InvalidKey

HEADER = b"SQLite format 3\x00" + b"\x00" * 84


def _walk(root: Path, now: float) -> tuple[list[str], list[str]]:
    entries = [resolve_watch(str(root))]
    found: list[str] = []
    settling: list[str] = []
    walk(entries, watch_roots(entries), found.append, lambda msg: None, settling=settling.append, now=now)
    return sorted(found), sorted(settling)


def test_a_database_written_just_now_is_reported_settling_and_an_older_one_found(tmp_path: Path) -> None:
    copying, old = tmp_path / "copying.db", tmp_path / "old.db"
    copying.write_bytes(HEADER + b"half of it")
    old.write_bytes(HEADER)
    written = max(os.stat(old).st_mtime, os.stat(old).st_ctime)
    # The same files, seen at the moment they were written and SETTLE_S later.
    assert _walk(tmp_path, now=written) == ([], [str(copying), str(old)])
    assert _walk(tmp_path, now=written + SETTLE_S + 1) == ([str(copying), str(old)], [])


def test_a_database_with_a_journal_beside_it_is_settling_however_old(tmp_path: Path) -> None:
    db = tmp_path / "busy.db"
    db.write_bytes(HEADER)
    (tmp_path / "busy.db-journal").write_bytes(b"\x00" * 512)
    assert _walk(tmp_path, now=time.time() + 3600) == ([], [str(db)])


def test_without_a_settling_callback_every_database_is_found(tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    db.write_bytes(HEADER)
    entries = [resolve_watch(str(tmp_path))]
    found: list[str] = []
    assert walk(entries, watch_roots(entries), found.append, lambda msg: None) == 1
    assert found == [str(db)]


def test_the_watcher_hands_a_settling_database_to_the_debounce_not_to_the_examination(tmp_path: Path) -> None:
    from smoosh.daemon.watch.watcher import Watcher

    fresh = tmp_path / "fresh.db"
    make_bloated_db(str(fresh), rows=50)
    events: list[str] = []
    scanned: list[str] = []
    w = Watcher([str(tmp_path)], lambda path: None, on_scanned=scanned.append, on_settling=events.append)
    w.scan()  # the start-up scan, in its helper process, a moment after the file was written
    assert events == [str(fresh)] and scanned == []


@pytest.mark.parametrize("name", ["big.db.tmp", "big.db.TMP", "t.sqlite.part", "t.db.partial", "t.db~", "x.temp"])
def test_a_temporary_name_is_not_a_key(tmp_path: Path, name: str) -> None:
    from smoosh.compactors import SqliteCompactor
    from smoosh.daemon.intake.router import Router

    router = Router([SqliteCompactor()])
    with pytest.raises(InvalidKey) as info:
        check_key(str(tmp_path / name), router, [str(tmp_path)], [])
    assert info.value.reason == ("a temporary name (*.tmp, *.temp, *.part, *.partial, *~): it is compacted under its "
                                 "final name, once renamed into place")
    check_key(str(tmp_path / "tmp.db"), router, [str(tmp_path)], [])  # only the suffix counts
