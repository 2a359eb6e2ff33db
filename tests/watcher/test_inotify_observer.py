"""smoosh's one-thread inotify observer against real directories and real file operations.

Waiting for an event uses a bounded poll (every 20 ms, under a ceiling that only bounds a
hang): the kernel delivers it, not a timer of the observer's. Only the queue overflow is
handed to the observer as the kernel's record would be: a test cannot make the kernel drop
events without changing a system-wide limit.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest
from inotify_simple import Event
from watchdog.events import (
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
)

from smoosh.daemon.watch.inotify import IN_Q_OVERFLOW, MOVE_PAIR_S, InotifyObserver, inotify_available
from smoosh.daemon.watch.inotify_watch import IN_MOVED_FROM, IN_MOVED_TO
from watcher.test_watcher import wait_for
from helpers.clocks import FakeClock
from helpers.daemon import HANG_S

pytestmark = pytest.mark.skipif(not inotify_available(), reason="needs Linux inotify")

class Recorder:
    """A handler recording (event type, src, dest) triples; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.events: list[tuple[str, str, str]] = []
        self.overflows = 0

    def dispatch(self, event: FileSystemEvent) -> None:
        with self._lock:
            self.events.append((event.event_type, os.fsdecode(event.src_path), os.fsdecode(event.dest_path)))

    def on_overflow(self) -> None:
        with self._lock:
            self.overflows += 1

    def saw(self, kind: str, src: Path | str, dest: Path | str = "") -> bool:
        with self._lock:
            return (kind, str(src), str(dest)) in self.events

    def paths(self) -> set[str]:
        with self._lock:
            return {e[1] for e in self.events} | {e[2] for e in self.events if e[2]}


@pytest.fixture
def observer() -> Iterator[InotifyObserver]:
    obs = InotifyObserver()
    obs.start()
    yield obs
    obs.stop()
    obs.join(5)


WANTED = [FileCreatedEvent, FileModifiedEvent, FileMovedEvent]


def test_writes_creates_and_moves_in_a_directory_are_reported(tmp_path: Path, observer: InotifyObserver) -> None:
    rec = Recorder()
    observer.schedule(rec, str(tmp_path), recursive=False, event_filter=WANTED)
    # When a file is made, written, and renamed inside the watched directory
    f = tmp_path / "a.db"
    f.write_bytes(b"x")
    with open(f, "ab") as fh:
        fh.write(b"more")
    f.rename(tmp_path / "b.db")
    # Then each arrives as watchdog's event, the move paired with its source
    assert wait_for(lambda: rec.saw("moved", f, tmp_path / "b.db"))
    assert rec.saw("created", f) and rec.saw("modified", f)
    # And kinds not asked for (deleted) are not delivered
    (tmp_path / "b.db").unlink()
    time.sleep(0.1)  # nothing should arrive; a short look for an event that must not come
    assert not any(kind == "deleted" for kind, _, _ in rec.events)


def test_a_file_moved_in_from_outside_is_created_and_one_moved_out_is_deleted(tmp_path: Path, observer: InotifyObserver) -> None:
    watched, outside = tmp_path / "w", tmp_path / "out"
    watched.mkdir()
    outside.mkdir()
    rec = Recorder()
    observer.schedule(rec, str(watched), recursive=True, event_filter=[FileCreatedEvent, FileDeletedEvent])
    (outside / "in.db").write_bytes(b"x")
    (outside / "in.db").rename(watched / "in.db")
    (watched / "stay.db").write_bytes(b"x")
    (watched / "stay.db").rename(outside / "gone.db")
    assert wait_for(lambda: rec.saw("created", watched / "in.db") and rec.saw("deleted", watched / "stay.db"))
    assert str(outside / "gone.db") not in rec.paths()


