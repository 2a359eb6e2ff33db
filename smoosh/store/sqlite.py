"""``sqlite:PATH`` — the embedded default store: one SQLite file, FoundationDB's semantics.

Layout (one file, WAL mode, shared safely by every process on the machine):

* ``kv(key BLOB PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID`` — BLOB order is FDB's order.
* ``meta(name, value)`` — ``version``, the commit counter (the read version of a snapshot and
  the first 8 bytes of every versionstamp), and ``pruned_through``, the newest commit whose
  write ranges have left the conflict log.
* ``conflict_log(commit_version, begin_key, end_key, commit_time)`` — write ranges of recent
  commits (kept :attr:`~BufferedStore.retention_s`, wall clock, so every process agrees).

A transaction reads from its own WAL snapshot: a pooled read connection inside ``BEGIN``,
held until commit or reset. Writes are buffered (reads see them). Commits queue in this
process; the thread that leads (the committing thread itself when no other leads) takes
the write lock once (``BEGIN IMMEDIATE``), drains every commit waiting and, for each
transaction in turn inside a savepoint, checks its read conflict ranges against the log
rows newer than its read version (earlier members of the batch included), applies its
mutations and logs its write ranges. Only a real overlap is a 1020; a member that fails is
rolled back alone. One ``COMMIT`` (``synchronous=FULL``) then
makes the whole group durable: group commit. Member ``i`` gets the stamp
``(version + 1, i)``.

Watches fire in this process right after the commit that changes their key, and for commits
of other processes through a poller thread that watches ``PRAGMA data_version``.
"""

from __future__ import annotations

import collections
import logging
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator

from smoosh.store.base import (
    MAX_WATCHES,
    TRANSACTION_MAX_AGE_S,
    TRANSACTION_SIZE_LIMIT_BYTES,
)
from smoosh.store.errors import (
    CLIENT_INVALID_OPERATION,
    COMMIT_UNKNOWN_RESULT,
    DATABASE_LOCKED,
    NOT_COMMITTED,
    TRANSACTION_TOO_OLD,
    StoreError,
    StoreUnavailable,
)
from smoosh.store._commit import CommitRequest, PendingWatch, Snapshot
from smoosh.store._mutations import apply_mutations, make_stamp, write_ranges
from smoosh.store._txn import BufferedStore

log = logging.getLogger(__name__)

#: Seconds a connection waits for another process's write lock before giving up (1038).
DEFAULT_BUSY_TIMEOUT_S = 5.0
#: Seconds between two ``PRAGMA data_version`` polls while watches are armed.
DEFAULT_POLL_INTERVAL_S = 0.05
#: Longest wait between two polls: after a quiet spell the poller slows down to this, so an idle
#: process wakes once a second, not twenty times; a change seen brings it back to full speed.
MAX_POLL_INTERVAL_S = 1.0
#: Most transactions committed in one SQLite transaction.
MAX_GROUP = 256
#: Rows fetched per query of a range scan.
SCAN_CHUNK = 256
#: Keys per ``IN (...)`` query when re-reading watched keys.
WATCH_READ_CHUNK = 500
#: Seconds between two prunings of the conflict log.
PRUNE_INTERVAL_S = 1.0
#: Idle read connections kept for reuse.
MAX_POOLED_CONNECTIONS = 8

_SCHEMA = """
CREATE TABLE IF NOT EXISTS kv(key BLOB PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta(name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS conflict_log(
    commit_version INTEGER NOT NULL, begin_key BLOB NOT NULL, end_key BLOB NOT NULL, commit_time REAL NOT NULL);
CREATE INDEX IF NOT EXISTS conflict_log_version ON conflict_log(commit_version);
INSERT OR IGNORE INTO meta(name, value) VALUES ('version', 0), ('pruned_through', 0);
"""


