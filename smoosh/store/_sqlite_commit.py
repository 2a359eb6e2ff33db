"""Group commit of the SQLite store: every commit waiting in this process, one write lock, one fsync.

Commits queue in this process; the thread that leads (the committing thread itself when no
other leads) takes the write lock once (``BEGIN IMMEDIATE``), drains every commit waiting
and checks each transaction in turn on its own read conflict ranges, against the commits
newer than its read version (:class:`~smoosh.store._sqlite_log.CommitLog`) and the earlier
members of its group. Only a real overlap is a 1020, and a member that fails is left out
alone. The members that pass are folded into the group's net effect on ``kv`` in Python
(:class:`_GroupWrites`), written with a few statements (range deletes, one upsert of every
key set, one delete of every key cleared) and one ``commit_log`` row; one ``COMMIT``
(``synchronous=FULL``) makes the whole group durable. Member ``i`` gets the stamp ``(version,
i)``. The leader also arms the group's new watches, fires the watches its writes change,
and prunes the commit log. The file's layout is described in :mod:`smoosh.store.sqlite`.

The leader hands the lead on when its own commit is done; a thread that waits is woken by
releasing a lock it blocks on, the cheapest hand-off between two Python threads.
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
from smoosh.store._commit import CommitRequest, PendingWatch
from smoosh.store._mutations import OP_ADD, Mutation, make_stamp, writes_of
from smoosh.store._sqlite_log import CommitLog
from smoosh.store._sqlite_schema import SELECT_VERSION_AND_PRUNED, encode_writes, read_values, store_error
from smoosh.store._txn import BufferedStore

# The store's log lines keep the logger name operators know, whichever module writes them.
log = logging.getLogger("smoosh.store.sqlite")

#: Most transactions committed in one SQLite transaction.
MAX_GROUP = 256
#: Seconds between two prunings of the commit log.
PRUNE_INTERVAL_S = 1.0
#: Most atomic-add keys whose committed values the committer remembers between groups.
MAX_CACHED_COUNTERS = 1024


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
    #: Groups that found another process's commits since this handle's last one.
    foreign_catch_ups: int = 0


class _Pending:
    __slots__ = ("req", "wake", "finished", "lead", "stamp", "error")

    def __init__(self, req: CommitRequest) -> None:
        self.req = req
        #: Held from the start; released once, when this commit is finished or its thread is
        #: appointed to lead, to wake the thread blocked acquiring it.
        self.wake = threading.Lock()
        self.wake.acquire()
        self.finished = False
        self.lead = False
        self.stamp: bytes | None = None
        self.error: BaseException | None = None


class _OutcomeUnknown(sqlite3.OperationalError):
    """Raised to the members of a group whose COMMIT failed when the file cannot say whether it landed.

    Not a StoreError: no retry loop runs a transaction again after it (it may have committed).
    """


def _finish(batch: list[_Pending], error: BaseException | None = None) -> None:
    for p in batch:
        if error is not None:
            p.error = error
        p.finished = True
        if not p.lead:  # a leader never blocks on its lock (an appointed one had it released)
            p.wake.release()


class _GroupWrites:
    """The net effect of a group's members on ``kv``, applied in their order, in Python.

    Point writes land in ``values`` (None: deleted). A range clear drops the point writes it
    covers and is recorded: the file's rows are deleted by the ranges first, then every point
    write is applied, which leaves each key as the last operation on it says.
    """

    __slots__ = ("values", "cleared", "bases")

    def __init__(self, bases: dict[bytes, bytes | None]) -> None:
        self.values: dict[bytes, bytes | None] = {}
        self.cleared: list[tuple[bytes, bytes]] = []
        #: Committed values of the keys atomic adds read (from before the group).
        self.bases = bases

    def current(self, key: bytes) -> bytes | None:
        """``key``'s value after the members applied so far (for an atomic add, a watch)."""
        values = self.values
        if key in values:
            return values[key]
        for begin, end in self.cleared:
            if begin <= key < end:
                return None
        return self.bases[key]

    def apply(self, mutations: list[Mutation], stamp: bytes) -> tuple[set[bytes], list[tuple[bytes, bytes]]]:
        """Fold one member's mutations in; returns its write conflict ranges (keys, ranges)."""
        values = self.values
        points: set[bytes] = set()
        ranges: list[tuple[bytes, bytes]] = []
        for key, value, end in writes_of(mutations, stamp, self.current):
            if end is not None:  # a range clear
                ranges.append((key, end))
                self.cleared.append((key, end))
                for k in [k for k in values if key <= k < end]:
                    del values[k]
                continue
            points.add(key)
            values[key] = value
        return points, ranges

    def write(self, conn: sqlite3.Connection) -> None:
        """Write the net effect with the writer connection (inside its write transaction)."""
        if self.cleared:
            conn.executemany("DELETE FROM kv WHERE key >= ? AND key < ?", self.cleared)
        upserts = [(k, v) for k, v in self.values.items() if v is not None]
        if upserts:
            conn.executemany("INSERT OR REPLACE INTO kv(key, value) VALUES (?, ?)", upserts)
        if len(upserts) < len(self.values):
            conn.executemany("DELETE FROM kv WHERE key = ?", [(k,) for k, v in self.values.items() if v is None])


