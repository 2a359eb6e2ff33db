"""Issue 45: a hostile tree costs the watcher at most its own files, each named once in the log.

The trial of the issue: a directory chain deeper than the path limit, present at start, turned
file events off for its whole root (a new database waited for the ten-minute rescan) and said
so every 5 s; a non-UTF-8 or 255-byte file name became a key that crashed every compaction of
it. Here the trees are real (a chain built with ``mkdir`` through directory descriptors, as
no path can name its bottom), the observer is the daemon's, and the watcher's clock is stepped
by hand, so a rescan runs only when the test says and cannot be what found a file.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Callable

import pytest

from smoosh.daemon.intake.keys import check_key
from smoosh.daemon.intake.router import Router
from smoosh.daemon.watch.hostile import PATH_MAX_BYTES, refused_name, too_deep, unreadable
from smoosh.daemon.watch.scan import resolve_watch, short_of_header, walk, watch_roots
from smoosh.daemon.watch.watcher import DEFAULT_RESCAN_INTERVAL_S, ROOT_CHECK_INTERVAL_S, Watcher
from smoosh.errors import InvalidKey
from smoosh.paths import NAME_MAX_BYTES, NOT_UTF8, SQLITE_MAX_PATH_BYTES, name_refusal
from helpers.clocks import FakeClock
from watcher.test_watcher import Seen, make_db, wait_for

WATCHER_LOG = "smoosh.daemon.watch.watcher"
#: One directory name of the chain: long, so the chain passes the path limit in a few dozen levels.
LINK = "d" * 200


def deep_chain(top: Path) -> str:
    """A chain of directories below ``top`` whose bottom lies deeper than the path limit; the
    path of the deepest directory that still has a path the kernel takes (its parent's)."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    path = str(top)
    try:
        while len(path) < PATH_MAX_BYTES + 2 * len(LINK):
            os.mkdir(LINK, dir_fd=fd)
            below = os.open(LINK, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = below
            path = os.path.join(path, LINK)
    finally:
        os.close(fd)
    reachable = str(top)
    while len(os.path.join(reachable, LINK)) < PATH_MAX_BYTES:
        reachable = os.path.join(reachable, LINK)
    return reachable


def said(caplog: pytest.LogCaptureFixture, sentence: str) -> int:
    return sum(1 for r in caplog.records if r.name == WATCHER_LOG and r.getMessage() == sentence)


@pytest.fixture
def stepped(tmp_path: Path) -> "Callable[[Path], tuple[Watcher, FakeClock, Seen, Seen]]":
    """Factory: a started watcher on the daemon's observer whose clock moves only when the test
    steps it (no rescan comes due by itself); events and scans recorded apart."""
    started: list[Watcher] = []

    def factory(root: Path) -> tuple[Watcher, FakeClock, Seen, Seen]:
        clock = FakeClock(1_000.0)
        events, scanned = Seen(), Seen()
        w = Watcher([str(root)], events, on_scanned=scanned, on_settling=scanned, clock=clock)
        w.start()
        started.append(w)
        assert wait_for(lambda: w.scans_completed >= 1)
        return w, clock, events, scanned

    yield factory  # type: ignore[misc]
    for w in started:
        w.stop()


def test_a_chain_deeper_than_the_path_limit_costs_only_itself(
    tmp_path: Path, stepped: Callable[[Path], tuple[Watcher, FakeClock, Seen, Seen]], caplog: pytest.LogCaptureFixture
) -> None:
    # Given a root with a chain deeper than the path limit in it, present at start
    root = Path(os.path.realpath(tmp_path)) / "watched"
    root.mkdir()
    (root / "tenants").mkdir()
    reachable = deep_chain(root)
    caplog.set_level(logging.INFO, logger=WATCHER_LOG)
    w, clock, events, scanned = stepped(root)
    # When a database is made elsewhere in that root, and one in the chain where it still has a path
    new = make_db(root / "tenants" / "new.db")
    shallow = make_db(root / LINK / "in-the-chain.db")
    # Then each is seen by its own file events: the root is watched, not left to rescans
    assert wait_for(lambda: events.has(new) and events.has(shallow))
    assert not scanned.has(new) and not scanned.has(shallow)
    assert w.scans_completed == 1  # the start-up scan; the clock was never stepped to a rescan
    assert not w.polling
    # And the chain is named once, by whichever of the observer and the scan met it first,
    # through root checks and a periodic rescan that meet it again
    for _ in range(3):
        clock.advance(ROOT_CHECK_INTERVAL_S)
        w.tick(clock())
    clock.advance(DEFAULT_RESCAN_INTERVAL_S)
    w.tick(clock())
    assert wait_for(lambda: w.scans_completed >= 2)
    assert said(caplog, too_deep(reachable)) == 1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and r.getMessage() != too_deep(reachable)]


def test_a_walk_skips_a_chain_deeper_than_the_path_limit_and_walks_the_rest(tmp_path: Path) -> None:
    root = Path(os.path.realpath(tmp_path))
    reachable = deep_chain(root)
    db = make_db(root / "z" / "x.db")
    entries = [resolve_watch(str(root))]
    found: list[str] = []
    warnings: list[str] = []
    walk(entries, watch_roots(entries), found.append, warnings.append)
    assert found == [str(db)]
    assert warnings == [too_deep(reachable)]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every directory")
def test_a_directory_without_permission_costs_only_itself(
    tmp_path: Path, stepped: Callable[[Path], tuple[Watcher, FakeClock, Seen, Seen]], caplog: pytest.LogCaptureFixture
) -> None:
    root = Path(os.path.realpath(tmp_path)) / "watched"
    closed = root / "closed"
    closed.mkdir(parents=True)
    closed.chmod(0)
    try:
        w, clock, events, scanned = stepped(root)
        new = make_db(root / "open" / "new.db")
        assert wait_for(lambda: events.has(new))
        clock.advance(DEFAULT_RESCAN_INTERVAL_S)
        w.tick(clock())
        assert wait_for(lambda: w.scans_completed >= 2)
        sentence = unreadable(str(closed), PermissionError(13, os.strerror(13)))
        assert said(caplog, sentence) == 1
    finally:
        closed.chmod(0o700)


# ---------------------------------------------------------------------- odd names


def test_names_that_smoosh_or_sqlite_cannot_carry_are_refused_with_their_reason() -> None:
    assert name_refusal("/srv/dbs/tenant.db") is None
    assert name_refusal("/srv/dbs/caf\u00e9.db") is None  # UTF-8 that is not ASCII is fine
    assert name_refusal("/srv/dbs/" + os.fsdecode(b"caf\xe9.db")) == NOT_UTF8
    longest = "n" * (NAME_MAX_BYTES - len("-journal"))
    assert name_refusal("/srv/" + longest) is None
    assert name_refusal("/srv/" + longest + "n") == (
        "its name (248 bytes) leaves no room for SQLite's -journal file beside it: file names end at 255 bytes, "
        "so SQLite could never open its journal (a name of at most 247 bytes can be compacted)")
    assert name_refusal("/srv/" + "\u00e9" * 124) is not None  # counted in bytes: 248 of them
    path = "/srv" + "/d" * ((SQLITE_MAX_PATH_BYTES - len("-journal") - 4) // 2)
    assert len(path) == SQLITE_MAX_PATH_BYTES - len("-journal") and name_refusal(path) is None
    assert name_refusal(path + "x") == (
        "its path (505 bytes) leaves no room for SQLite's -journal file: SQLite opens no database whose path is "
        "longer than 504 bytes")


def test_the_key_check_refuses_odd_names_from_every_way_in(tmp_path: Path) -> None:
    from smoosh.compactors import SqliteCompactor

    router = Router([SqliteCompactor()])
    odd = str(tmp_path / os.fsdecode(b"caf\xe9.db"))
    for key in (odd, "cleanup:" + odd):
        with pytest.raises(InvalidKey) as info:
            check_key(key, router, [str(tmp_path)], [])
        assert info.value.reason == NOT_UTF8


def test_the_watcher_names_an_odd_file_once_and_never_reports_it(
    tmp_path: Path, stepped: Callable[[Path], tuple[Watcher, FakeClock, Seen, Seen]], caplog: pytest.LogCaptureFixture
) -> None:
    root = Path(os.path.realpath(tmp_path)) / "watched"
    latin1 = make_db(root / os.fsdecode(b"caf\xe9.db"))
    long_name = root / ("L" * (NAME_MAX_BYTES - 3) + ".db")
    os.rename(make_db(tmp_path / "made.db"), long_name)  # SQLite cannot make it in place: no room for its journal
    caplog.set_level(logging.INFO, logger=WATCHER_LOG)
    w, clock, events, scanned = stepped(root)  # the start-up scan finds both
    # When the application writes them again, and a rescan meets them again
    make_db(latin1, commits=2)
    with open(long_name, "r+b") as fh:  # a writer without a journal (journal_mode=OFF, say)
        fh.write(fh.read(100))
    marker = make_db(root / "plain.db")  # its events come after theirs
    assert wait_for(lambda: events.has(marker))
    clock.advance(DEFAULT_RESCAN_INTERVAL_S)
    w.tick(clock())
    assert wait_for(lambda: w.scans_completed >= 2)
    # Then neither was ever reported, and each is named once, with its reason
    reported = events.snapshot() | scanned.snapshot()
    assert str(latin1) not in reported and str(long_name) not in reported
    assert said(caplog, refused_name(str(latin1), NOT_UTF8)) == 1
    assert said(caplog, refused_name(str(long_name), name_refusal(str(long_name)) or "")) == 1
    assert "caf\\xe9.db" in refused_name(str(latin1), NOT_UTF8)  # the bytes, as `ls -b` shows them


# ---------------------------------------------------------------------- slow copies


HEADER = bytearray(b"SQLite format 3\x00" + b"\x00" * 84)
HEADER[16:18] = (4096).to_bytes(2, "big")  # page size
HEADER[24:28] = HEADER[92:96] = (7).to_bytes(4, "big")  # change counter, and the version it is valid for
HEADER[28:32] = (10).to_bytes(4, "big")  # 10 pages: 40,960 bytes


def test_a_file_shorter_than_its_header_says_is_short_of_it() -> None:
    assert short_of_header(bytes(HEADER), 40_960 - 1)
    assert not short_of_header(bytes(HEADER), 40_960)
    assert short_of_header(bytes(HEADER[:50]), 50)  # not even its header yet
    stale = bytearray(HEADER)
    stale[92:96] = (6).to_bytes(4, "big")  # written by a SQLite that does not keep the size: no claim
    assert not short_of_header(bytes(stale), 4096)


def test_a_scan_hands_a_file_still_short_of_its_header_to_the_debounce_however_old(tmp_path: Path) -> None:
    copying, whole = tmp_path / "copying.db", tmp_path / "whole.db"
    copying.write_bytes(bytes(HEADER) + b"\x00" * 8000)
    whole.write_bytes(bytes(HEADER) + b"\x00" * (40_960 - 100))
    entries = [resolve_watch(str(tmp_path))]
    found: list[str] = []
    settling: list[str] = []
    # Seen an hour after their last write: only a length can tell the copy from the database
    walk(entries, watch_roots(entries), found.append, lambda msg: None, settling=settling.append,
         now=os.stat(copying).st_mtime + 3600)
    assert found == [str(whole)] and settling == [str(copying)]
