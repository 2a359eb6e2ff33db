"""Issue 27: a WAL past wal_max_size is emptied when its readers allow, and a reader that never lets go is named.

Real processes: an application that writes, a reader that holds a read transaction (its pid
is in the kernel's lock list), and the ``cleanup:`` job's connection. The job never holds the
application's writers while it waits for the reader: it waits with no lock at all, and only
checkpoints once no reader holds a snapshot.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from compactor.contexts import RecordingContext
from compactor.dbfactory import integrity, make_bloated_db
from helpers.locks import ChildConnection
from smoosh.compactors import Blocked, SqliteCompactor, sqlite_wal
from smoosh.compactors.base import Interrupted
from smoosh.compactors.sqlite_compact import open_for_compaction
from smoosh.compactors.sqlite_file import footprint_bytes
from smoosh.compactors.sqlite_open import canonical_roots, close_quietly, pragma, run
from smoosh.compactors.sqlite_openers import PinningReaders, wal_readers
from smoosh.config.sections import SqliteConfig
from smoosh.compactors.sqlite_wal import WAL_QUIET_S, cleanup, truncate_wal, wal_content_bytes

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/locks is Linux only")

#: A ceiling on a hang, never a measure of speed.
HANG_S = 60.0


@pytest.fixture
def grown(tmp_path: Path) -> str:
    path = str(tmp_path / "w.db")
    make_bloated_db(path, rows=1000, delete_fraction=0.0)
    return path


@contextlib.contextmanager
def _growing_app(path: str) -> Iterator[tuple[ChildConnection, int]]:
    """The application (another process) holding the database open, never checkpointing, its
    log grown by a rewrite of every row: the application, and the log's size."""
    with ChildConnection(path) as app:
        app.execute("PRAGMA wal_autocheckpoint=0")
        app.execute("UPDATE docs SET body = randomblob(1000)")
        yield app, os.path.getsize(path + "-wal")


def _grow(path: str) -> None:
    with _growing_app(path):
        pass


def _run_cleanup(path: str, **kwargs: Any) -> None:
    """One ``cleanup:`` job's work on ``path``, on a connection of its own."""
    conn = open_for_compaction(path, None, 1.0)
    try:
        cleanup(conn, path, RecordingContext(), **kwargs)
    finally:
        close_quietly(conn)


def test_the_job_waits_for_the_reader_without_holding_the_writers_then_empties_the_log(grown: str) -> None:
    with ChildConnection(grown) as reader, ChildConnection(grown, timeout_s=0.05) as writer:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM docs")
        writer.execute("PRAGMA wal_autocheckpoint=0")
        writer.execute("UPDATE docs SET body = randomblob(1000)")  # the log grows behind the reader
        assert os.path.getsize(grown + "-wal") > 1_000_000
        assert [r.pid for r in wal_readers(grown) or []] == [reader.proc.pid]
        conn = open_for_compaction(grown, None, 1.0)
        done: list[BaseException | None] = []

        def job() -> None:
            try:
                cleanup(conn, grown, RecordingContext(), readers_wait_s=HANG_S)
                done.append(None)
            except BaseException as e:  # noqa: BLE001 - handed to the test thread
                done.append(e)

        t = threading.Thread(target=job)
        t.start()
        # While the job waits for the reader, the application writes (a 50 ms busy timeout)
        for _ in range(5):
            writer.execute("INSERT INTO docs(key, body) VALUES ('while waiting', x'00')")
        assert not done  # still waiting: the reader has not let go
        reader.execute("COMMIT")  # the reader lets go
        t.join(HANG_S)
        close_quietly(conn)
        assert done == [None]
        assert os.path.getsize(grown + "-wal") == 0  # (the application still has it open)
    assert integrity(grown) == "ok"


class JumpingClock:
    """Monotonic seconds that jump past the job's wait at the second reading."""

    def __init__(self) -> None:
        self.readings = 0

    def __call__(self) -> float:
        self.readings += 1
        return 0.0 if self.readings == 1 else 1_000.0