def _is_busy(e: sqlite3.Error) -> bool:
    code = getattr(e, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    msg = str(e)
    return "locked" in msg or "busy" in msg


def _store_error(e: sqlite3.Error) -> BaseException:
    """FoundationDB's view of an SQLite error: lock contention is retryable 1038."""
    if _is_busy(e):
        return StoreError(DATABASE_LOCKED, f"SQLite store is locked: {e}")
    return e


@dataclass
class SqliteStats:
    """Counters of one store handle's commits (this process only)."""

    #: Commits queued for a group.
    requests: int = 0
    #: Store transactions whose writes were committed.
    store_commits: int = 0
    #: SQLite write transactions committed (fewer than ``store_commits`` when groups form).
    sqlite_commits: int = 0
    #: Commits refused with 1020.
    conflicts: int = 0
    #: The largest group committed in one SQLite transaction.
    max_group: int = 0


class _Pending:
    __slots__ = ("req", "wake", "finished", "lead", "stamp", "error")

    def __init__(self, req: CommitRequest) -> None:
        self.req = req
        #: Set when this commit is finished, or when its thread is appointed to lead.
        self.wake = threading.Event()
        self.finished = False
        self.lead = False
        self.stamp: bytes | None = None
        self.error: BaseException | None = None


class _SqliteSnapshot(Snapshot):
    def __init__(self, store: SqliteStore) -> None:
        self._store = store
        self._conn: sqlite3.Connection | None = store._acquire()
        try:
            self._conn.execute("BEGIN")
            # The first SELECT starts the WAL read transaction: from here on this connection
            # sees exactly the commits up to ``read_version``.
            self.read_version = self._conn.execute("SELECT value FROM meta WHERE name = 'version'").fetchone()[0]
        except sqlite3.Error as e:
            self.close()
            raise _store_error(e) from e

    def _c(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(CLIENT_INVALID_OPERATION, "snapshot already released")
        return self._conn

    def get(self, key: bytes) -> bytes | None:
        try:
            row = self._c().execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
        except sqlite3.Error as e:
            raise _store_error(e) from e
        return None if row is None else row[0]

    def scan(self, begin: bytes, end: bytes, reverse: bool, first_chunk: int = 0) -> Iterator[tuple[bytes, bytes]]:
        lo, hi = begin, end
        # The merge above us reads one pair ahead; later chunks grow back to the usual size.
        chunk_size = min(first_chunk + 1, SCAN_CHUNK) if first_chunk > 0 else SCAN_CHUNK
        while True:
            try:
                if reverse:
                    rows = self._c().execute(
                        "SELECT key, value FROM kv WHERE key >= ? AND key < ? ORDER BY key DESC LIMIT ?", (lo, hi, chunk_size)
                    ).fetchall()
                else:
                    rows = self._c().execute(
                        "SELECT key, value FROM kv WHERE key >= ? AND key < ? ORDER BY key LIMIT ?", (lo, hi, chunk_size)
                    ).fetchall()
            except sqlite3.Error as e:
                raise _store_error(e) from e
            yield from rows
            if len(rows) < chunk_size:
                return
            chunk_size = min(chunk_size * 4, SCAN_CHUNK)
            if reverse:
                hi = rows[-1][0]
            else:
                lo = rows[-1][0] + b"\x00"

    def abandon(self) -> None:
        # Closing the connection ends its read transaction; the pool (and its lock) is skipped.
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                conn.close()
                return
            self._store._release(conn)


class _SqlTarget:
    """Mutations of one commit applied to ``kv`` on the writer connection."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def get(self, key: bytes) -> bytes | None:
        row = self._conn.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def put(self, key: bytes, value: bytes) -> None:
        self._conn.execute("INSERT OR REPLACE INTO kv(key, value) VALUES (?, ?)", (key, value))

    def delete(self, key: bytes) -> None:
        self._conn.execute("DELETE FROM kv WHERE key = ?", (key,))

    def delete_range(self, begin: bytes, end: bytes) -> None:
        self._conn.execute("DELETE FROM kv WHERE key >= ? AND key < ?", (begin, end))


def _read_values(conn: sqlite3.Connection, keys: list[bytes]) -> dict[bytes, bytes | None]:
    values: dict[bytes, bytes | None] = dict.fromkeys(keys)
    for i in range(0, len(keys), WATCH_READ_CHUNK):
        chunk = keys[i : i + WATCH_READ_CHUNK]
        marks = ",".join("?" * len(chunk))
        for key, value in conn.execute(f"SELECT key, value FROM kv WHERE key IN ({marks})", chunk):
            values[key] = value
    return values


class SqliteStore(BufferedStore):
    """The ``sqlite:PATH`` store (see the module docstring).

    Parameters:
        path: the SQLite file (created if missing).
        url: the URL it was opened with (default ``sqlite:PATH``).
        max_age_s: seconds a transaction may read and commit after its first read (1007 beyond).
        size_limit_bytes: transaction size limit (2101 beyond it).
        max_watches: outstanding watches allowed (1032 beyond).
        busy_timeout_s: how long to wait for another process's write lock (1038 beyond).
        poll_interval_s: period of the ``PRAGMA data_version`` poller while changes come; it
            doubles after each quiet poll up to :data:`MAX_POLL_INTERVAL_S`, and the poller
            sleeps outright while no watch is armed.
        clock: monotonic seconds for the age limit; tests inject one.

    Raises:
        StoreUnavailable: the file cannot be opened or is not a store.
    """

    def __init__(
        self,
        path: str,
        *,
        url: str | None = None,
        max_age_s: float | None = TRANSACTION_MAX_AGE_S,
        size_limit_bytes: int = TRANSACTION_SIZE_LIMIT_BYTES,
        max_watches: int = MAX_WATCHES,
        busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
        poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(
            url or f"sqlite:{path}", max_age_s=max_age_s, size_limit_bytes=size_limit_bytes, max_watches=max_watches, clock=clock
        )
        self.path = os.path.abspath(path)
        self.busy_timeout_s = busy_timeout_s
        self.poll_interval_s = poll_interval_s
        self._poll_wake = threading.Event()  # a watch was armed, or the store closes
        self.stats = SqliteStats()
        self._pool: list[sqlite3.Connection] = []
        self._pool_lock = threading.Lock()
        self._queue: collections.deque[_Pending] = collections.deque()
        self._cv = threading.Condition()
        #: Whether some thread is leading the commits (see :meth:`_commit`); under ``_cv``.
        self._leading = False
        self._poller: threading.Thread | None = None
        self._stop = threading.Event()
        self._last_prune = 0.0
        try:
            # A new user's `sqlite:var/jobs.db` should just work: create the directory too.
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        except OSError as e:
            raise StoreUnavailable(f"cannot open SQLite store {self.path!r}: {e}") from e
        deadline = time.monotonic() + self.busy_timeout_s
        while True:
            try:
                self._open_writer()
                break
            except sqlite3.OperationalError as e:
                # Switching a new file to WAL while another process does the same can report
                # "database is locked" at once, without waiting in the busy handler: two
                # daemons opening one new shared store together. Try again until the timeout.
                if (e.sqlite_errorcode & 0xFF) not in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) \
                        or time.monotonic() >= deadline:
                    raise StoreUnavailable(f"cannot open SQLite store {self.path!r}: {e}") from e
                time.sleep(0.01)
            except sqlite3.Error as e:
                raise StoreUnavailable(f"cannot open SQLite store {self.path!r}: {e}") from e

    def _open_writer(self) -> None:
        writer = self._connect()
        try:
            writer.execute("PRAGMA journal_mode=WAL")
            writer.execute("PRAGMA synchronous=FULL")
            # executescript() would COMMIT first: run the statements one by one under our lock,
            # so processes opening a new file at once create the schema once.
            writer.execute("BEGIN IMMEDIATE")
            try:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        writer.execute(statement)
                writer.execute("COMMIT")
            except BaseException:
                writer.execute("ROLLBACK")
                raise
        except BaseException:
            writer.close()
            raise
        self._writer = writer

    # -- connections ------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=self.busy_timeout_s, isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_s * 1000)}")
        return conn

    def _acquire(self) -> sqlite3.Connection:
        if self.closed:
            raise StoreError(CLIENT_INVALID_OPERATION, "store is closed")
        with self._pool_lock:
            if self._pool:
                return self._pool.pop()
        try:
            return self._connect()
        except sqlite3.Error as e:
            raise _store_error(e) from e

    def _release(self, conn: sqlite3.Connection) -> None:
        with self._pool_lock:
            if not self.closed and len(self._pool) < MAX_POOLED_CONNECTIONS:
                self._pool.append(conn)
                return
        conn.close()

    def _open_snapshot(self) -> Snapshot:
        return _SqliteSnapshot(self)

    # -- commit -----------------------------------------------------------------------
    def _commit(self, req: CommitRequest) -> bytes:
        # Group commit without a committer thread: the first thread to queue a commit while
        # none leads becomes the leader and writes groups in its own thread until its own
        # commit is done, then appoints the oldest waiting thread to lead on. One worker
        # thus commits with no thread hand-off at all (a dedicated committer thread cost two
        # per transaction: 22% of a job round trip), and concurrent commits still share one
        # SQLite transaction and one fsync.
        item = _Pending(req)
        with self._cv:
            # _stop, not closed: once close() began, no new commit may start.
            if self._stop.is_set():
                raise StoreError(CLIENT_INVALID_OPERATION, "store is closed")
            self._queue.append(item)
            self.stats.requests += 1
            if not self._leading:
                self._leading = item.lead = True
        if not item.lead:
            item.wake.wait()  # until finished by a leader, or appointed to lead
        if not item.finished:
            self._lead(item)
        if item.error is not None:
            raise item.error
        assert item.stamp is not None
        return item.stamp

    def _lead(self, item: _Pending) -> None:
        """Write groups until ``item`` is finished, then hand the lead on (or give it up)."""
        try:
            while not item.finished:
                self._write_group()
        finally:
            with self._cv:
                if self._queue:
                    successor = self._queue[0]
                    successor.lead = True
                    successor.wake.set()
                else:
                    self._leading = False
                    self._cv.notify_all()  # close() waits for the last leader

    def _write_group(self) -> None:
        """Take the write lock, then every queued commit (up to MAX_GROUP), and commit them."""
        batch: list[_Pending] = []
        try:
            # Take the lock first, then the batch: commits queued while we waited for
            # another process's lock join this group.
            self._writer.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as e:
            # Everything queued has waited as long as the lock holder kept the lock.
            with self._cv:
                batch = list(self._queue)
                self._queue.clear()
            self._finish(batch, _store_error(e))
            return
        with self._cv:
            while self._queue and len(batch) < MAX_GROUP:
                batch.append(self._queue.popleft())
        try:
            self._commit_group(batch)
        except BaseException as e:  # fail this group only, whatever happened, and go on
            log.exception("SQLite store %r: group commit failed", self.path)
            try:
                self._writer.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            if isinstance(e, sqlite3.Error):
                error: BaseException = _store_error(e)
            elif isinstance(e, Exception):
                error = e
            else:  # an interrupt in the leader's thread: its own commit re-raises it
                error = StoreError(COMMIT_UNKNOWN_RESULT, f"commit interrupted: {e!r}")
            self._finish([p for p in batch if not p.finished], error)
            if not isinstance(e, Exception):
                raise

    @classmethod
    def _finish(cls, batch: list[_Pending], error: BaseException) -> None:
        for p in batch:
            p.error = error
        cls._finish_ok(batch)

    def _commit_group(self, batch: list[_Pending]) -> None:
        conn = self._writer
        version = conn.execute("SELECT value FROM meta WHERE name = 'version'").fetchone()[0] + 1
        pruned_through = conn.execute("SELECT value FROM meta WHERE name = 'pruned_through'").fetchone()[0]
        now = time.time()
        committed: list[_Pending] = []
        points_all: set[bytes] = set()
        ranges_all: list[tuple[bytes, bytes]] = []
        for order, p in enumerate(batch):
            req = p.req
            if req.read_ranges:
                assert req.read_version is not None
                if req.read_version < pruned_through:
                    p.error = StoreError(TRANSACTION_TOO_OLD)
                    continue
                # Rows of earlier members of this group carry ``version`` too, so they are checked.
                rows = conn.execute(
                    "SELECT begin_key, end_key FROM conflict_log WHERE commit_version > ?", (req.read_version,)
                ).fetchall()
                if any(req.read_ranges.intersects(b, e) for b, e in rows):
                    p.error = StoreError(NOT_COMMITTED)
                    self.stats.conflicts += 1
                    continue
            conn.execute("SAVEPOINT member")
            try:
                stamp = make_stamp(version, order)
                points, cleared = apply_mutations(req.mutations, stamp, _SqlTarget(conn))
                conn.executemany(
                    "INSERT INTO conflict_log(commit_version, begin_key, end_key, commit_time) VALUES (?, ?, ?, ?)",
                    [(version, b, e, now) for b, e in write_ranges(points, cleared)],
                )
                for w in req.watches:
                    if w.use_committed:
                        w.seen = _SqlTarget(conn).get(w.key)
                conn.execute("RELEASE member")
            except sqlite3.Error as e:
                conn.execute("ROLLBACK TO member")
                conn.execute("RELEASE member")
                p.error = _store_error(e)
                continue
            p.stamp = stamp
            committed.append(p)
            points_all.update(points)
            ranges_all.extend(cleared)
        if not committed:
            conn.execute("ROLLBACK")
            self._finish_ok(batch)
            return
        conn.execute("UPDATE meta SET value = ? WHERE name = 'version'", (version,))
        if now - self._last_prune >= PRUNE_INTERVAL_S:
            self._prune(conn, now)
        # Arm the new watches before COMMIT, while no other process can commit: a poller that
        # reads older data skips them (min_version), and nothing committed after ours is missed.
        new_watches = [w for p in committed for w in p.req.watches]
        armed = [w for w in new_watches if self.watches.arm(w.watch, w.seen, min_version=version)]
        keys = self.watches.affected(points_all, ranges_all) | {w.key for w in armed}
        values = _read_values(conn, sorted(keys)) if keys else {}
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as e:
            # The outcome of a failed COMMIT is not certain: FDB's commit_unknown_result.
            log.error("SQLite store %r: COMMIT failed: %s", self.path, e)
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            self.watches.fail([w.watch for w in armed], COMMIT_UNKNOWN_RESULT)
            for p in committed:
                p.stamp = None
                p.error = StoreError(COMMIT_UNKNOWN_RESULT, f"SQLite COMMIT failed: {e}")
            self._finish_ok(batch)
            return
        self.stats.sqlite_commits += 1
        self.stats.store_commits += len(committed)
        self.stats.max_group = max(self.stats.max_group, len(committed))
        self.watches.check(values, version)
        if self.watches.has_armed():
            self._ensure_poller()
        self._finish_ok(batch)

    @staticmethod
    def _finish_ok(batch: list[_Pending]) -> None:
        for p in batch:
            p.finished = True
            p.wake.set()

    def _prune(self, conn: sqlite3.Connection, now: float) -> None:
        """Drop log rows older than the retention; ``pruned_through`` makes older readers fail 1007."""
        self._last_prune = now
        row = conn.execute("SELECT max(commit_version) FROM conflict_log WHERE commit_time < ?", (now - self.retention_s,)).fetchone()
        if row[0] is not None:
            conn.execute("DELETE FROM conflict_log WHERE commit_version <= ?", (row[0],))
            conn.execute("UPDATE meta SET value = max(value, ?) WHERE name = 'pruned_through'", (row[0],))

    # -- watches ----------------------------------------------------------------------
    def _arm_read_only(self, watches: list[PendingWatch]) -> None:
        if not watches:
            return
        armed = [p for p in watches if self.watches.arm(p.watch, p.seen)]
        # Armed first, then checked: a change before the check is seen by it, one after it
        # moves data_version and the poller re-reads.
        self._ensure_poller()
        conn = self._acquire()
        try:
            values = _read_values(conn, sorted({p.key for p in armed}))
        except sqlite3.Error as e:
            conn.close()
            raise _store_error(e) from e
        self._release(conn)
        self.watches.check(values)

    def _ensure_poller(self) -> None:
        with self._cv:
            if self._poller is None and not self._stop.is_set():
                self._poller = threading.Thread(target=self._poll_loop, name=f"smoosh-store-watch {self.path}", daemon=True)
                self._poller.start()
        self._poll_wake.set()  # a watch was armed: poll at full speed again

    def _poll_loop(self) -> None:
        conn = self._connect()
        try:
            # No baseline: the first poll re-reads every armed key. A commit that landed after
            # a watch was armed and checked but before this thread took its first
            # data_version would otherwise be in that baseline and never be seen (a blocked
            # accept missed the job added right after it went to sleep).
            last: int | None = None
            interval = self.poll_interval_s
            while not self._stop.is_set():
                armed = self.watches.has_armed()
                if self._poll_wake.wait(interval if armed else None):
                    self._poll_wake.clear()
                    interval = self.poll_interval_s
                if self._stop.is_set():
                    break
                try:
                    changed, last = self._poll_once(conn, last)
                except Exception:
                    log.exception("SQLite store %r: watch poller failed; retrying", self.path)
                    changed = False
                interval = self.poll_interval_s if changed else min(interval * 2, MAX_POLL_INTERVAL_S)
        finally:
            conn.close()

    def _poll_once(self, conn: sqlite3.Connection, last: int | None) -> tuple[bool, int | None]:
        """Re-read the armed keys if another connection committed; ``(changed, data_version)``."""
        if not self.watches.has_armed():
            return False, last
        current = conn.execute("PRAGMA data_version").fetchone()[0]
        if current == last:
            return False, last
        keys = self.watches.armed_keys()
        conn.execute("BEGIN")
        try:
            version = conn.execute("SELECT value FROM meta WHERE name = 'version'").fetchone()[0]
            values = _read_values(conn, keys)
        finally:
            conn.execute("ROLLBACK")
        self.watches.check(values, version)
        return True, current

    # -- lifecycle --------------------------------------------------------------------
    def close(self) -> None:
        """Finish the commits under way, stop the poller, close the connections. Idempotent."""
        with self._cv:
            if self._stop.is_set():
                return
            self._stop.set()
            self._poll_wake.set()
            # Commits already queued finish: their threads lead until the queue is empty.
            while self._leading:
                self._cv.wait()
        if self._poller is not None:
            self._poller.join()
        super().close()
        with self._pool_lock:
            pool, self._pool = self._pool, []
        for conn in pool:
            conn.close()
        self._writer.close()
