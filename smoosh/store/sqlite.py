"""``sqlite:PATH`` — the embedded default store: one SQLite file, FoundationDB's semantics.

Layout (one file, WAL mode, shared safely by every process on the machine):

* ``kv(key BLOB PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID`` — BLOB order is FDB's order.
* ``commit_log(version INTEGER PRIMARY KEY, commit_time, writes)`` — one row per SQLite
  transaction: its version (the read version of a snapshot and the first 8 bytes of every
  versionstamp; the newest row's is the file's) and the keys and ranges its commits wrote
  (kept :attr:`~BufferedStore.retention_s`, wall clock, so every process agrees).
* ``meta(name, value)`` — ``pruned_through``, the newest version whose row has left the log.

A transaction reads from its own WAL snapshot: a pooled read connection inside ``BEGIN``,
held until commit or reset. Writes are buffered (reads see them). Commits queue in this
process and are written in groups, one SQLite transaction and one fsync for every commit
waiting, each checked on its own conflict ranges (:mod:`smoosh.store._sqlite_commit`).

Watches fire in this process right after the commit that changes their key, and for commits
of other processes through a poller thread that watches ``PRAGMA data_version``; while other
processes commit, the doorbell each commit rings wakes it at once (:mod:`smoosh.store._sqlite_wake`).

This module owns the store handle: opening the file, the read connections and their
snapshots, the watch poller, and closing; the schema and the SQL shared by its pieces are
in :mod:`smoosh.store._sqlite_schema`.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from typing import Callable, Iterator

from smoosh.store.base import (
    MAX_WATCHES,
    TRANSACTION_MAX_AGE_S,
    TRANSACTION_SIZE_LIMIT_BYTES,
)
from smoosh.store.errors import CLIENT_INVALID_OPERATION, StoreError, StoreUnavailable
from smoosh.store._commit import CommitRequest, PendingWatch, Snapshot
from smoosh.store._sqlite_commit import GroupCommitter, SqliteStats
from smoosh.store._sqlite_schema import SELECT_VERSION, create_schema, read_values, store_error
from smoosh.store._sqlite_wake import LISTEN_QUIET_S, Doorbell, PollWake
from smoosh.store._txn import BufferedStore

log = logging.getLogger(__name__)

# The sqlite3 module binds str, int and float directly but hands every bytes parameter to
# its adaptation protocol first, which, finding no adapter, fails two attribute lookups (two
# formatted AttributeErrors) before binding the value as it is; every key and value here is
# bytes. An identity adapter is found at the first lookup. It changes nothing else: the value
# bound is the same bytes, for every sqlite3 connection of the process.
sqlite3.register_adapter(bytes, bytes)

#: Seconds a connection waits for another process's write lock before giving up (1038).
DEFAULT_BUSY_TIMEOUT_S = 5.0
#: Seconds between two ``PRAGMA data_version`` polls while watches are armed.
DEFAULT_POLL_INTERVAL_S = 0.05
#: Longest wait between two polls: after a quiet spell the poller slows down to this, so an idle
#: process wakes once a second, not twenty times; a change seen brings it back to full speed.
MAX_POLL_INTERVAL_S = 1.0
#: Most own commit versions remembered for the poller (see ``SqliteStore.note_own_commit``).
MAX_OWN_VERSIONS = 10_000
#: Rows fetched per query of a range scan.
SCAN_CHUNK = 256
#: Idle read connections kept for reuse.
MAX_POOLED_CONNECTIONS = 8
#: A snapshot's read version, with a second row left unread to hold the read transaction open.
_HOLD_SNAPSHOT = f"{SELECT_VERSION} UNION ALL SELECT NULL"
#: The same with a first point read: (0, version), then (1, value) if the key exists, then two
#: pads, so one row is left unread either way.
_HOLD_SNAPSHOT_WITH_GET = (
    f"SELECT 0, ({SELECT_VERSION}) UNION ALL SELECT 1, value FROM kv WHERE key = ? UNION ALL SELECT 2, NULL UNION ALL SELECT 2, NULL"
)
#: The same with a first chunk of a range read: (0, version, NULL), the chunk's (1, key,
#: value) rows in order, then two pads, so one row is left unread however many the chunk has.
_HOLD_SNAPSHOT_WITH_SCAN = (
    f"SELECT 0, ({SELECT_VERSION}), NULL"
    " UNION ALL SELECT * FROM (SELECT 1, key, value FROM kv WHERE key >= ? AND key < ? ORDER BY key {} LIMIT ?)"
    " UNION ALL SELECT 2, NULL, NULL UNION ALL SELECT 2, NULL, NULL"
)
_HOLD_SNAPSHOT_WITH_SCAN_FORWARD = _HOLD_SNAPSHOT_WITH_SCAN.format("")
_HOLD_SNAPSHOT_WITH_SCAN_REVERSE = _HOLD_SNAPSHOT_WITH_SCAN.format("DESC")
_SCAN_FORWARD = "SELECT key, value FROM kv WHERE key >= ? AND key < ? ORDER BY key LIMIT ?"
_SCAN_REVERSE = "SELECT key, value FROM kv WHERE key >= ? AND key < ? ORDER BY key DESC LIMIT ?"


#: The tables of a smoosh job store (``conflict_log``: an older store's, moved at its next open).
STORE_TABLES = frozenset({"kv", "meta", "commit_log", "conflict_log"})
#: The first 16 bytes of every SQLite database file.
_SQLITE_HEADER = b"SQLite format 3\x00"


def foreign_tables(path: str) -> list[str] | None:
    """The tables of the SQLite database at ``path`` that are not a smoosh job store's, or None when it
    is none of an application's: absent, empty, a store, or not (readably) a SQLite database.

    Read through a read-only connection: nothing is created or written. A file SQLite cannot
    read is left to the store's own open (a damaged store is :class:`~smoosh.errors.CorruptStore`,
    with its way out), and so is a file that is not SQLite at all.

    Parameters:
        path: the store's file.

    Returns:
        The foreign tables, sorted (never empty), or None.
    """
    import urllib.parse

    try:
        with open(path, "rb") as f:
            if f.read(len(_SQLITE_HEADER)) != _SQLITE_HEADER:
                return None
    except OSError:
        return None
    try:
        conn = sqlite3.connect("file:" + urllib.parse.quote(path) + "?mode=ro", uri=True, timeout=1.0)
        try:
            names = [name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")]
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    foreign = sorted(n for n in names if n not in STORE_TABLES and not n.lower().startswith("sqlite_"))
    return foreign or None


def not_a_store(path: str) -> str | None:
    """Why the file at ``path`` must not be opened as a smoosh job store, in words; None when it may.

    An application's SQLite database (tables that are not the store's) is never one: opening it
    as the store would write smoosh's tables into the application's file (issue 45).
    """
    foreign = foreign_tables(path)
    if foreign is None:
        return None
    shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
    return f"an application's SQLite database (its tables: {shown}), not a smoosh job store"


def probe(path: str) -> int:
    """Open an existing store file read-only (nothing is created or written) and read its version.

    For ``smoosh doctor``, which must not create a store that is absent, nor change one.

    Parameters:
        path: the store's file (it exists).

    Returns:
        The version of its last commit.

    Raises:
        StoreUnavailable: the file does not open read-only, or holds no smoosh job store.
    """
    import urllib.parse

    try:
        conn = sqlite3.connect("file:" + urllib.parse.quote(path) + "?mode=ro", uri=True, timeout=1.0)
        try:
            tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "commit_log" in tables:
                row = conn.execute(SELECT_VERSION).fetchone()
            else:  # a file of an earlier smoosh, moved to the commit log at its next open
                row = conn.execute("SELECT value FROM meta WHERE name = 'version'").fetchone()
        finally:
            conn.close()
    except sqlite3.Error as e:
        if "no such table" in str(e):
            raise StoreUnavailable(f"{path} is a SQLite file but not a smoosh job store ({e})") from None
        raise StoreUnavailable(f"{path} does not open read-only: {e}") from None
    return int(row[0]) if row else 0


class _SqliteSnapshot(Snapshot):
    """A read transaction on a pooled connection: every read sees the file as of its first one.

    No ``BEGIN``/``ROLLBACK``: the first read is a statement that also reads the version and
    is left with a row still to fetch, and SQLite keeps a connection's implicit read
    transaction open as long as one of its statements is active, so every later read of this
    connection sees the same WAL snapshot; closing that statement's cursor ends it. Each
    statement is a GIL hand-off when threads contend (the sqlite3 module releases the GIL
    around every step), so a transaction's first point read, its version and the hold on
    its snapshot are one statement, and a key read again answers from what its first read
    found (the snapshot does not change under it: the same answer, no statement).

    Owner: the transaction that opened it, on that transaction's thread.
    """

    def __init__(self, store: SqliteStore) -> None:
        self._store = store
        self._holder: sqlite3.Cursor | None = None
        self._version: int | None = None
        self._conn: sqlite3.Connection | None = store._acquire()
        # Point reads made in this snapshot: key -> value (None: no row). Bounded by the
        # transaction's own reads; gone with the snapshot.
        self._points: dict[bytes, bytes | None] = {}

    def _c(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(CLIENT_INVALID_OPERATION, "snapshot already released")
        return self._conn

    def _hold(self, key: bytes | None) -> bytes | None:
        """Start the read transaction (reading ``key`` with it, unless None); returns its value."""
        conn = self._c()
        value = None
        try:
            if key is None:
                holder = conn.execute(_HOLD_SNAPSHOT)
                self._version = holder.fetchone()[0]
            else:
                holder = conn.execute(_HOLD_SNAPSHOT_WITH_GET, (key,))
                self._version = holder.fetchone()[1]
                tag, value = holder.fetchone()  # the key's row, or the first of two pads
                if tag != 1:
                    value = None
        except sqlite3.Error as e:
            raise store_error(e) from e
        self._holder = holder
        return value

    @property
    def read_version(self) -> int:  # type: ignore[override]
        """The newest commit this snapshot sees."""
        if self._version is None:
            self._hold(None)
        assert self._version is not None
        return self._version

    def get(self, key: bytes) -> bytes | None:
        points = self._points
        if key in points:
            self._c()  # released: refused, as a statement would be
            return points[key]
        if self._holder is None:
            value = points[key] = self._hold(key)
            return value
        try:
            # A key has one row at most: fetchone() runs the statement to its end, so only
            # the holder stays active.
            row = self._c().execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
        except sqlite3.Error as e:
            raise store_error(e) from e
        value = points[key] = None if row is None else row[0]
        return value

    def scan(self, begin: bytes, end: bytes, reverse: bool, first_chunk: int = 0) -> Iterator[tuple[bytes, bytes]]:
        lo, hi = begin, end
        # The merge above us reads one pair ahead; later chunks grow back to the usual size.
        chunk_size = min(first_chunk + 1, SCAN_CHUNK) if first_chunk > 0 else SCAN_CHUNK
        try:
            if self._holder is None:
                # The transaction's first read: its version, the hold and the first chunk are
                # one statement (an accept's pick is such a read).
                rows = self._hold_with_chunk(lo, hi, reverse, chunk_size)
            else:
                rows = self._c().execute(_SCAN_REVERSE if reverse else _SCAN_FORWARD, (lo, hi, chunk_size)).fetchall()
            while True:
                yield from rows
                if len(rows) < chunk_size:
                    return
                chunk_size = min(chunk_size * 4, SCAN_CHUNK)
                if reverse:
                    hi = rows[-1][0]
                else:
                    lo = rows[-1][0] + b"\x00"
                rows = self._c().execute(_SCAN_REVERSE if reverse else _SCAN_FORWARD, (lo, hi, chunk_size)).fetchall()
        except sqlite3.Error as e:
            raise store_error(e) from e

    def _hold_with_chunk(self, lo: bytes, hi: bytes, reverse: bool, chunk_size: int) -> list[tuple[bytes, bytes]]:
        """Start the read transaction with the first chunk of a range read; returns the chunk."""
        holder = self._c().execute(
            _HOLD_SNAPSHOT_WITH_SCAN_REVERSE if reverse else _HOLD_SNAPSHOT_WITH_SCAN_FORWARD, (lo, hi, chunk_size)
        )
        self._version = next(holder)[1]
        rows = []
        for tag, key, value in holder:
            if tag == 2:  # the first pad: the second stays unread and holds the snapshot
                break
            rows.append((key, value))
        self._holder = holder
        return rows

    def abandon(self) -> None:
        # Closing the connection ends its read transaction; the pool (and its lock) is skipped.
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        holder, self._holder = self._holder, None
        if conn is not None:
            try:
                if holder is not None:
                    holder.close()  # the last active statement: the read transaction ends
            except sqlite3.Error:
                conn.close()
                return
            self._store._release(conn)


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
            sleeps outright while no watch is armed. While other processes commit, the
            doorbell each of their commits rings wakes it between polls.
        clock: monotonic seconds for the age limit; tests inject one.
        create: make the file (and its directory) when it does not exist: ``smoosh run`` and
            ``smoosh worker``; a command that only reads or marks a store passes False, so a
            mistyped path is an error, not a new, empty store.

    Raises:
        StoreUnavailable: the file cannot be opened or is not a store: absent (with
            ``create=False``), or an application's SQLite database (:func:`not_a_store`).
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
        create: bool = True,
    ) -> None:
        self.path = os.path.abspath(path)
        if not create and not os.path.isfile(self.path):
            what = "a directory" if os.path.isdir(self.path) else "no such file"
            raise StoreUnavailable(f"no smoosh job store at {self.path} ({what}): is the path mistyped? Only "
                                   "`smoosh run` and `smoosh worker` create a store")
        refused = not_a_store(self.path)
        if refused is not None:
            raise StoreUnavailable(f"refusing to open {self.path} as the job store: it is {refused}; smoosh would "
                                   "write its own tables into it")
        super().__init__(
            url or f"sqlite:{path}", max_age_s=max_age_s, size_limit_bytes=size_limit_bytes, max_watches=max_watches, clock=clock
        )
        self.busy_timeout_s = busy_timeout_s
        self.poll_interval_s = poll_interval_s
        # A watch was armed, the store closes, or (while listening) another process committed.
        self._poll_wake = PollWake(self.path)
        self._pool: list[sqlite3.Connection] = []
        self._pool_lock = threading.Lock()
        self._poller: threading.Thread | None = None
        #: Guards starting the poller against close(), which sets ``_stop`` under it.
        self._poller_lock = threading.Lock()
        # Versions this process committed that the poller has not yet passed (under
        # _own_lock): a change of data_version made only of them needs no re-read, since
        # in-process watches fired at commit.
        self._own_versions: set[int] = set()
        self._own_lock = threading.Lock()
        # Orders a read-only transaction's arm-and-check against a commit's (see GroupCommitter).
        self._arm_lock = threading.Lock()
        self._stop = threading.Event()
        #: Polls the watch poller has done (its thread writes it; tests and benches read it).
        self.polls = 0
        try:
            # A new user's `sqlite:var/jobs.db` should just work: create the directory too.
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        except OSError as e:
            raise StoreUnavailable(f"cannot open SQLite store {self.path!r}: {e}") from e
        deadline = time.monotonic() + self.busy_timeout_s
        while True:
            try:
                writer = self._open_writer()
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
        self._bell = Doorbell(self.path)
        self._committer = GroupCommitter(
            writer, self, self.path, self._ensure_poller, self._committed, arm_lock=self._arm_lock
        )
        #: This handle's commit counters.
        self.stats: SqliteStats = self._committer.stats

    def _open_writer(self) -> sqlite3.Connection:
        writer = self._connect()
        try:
            writer.execute("PRAGMA journal_mode=WAL")
            writer.execute("PRAGMA synchronous=FULL")
            create_schema(writer)
        except BaseException:
            writer.close()
            raise
        return writer

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
            raise store_error(e) from e

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
        return self._committer.commit(req)

    # -- watches ----------------------------------------------------------------------
    def _arm_read_only(self, watches: list[PendingWatch]) -> None:
        if not watches:
            return
        # Armed first, then checked: a change before the check is seen by it; one of another
        # process after it moves data_version and the poller re-reads; one of this process
        # is ordered by _arm_lock (its commit's own check sees the watch, or this read sees it).
        conn = self._acquire()
        try:
            with self._arm_lock:
                armed = [p for p in watches if self.watches.arm(p.watch, p.seen)]
                self._ensure_poller()  # after arming: a poller woken before would sleep again
                values = read_values(conn, sorted({p.key for p in armed}))
                self.watches.check(values)
        except sqlite3.Error as e:
            conn.close()
            raise store_error(e) from e
        self._release(conn)

    @property
    def listening(self) -> bool:
        """Whether the watch poller listens for other processes' commits (their doorbell)."""
        return self._poll_wake.listening

    def _ensure_poller(self) -> None:
        with self._poller_lock:
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
            last_version: int | None = None
            interval = self.poll_interval_s
            wake = self._poll_wake
            foreign_at = float("-inf")  # when a poll last found another process's commit
            while not self._stop.is_set():
                armed = self.watches.has_armed()
                timeout_s = interval if armed else (LISTEN_QUIET_S if wake.listening else None)
                if wake.wait(timeout_s):
                    interval = self.poll_interval_s
                if self._stop.is_set():
                    break
                baseline = last is not None
                try:
                    changed, last, last_version = self._poll_once(conn, last, last_version)
                except Exception:
                    log.exception("SQLite store %r: watch poller failed; retrying", self.path)
                    changed = False
                # Listening while others commit, so their next commit wakes this thread at
                # once; not while this process alone writes (see smoosh.store._sqlite_wake).
                # The first poll has no baseline to tell whose commits it reads: not a sign.
                if changed and baseline:
                    foreign_at = self.clock()
                    wake.listen(True)
                elif wake.listening and self.clock() - foreign_at >= LISTEN_QUIET_S:
                    wake.listen(False)
                self.polls += 1
                interval = self.poll_interval_s if changed else min(interval * 2, MAX_POLL_INTERVAL_S)
        finally:
            conn.close()

    def _committed(self, version: int) -> None:
        """The committer committed ``version``: record it, and ring the bell for other processes."""
        self.note_own_commit(version)
        self._bell.ring()

    def note_own_commit(self, version: int) -> None:
        """The committer committed ``version`` (called after COMMIT succeeded, never before).

        Recorded only while a poller runs; bounded, since a version missing from the record
        only costs the poller one re-read it could have skipped.
        """
        if self._poller is None:
            return
        with self._own_lock:
            if len(self._own_versions) >= MAX_OWN_VERSIONS:
                self._own_versions.clear()
            self._own_versions.add(version)

    def _only_own_since(self, last_version: int | None, version: int) -> bool:
        """Whether every commit after ``last_version`` up to ``version`` was this process's."""
        with self._own_lock:
            own = self._own_versions
            # A changed data_version with an unchanged counter was written past the store
            # (by hand): not ours, so re-read.
            ours = last_version is not None and 0 < version - last_version <= len(own) and all(
                v in own for v in range(last_version + 1, version + 1)
            )
            self._own_versions = {v for v in own if v > version}
        return ours

    def _poll_once(
        self, conn: sqlite3.Connection, last: int | None, last_version: int | None
    ) -> tuple[bool, int | None, int | None]:
        """Re-read the armed keys if another connection committed.

        Returns:
            ``(changed, data_version, version)``: whether another process committed, and the
            file's ``data_version`` and commit counter as this poll saw them.
        """
        if not self.watches.has_armed():
            return False, last, last_version
        current = conn.execute("PRAGMA data_version").fetchone()[0]
        if current == last:
            return False, last, last_version
        # data_version moves with this process's own commits too (they come through another
        # connection); those woke their watches at commit, so only others' need a re-read.
        version = conn.execute(SELECT_VERSION).fetchone()[0]
        if self._only_own_since(last_version, version):
            return False, current, version
        keys = self.watches.armed_keys()
        conn.execute("BEGIN")
        try:
            version = conn.execute(SELECT_VERSION).fetchone()[0]
            values = read_values(conn, keys)
        finally:
            conn.execute("ROLLBACK")
        self.watches.check(values, version)
        return True, current, version

    # -- lifecycle --------------------------------------------------------------------
    def close(self) -> None:
        """Finish the commits under way, stop the poller, close the connections. Idempotent."""
        with self._poller_lock:
            if self._stop.is_set():
                return
            self._stop.set()
        self._poll_wake.set()
        # Commits already queued finish; a commit that starts from here on is refused.
        self._committer.close()
        self._bell.close()
        if self._poller is not None:
            self._poller.join()
        self._poll_wake.close()
        super().close()
        with self._pool_lock:
            pool, self._pool = self._pool, []
        for conn in pool:
            conn.close()