@contextlib.contextmanager
def _pinned_log(grown: str) -> Iterator[tuple[ChildConnection, int, Any]]:
    """A reader (another process) holding a snapshot while the log grows past it: the reader,
    the log's size, and smoosh's connection to the database (closed on the way out)."""
    with ChildConnection(grown) as reader:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM docs")
        _grow(grown)
        wal = os.path.getsize(grown + "-wal")
        conn = open_for_compaction(grown, None, 1.0)
        try:
            yield reader, wal, conn
        finally:
            close_quietly(conn)


def test_a_reader_that_never_lets_go_is_named_and_the_log_left_to_it(grown: str) -> None:
    with _pinned_log(grown) as (reader, wal, conn):
        with pytest.raises(Blocked) as info:
            cleanup(conn, grown, RecordingContext(), clock=JumpingClock())
        reason = str(info.value)
        assert reason.startswith(f"a reader holds the WAL: {wal} bytes still in {grown}-wal; held by pid "
                                 f"{reader.proc.pid} ({sys.executable} -c ")
        assert not info.value.read_only
        assert os.path.getsize(grown + "-wal") == wal
        reader.execute("COMMIT")


def test_a_job_started_early_ends_quietly_while_the_pinned_log_is_under_wal_max_size(grown: str) -> None:
    # Started at half of wal_max_size: a reader in the way is not reported yet; the next look
    # at the growing log starts the next job
    with _pinned_log(grown) as (reader, wal, conn):
        cleanup(conn, grown, RecordingContext(), clock=JumpingClock(), wal_max_bytes=wal)
        with pytest.raises(Blocked) as info:  # one byte less: past the limit, the reader is named
            cleanup(conn, grown, RecordingContext(), clock=JumpingClock(), wal_max_bytes=wal - 1)
        assert f"held by pid {reader.proc.pid} (" in str(info.value)
        assert os.path.getsize(grown + "-wal") == wal
        reader.execute("COMMIT")
    assert integrity(grown) == "ok"


def test_the_truncate_that_holds_the_writers_finds_the_log_already_copied_back(tmp_path: Path) -> None:
    # Given a WAL database just compacted: the whole new database sits in the log, the file
    # beside it is still the old, larger one
    path = str(tmp_path / "v.db")
    make_bloated_db(path, rows=3000, delete_fraction=0.8, journal_mode="wal")
    conn = open_for_compaction(path, None, 1.0)
    try:
        run(conn, "PRAGMA wal_autocheckpoint=0")
        run(conn, "VACUUM")
        old_bytes = os.path.getsize(path)
        assert os.path.getsize(path + "-wal") > 0
        # When its log is truncated, the database file's size is noted as the TRUNCATE starts
        at_truncate: list[int] = []

        def trace(_cursor: Any, sql: str, _bindings: Any) -> bool:
            if "wal_checkpoint(TRUNCATE)" in sql:
                at_truncate.append(os.path.getsize(path))
            return True

        conn.exec_trace = trace
        truncate_wal(conn, path, busy_timeout_s=0.75)
        conn.exec_trace = None
        # Then the copy back was done before it (by a checkpoint that holds no writer): the file
        # had already shrunk, so the TRUNCATE, which holds the application's writers, copies
        # nothing back
        assert at_truncate and at_truncate[0] < old_bytes
        assert os.path.getsize(path + "-wal") == 0
        # ... and the connection has its own busy timeout back
        assert pragma(conn, "busy_timeout") == 750
    finally:
        close_quietly(conn)
    assert integrity(path) == "ok"


# ---------------------------------------------------------------------- the log, not the file


def test_the_log_in_use_is_read_from_the_file_and_starts_over_after_a_restart(grown: str) -> None:
    with _growing_app(grown) as (app, wal):
        assert wal_content_bytes(grown) == wal  # one log, written from the start of its file
        app.execute("PRAGMA wal_checkpoint(RESTART)")
        app.execute("INSERT INTO docs(key, body) VALUES ('after', x'00')")
        # The next commit wrote from the file's start: the file kept its size, the log is small
        assert os.path.getsize(grown + "-wal") == wal
        assert 0 < wal_content_bytes(grown) < 20_000  # type: ignore[operator]
    assert integrity(grown) == "ok"