def test_a_recursive_watch_follows_new_and_moved_in_directories(tmp_path: Path, observer: InotifyObserver) -> None:
    watched, outside = tmp_path / "w", tmp_path / "out"
    watched.mkdir()
    (outside / "deep").mkdir(parents=True)
    (outside / "deep" / "t1.db").write_bytes(b"x")
    rec = Recorder()
    observer.schedule(rec, str(watched), recursive=True, event_filter=WANTED)
    # A directory made inside the tree is watched at once: a file written in it is seen
    (watched / "new").mkdir()
    assert wait_for(lambda: observer.is_watching_dir(str(watched / "new")))
    (watched / "new" / "n.db").write_bytes(b"x")
    assert wait_for(lambda: rec.saw("created", watched / "new" / "n.db"))
    # A tree moved in reports the files already in it, and is watched from then on
    outside.rename(watched / "moved")
    assert wait_for(lambda: rec.saw("created", watched / "moved" / "deep" / "t1.db"))
    with open(watched / "moved" / "deep" / "t1.db", "ab") as fh:
        fh.write(b"y")
    assert wait_for(lambda: rec.saw("modified", watched / "moved" / "deep" / "t1.db"))


def test_a_directory_moved_out_is_no_longer_reported_under_its_old_name(tmp_path: Path, observer: InotifyObserver) -> None:
    watched, outside = tmp_path / "w", tmp_path / "out"
    (watched / "sub").mkdir(parents=True)
    outside.mkdir()
    rec = Recorder()
    observer.schedule(rec, str(watched), recursive=True, event_filter=WANTED)
    (watched / "sub").rename(outside / "sub")
    assert wait_for(lambda: not observer.is_watching_dir(str(watched / "sub")))
    (outside / "sub" / "late.db").write_bytes(b"x")
    (watched / "marker.db").write_bytes(b"x")  # an event that must come after any stray one
    assert wait_for(lambda: rec.saw("created", watched / "marker.db"))
    assert not any("late.db" in p for p in rec.paths())


def test_a_deleted_root_ends_its_watch(tmp_path: Path, observer: InotifyObserver) -> None:
    root = tmp_path / "w"
    root.mkdir()
    watch = observer.schedule(Recorder(), str(root), recursive=True, event_filter=WANTED)
    assert observer.is_watching(watch)
    root.rmdir()
    assert wait_for(lambda: not observer.is_watching(watch))
    # The owner schedules again once a directory is back (WatchedRoots' root check)
    root.mkdir()
    rec = Recorder()
    again = observer.schedule(rec, str(root), recursive=True, event_filter=WANTED)
    (root / "x.db").write_bytes(b"x")
    assert wait_for(lambda: rec.saw("created", root / "x.db"))
    assert observer.is_watching(again)


def test_two_watches_on_one_directory_each_get_their_own_kinds(tmp_path: Path, observer: InotifyObserver) -> None:
    files, closes = Recorder(), Recorder()
    observer.schedule(files, str(tmp_path), recursive=True, event_filter=[FileCreatedEvent])
    w2 = observer.schedule(closes, str(tmp_path), recursive=False, event_filter=[FileClosedEvent])
    (tmp_path / "c.ini").write_text("x")
    assert wait_for(lambda: files.saw("created", tmp_path / "c.ini") and closes.saw("closed", tmp_path / "c.ini"))
    assert {k for k, _, _ in files.events} == {"created"}
    assert {k for k, _, _ in closes.events} == {"closed"}
    # Unscheduling one leaves the other working
    observer.unschedule(w2)
    (tmp_path / "d.ini").write_text("x")
    assert wait_for(lambda: files.saw("created", tmp_path / "d.ini"))
    assert not closes.saw("closed", tmp_path / "d.ini")
    with pytest.raises(KeyError):
        observer.unschedule(w2)


class Ignoring(Recorder):
    """A recorder whose ``ignores`` names the files under one directory, counting what it is asked."""

    def __init__(self, ignored: Path) -> None:
        super().__init__()
        self.prefix = str(ignored) + os.sep
        self.asked: list[str] = []

    def ignores(self, path: str) -> bool:
        with self._lock:
            self.asked.append(path)
        return path.startswith(self.prefix)


