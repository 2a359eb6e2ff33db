"""The watcher against a real directory, real SQLite writers and real watchdog observers.

Waiting for a file-system event uses a bounded poll (up to 5 s, every 20 ms): that waits for
something outside the test. The watcher's own timers are always stepped with an injected clock.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from watchdog.events import FileSystemEvent
from watchdog.observers import Observer

from inotify_simple import Event

from smoosh.daemon.watch.inotify import IN_Q_OVERFLOW, InotifyObserver
from smoosh.daemon.watch.hostile import refused_name
from smoosh.daemon.watch.observers import WatchedRoots
from smoosh.daemon.watch.scan import walk
from smoosh.daemon.watch.watcher import (
    ROOT_CHECK_INTERVAL_S,
    Watcher,
    is_sqlite_file,
    main_db_path,
    resolve_watch,
    watch_roots,
)
from smoosh.paths import NOT_UTF8
from helpers.clocks import FakeClock
from helpers.daemon import HANG_S

EVENT_WAIT_S = HANG_S  # a ceiling on a hang, never a measure of speed
Running = Callable[..., "tuple[Watcher, Seen]"]


def wait_for(condition: Callable[[], bool], timeout_s: float = EVENT_WAIT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


class Seen:
    """A thread-safe on_path recorder."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.paths: list[str] = []

    def __call__(self, path: str) -> None:
        with self._lock:
            self.paths.append(path)

    def has(self, path: str | Path) -> bool:
        with self._lock:
            return os.path.realpath(path) in self.paths

    def snapshot(self) -> set[str]:
        with self._lock:
            return set(self.paths)


def make_db(path: Path, journal_mode: str = "delete", commits: int = 3) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(f"PRAGMA journal_mode={journal_mode}")
        conn.execute("CREATE TABLE IF NOT EXISTS t(x)")
        for _ in range(commits):
            conn.execute("INSERT INTO t VALUES (randomblob(300))")
    finally:
        conn.close()
    return path