def test_what_is_not_a_log_reads_as_unknown_and_a_log_shorter_than_its_header_as_empty(tmp_path: Path) -> None:
    path = str(tmp_path / "x.db")
    assert wal_content_bytes(path) is None  # no -wal
    Path(path + "-wal").write_bytes(b"\x37\x7f")
    assert wal_content_bytes(path) == 0
    Path(path + "-wal").write_bytes(b"not a log at all, and longer than a header")
    assert wal_content_bytes(path) is None
    os.remove(path + "-wal")
    real = tmp_path / "elsewhere-wal"
    real.write_bytes(bytes.fromhex("377f0682002de21800001000") + b"\0" * 4200)
    os.symlink(real, path + "-wal")
    assert wal_content_bytes(path) is None  # a link is not followed


def test_a_log_under_wal_max_size_is_restarted_in_its_file_not_cut(grown: str) -> None:
    with _growing_app(grown) as (app, wal):
        _run_cleanup(grown, wal_max_bytes=2 * wal)
        # The file is kept (cutting it holds the writers as long as freeing its blocks takes) ...
        assert os.path.getsize(grown + "-wal") == wal
        # ... and the application's next commit starts the log over at its start
        app.execute("INSERT INTO docs(key, body) VALUES ('after', x'00')")
        assert wal_content_bytes(grown) < 20_000  # type: ignore[operator]
        assert os.path.getsize(grown + "-wal") == wal
    assert integrity(grown) == "ok"


def test_a_log_past_wal_max_size_is_cut(grown: str) -> None:
    with _growing_app(grown) as (_app, wal):
        _run_cleanup(grown, wal_max_bytes=wal - 1)
        assert os.path.getsize(grown + "-wal") == 0
    assert integrity(grown) == "ok"


def test_a_restarted_log_calls_for_no_cleanup_until_it_grows_again_in_its_file(grown: str) -> None:
    with _growing_app(grown) as (app, wal):
        compactor = SqliteCompactor(None, wal_max_size_bytes=2 * wal - 2)  # acts past wal - 1 bytes
        assert compactor.cleanup_key(grown) == "cleanup:" + grown
        compactor.compact("cleanup:" + grown, RecordingContext())
        app.execute("INSERT INTO docs(key, body) VALUES ('after', x'00')")  # the log starts over
        # The file is as large as before, but the log in it is not: no job, and none at the re-check
        assert os.path.getsize(grown + "-wal") == wal
        assert compactor.cleanup_key(grown) is None
        assert compactor.cleanup_priority("cleanup:" + grown) == 0.0
        # ... while a file past wal_max_size calls for one whatever the log in it (to be cut)
        assert SqliteCompactor(None, wal_max_size_bytes=wal - 1).cleanup_key(grown) == "cleanup:" + grown
        # When the log fills its file again, it calls for the next one
        app.execute("UPDATE docs SET body = randomblob(1000)")
        assert compactor.cleanup_key(grown) == "cleanup:" + grown
        assert compactor.cleanup_priority("cleanup:" + grown) == 1.0


def test_a_restarted_log_whose_application_went_quiet_has_its_file_cut(grown: str) -> None:
    with _growing_app(grown) as (app, wal):
        compactor = SqliteCompactor(None, wal_max_size_bytes=2 * wal - 2)
        compactor.compact("cleanup:" + grown, RecordingContext())
        app.execute("INSERT INTO docs(key, body) VALUES ('last', x'00')")  # the log starts over; then nothing
        assert compactor.cleanup_key(grown) is None  # written a moment ago: restarting was enough
        # When its application has not written for WAL_QUIET_S
        old = time.time() - WAL_QUIET_S - 1
        os.utime(grown + "-wal", (old, old))
        # Then the file is worth a job, and the job cuts it: nobody waits for the cut
        assert compactor.cleanup_key(grown) == "cleanup:" + grown
        compactor.compact("cleanup:" + grown, RecordingContext())
        assert os.path.getsize(grown + "-wal") == 0
        assert compactor.cleanup_key(grown) is None
    assert integrity(grown) == "ok"