def test_a_handler_that_ignores_a_file_gets_no_event_for_its_writes(tmp_path: Path, observer: InotifyObserver) -> None:
    own, app = tmp_path / "own", tmp_path / "app"
    own.mkdir()
    app.mkdir()
    rec, plain = Ignoring(own), Recorder()
    observer.schedule(rec, str(tmp_path), recursive=True, event_filter=WANTED)
    observer.schedule(plain, str(tmp_path), recursive=True, event_filter=WANTED)
    # When files the handler ignores are made and written, then one it does not
    (own / "x.db").write_bytes(b"x")
    with open(own / "x.db-journal", "ab") as fh:
        fh.write(b"j")
    (app / "y.db").write_bytes(b"y")
    assert wait_for(lambda: rec.saw("created", app / "y.db") and plain.saw("created", own / "x.db-journal"))
    # Then it was asked about each, and got events only for the file it did not ignore;
    # a handler without ignores still gets them all
    assert {str(own / "x.db"), str(own / "x.db-journal"), str(app / "y.db")} <= set(rec.asked)
    assert rec.paths() == {str(app / "y.db")}
    assert {str(own / "x.db"), str(app / "y.db")} <= plain.paths()
    # And a move is not a write: it arrives whole, even out of an ignored file (the kernel's own
    # rename: its two halves may fall in one read or in two, see the test below)
    (own / "x.db").rename(app / "z.db")
    assert wait_for(lambda: rec.saw("moved", own / "x.db", app / "z.db"))
    assert not rec.saw("created", app / "z.db")


@pytest.fixture
def reader() -> Iterator[tuple[InotifyObserver, FakeClock]]:
    """An observer whose reads the test makes itself (no thread), on a stepped clock: the test
    hands it the kernel's records as a read would return them."""
    clock = FakeClock(0.0)
    obs = InotifyObserver(clock=clock)
    yield obs, clock
    obs.stop()


def test_a_move_whose_two_halves_fall_in_two_reads_is_reported_as_a_move(
    tmp_path: Path, reader: tuple[InotifyObserver, FakeClock]
) -> None:
    # The move of the test above, read as it is when the suite flaked: the kernel queues the
    # rename's IN_MOVED_FROM and IN_MOVED_TO one after the other, and a read fell between them.
    obs, clock = reader
    own, app = tmp_path / "own", tmp_path / "app"
    own.mkdir()
    app.mkdir()
    rec = Ignoring(own)
    obs.schedule(rec, str(tmp_path), recursive=True, event_filter=WANTED)
    own_wd, app_wd = obs._dir_wd[str(own)], obs._dir_wd[str(app)]
    # When one read ends with the first half and the next, a little later, begins with the second
    obs._handle([Event(own_wd, IN_MOVED_FROM, 7, "x.db")])
    assert rec.events == []  # held for its second half: neither a deletion nor anything yet
    clock.advance(MOVE_PAIR_S / 2)
    obs._handle([Event(app_wd, IN_MOVED_TO, 7, "z.db")])
    # Then it is one move, out of the ignored file, never a deletion and a creation
    assert rec.events == [("moved", str(own / "x.db"), str(app / "z.db"))]
    # And a second half read after the hold pairs all the same: the queue is read before the
    # hold is judged, so only a move whose second half never came is a deletion
    obs._handle([Event(app_wd, IN_MOVED_FROM, 8, "z.db")])
    clock.advance(MOVE_PAIR_S * 10)
    obs._handle([Event(app_wd, IN_MOVED_TO, 8, "y.db")])
    assert rec.events[1:] == [("moved", str(app / "z.db"), str(app / "y.db"))]