def write_text(path: Path, size_bytes: int = 4096) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"not a database\n" * (size_bytes // 15 + 1))
    return path


@pytest.fixture
def watched(tmp_path: Path) -> Path:
    d = tmp_path / "watched"
    d.mkdir()
    return d


@pytest.fixture
def running() -> Iterator[Running]:
    """Factory: a started watcher with a recorder; stopped at teardown."""
    started: list[Watcher] = []

    def factory(watch: list[str], **kwargs: object) -> tuple[Watcher, Seen]:
        seen = Seen()
        w = Watcher(watch, seen, **kwargs)  # type: ignore[arg-type]
        w.start()
        started.append(w)
        # Let the start-up scan finish, so what a test sees later came from events.
        assert wait_for(lambda: w.scans_completed >= 1)
        return w, seen

    yield factory
    for w in started:
        w.stop()


# ---------------------------------------------------------------------- pure helpers


def test_side_files_map_to_their_database() -> None:
    assert main_db_path("/d/x.db-wal") == "/d/x.db"
    assert main_db_path("/d/x.db-journal") == "/d/x.db"
    assert main_db_path("/d/x.db-shm") == "/d/x.db"
    assert main_db_path("/d/x.db") == "/d/x.db"


def test_sqlite_header_recognises_databases_only(tmp_path: Path) -> None:
    db = make_db(tmp_path / "real.anything")
    (tmp_path / "empty").touch()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert is_sqlite_file(str(db))
    assert not is_sqlite_file(str(write_text(tmp_path / "x.db")))
    assert not is_sqlite_file(str(tmp_path / "empty"))
    assert not is_sqlite_file(str(tmp_path / "missing.db"))
    assert not is_sqlite_file(str(tmp_path))
    assert not is_sqlite_file(str(fifo))  # and does not block on it


def test_glob_entry_watches_its_static_prefix_canonically(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    entry = resolve_watch(str(tmp_path / "link" / "*" / "*.db"))
    assert entry.root == str(real)
    assert entry.recursive
    assert entry.accepts(str(real / "a" / "x.db"))
    assert not entry.accepts(str(real / "a" / "x.sqlite"))
    assert not entry.accepts(str(tmp_path / "elsewhere" / "a" / "x.db"))


def test_single_file_entry_accepts_only_that_file(tmp_path: Path) -> None:
    db = make_db(tmp_path / "weird[1].db")
    entry = resolve_watch(str(db))
    assert (entry.root, entry.recursive) == (str(tmp_path), False)
    assert entry.accepts(str(db))
    assert not entry.accepts(str(tmp_path / "weird1.db"))


def test_nested_roots_are_watched_once(tmp_path: Path) -> None:
    entries = [resolve_watch(str(p)) for p in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "c" / "*.db")]
    assert watch_roots(entries) == {str(tmp_path / "a"): True, str(tmp_path / "c"): True}


# ---------------------------------------------------------------------- scans


def test_scan_reports_databases_in_nested_dirs_and_nothing_else(watched: Path) -> None:
    dbs = [
        make_db(watched / "top.db"),
        make_db(watched / "a" / "b" / "c" / "deep.sqlite", "wal"),
        make_db(watched / "a" / "no_extension"),
    ]
    write_text(watched / "notes.db")
    write_text(watched / "a" / "log.txt")
    (watched / "a" / "empty.db").touch()
    shutil.copy(dbs[0], watched / "copy.db-journal")  # a side file, even with a database header
    (watched / "a" / "loop").symlink_to(watched)  # not followed
    seen = Seen()
    w = Watcher([str(watched)], seen)
    assert w.scan() == 3
    # (the side file's database is gone: its cleanup key is reported, not counted)
    cleanup = "cleanup:" + os.path.realpath(watched / "copy.db")
    assert sorted(seen.paths) == sorted([*(os.path.realpath(p) for p in dbs), cleanup])


def test_scan_reports_the_cleanup_key_of_a_vanished_database_once_and_never_of_a_present_one(
    watched: Path
) -> None:
    present = make_db(watched / "present.db", "wal")
    (watched / "present.db-wal").write_bytes(b"x" * 64)  # beside its database: not a leftover
    (watched / "gone.db-wal").write_bytes(b"x" * 64)  # a crashed application's, database deleted
    (watched / "gone.db-shm").write_bytes(b"x" * 64)
    (watched / "sub").mkdir()
    (watched / "sub" / "old.db-journal").write_bytes(b"x" * 64)
    (watched / "linked.db-wal").symlink_to(watched / "gone.db-wal")  # a symlink is nobody's leftover
    seen = Seen()
    assert Watcher([str(watched)], seen).scan() == 1
    real = os.path.realpath(watched)
    assert sorted(seen.paths) == sorted([
        os.path.realpath(present), f"cleanup:{real}/gone.db", f"cleanup:{real}/sub/old.db",
    ])


def test_glob_entries_filter_scans_and_events(watched: Path, running: Running) -> None:
    wanted = make_db(watched / "a" / "x.sqlite")
    make_db(watched / "y.sqlite")  # not two levels deep
    make_db(watched / "a" / "z.db")
    seen = Seen()
    assert Watcher([str(watched / "*" / "*.sqlite")], seen).scan() == 1
    assert seen.paths == [str(wanted)]

    w, live = running([str(watched / "*" / "*.sqlite")])
    assert wait_for(lambda: live.has(wanted))  # the start-up scan
    make_db(watched / "b" / "skip.db")
    new = make_db(watched / "b" / "new.sqlite")
    assert wait_for(lambda: live.has(new))
    assert not live.has(watched / "b" / "skip.db")


def test_exclude_hides_paths_from_scans_and_events(watched: Path, running: Running) -> None:
    own = watched / "own"
    make_db(own / "jobs.db", "wal")
    other = make_db(watched / "tenant.db")
    exclude = lambda p: p.startswith(str(own) + os.sep)  # noqa: E731
    seen = Seen()
    assert Watcher([str(watched)], seen, exclude=exclude).scan() == 1
    assert seen.paths == [str(other)]

    w, live = running([str(watched)], exclude=exclude)
    make_db(own / "jobs.db", "wal", commits=5)
    marker = make_db(watched / "after.db")
    assert wait_for(lambda: live.has(marker))
    assert not any(p.startswith(str(own)) for p in live.snapshot())


def test_scan_does_not_release_sqlite_locks_held_in_process(watched: Path) -> None:
    """A header read in this process would drop our own lock (sqlite.org howtocorrupt §2.2)."""
    db = make_db(watched / "busy.db")
    holder = sqlite3.connect(db, isolation_level=None)
    writer = (
        "import sqlite3, sys\n"
        "c = sqlite3.connect(sys.argv[1], timeout=0)\n"
        "try:\n"
        "    c.execute('INSERT INTO t VALUES (1)')\n"
        "except sqlite3.OperationalError as e:\n"
        "    print(e)\n"
        "else:\n"
        "    print('wrote')\n"
    )
    try:
        holder.execute("BEGIN EXCLUSIVE")
        seen = Seen()
        assert Watcher([str(watched)], seen).scan() == 1
        out = subprocess.run([sys.executable, "-c", writer, str(db)], capture_output=True, text=True, timeout=30)
        assert out.stdout.strip() == "database is locked"
    finally:
        holder.close()


def test_periodic_rescan_is_stepped_by_tick(watched: Path) -> None:
    clock = FakeClock(100.0)
    seen = Seen()
    w = Watcher([str(watched)], seen, rescan_interval_s=600.0, clock=clock)
    db = make_db(watched / "later.db")
    w.tick(699.0)
    assert seen.paths == []
    w.tick(700.0)
    assert seen.paths == [str(db)]
    w.tick(1299.0)
    assert seen.paths == [str(db)]
    w.tick(1300.0)
    assert seen.paths == [str(db), str(db)]


def test_events_of_one_database_within_the_coalescing_window_are_considered_once(watched: Path) -> None:
    # An application's commit makes several events (its journal created, written, deleted; the
    # database written): one look per database per burst, stepped with the watcher's own clock.
    from smoosh.daemon.watch.watcher import COALESCE_S

    clock = FakeClock(100.0)
    seen = Seen()
    w = Watcher([str(watched)], seen, clock=clock)
    db, other = make_db(watched / "busy.db"), make_db(watched / "other.db")
    for side in ("-journal", "", "-journal", ""):
        w._consider(f"{db}{side}")
    w._consider(str(other))
    assert seen.paths == [str(db), str(other)]
    clock.advance(COALESCE_S / 2)
    w._consider(str(db))
    assert seen.paths == [str(db), str(other)]
    clock.advance(COALESCE_S)
    w._consider(f"{db}-journal")
    assert seen.paths == [str(db), str(other), str(db)]


def test_an_event_not_handed_on_drops_none_after_it(watched: Path) -> None:
    # A database being written: its first event found it too small to be one, so it was not
    # handed on; the event that finds it whole, a moment later, must be.
    clock = FakeClock(100.0)
    seen = Seen()
    w = Watcher([str(watched)], seen, clock=clock)
    growing = watched / "growing.db"
    growing.write_bytes(b"SQLite format 3\x00")
    w._consider(str(growing))
    assert seen.paths == []
    growing.unlink()
    make_db(growing)
    w._consider(f"{growing}-journal")
    assert seen.paths == [str(growing)]


def test_missing_directory_is_reported_once_and_picked_up_when_it_appears(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "not-yet"
    seen = Seen()
    w = Watcher([str(root)], seen, clock=FakeClock(0.0))
    with caplog.at_level(logging.WARNING, logger="smoosh.daemon.watch.watcher"):
        w.tick(0.0)
        w.tick(ROOT_CHECK_INTERVAL_S)
    warnings = [r.getMessage() for r in caplog.records if "does not exist" in r.getMessage()]
    assert warnings == [f"watched directory {root} does not exist; checking for it every 5 s"]
    db = make_db(root / "x.db")
    w.tick(2 * ROOT_CHECK_INTERVAL_S)
    assert seen.paths == [str(db)]


# ---------------------------------------------------------------------- live events


@pytest.mark.parametrize("journal_mode", ["wal", "delete"])
def test_commits_report_the_database_path_never_a_side_file(
    watched: Path, running: Running, journal_mode: str
) -> None:
    w, seen = running([str(watched)])
    db = watched / f"{journal_mode}.db"
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute(f"PRAGMA journal_mode={journal_mode}")
        conn.execute("CREATE TABLE t(x)")
        for _ in range(5):
            conn.execute("INSERT INTO t VALUES (randomblob(300))")
        assert wait_for(lambda: seen.has(db))
    finally:
        conn.close()
    assert seen.snapshot() == {str(db)}


def test_wal_commits_alone_are_seen_through_the_wal_file(
    watched: Path, running: Running
) -> None:
    db = make_db(watched / "w.db", "wal")
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("SELECT 1 FROM t").fetchall()  # keep the WAL alive: no checkpoint on close
    try:
        w, seen = running([str(watched)])
        assert wait_for(lambda: seen.has(db))  # start-up scan
        seen.paths.clear()
        mtime_ns = db.stat().st_mtime_ns
        conn.execute("INSERT INTO t VALUES (randomblob(300))")
        assert wait_for(lambda: seen.has(db))
        assert db.stat().st_mtime_ns == mtime_ns  # only the -wal file was written
    finally:
        conn.close()


def test_atomic_replace_into_the_directory_is_seen(
    tmp_path: Path, watched: Path, running: Running
) -> None:
    source = make_db(tmp_path / "source.db")
    w, seen = running([str(watched / "*.db")])
    target = watched / "tenant.db"
    tmp = watched / "tenant.db.tmp"
    tmp.write_bytes(source.read_bytes())
    os.replace(tmp, target)
    assert wait_for(lambda: seen.has(target))
    assert seen.snapshot() == {str(target)}


def test_file_moved_in_from_outside_is_seen(
    tmp_path: Path, watched: Path, running: Running
) -> None:
    outside = make_db(tmp_path / "outside" / "moved.db")
    (watched / "sub").mkdir()
    w, seen = running([str(watched)])
    target = watched / "sub" / "moved.db"
    os.rename(outside, target)
    assert wait_for(lambda: seen.has(target))


def test_directory_moved_in_reports_its_databases(
    tmp_path: Path, watched: Path, running: Running
) -> None:
    make_db(tmp_path / "tree" / "inner" / "a.db")
    w, seen = running([str(watched)])
    os.rename(tmp_path / "tree", watched / "tree")
    assert wait_for(lambda: seen.has(watched / "tree" / "inner" / "a.db"))


def test_polling_observer_reports_changes(watched: Path, running: Running) -> None:
    w, seen = running([str(watched)], polling=True)
    assert w.polling
    db = make_db(watched / "polled.db", "wal")
    assert wait_for(lambda: seen.has(db))


def test_startup_scan_reports_existing_databases(watched: Path, running: Running) -> None:
    db = make_db(watched / "n1" / "n2" / "old.db")
    w, seen = running([str(watched)])
    assert wait_for(lambda: seen.has(db))


def test_a_raising_callback_is_logged_and_events_keep_flowing(
    watched: Path, running: Running, caplog: pytest.LogCaptureFixture
) -> None:
    seen = Seen()
    first = str(watched / "first.db")

    def on_path(path: str) -> None:
        if path == first:
            raise RuntimeError("boom")
        seen(path)

    w = Watcher([str(watched)], on_path)
    with caplog.at_level(logging.ERROR, logger="smoosh.daemon.watch.watcher"):
        w.start()
        try:
            make_db(watched / "first.db")
            assert wait_for(lambda: any("on_path callback failed" in r.getMessage() for r in caplog.records))
            second = make_db(watched / "second.db")
            assert wait_for(lambda: seen.has(second))
        finally:
            w.stop()


def test_inotify_watch_limit_falls_back_to_polling(
    watched: Path, caplog: pytest.LogCaptureFixture, running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    class ExhaustedObserver(Observer):  # type: ignore[misc, valid-type]
        def schedule(self, *args: object, **kwargs: object) -> None:
            raise OSError(errno.ENOSPC, "inotify watch limit reached")

    real_new_observer = WatchedRoots._new_observer

    def new_observer(self: WatchedRoots) -> object:
        return real_new_observer(self) if self.polling else ExhaustedObserver()

    monkeypatch.setattr(WatchedRoots, "_new_observer", new_observer)
    seen = Seen()
    w = Watcher([str(watched)], seen)
    with caplog.at_level(logging.ERROR, logger="smoosh.daemon.watch.watcher"):
        w.start()
    try:
        assert w.polling
        messages = [r.getMessage() for r in caplog.records]
        assert any("fs.inotify.max_user_watches" in m and "falling back to polling" in m for m in messages)
        db = make_db(watched / "after-fallback.db")
        assert wait_for(lambda: seen.has(db))
    finally:
        w.stop()


def test_directory_that_appears_after_start_is_watched(
    tmp_path: Path, running: Running
) -> None:
    root = tmp_path / "later"
    clock = FakeClock(0.0)
    w, seen = running([str(root)], clock=clock)
    existing = make_db(root / "existing.db")
    clock.now += ROOT_CHECK_INTERVAL_S
    w.tick(clock.now)
    assert wait_for(lambda: seen.has(existing))  # scanned when it appeared
    new = make_db(root / "new.db")
    assert wait_for(lambda: seen.has(new))  # and watched


def test_deleted_and_recreated_directory_is_watched_again(
    watched: Path, running: Running
) -> None:
    clock = FakeClock(0.0)
    w, seen = running([str(watched)], clock=clock)
    shutil.rmtree(watched)
    clock.now += ROOT_CHECK_INTERVAL_S
    w.tick(clock.now)
    watched.mkdir()
    clock.now += ROOT_CHECK_INTERVAL_S
    w.tick(clock.now)
    db = make_db(watched / "again.db")
    assert wait_for(lambda: seen.has(db))


def test_stop_joins_every_thread(watched: Path) -> None:
    before = set(threading.enumerate())
    w = Watcher([str(watched)], Seen())
    w.start()
    make_db(watched / "x.db")
    w.stop()
    leftover = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert leftover == []


def test_a_scan_carries_a_path_that_is_not_utf8_and_the_watcher_names_it_instead_of_reporting_it(
    watched: Path, caplog: pytest.LogCaptureFixture
) -> None:
    name = os.fsdecode(b"caf\xe9.db")  # a Latin-1 name: surrogate-escaped in Python
    db = make_db(watched / name)
    plain = make_db(watched / "plain.db")
    # The helper process's walk hands the name back byte for byte (the file can be found by it)
    found: list[str] = []
    entries = [resolve_watch(str(watched))]
    walk(entries, watch_roots(entries), found.append, lambda msg: None)
    assert sorted(found) == sorted([str(db), str(plain)]) and os.path.exists(str(db))
    # But smoosh's keys are text: the watcher names it once and reports the rest
    seen = Seen()
    with caplog.at_level(logging.WARNING, logger="smoosh.daemon.watch.watcher"):
        assert Watcher([str(watched)], seen).scan() == 1
    assert seen.paths == [str(plain)]
    assert [r.getMessage() for r in caplog.records] == [refused_name(str(db), NOT_UTF8)]


def test_a_walk_reading_headers_on_many_threads_finds_exactly_what_a_serial_walk_finds(tmp_path: Path) -> None:
    from smoosh.daemon.watch.scan import HEADER_CHUNK, resolve_watch, walk, watch_roots

    header = b"SQLite format 3\x00" + b"\x00" * 84
    expected = set()
    for d in range(3):
        sub = tmp_path / f"d{d}"
        sub.mkdir()
        for i in range(HEADER_CHUNK * 2 + 7):  # several chunks per directory, a ragged last one
            path = sub / f"f{i}.db"
            is_db = i % 3 != 0
            path.write_bytes(header if is_db else b"not a database at all")
            if is_db:
                expected.add(str(path))
    entries = [resolve_watch(str(tmp_path))]
    roots = watch_roots(entries)
    found: dict[int, list[str]] = {1: [], 8: []}
    for threads, out in found.items():
        assert walk(entries, roots, out.append, lambda msg: None, header_threads=threads) == len(expected)
    assert set(found[1]) == set(found[8]) == expected
    assert found[1] == found[8]  # same order: a directory's files (all one size here) in listing order


def test_a_walk_reports_a_directorys_largest_databases_first(tmp_path: Path) -> None:
    # Given a directory of databases of several sizes, and a file that is no database
    from smoosh.daemon.watch.scan import resolve_watch, walk, watch_roots

    header = b"SQLite format 3\x00" + b"\x00" * 84
    sizes = {"a.db": 20, "b.db": 3, "c.db": 40, "d.db": 1, "e.db": 7}
    for name, pages in sizes.items():
        (tmp_path / name).write_bytes(header + b"\x00" * (4096 * pages - len(header)))
    (tmp_path / "huge.txt").write_bytes(b"x" * 4096 * 100)
    entries = [resolve_watch(str(tmp_path))]
    for threads in (1, 8):
        found: list[str] = []
        # When it is walked
        assert walk(entries, watch_roots(entries), found.append, lambda msg: None, header_threads=threads) == 5
        # Then the largest come first, so the daemon examines (and, with no start-up pause,
        # starts) the most bytes the directory could give back first
        assert [os.path.basename(p) for p in found] == ["c.db", "a.db", "e.db", "b.db", "d.db"]


def test_a_periodic_rescan_reports_only_databases_changed_since_the_previous_scan(
    watched: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import smoosh.daemon.watch.watcher as watcher_module

    monkeypatch.setattr(watcher_module, "RESCAN_MARGIN_S", 0.0)
    quiet = make_db(watched / "quiet.db")
    busy = make_db(watched / "busy.db")
    wal = make_db(watched / "wal.db", journal_mode="wal")
    time.sleep(0.05)  # file times come from a coarse clock: keep them clear of the scan's start
    clock = FakeClock(0.0)
    seen = Seen()
    w = Watcher([str(watched)], seen, rescan_interval_s=600.0, clock=clock)
    w.tick(600.0)  # the first scan reports everything
    assert seen.snapshot() == {str(quiet), str(busy), str(wal)}
    assert w.startup_scan[0] == 3
    time.sleep(0.05)
    make_db(busy, commits=1)
    holder = sqlite3.connect(wal, isolation_level=None)  # keeps the -wal: only it changes
    try:
        holder.execute("INSERT INTO t VALUES (1)")
        seen.paths.clear()
        w.tick(1200.0)
        assert sorted(seen.paths) == sorted([str(busy), str(wal)])
        assert w.last_scan[0] == 2 and w.startup_scan[0] == 3
    finally:
        holder.close()
    seen.paths.clear()
    w.request_full_scan()  # a config reload: every database is priced again
    w.tick(1300.0)
    assert seen.snapshot() == {str(quiet), str(busy), str(wal)}


@pytest.mark.parametrize("observer_kind", ["smoosh", "watchdog"])
def test_an_inotify_overflow_rescans_what_changed_and_warns_once_a_minute(
    watched: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, observer_kind: str
) -> None:
    import smoosh.daemon.watch.watcher as watcher_module

    monkeypatch.setattr(watcher_module, "RESCAN_MARGIN_S", 0.0)
    quiet = make_db(watched / "quiet.db")
    written = make_db(watched / "written.db")
    time.sleep(0.05)  # file times come from a coarse clock: keep them clear of the scan's start
    clock = FakeClock(0.0)
    scanned = Seen()  # what scans report (events go elsewhere: they are not the point here)
    # smoosh's observer (Linux) hears of an overflow from the kernel's record; watchdog's
    # observer (elsewhere) only says so in a log line, which the watcher listens for.
    shared = None if observer_kind == "smoosh" else Observer()
    if shared is not None:
        shared.start()
    w = Watcher([str(watched)], Seen(), rescan_interval_s=600.0, clock=clock, on_scanned=scanned, observer=shared)
    w.start()  # its own thread; the clock stands still, so no periodic rescan comes
    try:
        assert wait_for(lambda: w.scans_completed == 1)
        assert scanned.snapshot() == {str(quiet), str(written)}
        time.sleep(0.05)
        make_db(written, commits=1)
        scanned.paths.clear()

        def overflow() -> None:
            if shared is None:
                # The kernel's record of an overflow (wd -1), as the observer's thread reads it.
                observer = w._roots._observer
                assert isinstance(observer, InotifyObserver)
                observer._handle([Event(-1, IN_Q_OVERFLOW, 0, "")])
                return
            # What watchdog says when the kernel drops events (it offers no other signal).
            logging.getLogger("watchdog.observers.inotify_c").warning("Inotify queue overflowed; filesystem events were lost")
            logging.getLogger("watchdog.observers.inotify").warning(
                "Inotify queue overflowed; reconciling recursive watches below %r", str(watched))

        def lines() -> list[str]:
            return [r.getMessage() for r in caplog.records
                    if "overflowed" in r.getMessage() and (r.name != "smoosh.daemon.watch.watcher" or str(watched) in r.getMessage())]

        with caplog.at_level(logging.WARNING):
            # When the kernel's queue overflows, long before the next periodic rescan
            clock.now = 1.0
            overflow()
            # Then what changed since the last scan is reported, with one line of smoosh's own
            assert wait_for(lambda: w.scans_completed == 2)
            assert scanned.paths == [str(written)]
            assert [line.split(";")[0] for line in lines()] == ["inotify queue overflowed: file-system events were lost"]
            # And a flood of overflows rescans each time but warns once a minute, with the count
            clock.now = 20.0
            overflow()
            assert wait_for(lambda: w.scans_completed == 3)
            assert len(lines()) == 1
            clock.now = 61.0
            overflow()
            assert wait_for(lambda: w.scans_completed == 4)
            assert lines()[1].startswith("inotify queue overflowed 2 times:")
    finally:
        w.stop()
        if shared is not None:
            shared.stop()
            shared.join(5)


def test_the_last_events_of_smooshs_own_compaction_are_ignored_and_the_next_write_is_seen(
    watched: Path, running: Running
) -> None:
    observer = InotifyObserver()
    observer.start()
    try:
        busy: set[str] = set()
        w, seen = running([str(watched)], busy=lambda path: path in busy, observer=observer)
        db = watched / "own.db"
        key = os.path.realpath(db)
        # The observer's thread held up in the middle of a read, as under load: what is
        # written now stays queued, and the compaction's end cannot read it itself
        held = watched.parent / "held"
        held.mkdir()
        inside, go_on = threading.Event(), threading.Event()

        class Slow:
            def dispatch(self, event: FileSystemEvent) -> None:
                inside.set()
                go_on.wait(EVENT_WAIT_S)

        observer.schedule(Slow(), str(held))
        (held / "x").write_bytes(b"x")
        assert inside.wait(EVENT_WAIT_S)
        # Given smoosh compacting the database: its writes queue events while it is busy
        busy.add(key)
        make_db(db, commits=3)
        # When the compaction ends: settled first, then no longer busy (the worker's order),
        # and only then are its events read
        w.settle(key)
        busy.discard(key)
        assert w.settling() == 1
        go_on.set()
        # Then the queue as it was is handled, by the observer's thread once it is free,
        # without a report of the compaction's writes
        assert wait_for(lambda: w.settling() == 0)
        assert not seen.has(db)
        # And the application's next write is reported
        make_db(db, commits=1)
        assert wait_for(lambda: seen.has(db))
    finally:
        observer.stop()
        observer.join(5)


def test_smooshs_own_writes_are_dropped_before_an_event_is_built_for_them(watched: Path, running: Running) -> None:
    observer = InotifyObserver()
    observer.start()
    try:
        db, app = make_db(watched / "own.db"), make_db(watched / "app.db")
        key = os.path.realpath(db)
        busy = {key}
        w, seen = running([str(watched)], busy=lambda path: path in busy, observer=observer)
        handler = observer._watches[0].handler
        dispatched: list[str] = []
        real_dispatch = handler.dispatch

        def spy(event: FileSystemEvent) -> None:
            dispatched.append(os.fsdecode(event.src_path))
            real_dispatch(event)

        handler.dispatch = spy
        seen.paths.clear()  # what the start-up scan found
        # When smoosh compacts own.db (its writes and its journal's) and the application writes app.db
        make_db(db, commits=3)
        make_db(app, commits=1)
        assert wait_for(lambda: seen.has(app))
        # Then no event of the compaction's files was built or dispatched, and it is not reported
        assert dispatched and key not in {os.path.realpath(main_db_path(p)) for p in dispatched}
        assert not seen.has(db)
        # And once it is no longer compacting, its writes are events again
        busy.clear()
        make_db(db, commits=1)
        assert wait_for(lambda: seen.has(db))
    finally:
        observer.stop()
        observer.join(5)


def test_settling_with_an_observer_that_cannot_tell_changes_nothing(watched: Path, running: Running) -> None:
    db = make_db(watched / "own.db")
    w, seen = running([str(watched)], polling=True)
    w.settle(os.path.realpath(db))
    assert w.settling() == 0  # nothing to wait for: the polling observer reports no queue
    make_db(db, commits=1)
    assert wait_for(lambda: seen.has(db))


def test_a_periodic_rescan_still_sees_changes_stamped_by_a_wall_clock_set_back_a_day(
    watched: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import smoosh.daemon.watch.watcher as watcher_module

    monkeypatch.setattr(watcher_module, "RESCAN_MARGIN_S", 0.0)
    day_s = 86_400.0
    ahead_s = [day_s]

    class SteppedTime:
        """The watcher's ``time``: its wall clock a day ahead of the kernel's file times, until set back."""

        def __getattr__(self, name: str) -> Any:
            return getattr(time, name)

        def time(self) -> float:
            return time.time() + ahead_s[0]

    monkeypatch.setattr(watcher_module, "time", SteppedTime())
    quiet = make_db(watched / "quiet.db")
    busy = make_db(watched / "busy.db")
    time.sleep(0.05)  # file times come from a coarse clock: keep them clear of the scan's start
    clock = FakeClock(0.0)
    seen = Seen()
    w = Watcher([str(watched)], seen, rescan_interval_s=600.0, clock=clock)
    w.tick(600.0)  # the first scan (it starts a day ahead of the files' times) reports everything
    assert seen.snapshot() == {str(quiet), str(busy)}
    # When the wall clock is set back a day (the daemon tells the watcher), and the application
    # then writes busy.db: its times are a day before the last scan's start
    ahead_s[0] = 0.0
    w.wall_stepped(-day_s)
    w.wall_stepped(day_s / 2)  # a step forward moves nothing
    time.sleep(0.05)
    make_db(busy, commits=1)
    seen.paths.clear()
    w.tick(1200.0)
    # Then the next periodic rescan reports it, and only it
    assert seen.paths == [str(busy)]


@pytest.mark.parametrize(("whose", "level", "said"), [
    ("smoosh's", logging.INFO,
     "inotify queue overflowed while smoosh compacted (4000 of the last 4000 file events were its own writes); "
     "rescanning {root} for databases changed since the last scan"),
    ("the application's", logging.WARNING,
     "inotify queue overflowed: file-system events were lost; rescanning {root} for databases changed since the "
     "last scan (raise fs.inotify.max_queued_events if this repeats)"),
])
def test_an_overflow_of_smooshs_own_writes_rescans_without_a_warning_about_itself(
    watched: Path, caplog: pytest.LogCaptureFixture, whose: str, level: int, said: str
) -> None:
    # Given a watcher while smoosh compacts big.db (its VACUUM writes big.db-wal) beside the
    # application's own app.db
    from smoosh.daemon.watch.inotify_watch import IN_MODIFY

    big, app = make_db(watched / "big.db", "wal"), make_db(watched / "app.db", "wal")
    clock = FakeClock(0.0)
    w = Watcher([str(watched)], Seen(), rescan_interval_s=600.0, clock=clock, busy=lambda p: p == str(big))
    w.start()
    try:
        assert wait_for(lambda: w.scans_completed == 1)
        observer = w._roots._observer
        assert isinstance(observer, InotifyObserver)
        wd = next(wd for wd, d in observer._wd_dir.items() if d == str(watched))
        flooded = big if whose == "smoosh's" else app
        # When the kernel's queue overflows, the events read with its record being those writes
        events = [Event(wd, IN_MODIFY, 0, f"{flooded.name}-wal") for _ in range(4000)]
        with caplog.at_level(logging.DEBUG, logger="smoosh.daemon.watch.watcher"):
            observer._handle([*events, Event(-1, IN_Q_OVERFLOW, 0, "")])
            # Then it rescans what changed either way, and says it at the level of whose writes they were
            assert wait_for(lambda: w.scans_completed == 2)
        lines = [(r.levelno, r.getMessage()) for r in caplog.records if "overflowed" in r.getMessage()]
        assert lines == [(level, said.format(root=watched))]
    finally:
        w.stop()