def test_a_log_goes_quiet_within_the_rescan_margin_so_a_rescan_after_its_last_write_sees_it() -> None:
    from smoosh.daemon.watch.watcher import RESCAN_MARGIN_S

    assert WAL_QUIET_S < RESCAN_MARGIN_S


#: A lock on one byte of a ``-shm``, as SQLite's unix VFS takes it (``fcntl``), held from
#: "locked" until a line comes in: ``python -c _SHM_LOCK SHM BYTE shared|exclusive``.
_SHM_LOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.lockf(fd, (fcntl.LOCK_SH if sys.argv[3] == "shared" else fcntl.LOCK_EX) | fcntl.LOCK_NB, 1, int(sys.argv[2]))
print("locked", flush=True)
sys.stdin.readline()
"""


@contextlib.contextmanager
def _shm_lock(path: str, byte: int, kind: str) -> Iterator[tuple[int, Any]]:
    """Another process holding a ``shared`` or ``exclusive`` lock on ``byte`` of ``path``'s
    ``-shm``: its pid, and a function that releases the lock."""
    proc = subprocess.Popen([sys.executable, "-c", _SHM_LOCK, path + "-shm", str(byte), kind],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "locked\n"

        def release() -> None:
            if proc.poll() is None:
                assert proc.stdin is not None
                proc.stdin.write("\n")
                proc.stdin.flush()
                proc.wait(HANG_S)

        yield proc.pid, release
    finally:
        proc.kill()
        proc.wait(HANG_S)


@contextlib.contextmanager
def _checkpoint_running(path: str) -> Iterator[Any]:
    """Another connection's checkpoint of ``path`` running until the returned function is called:
    SQLite's unix VFS holds the checkpointer byte (``WAL_CKPT_LOCK``: 120 + 1) exclusively, and
    fails any other checkpoint at once meanwhile."""
    with _shm_lock(path, 121, "exclusive") as (_pid, release):
        yield release


def _after_the_vacuum(path: str, live_bytes: float, then: Any) -> threading.Thread:
    """A thread that calls ``then`` 0.2 s after the VACUUM has written the new database into the log."""

    def watch() -> None:
        deadline = time.monotonic() + HANG_S
        while time.monotonic() < deadline:
            if os.path.exists(path + "-wal") and os.path.getsize(path + "-wal") >= live_bytes / 2:
                time.sleep(0.2)  # well after the compaction's first checkpoint (its own cost: none)
                break
            time.sleep(0.005)
        then()

    t = threading.Thread(target=watch)
    t.start()
    return t


@pytest.fixture
def bloated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, int]:
    """A bloated WAL database and its file size; the wait after a compaction made a ceiling on a hang."""
    monkeypatch.setattr(sqlite_wal, "READERS_WAIT_S", HANG_S)
    path = str(tmp_path / "b.db")
    make_bloated_db(path, rows=2000, delete_fraction=0.8)
    return path, os.path.getsize(path)


def test_after_a_compaction_a_checkpoint_already_running_is_waited_out_then_the_log_is_cut(bloated: tuple[str, int]) -> None:
    # Given a bloated WAL database that an application has open, and another connection's
    # checkpoint (the application's automatic one) running when the VACUUM ends
    path, before = bloated
    with ChildConnection(path) as app:
        app.execute("SELECT count(*) FROM docs")
        with _checkpoint_running(path) as release:
            t = _after_the_vacuum(path, before * 0.2, release)
            # When it is compacted
            result = SqliteCompactor(SqliteConfig()).compact(path, RecordingContext())
            t.join(HANG_S)
        # Then the compaction waited for that checkpoint, and its own cut the log: the space is
        # back, and the result says so (before: "ok", the new database still in the log)
        assert os.path.getsize(path + "-wal") == 0
        assert result.size_after_bytes == footprint_bytes(path) < before / 2
    assert integrity(path) == "ok"


def test_a_stop_ends_the_wait_after_a_compaction_and_leaves_the_log_to_the_cleanup_key(
    bloated: tuple[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a compaction waiting, after its VACUUM, for a checkpoint that never ends (and a
    # wait far longer than the test's ceiling on a hang)
    monkeypatch.setattr(sqlite_wal, "READERS_WAIT_S", 100 * HANG_S)
    path, before = bloated
    ctx = RecordingContext()
    results: list[Any] = []
    with ChildConnection(path) as app:
        app.execute("SELECT count(*) FROM docs")
        with _checkpoint_running(path):
            compaction = threading.Thread(target=lambda: results.append(SqliteCompactor(SqliteConfig()).compact(path, ctx)))
            compaction.start()
            # When the job is told to stop
            _after_the_vacuum(path, before * 0.2, ctx.cancel).join(HANG_S)
            compaction.join(HANG_S)
            # Then the compaction ends as it was, its log left whole for the cleanup key to cut
            assert not compaction.is_alive()
            assert os.path.getsize(path + "-wal") > 0
            assert [r.size_after_bytes for r in results] == [footprint_bytes(path)]
    assert integrity(path) == "ok"


#: An application that adds one to a counter every 2 ms, each in its own transaction, and says
#: each value it committed. It never checkpoints: its log is smoosh's to empty.
_COUNTING_APP = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], timeout=30, isolation_level=None)
conn.execute("PRAGMA wal_autocheckpoint=0")
conn.execute("SELECT n FROM counter").fetchone()  # in the database now: it keeps the log
print("ready", flush=True)
while True:
    conn.execute("BEGIN IMMEDIATE")
    n = conn.execute("UPDATE counter SET n = n + 1 RETURNING n").fetchone()[0]
    conn.execute("COMMIT")
    print(n, flush=True)
    time.sleep(0.002)
"""