def test_a_move_out_is_a_deletion_once_its_hold_ends_unpaired(
    tmp_path: Path, reader: tuple[InotifyObserver, FakeClock]
) -> None:
    obs, clock = reader
    rec = Recorder()
    obs.schedule(rec, str(tmp_path), recursive=True, event_filter=[FileCreatedEvent, FileDeletedEvent, FileMovedEvent])
    wd = obs._dir_wd[str(tmp_path)]
    obs._handle([Event(wd, IN_MOVED_FROM, 9, "gone.db")])
    clock.advance(MOVE_PAIR_S - 0.01)
    obs._handle([])  # a read before the hold ends: still waiting for the second half
    assert rec.events == []
    clock.advance(0.02)
    obs._handle([])  # the read at the hold's end, with no second half queued: moved out
    assert rec.events == [("deleted", str(tmp_path / "gone.db"), "")]
    # A second half that comes after all is a file moved in from outside: created
    obs._handle([Event(wd, IN_MOVED_TO, 9, "back.db")])
    assert rec.events[1:] == [("created", str(tmp_path / "back.db"), "")]


def test_the_observer_thread_reads_again_when_a_held_move_is_due(tmp_path: Path) -> None:
    # The real kernel and the real thread: a file moved out of the watched tree is a deletion,
    # told by the thread's own read at the hold's end (no other event comes to wake it).
    watched, outside = tmp_path / "w", tmp_path / "out"
    watched.mkdir()
    outside.mkdir()
    obs = InotifyObserver()
    obs.start()
    try:
        rec = Recorder()
        obs.schedule(rec, str(watched), recursive=True, event_filter=[FileDeletedEvent])
        (watched / "a.db").write_bytes(b"x")
        (watched / "a.db").rename(outside / "a.db")
        assert wait_for(lambda: rec.saw("deleted", watched / "a.db"))
    finally:
        obs.stop()
        obs.join(5)


def test_a_handler_whose_ignores_fails_still_gets_every_event(
    tmp_path: Path, observer: InotifyObserver, caplog: pytest.LogCaptureFixture
) -> None:
    class Failing(Recorder):
        def ignores(self, path: str) -> bool:
            raise RuntimeError("boom")

    rec = Failing()
    observer.schedule(rec, str(tmp_path), event_filter=WANTED)
    # When its ignores() raises on each of two files written in one burst
    (tmp_path / "a.db").write_bytes(b"a")
    (tmp_path / "b.db").write_bytes(b"b")
    # Then both still arrive (the read is not lost), and the failure is logged
    assert wait_for(lambda: rec.saw("created", tmp_path / "a.db") and rec.saw("created", tmp_path / "b.db"))
    assert any("ignores() failed" in r.getMessage() for r in caplog.records)


def test_a_queue_overflow_tells_every_handler_that_listens_for_it(tmp_path: Path, observer: InotifyObserver) -> None:
    a, b = Recorder(), Recorder()
    observer.schedule(a, str(tmp_path), event_filter=WANTED)
    observer.schedule(b, str(tmp_path), event_filter=WANTED)
    plain = object()  # a handler without on_overflow is simply not told
    observer.schedule(plain, str(tmp_path), event_filter=[FileClosedEvent])
    # The kernel's record of an overflow (wd -1), as the observer's thread reads it
    observer._handle([Event(-1, IN_Q_OVERFLOW, 0, "")])
    assert (a.overflows, b.overflows) == (1, 1)


def test_missing_directory_raises_and_stop_releases_thread_and_descriptors(tmp_path: Path) -> None:
    fds_before = set(os.listdir("/proc/self/fd"))
    obs = InotifyObserver()
    obs.start()
    with pytest.raises(FileNotFoundError):
        obs.schedule(Recorder(), str(tmp_path / "missing"))
    obs.schedule(Recorder(), str(tmp_path), recursive=True)
    assert obs.is_alive()
    obs.stop()
    obs.join(5)
    assert not obs.is_alive()
    assert set(os.listdir("/proc/self/fd")) <= fds_before