class GroupCommitter:
    """The commits of one SQLite store handle, grouped (see the module docstring).

    Parameters:
        writer: the store's write connection, schema created; closed by :meth:`close`.
        store: the store, for its watch registry and its retention of the commit log.
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
        self._mutex = threading.Lock()
        #: close() waits on it for the last leader; under ``_mutex``.
        self._idle = threading.Condition(self._mutex)
        #: Whether some thread is leading the commits (see :meth:`commit`); under ``_mutex``.
        self._leading = False
        #: Whether :meth:`close` began; under ``_mutex``.
        self._closing = False
        self._last_prune = 0.0
        #: Monotonic time of our last COMMIT, and the file's pruned version as of then.
        self._last_commit_s = 0.0
        self._pruned_through = 0
        #: The commit log as this handle knows it (the leader's only: one leads at a time).
        self._log = CommitLog(store.retention_s)
        #: Committed values of atomic-add keys as of ``_log.known`` (a job type's pending
        #: counter is added to by every enqueue: reading it once per group was a statement).
        self._counters: dict[bytes, bytes | None] = {}

    def commit(self, req: CommitRequest) -> bytes:
        """Commit one transaction, in a group with the others waiting; returns its versionstamp.

        Raises:
            StoreError: 1020 (a conflict), 1007 (its read version left the commit log),
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
        with self._mutex:
            if self._closing:
                raise StoreError(CLIENT_INVALID_OPERATION, "store is closed")
            self._queue.append(item)
            self.stats.requests += 1
            if not self._leading:
                self._leading = item.lead = True
        if not item.lead:
            item.wake.acquire()  # until finished by a leader, or appointed to lead
        if not item.finished:
            self._lead(item)
        if item.error is not None:
            raise item.error
        assert item.stamp is not None
        return item.stamp

    def close(self) -> None:
        """Refuse new commits, wait for the queued ones, then close the write connection. Idempotent."""
        with self._mutex:
            if self._closing:
                return
            self._closing = True
            # Commits already queued finish: their threads lead until the queue is empty.
            while self._leading:
                self._idle.wait()
        self._writer.close()

    def _lead(self, item: _Pending) -> None:
        """Write groups until ``item`` is finished, then hand the lead on (or give it up)."""
        try:
            while not item.finished:
                self._write_group()
        finally:
            with self._mutex:
                if self._queue:
                    successor = self._queue[0]
                    successor.lead = True
                    successor.wake.release()
                else:
                    self._leading = False
                    self._idle.notify_all()  # close() waits for the last leader

    def _write_group(self) -> None:
        """Take the write lock, then every queued commit (up to MAX_GROUP), and commit them."""
        try:
            # Take the lock first, then the batch: commits queued while we waited for
            # another process's lock join this group.
            self._writer.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as e:
            # Everything queued has waited as long as the lock holder kept the lock.
            with self._mutex:
                batch = list(self._queue)
                self._queue.clear()
            _finish(batch, store_error(e))
            return
        with self._mutex:
            queue = self._queue
            batch = [queue.popleft() for _ in range(min(len(queue), MAX_GROUP))]
        try:
            if not self._commit_group(batch, self._assume_no_foreign()):
                # Another process committed since our last group: start again, reading the
                # version and its rows first.
                self._writer.execute("ROLLBACK")
                self._writer.execute("BEGIN IMMEDIATE")
                self._commit_group(batch, False)
        except BaseException as e:  # fail this group only, whatever happened, and go on
            log.exception("SQLite store %r: group commit failed", self._path)
            self._counters.clear()
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
            for p in batch:
                p.stamp = None
            _finish([p for p in batch if not p.finished], error)
            if not isinstance(e, Exception):
                raise

    def _assume_no_foreign(self) -> bool:
        """Whether the next group may take its version as one past our last one, unread.

        Versions are the commit log's keys and every commit takes the newest plus one, so a
        commit of another process since our last one holds our next version: the group's
        INSERT of that row then fails, and the group starts again (:meth:`_write_group`). The
        row is never pruned first while our last commit is recent: a row leaves the log only
        after the retention.
        """
        return self._log.known > 0 and time.monotonic() - self._last_commit_s < self._store.retention_s / 2

    def _commit_group(self, batch: list[_Pending], optimistic: bool) -> bool:
        """Check, apply and commit ``batch`` inside the write transaction the caller began.

        Returns:
            False, with nothing finished, when ``optimistic`` found another process's commit
            (the caller rolls back and calls again with ``optimistic`` False); else True.
        """
        conn, watches, commit_log = self._writer, self._store.watches, self._log
        if optimistic:
            latest, pruned_through = commit_log.known, self._pruned_through
        else:
            latest, pruned_through = conn.execute(SELECT_VERSION_AND_PRUNED).fetchone()
            self._pruned_through = pruned_through
            if commit_log.catch_up(conn, latest, pruned_through):
                self.stats.foreign_catch_ups += 1
                self._counters.clear()  # another process may have added to them
        version = latest + 1
        group = _GroupWrites(self._counter_values(conn, batch))
        committed: list[_Pending] = []
        points_all: set[bytes] = set()
        ranges_all: list[tuple[bytes, bytes]] = []
        for order, p in enumerate(batch):
            req = p.req
            reads = req.reads
            if reads:
                assert req.read_version is not None
                if req.read_version < pruned_through:
                    p.error = StoreError(TRANSACTION_TOO_OLD)
                    continue
                # Earlier members of this group commit at ``version`` too: they count.
                if reads.intersects(points_all, ranges_all) or commit_log.conflicts(conn, reads, req.read_version):
                    p.error = StoreError(NOT_COMMITTED)
                    self.stats.conflicts += 1
                    continue
            p.stamp = make_stamp(version, order)
            points, ranges = group.apply(req.mutations, p.stamp)
            for w in req.watches:
                if w.use_committed:
                    # The baseline is what this member wrote: a later member's change fires it.
                    w.seen = group.current(w.key)
            committed.append(p)
            points_all |= points
            ranges_all += ranges
        if not committed:
            if optimistic and self._foreign_commit(conn, version):
                return self._retry_group(batch)
            conn.execute("ROLLBACK")
            _finish(batch)
            return True
        group.write(conn)
        now = time.time()
        try:
            conn.execute(
                "INSERT INTO commit_log(version, commit_time, writes) VALUES (?, ?, ?)",
                (version, now, encode_writes(list(points_all), ranges_all)),
            )
        except sqlite3.IntegrityError:
            if not optimistic:
                raise
            return self._retry_group(batch)
        if now - self._last_prune >= PRUNE_INTERVAL_S:
            self._prune(conn, now, version)
        # Arm the new watches before COMMIT, while no other process can commit: a poller that
        # reads older data skips them (min_version), and nothing committed after ours is missed.
        # Under arm_lock from the values they are checked against to the check after COMMIT:
        # a watch armed by a read-only transaction meanwhile is either among those keys or
        # armed after the check (its own read then sees this commit); the poller, which skips
        # this process's own commits, is never the one that must notice it.
        with self._arm_lock:
            new_watches = [w for p in committed for w in p.req.watches]
            armed = [w for w in new_watches if watches.arm(w.watch, w.seen, min_version=version)]
            values = self._watched_values(conn, group, watches.affected(points_all, ranges_all), armed)
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as e:
                landed = self._landed_anyway(conn, version, e)
                if not landed:
                    self._counters.clear()
                    watches.fail([w.watch for w in armed], COMMIT_UNKNOWN_RESULT)
                    error: BaseException = store_error(e)
                    if landed is None:
                        error = _OutcomeUnknown(f"SQLite COMMIT failed ({e}); whether it committed is unknown")
                    for p in committed:
                        p.stamp = None
                        p.error = error
                    _finish(batch)
                    return True
            self._last_commit_s = time.monotonic()
            self._on_committed(version)
            if values:
                watches.check(values, version)
        commit_log.append(version, points_all, ranges_all)
        for key in self._counters:
            self._counters[key] = group.current(key)
        self.stats.sqlite_commits += 1
        self.stats.store_commits += len(committed)
        self.stats.max_group = max(self.stats.max_group, len(committed))
        # Only a commit that armed a watch wakes the poller: waking it after every commit made
        # it re-read the commit counter once per commit of this process, which it then skips.
        if armed and watches.has_armed():
            self._on_watches_armed()
        _finish(batch)
        return True

    def _landed_anyway(self, conn: sqlite3.Connection, version: int, error: sqlite3.Error) -> bool | None:
        """After a failed COMMIT: whether the group committed all the same (None: cannot tell).

        The group's commit log row is written in its own transaction, so the file says: the
        row is there (the COMMIT got far enough before failing) or it is not (nothing of the
        group is). Either way every member gets one certain answer, as a local store promises
        (``commit_outcome_may_be_unknown`` is False: the job layer writes no transaction ids
        here). Only when the file cannot even be read is the outcome unknown: the members then
        get an error no retry loop retries.
        """
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass
        try:
            landed = conn.execute("SELECT 1 FROM commit_log WHERE version = ?", (version,)).fetchone() is not None
        except sqlite3.Error as check_error:
            log.error("SQLite store %r: COMMIT failed (%s) and the log cannot be read (%s): outcome unknown",
                      self._path, error, check_error)
            return None
        if landed:
            log.warning("SQLite store %r: COMMIT reported %s, but the group is in the log: it committed", self._path, error)
        else:
            log.error("SQLite store %r: COMMIT failed, nothing of the group committed: %s", self._path, error)
        return landed

    @staticmethod
    def _foreign_commit(conn: sqlite3.Connection, version: int) -> bool:
        """Whether the version we assumed is taken (a group that committed nothing cannot tell by its INSERT)."""
        return conn.execute("SELECT 1 FROM commit_log WHERE version = ?", (version,)).fetchone() is not None

    def _retry_group(self, batch: list[_Pending]) -> bool:
        """Undo what an optimistic pass set on the members, for the caller's second pass."""
        self._counters.clear()
        for p in batch:
            p.stamp = None
            p.error = None
        return False

    def _counter_values(self, conn: sqlite3.Connection, batch: list[_Pending]) -> dict[bytes, bytes | None]:
        """The committed values the batch's atomic adds start from (remembered, or read once)."""
        counters = self._counters
        missing = {m[1] for p in batch for m in p.req.mutations if m[0] == OP_ADD and m[1] not in counters}
        if missing:
            if len(counters) + len(missing) > MAX_CACHED_COUNTERS:
                counters.clear()
                missing = {m[1] for p in batch for m in p.req.mutations if m[0] == OP_ADD}
            counters.update(read_values(conn, sorted(missing)))
        return counters

    @staticmethod
    def _watched_values(
        conn: sqlite3.Connection, group: _GroupWrites, affected: set[bytes], armed: list[PendingWatch]
    ) -> dict[bytes, bytes | None]:
        """Values to check watches against after the group: its own writes (``affected``: the
        armed keys it wrote), and each other key a new watch tracks, read now (another
        transaction may have changed it since that watch's transaction read it)."""
        values = {key: group.current(key) for key in affected}
        others = sorted({w.key for w in armed} - affected)
        if others:
            values.update(read_values(conn, others))
        return values

    def _prune(self, conn: sqlite3.Connection, now: float, version: int) -> None:
        """Drop log rows older than the retention; ``pruned_through`` makes older readers fail 1007.

        The newest row always stays: the file's version is the log's last row.
        """
        self._last_prune = now
        row = conn.execute(
            "SELECT version FROM commit_log WHERE commit_time >= ? ORDER BY version LIMIT 1", (now - self._store.retention_s,)
        ).fetchone()
        # Rows are in version order and (but for a clock step back) in time order: the first
        # row inside the retention bounds the old ones. A step back only keeps rows longer.
        cutoff = (row[0] if row is not None else version) - 1
        if cutoff > 0:
            conn.execute("DELETE FROM commit_log WHERE version <= ?", (cutoff,))
            conn.execute("UPDATE meta SET value = max(value, ?) WHERE name = 'pruned_through'", (cutoff,))
            self._pruned_through = max(self._pruned_through, cutoff)