def test_a_log_cut_in_steps_beside_a_writer_never_cuts_into_it_and_a_crash_loses_no_commit(
    grown: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a WAL database whose log grew to megabytes, and an application committing to it
    step = 64 * 1024
    monkeypatch.setattr(sqlite_wal, "CUT_STEP_BYTES", step)
    with ChildConnection(grown) as setup:
        setup.execute("PRAGMA wal_autocheckpoint=0")
        setup.execute("CREATE TABLE counter(n INTEGER NOT NULL)")
        setup.execute("INSERT INTO counter VALUES (0)")
        setup.execute("UPDATE docs SET body = randomblob(1000)")
        app = subprocess.Popen([sys.executable, "-c", _COUNTING_APP, grown], stdout=subprocess.PIPE, text=True)
        assert app.stdout is not None and app.stdout.readline() == "ready\n"
    try:
        wal_before = os.path.getsize(grown + "-wal")
        assert wal_before > 8 * step
        # When smoosh cuts its -wal (each cut recorded with the log's extent at that moment)
        cuts: list[tuple[int, int | None, int]] = []
        ftruncate = os.ftruncate

        def recording(fd: int, length: int) -> None:
            cuts.append((length, wal_content_bytes(grown), os.fstat(fd).st_size))
            ftruncate(fd, length)

        monkeypatch.setattr(os, "ftruncate", recording)
        conn = open_for_compaction(grown, None, 1.0)
        try:
            sqlite_wal.cut_wal(conn, grown, busy_timeout_s=1.0)
        finally:
            close_quietly(conn)
        monkeypatch.setattr(os, "ftruncate", ftruncate)
        # Then it was cut in steps of at most `step`, never into the log the application writes
        assert len(cuts) >= 8
        for length, log_bytes, size in cuts:
            assert log_bytes is not None and log_bytes <= length < size <= length + step
        # and what is left of the file is the application's log since it started over
        left = os.path.getsize(grown + "-wal")
        assert left <= (wal_content_bytes(grown) or 0) and left < wal_before
        # And when the application dies with its log on disk (kill -9), the next open recovers
        # every commit it was told of from that log, and nothing older
        app.kill()
        app.wait(HANG_S)
        told = [int(line) for line in app.stdout.read().split()]
    finally:
        app.kill()
        app.wait(HANG_S)
    assert told and os.path.exists(grown + "-wal")
    with ChildConnection(grown) as reopened:
        [(n,)] = reopened.execute("SELECT n FROM counter")
        assert n in (told[-1], told[-1] + 1)  # (the last commit may have landed untold)
    assert integrity(grown) == "ok"


def test_a_log_its_idle_application_never_started_over_is_started_by_a_commit_that_changes_nothing(
    grown: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an application holding the database open, idle, after its log grew
    monkeypatch.setattr(sqlite_wal, "CUT_STEP_BYTES", 64 * 1024)
    with _growing_app(grown) as (app, wal):
        app.execute("PRAGMA user_version = 42")
        [(rows,)] = app.execute("SELECT count(*) FROM docs")
        assert wal > 8 * 64 * 1024
        # When smoosh cuts its -wal in steps
        conn = open_for_compaction(grown, None, 1.0)
        try:
            sqlite_wal.cut_wal(conn, grown, busy_timeout_s=1.0)
        finally:
            close_quietly(conn)
        # Then the log is gone, and what the application reads is what it wrote
        assert os.path.getsize(grown + "-wal") == 0
        assert app.execute("PRAGMA user_version") == [(42,)]
        assert app.execute("SELECT count(*) FROM docs") == [(rows,)]
    assert integrity(grown) == "ok"


def test_a_wal_hard_linked_elsewhere_is_not_cut_in_steps(grown: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given an application holding the database open, and its -wal with a second name
    monkeypatch.setattr(sqlite_wal, "CUT_STEP_BYTES", 64 * 1024)
    with _growing_app(grown) as (app, wal):
        other = tmp_path / "elsewhere"
        os.link(grown + "-wal", other)
        # (a root that opts in to hard links: otherwise the -wal's open is refused outright)
        here = os.path.dirname(grown)
        conn = open_for_compaction(grown, canonical_roots([here], allow_hard_links=[here]), 1.0)
        try:
            # When smoosh would cut it in steps
            sqlite_wal.cut_wal(conn, grown, busy_timeout_s=1.0)
        finally:
            close_quietly(conn)
        # Then it cut nothing of that file (the log restarted in it all the same)
        assert os.path.getsize(other) == wal == os.path.getsize(grown + "-wal")
        assert app.execute("SELECT count(*) FROM docs") == [(1000,)]
    assert integrity(grown) == "ok"


def test_a_stop_that_interrupts_the_checkpoint_after_the_vacuum_leaves_the_compaction_done(
    bloated: tuple[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a compaction whose checkpoint after the VACUUM is interrupted, as the job's cancel
    # interrupts the connection mid-statement when the daemon stops (SQLITE_INTERRUPT, mapped)
    path, before = bloated
    restart = sqlite_wal.restart_wal

    def interrupted(conn: Any, db: str, **kwargs: Any) -> None:
        raise Interrupted(f"compaction of {db} was interrupted")

    monkeypatch.setattr(sqlite_wal, "restart_wal", interrupted)
    with ChildConnection(path) as app:  # (another process has it open: the cut goes in steps)
        app.execute("SELECT count(*) FROM docs")
        # When it is compacted
        result = SqliteCompactor(SqliteConfig()).compact(path, RecordingContext())
        # Then the VACUUM's result stands (the log is left for the cleanup key), not "interrupted"
        assert result.size_after_bytes == footprint_bytes(path) < before
    monkeypatch.setattr(sqlite_wal, "restart_wal", restart)
    assert integrity(path) == "ok"


def test_a_writer_in_its_transaction_is_no_reader_to_wait_for(grown: str) -> None:
    # Given a reader inside a read transaction, and a writer inside a write transaction (each
    # holds a read mark; the writer holds the log's write lock too)
    with ChildConnection(grown) as reader, ChildConnection(grown) as writer:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM docs")
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("INSERT INTO docs(key, body) VALUES ('w', x'00')")
        # Then only the reader pins the log: the writer's mark goes with its commit
        assert [r.pid for r in wal_readers(grown) or []] == [reader.proc.pid]
        writer.execute("COMMIT")
        reader.execute("COMMIT")
        # (the same process, reading with no write under way, is a reader like any)
        writer.execute("BEGIN")
        writer.execute("SELECT count(*) FROM docs")
        assert [r.pid for r in wal_readers(grown) or []] == [writer.proc.pid]
        writer.execute("COMMIT")


#: One application process with two connections, as a pool has them: a read transaction held
#: on one, a write transaction begun and ended on the other, each on a line in.
_TWO_CONNECTIONS = """
import sqlite3, sys
reader = sqlite3.connect(sys.argv[1], isolation_level=None)
writer = sqlite3.connect(sys.argv[1], isolation_level=None)
print("ready", flush=True)
sys.stdin.readline()
reader.execute("BEGIN"); reader.execute("SELECT count(*) FROM docs").fetchone()
print("reading", flush=True)
sys.stdin.readline()
writer.execute("BEGIN IMMEDIATE"); writer.execute("INSERT INTO docs(key, body) VALUES ('w', x'00')")
print("writing", flush=True)
sys.stdin.readline()
writer.execute("COMMIT"); reader.execute("COMMIT")
print("done", flush=True)
"""


def test_a_process_that_reads_on_one_connection_stays_a_reader_while_another_of_its_connections_writes(grown: str) -> None:
    app = subprocess.Popen([sys.executable, "-c", _TWO_CONNECTIONS, grown], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True)
    try:
        assert app.stdin is not None and app.stdout is not None

        def step(expect: str) -> None:
            app.stdin.write("\n")
            app.stdin.flush()
            assert app.stdout.readline() == expect + "\n"

        assert app.stdout.readline() == "ready\n"
        pinning = PinningReaders(grown)
        # Given a process inside a read transaction, seen by the job's looks
        step("reading")
        assert [r.pid for r in pinning.look() or []] == [app.pid]
        # When another of its connections writes (the process then holds the write lock too)
        step("writing")
        # Then to the job it is still the reader it was (its read mark still pins the log)
        assert [r.pid for r in pinning.look() or []] == [app.pid]
        # (a single look, which has not seen it read alone, takes it for a writer)
        assert wal_readers(grown) == []
        step("done")
        assert pinning.look() == []
    finally:
        app.kill()
        app.wait(HANG_S)


@pytest.mark.parametrize("kind, a_reader", [("shared", True), ("exclusive", False)])
def test_only_a_shared_lock_on_a_read_mark_is_a_reader(grown: str, kind: str, a_reader: bool) -> None:
    # Given a process holding a lock on a read mark of the -shm (byte 124: mark 1): shared as a
    # reader holds it, or exclusive as a checkpoint takes it for a moment to move the marks
    with ChildConnection(grown) as app:  # (keeps the -shm)
        app.execute("SELECT count(*) FROM docs")
        with _shm_lock(grown, 124, kind) as (pid, _release):
            # Then only the shared one makes it a reader
            assert [r.pid for r in wal_readers(grown) or []] == ([pid] if a_reader else [])


def test_a_look_at_the_readers_also_says_whether_another_process_has_the_database_open(grown: str) -> None:
    # The cut after a look decides between a TRUNCATE and steps from that look's lock list,
    # not from a second read of /proc/locks
    pinning = PinningReaders(grown)
    assert pinning.others_open is None  # no look yet: it cannot be told
    own = sqlite3.connect(grown)  # this process's own connection keeps the -shm, and is not another's
    try:
        own.execute("SELECT count(*) FROM docs").fetchone()
        assert pinning.look() == [] and pinning.others_open is False
        with ChildConnection(grown) as app:
            app.execute("SELECT count(*) FROM docs")
            assert pinning.look() == [] and pinning.others_open is True
        assert pinning.look() == [] and pinning.others_open is False
    finally:
        own.close()
    # The last connection closed: SQLite removed the -shm, so nothing can be told
    assert pinning.look() is None and pinning.others_open is None