def test_running_out_of_watches_mid_tree_raises_and_keeps_no_half_watched_tree(tmp_path: Path, observer: InotifyObserver) -> None:
    import errno

    for i in range(4):
        (tmp_path / f"d{i}").mkdir()
    observer.schedule(Recorder(), str(tmp_path))  # some watch first, so the descriptor exists
    inotify = observer._inotify
    real_add = inotify.add_watch
    calls = []

    def add_watch(path: str, mask: int) -> int:
        calls.append(path)
        if len(calls) > 2:  # the kernel's fs.inotify.max_user_watches, reached mid-walk
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return int(real_add(path, mask))

    inotify.add_watch = add_watch
    with pytest.raises(OSError) as raised:
        observer.schedule(Recorder(), str(tmp_path), recursive=True)
    assert raised.value.errno == errno.ENOSPC  # WatchedRoots falls back to polling on it
    inotify.add_watch = real_add
    # Only the first watch's directory stays watched: the subdirectories it reached are dropped
    assert observer.is_watching_dir(str(tmp_path))
    assert not any(observer.is_watching_dir(str(tmp_path / f"d{i}")) for i in range(4))


def created_seen_by_after_drain(observer: InotifyObserver, rec: Recorder, f: Path) -> bool:
    """Write ``f``, then ask for an after_drain callback: whether ``f``'s creation had been
    dispatched to ``rec`` when the callback ran (on whichever thread read it)."""
    f.write_bytes(b"x")
    seen_then: list[bool] = []
    done = threading.Event()
    assert observer.after_drain(lambda: (seen_then.append(rec.saw("created", f)), done.set()))
    assert done.wait(HANG_S)
    return seen_then == [True]


def test_after_drain_runs_once_the_events_queued_before_it_are_dispatched(
    tmp_path: Path, observer: InotifyObserver
) -> None:
    rec = Recorder()
    observer.schedule(rec, str(tmp_path), recursive=False, event_filter=WANTED)
    # When a callback is asked for after a write, then it runs after that write's event was dispatched
    assert created_seen_by_after_drain(observer, rec, tmp_path / "a.db")


