"""Group commit of the SQLite store: every commit waiting in this process, one write lock, one fsync.

Commits queue in this process; the thread that leads (the committing thread itself when no
other leads) takes the write lock once (``BEGIN IMMEDIATE``), drains every commit waiting
and, for each transaction in turn inside a savepoint, checks its read conflict ranges against
the log rows newer than its read version (earlier members of the batch included), applies
its mutations and logs its write ranges. Only a real overlap is a 1020; a member that fails
is rolled back alone. One ``COMMIT`` (``synchronous=FULL``) then makes the whole group
durable. Member ``i`` gets the stamp ``(version + 1, i)``. The leader also arms the group's
new watches, fires the watches its writes change, and prunes the conflict log. The file's
layout is described in :mod:`smoosh.store.sqlite`.
"""

from __future__ import annotations

import collections
import logging
import sqlite3
import threading
import time
from dataclasses import dataclass
from typing import Callable

from smoosh.store.errors import (
    CLIENT_INVALID_OPERATION,
    COMMIT_UNKNOWN_RESULT,
    NOT_COMMITTED,
    TRANSACTION_TOO_OLD,
    StoreError,
)
from smoosh.store._commit import CommitRequest
from smoosh.store._mutations import apply_mutations, make_stamp, write_ranges
from smoosh.store._sqlite_schema import read_values, store_error
from smoosh.store._txn import BufferedStore

# The store's log lines keep the logger name operators know, whichever module writes them.
log = logging.getLogger("smoosh.store.sqlite")

#: Most transactions committed in one SQLite transaction.
MAX_GROUP = 256
#: Seconds between two prunings of the conflict log.
PRUNE_INTERVAL_S = 1.0


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


def _finish(batch: list[_Pending], error: BaseException) -> None:
    for p in batch:
        p.error = error
    _finish_ok(batch)


def _finish_ok(batch: list[_Pending]) -> None:
    for p in batch:
        p.finished = True
        p.wake.set()