class Blocker(Recorder):
    """A recorder whose dispatch of ``path``'s events waits for ``go_on``: a read held up
    mid-dispatch, as under load. Records each event's thread."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = str(path)
        self.inside, self.go_on = threading.Event(), threading.Event()
        self.threads: list[str] = []

    def dispatch(self, event: FileSystemEvent) -> None:
        super().dispatch(event)
        with self._lock:
            self.threads.append(threading.current_thread().name)
        if os.fsdecode(event.src_path) == self.path:
            self.inside.set()
            self.go_on.wait(HANG_S)


@pytest.fixture
def parked() -> Iterator[tuple[InotifyObserver, threading.Event]]:
    """A started observer whose thread is held before its first wait (the quiet predicate it
    asks there waits), as a thread the scheduler has not run yet: it reads nothing until the
    event it yields is set."""
    obs = InotifyObserver()
    asked, go_on = threading.Event(), threading.Event()
    obs.set_quiet(lambda: (asked.set(), go_on.wait(HANG_S), False)[2])
    obs.start()
    assert asked.wait(HANG_S)
    yield obs, go_on
    go_on.set()
    obs.stop()
    obs.join(5)


def test_after_drain_reads_on_the_callers_thread_when_no_read_is_under_way(
    tmp_path: Path, parked: tuple[InotifyObserver, threading.Event]
) -> None:
    observer, _ = parked
    rec = Blocker(tmp_path / "never")
    observer.schedule(rec, str(tmp_path), recursive=False, event_filter=WANTED)
    # When a file is written and its writer asks for a callback (a compaction's end)
    (tmp_path / "a.db").write_bytes(b"x")
    called: list[str] = []
    assert observer.after_drain(lambda: called.append(threading.current_thread().name))
    # Then the write's event was dispatched, and the callback called, on the caller's
    # thread before after_drain returned: the observer's thread was not needed for them
    here = threading.current_thread().name
    assert rec.saw("created", tmp_path / "a.db")
    assert set(rec.threads) == {here}
    assert called == [here]


def test_after_drain_during_a_read_leaves_the_callback_to_the_observers_next_read(
    tmp_path: Path, observer: InotifyObserver
) -> None:
    # Given the observer's thread held up in the middle of dispatching a read
    rec = Blocker(tmp_path / "slow.db")
    observer.schedule(rec, str(tmp_path), recursive=False, event_filter=WANTED)
    (tmp_path / "slow.db").write_bytes(b"x")
    assert rec.inside.wait(HANG_S)
    # When another file is written (after that read began) and a callback is asked for
    (tmp_path / "a.db").write_bytes(b"x")
    called = threading.Event()
    seen_then: list[bool] = []
    assert observer.after_drain(lambda: (seen_then.append(rec.saw("created", tmp_path / "a.db")), called.set()))
    # Then the caller does not wait for that read, nor read beside it: nothing is called yet
    assert not called.is_set()
    assert not rec.saw("created", tmp_path / "a.db")
    # And once the read is done, the observer's thread reads again and calls back after
    # dispatching the write made before the callback was asked for
    rec.go_on.set()
    assert called.wait(HANG_S)
    assert seen_then == [True]
    assert set(rec.threads) == {"smoosh-inotify"}


def test_a_stop_waits_for_an_after_drain_read_under_way(tmp_path: Path, observer: InotifyObserver) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    rec1, rec2 = Blocker(first / "slow.db"), Blocker(second / "slow.db")
    observer.schedule(rec1, str(first), recursive=False, event_filter=WANTED)
    observer.schedule(rec2, str(second), recursive=False, event_filter=WANTED)
    # Given the observer's thread held up in a callback, outside any read: it was reading
    # when the callback was asked for, so the callback waited for its next read
    (first / "slow.db").write_bytes(b"x")
    assert rec1.inside.wait(HANG_S)
    in_callback, callback_go_on = threading.Event(), threading.Event()
    assert observer.after_drain(lambda: (in_callback.set(), callback_go_on.wait(HANG_S)))
    rec1.go_on.set()
    assert in_callback.wait(HANG_S)
    # And an after_drain reading on its caller's thread meanwhile, held up mid-dispatch
    (second / "slow.db").write_bytes(b"x")
    returned = threading.Event()
    caller = threading.Thread(target=lambda: (observer.after_drain(lambda: None), returned.set()))
    caller.start()
    try:
        assert rec2.inside.wait(HANG_S)
        assert set(rec2.threads) == {caller.name}
        # When the observer is stopped, and its thread goes on to end
        observer.stop()
        callback_go_on.set()
        # Then it does not close the descriptor under that read: it waits for it to end
        assert not wait_for(lambda: not observer.is_alive(), timeout_s=0.3)
        rec2.go_on.set()
        assert returned.wait(HANG_S)
        observer.join(HANG_S)
        assert not observer.is_alive()
    finally:
        rec2.go_on.set()
        callback_go_on.set()
        caller.join(HANG_S)


def test_after_drain_reads_a_descriptor_the_first_schedule_opened_while_the_thread_slept(
    tmp_path: Path, observer: InotifyObserver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an observer thread asleep since before its first watch: it had no descriptor then
    # (one turn with nothing scheduled puts it back to sleep), and the first schedule's wake-up
    # has not reached it yet (the schedule's wake is held back: the thread is slow to run)
    turned = threading.Event()
    assert observer.after_drain(turned.set)
    assert turned.wait(HANG_S)
    rec = Recorder()
    with monkeypatch.context() as slow_thread:
        slow_thread.setattr(observer, "_wake", lambda: None)
        observer.schedule(rec, str(tmp_path), recursive=False, event_filter=WANTED)
    # When a callback is asked for after a write, then the thread reads the new descriptor
    # before it calls back: the write's event first
    assert created_seen_by_after_drain(observer, rec, tmp_path / "a.db")


def test_after_drain_runs_without_watches_and_refuses_before_a_start(observer: InotifyObserver) -> None:
    done = threading.Event()
    assert observer.after_drain(done.set)  # nothing scheduled: nothing to wait for
    assert done.wait(HANG_S)
    idle = InotifyObserver()
    try:
        assert idle.after_drain(lambda: None) is False  # no thread: the caller does not wait
    finally:
        idle.stop()


def test_a_quiet_observer_reads_what_queued_when_a_compaction_ends(
    tmp_path: Path, observer: InotifyObserver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an observer told that events may wait (a compaction of the daemon runs), with the
    # bound on the wait out of the test's reach: only a wake-up makes it read
    monkeypatch.setattr("smoosh.daemon.watch.inotify.QUIET_READ_S", 10 * HANG_S)
    rec = Recorder()
    observer.schedule(rec, str(tmp_path), recursive=False, event_filter=WANTED)
    observer.set_quiet(lambda: True)
    turned = threading.Event()
    assert observer.after_drain(turned.set)  # the thread is in its quiet wait from here on
    assert turned.wait(HANG_S)
    # When the compaction ends (after_drain), then every event queued before it was dispatched
    assert created_seen_by_after_drain(observer, rec, tmp_path / "a.db")


def test_events_that_arrive_as_a_compaction_starts_wait_for_its_end(
    tmp_path: Path, observer: InotifyObserver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an observer between two compactions (not quiet: it reads each event at once), with
    # the quiet bound out of the test's reach. No after_drain before the compaction starts: its
    # wake-up could still be unread then, and a wake-up is a read by design.
    monkeypatch.setattr("smoosh.daemon.watch.inotify.QUIET_READ_S", 10 * HANG_S)
    rec = Recorder()
    observer.schedule(rec, str(tmp_path), recursive=False, event_filter=WANTED)
    lock = threading.Lock()
    state = {"quiet": False}

    def quiet() -> bool:
        with lock:
            return state["quiet"]

    observer.set_quiet(quiet)
    (tmp_path / "before.db").write_bytes(b"x")
    # Read at once: not quiet. Its last event too, or the read it wakes the thread for could
    # take the next write with it (the thread looks at quiet() before it reads, not after).
    assert wait_for(lambda: rec.saw("modified", tmp_path / "before.db"))
    # When a compaction starts and writes, waking the thread from its wait for any event
    with lock:
        state["quiet"] = True
    f = tmp_path / "a.db"
    f.write_bytes(b"x")
    # Then the write is left for the compaction's end (it would be read within milliseconds
    # otherwise), whose after_drain reads it with the rest, in one read
    assert not wait_for(lambda: rec.saw("created", f), timeout_s=0.5)
    assert created_seen_by_after_drain(observer, rec, tmp_path / "b.db")
    assert rec.saw("created", f)


def test_a_quiet_observer_still_reads_events_nobody_wakes_it_for(tmp_path: Path, observer: InotifyObserver) -> None:
    # Given an observer told that events may wait, for the bounded time it may
    rec = Recorder()
    observer.schedule(rec, str(tmp_path), recursive=False, event_filter=WANTED)
    observer.set_quiet(lambda: True)
    # When an application writes and no compaction ends, then its event is still dispatched
    (tmp_path / "app.db").write_bytes(b"x")
    assert wait_for(lambda: rec.saw("created", tmp_path / "app.db"))


def test_a_failing_quiet_predicate_leaves_the_observer_reading_each_event(tmp_path: Path, observer: InotifyObserver) -> None:
    def broken() -> bool:
        raise RuntimeError("boom")

    rec = Recorder()
    observer.schedule(rec, str(tmp_path), recursive=False, event_filter=WANTED)
    observer.set_quiet(broken)
    (tmp_path / "app.db").write_bytes(b"x")
    # Then the observer goes on: the event is dispatched as if nothing were quiet
    assert wait_for(lambda: rec.saw("created", tmp_path / "app.db"))


def test_a_quiet_observer_whose_bounded_wait_found_nothing_still_reads_the_next_event(
    tmp_path: Path, observer: InotifyObserver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a quiet observer whose bounded waits end at once and find nothing (a compaction
    # held, writing nothing): it stops waking on the bound and waits for events instead
    monkeypatch.setattr("smoosh.daemon.watch.inotify.QUIET_READ_S", 0.0)
    rec = Recorder()
    observer.schedule(rec, str(tmp_path), recursive=False, event_filter=WANTED)
    observer.set_quiet(lambda: True)
    turned = threading.Event()
    assert observer.after_drain(turned.set)
    assert turned.wait(HANG_S)
    # When an application writes, then its event is dispatched
    (tmp_path / "app.db").write_bytes(b"x")
    assert wait_for(lambda: rec.saw("created", tmp_path / "app.db"))
    # ... and a compaction's end still reads what queued before it
    assert created_seen_by_after_drain(observer, rec, tmp_path / "b.db")


def test_a_files_repeated_changes_in_one_read_reach_the_handler_once(
    tmp_path: Path, parked: tuple[InotifyObserver, threading.Event]
) -> None:
    # Given two files written in turn, many times, while the observer's thread reads nothing:
    # the kernel queues every change (it merges a change only into the same one just before)
    observer, _ = parked
    rec = Recorder()
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    a.write_bytes(b"a")
    b.write_bytes(b"b")
    observer.after_drain(lambda: None)  # their creations read and dispatched
    with open(a, "ab") as fa, open(b, "ab") as fb:
        observer.schedule(rec, str(tmp_path), recursive=False, event_filter=WANTED)
        for _ in range(50):
            fa.write(b"x")
            fa.flush()
            fb.write(b"y")
            fb.flush()
    # When one read takes them
    assert observer.after_drain(lambda: None)
    # Then each file's changes reached the handler as one event
    assert sorted(e for e in rec.events if e[0] == "modified") == [("modified", str(a), ""), ("modified", str(b), "")]


def test_a_change_after_a_creation_or_a_move_of_its_name_is_reported_again() -> None:
    from smoosh.daemon.watch.inotify import fold_repeats
    from smoosh.daemon.watch.inotify_watch import IN_ATTRIB, IN_CREATE, IN_MODIFY

    events = [Event(1, IN_MODIFY, 0, "a"), Event(1, IN_MODIFY, 0, "b"), Event(1, IN_ATTRIB, 0, "a"),
              Event(1, IN_MOVED_TO, 7, "a"), Event(1, IN_MODIFY, 0, "a"), Event(2, IN_MODIFY, 0, "a"),
              Event(1, IN_CREATE, 0, "b"), Event(1, IN_MODIFY, 0, "b"), Event(1, IN_MODIFY, 0, "b")]
    assert fold_repeats(events) == [events[0], events[1], events[3], events[4], events[5], events[6], events[7]]


def test_the_gather_grows_while_events_keep_coming_and_never_risks_the_kernel_queue() -> None:
    from smoosh.daemon.watch.inotify import BUSY_READ_DELAY_S, BUSY_WINDOW_S, READ_DELAY_S, gather_s

    # The first burst after a pause, or after a read that found nothing: the short gather
    assert gather_s(0, 0.05, 0.001, 16384) == READ_DELAY_S
    assert gather_s(40, 0.05, BUSY_WINDOW_S + 0.1, 16384) == READ_DELAY_S
    # Events again soon after a read that found some: the long gather
    assert gather_s(40, 0.05, 0.001, 16384) == BUSY_READ_DELAY_S
    # At a rate that would fill a quarter of the queue sooner, a shorter one (never below the short)
    assert gather_s(8192, 1.0, 0.001, 16384) == pytest.approx(0.5)
    assert gather_s(10**7, 1.0, 0.001, 16384) == READ_DELAY_S