class GroupCommitter:
    """The commits of one SQLite store handle, grouped (see the module docstring).

    Parameters:
        writer: the store's write connection, schema created; closed by :meth:`close`.
        store: the store, for its watch registry and its retention of the conflict log.
        path: the store's file, for log lines.
        on_watches_armed: called by the leader after a commit that armed watches (and left
            some armed): the store's poller must run to see other processes' commits.
        on_committed: told each commit version once its COMMIT succeeded (never before).
        arm_lock: held from a commit's watch reads to its check after COMMIT; the store holds
            it while a read-only transaction arms and checks its watches.
    """

    def __init__(
        self,
        writer: sqlite3.Connection,
        store: BufferedStore,
        path: str,
        on_watches_armed: Callable[[], None],
        on_committed: Callable[[int], None] = lambda version: None,
        arm_lock: threading.Lock | None = None,
    ) -> None:
        self._writer = writer
        self._store = store
        self._path = path
        self._on_watches_armed = on_watches_armed
        self._on_committed = on_committed
        self._arm_lock = arm_lock if arm_lock is not None else threading.Lock()
        self.stats = SqliteStats()
        self._queue: collections.deque[_Pending] = collections.deque()
        self._cv = threading.Condition()
        #: Whether some thread is leading the commits (see :meth:`commit`); under ``_cv``.
        self._leading = False
        #: Whether :meth:`close` began; under ``_cv``.
        self._closing = False
        self._last_prune = 0.0

    def commit(self, req: CommitRequest) -> bytes:
        """Commit one transaction, in a group with the others waiting; returns its versionstamp.

        Raises:
            StoreError: 1020 (a conflict), 1007 (its read version left the conflict log),
                1038 (another process held the write lock too long), 1021 (COMMIT failed:
                the outcome is unknown), or 2000 once :meth:`close` began.
        """
        # Group commit without a committer thread: the first thread to queue a commit while
        # none leads becomes the leader and writes groups in its own thread until its own
        # commit is done, then appoints the oldest waiting thread to lead on. One worker
        # thus commits with no thread hand-off at all (a dedicated committer thread costs
        # two hand-offs per transaction), and concurrent commits still share one SQLite
        # transaction and one fsync.
        item = _Pending(req)
        with self._cv:
            if self._closing:
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

    def close(self) -> None:
        """Refuse new commits, wait for the queued ones, then close the write connection. Idempotent."""
        with self._cv:
            if self._closing:
                return
            self._closing = True
            # Commits already queued finish: their threads lead until the queue is empty.
            while self._leading:
                self._cv.wait()
        self._writer.close()

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
            _finish(batch, store_error(e))
            return
        with self._cv:
            while self._queue and len(batch) < MAX_GROUP:
                batch.append(self._queue.popleft())
        try:
            self._commit_group(batch)
        except BaseException as e:  # fail this group only, whatever happened, and go on
            log.exception("SQLite store %r: group commit failed", self._path)
            try:
                self._writer.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            if isinstance(e, sqlite3.Error):
                error: BaseException = store_error(e)
            elif isinstance(e, Exception):
                error = e
            else:  # an interrupt in the leader's thread: its own commit re-raises it
                error = StoreError(COMMIT_UNKNOWN_RESULT, f"commit interrupted: {e!r}")
            _finish([p for p in batch if not p.finished], error)
            if not isinstance(e, Exception):
                raise

    def _commit_group(self, batch: list[_Pending]) -> None:
        conn, watches = self._writer, self._store.watches
        version = conn.execute("SELECT value FROM meta WHERE name = 'version'").fetchone()[0] + 1
        pruned_through = conn.execute("SELECT value FROM meta WHERE name = 'pruned_through'").fetchone()[0]
        now = time.time()
        committed: list[_Pending] = []
        points_all: set[bytes] = set()
        ranges_all: list[tuple[bytes, bytes]] = []
        for order, p in enumerate(batch):
            req = p.req
            if req.reads:
                assert req.read_version is not None
                if req.read_version < pruned_through:
                    p.error = StoreError(TRANSACTION_TOO_OLD)
                    continue
                # Rows of earlier members of this group carry ``version`` too, so they are checked.
                rows = conn.execute(
                    "SELECT begin_key, end_key FROM conflict_log WHERE commit_version > ?", (req.read_version,)
                ).fetchall()
                if req.reads.intersects(set(), rows):
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
                p.error = store_error(e)
                continue
            p.stamp = stamp
            committed.append(p)
            points_all.update(points)
            ranges_all.extend(cleared)
        if not committed:
            conn.execute("ROLLBACK")
            _finish_ok(batch)
            return
        conn.execute("UPDATE meta SET value = ? WHERE name = 'version'", (version,))
        if now - self._last_prune >= PRUNE_INTERVAL_S:
            self._prune(conn, now)
        # Arm the new watches before COMMIT, while no other process can commit: a poller that
        # reads older data skips them (min_version), and nothing committed after ours is missed.
        # Under arm_lock from the keys it reads to the check after COMMIT: a watch armed by a
        # read-only transaction meanwhile is either among those keys or armed after the check
        # (its own read then sees this commit); the poller, which skips this process's own
        # commits, is never the one that must notice it.
        with self._arm_lock:
            new_watches = [w for p in committed for w in p.req.watches]
            armed = [w for w in new_watches if watches.arm(w.watch, w.seen, min_version=version)]
            keys = watches.affected(points_all, ranges_all) | {w.key for w in armed}
            values = read_values(conn, sorted(keys)) if keys else {}
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as e:
                # The outcome of a failed COMMIT is not certain: FDB's commit_unknown_result.
                log.error("SQLite store %r: COMMIT failed: %s", self._path, e)
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
                watches.fail([w.watch for w in armed], COMMIT_UNKNOWN_RESULT)
                for p in committed:
                    p.stamp = None
                    p.error = StoreError(COMMIT_UNKNOWN_RESULT, f"SQLite COMMIT failed: {e}")
                _finish_ok(batch)
                return
            self._on_committed(version)
            watches.check(values, version)
        self.stats.sqlite_commits += 1
        self.stats.store_commits += len(committed)
        self.stats.max_group = max(self.stats.max_group, len(committed))
        # Only a commit that armed a watch wakes the poller: waking it after every commit made
        # it re-read the commit counter once per commit of this process, which it then skips.
        if armed and watches.has_armed():
            self._on_watches_armed()
        _finish_ok(batch)

    def _prune(self, conn: sqlite3.Connection, now: float) -> None:
        """Drop log rows older than the retention; ``pruned_through`` makes older readers fail 1007."""
        self._last_prune = now
        row = conn.execute("SELECT max(commit_version) FROM conflict_log WHERE commit_time < ?", (now - self._store.retention_s,)).fetchone()
        if row[0] is not None:
            conn.execute("DELETE FROM conflict_log WHERE commit_version <= ?", (row[0],))
            conn.execute("UPDATE meta SET value = max(value, ?) WHERE name = 'pruned_through'", (row[0],))
