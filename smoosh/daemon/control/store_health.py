"""The job store's health as the daemon sees it: ``ok``, ``full`` or ``unreachable``; a gate on starts.

A full SQLite store, or a store that does not answer (a FoundationDB cluster down, a store
file whose directory went away), used to show as a stream of failed commits in the log and
keys ``pending`` with no error, and nothing at all while a cluster was merely unreachable
(issues 25 and 28). One state, changed by what the daemon's own transactions meet
(:class:`~smoosh.daemon.control.watched_store.WatchedStore` reports every one of them):

* ``full``: an attempt failed because the disk or the database is full (SQLITE_FULL,
  ENOSPC): at once, since a retry cannot help until space is freed;
* ``unreachable``: a transaction gave up on an error of the store (a retryable one the
  retry loop ran out of time for, a timeout, a file that cannot be opened or read), or one
  has had no answer for :data:`STALL_S` (looked at by the housekeeping, every few seconds);
* ``ok`` again: a transaction that wrote committed. Only a write proves it: a full store
  still answers reads.

Each change is one WARNING line (its end says how long it lasted), ``/status`` shows the
state (``store``), ``/metrics`` the gauge ``smoosh_store_state{state}``, and ``/jobs`` says
why the keys it holds back wait. Meanwhile the store and the job layer would log each failed
attempt of their own (a full SQLite store: every failed commit, several a second, and a
background role's traceback once its retries run out): while the state is known, those
repeats of it are counted instead of logged (:meth:`StoreHealth.quiet_store_logs`), and the
line that ends the state says how many there were. While the state is not ``ok`` no channel starts a new
compaction (:meth:`StoreHealth.admits`, asked with the other gates of a start): keys stay
queued instead of failing one by one, and the channels that asked are woken the moment the
store is back. Running compactions go on.

Owner: this object, under its one lock. Any thread reports (the wrapper does it from the
thread of each transaction; the housekeeping calls :meth:`check` on the server's loop);
channels ask :meth:`admits` from the loop; readers call :meth:`snapshot` from any thread.
Log lines and wake-ups happen after the lock is released.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from typing import Any, Callable

from smoosh.store.errors import StoreError, StoreUnavailable

__all__ = ["StoreHealth", "classify", "log_failure", "OK", "FULL", "UNREACHABLE", "STATES", "STALL_S"]

log = logging.getLogger(__name__)

OK = "ok"
FULL = "full"
UNREACHABLE = "unreachable"
#: Every state, in the order ``/metrics`` lists them.
STATES = (OK, FULL, UNREACHABLE)

#: A transaction with no answer for this many seconds makes the store ``unreachable``. Longer
#: than a lock another process holds through one busy timeout (that is contention, and the
#: retry loop says so), short enough to see a cluster that is down well before a
#: transaction's own 60 s timeout.
STALL_S = 10.0
#: The loggers whose WARNINGs and ERRORs repeating the store's state are counted, not logged.
QUIETED_LOGGERS = ("smoosh.store", "smoosh.jobs")
#: Longest error text kept (a store's message may embed a whole path or a statement).
MAX_ERROR_CHARS = 200

#: SQLite's primary result code for a full database or disk, and its words for it.
SQLITE_FULL = 13
FULL_TEXT = "database or disk is full"


def classify(error: BaseException) -> str | None:
    """What a store error says of the store: ``full``, ``unreachable``, or None (not the store's health).

    None for what the caller's own transaction got wrong (an invalid key, a transaction too
    large), for a cancelled one, and for anything the body raised that is not a store error.
    """
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return FULL
    # The embedded store's driver raises its own errors; told by their module, not imported
    # (the daemon never imports the stdlib sqlite3: one SQLite library per database, DESIGN §11).
    from_sqlite = type(error).__module__ == "sqlite3"
    if FULL_TEXT in str(error) and (from_sqlite or isinstance(error, StoreError)):
        return FULL  # the SQLite store's COMMIT failure carries SQLite's words in a StoreError
    if from_sqlite:
        code = getattr(error, "sqlite_errorcode", None)
        if isinstance(code, int) and code & 0xFF == SQLITE_FULL:
            return FULL
        # Cannot open, read or write the file (CANTOPEN, IOERR, READONLY, NOTADB ...); a
        # programming error (a closed connection at shutdown) says nothing of the store.
        return UNREACHABLE if type(error).__name__ in ("OperationalError", "DatabaseError") else None
    if isinstance(error, StoreError):
        return UNREACHABLE if error.loop_retryable else None
    if isinstance(error, (StoreUnavailable, OSError)):
        return UNREACHABLE
    return None


def log_failure(logger: logging.Logger, error: Exception, what: str, *args: object, health_says_it: bool) -> None:
    """Log that ``what`` failed and its thread goes on: with the traceback, unless the store is to blame.

    A full or unreachable store is one line without a traceback, at DEBUG where the daemon's
    health says it once (the daemon's own threads), else at WARNING (a stand-alone worker).

    Parameters:
        logger: the caller's logger.
        error: what failed.
        what: what was being done, a %-format of ``args`` ("Heartbeat of job %r").
        health_says_it: whether a :class:`StoreHealth` hears of the store's failures here.
    """
    if classify(error) is None:
        logger.exception(what + " failed; going on.", *args)
    else:
        logger.log(logging.DEBUG if health_says_it else logging.WARNING, what + " failed: %s; going on.", *args, error)


class StoreHealth:
    """The store's state, the transactions under way, and the channels waiting for it to be back.

    Parameters:
        url: the store's URL, for the log lines.
        clock: wall-clock seconds (``since``, which a person reads).
        monotonic: monotonic seconds (durations and stalls: a wall-clock step never fakes one).
        wake_channel: ticks a channel soon, from any thread (the server's ``wake``).
        stall_s: see :data:`STALL_S`.
    """

    def __init__(
        self,
        url: str,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        wake_channel: Callable[[str], None] = lambda name: None,
        stall_s: float = STALL_S,
    ) -> None:
        self.url = url
        self._clock = clock
        self._monotonic = monotonic
        self._stall_s = stall_s
        self.wake_channel = wake_channel
        self._lock = threading.Lock()
        self._state = OK
        self._since = clock()
        self._since_mono = monotonic()
        self._error: str | None = None
        #: Transactions under way: token -> monotonic start (insertion order: oldest first).
        self._in_flight: dict[int, float] = {}
        self._next_token = 0
        #: Channels refused a start while the store was not ok, woken when it is.
        self._line: list[str] = []
        self._closing = False
        #: Log records of the store and the job layer repeating the state, not logged.
        self._quieted = 0
        self._filter = _RepeatFilter(self)
        self._quieted_loggers: list[logging.Logger] = []

    # -- reports (any thread) ------------------------------------------------------------------

    def began(self) -> int:
        """A transaction starts; the token to hand to :meth:`ended`."""
        with self._lock:
            self._next_token += 1
            token = self._next_token
            self._in_flight[token] = self._monotonic()
            return token

    def ended(self, token: int) -> None:
        """The transaction of ``token`` is over, however it ended."""
        with self._lock:
            self._in_flight.pop(token, None)

    def attempt_failed(self, error: BaseException) -> None:
        """An attempt failed and will be retried: only a full store counts at once (a retry cannot help)."""
        if classify(error) == FULL:
            self._change(FULL, error)

    def failed(self, error: BaseException) -> None:
        """A transaction gave up with ``error``."""
        state = classify(error)
        if state is not None:
            self._change(state, error)

    def wrote(self) -> None:
        """A transaction with writes committed: the store is ok."""
        if self._state != OK:  # a racy read, settled under the lock in _change
            self._change(OK, None)

    def check(self) -> None:
        """Mark the store unreachable if a transaction has had no answer for ``stall_s`` (the housekeeping's tick)."""
        with self._lock:
            oldest = next(iter(self._in_flight.values()), None)
        if oldest is None:
            return
        waited_s = self._monotonic() - oldest
        if waited_s >= self._stall_s and self._state == OK:
            self._change(UNREACHABLE, f"no answer from the store for {waited_s:.0f} s", began=oldest)

    def closing(self) -> None:
        """The daemon stops: what its last transactions meet is not reported any more."""
        with self._lock:
            self._closing = True

    def quiet_store_logs(self, prefixes: tuple[str, ...] = QUIETED_LOGGERS) -> None:
        """While the store is not ok, count instead of log what the store and the job layer repeat of it.

        A filter goes on every logger under ``prefixes`` that exists now (the modules are
        imported, each with its logger): a logger's filter sees only its own records, so it
        is put on each one. Only WARNING and above that the state accounts for are held back
        (a failed commit on a full disk while the store is full, an unreachable store's
        errors while it is unreachable); anything else, and everything while the store is ok,
        is logged as always. :meth:`unquiet_store_logs` takes the filters off.
        """
        loggers = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)
                   if name.startswith(prefixes)]
        for logger in loggers:
            logger.addFilter(self._filter)
        with self._lock:
            self._quieted_loggers.extend(loggers)

    def unquiet_store_logs(self) -> None:
        """Take the filters of :meth:`quiet_store_logs` off (the daemon stops)."""
        with self._lock:
            loggers, self._quieted_loggers = self._quieted_loggers, []
        for logger in loggers:
            logger.removeFilter(self._filter)

    def _quiets(self, record: logging.LogRecord) -> bool:
        """Whether ``record`` only repeats the state the store is in (counted if so); any thread."""
        if record.levelno < logging.WARNING or self._state == OK:
            return False
        error = record.exc_info[1] if record.exc_info else None
        state = classify(error) if error is not None else None
        if state is None and FULL_TEXT in record.getMessage():
            state = FULL
        with self._lock:
            if state is None or state != self._state:
                return False
            self._quieted += 1
            return True

    # -- the gate (the server's loop) ------------------------------------------------------------

    def admits(self, channel: str) -> bool:
        """Whether ``channel`` may start a compaction now; if not, it is woken once the store is ok."""
        with self._lock:
            if self._state == OK:
                return True
            if channel not in self._line:
                self._line.append(channel)
            return False

    # -- readers (any thread) -------------------------------------------------------------------

    @property
    def state(self) -> str:
        """``ok``, ``full`` or ``unreachable``."""
        return self._state

    def snapshot(self) -> dict[str, Any]:
        """The state as ``/status`` shows it: ``{"state", "since": unix seconds, "error": text or None}``."""
        with self._lock:
            return {"state": self._state, "since": self._since, "error": self._error}

    def holding(self) -> str | None:
        """Why a key waits for the store now, in words (None while it is ok): ``/jobs`` and ``explain`` say it."""
        with self._lock:
            if self._state == OK:
                return None
            return f"the job store is {self._state} ({self._error}); compactions start when it is back"

    # -- the one way to change state --------------------------------------------------------------

    def _change(self, state: str, error: BaseException | str | None, *, began: float | None = None) -> None:
        text = None if error is None else _error_text(error)
        now_mono = self._monotonic()
        with self._lock:
            if self._closing or self._state == state:
                if not self._closing and state != OK:
                    self._error = text  # the same state, the latest words for it
                return
            old, lasted_s = self._state, now_mono - self._since_mono
            start_mono = now_mono if began is None else began
            self._state, self._error = state, text
            self._since_mono = start_mono
            self._since = self._clock() - (now_mono - start_mono)
            line, self._line = (self._line, []) if state == OK else ([], self._line)
            quieted, self._quieted = (self._quieted, 0) if state == OK else (0, self._quieted)
        unlogged = f"; {quieted} failed store operation(s) meanwhile were not logged one by one" if quieted else ""
        if state == OK:
            log.warning("job store %s is ok again; it was %s for %.1f s%s", self.url, old, lasted_s, unlogged)
        elif state == FULL:
            log.warning("job store %s is full: %s; new compactions wait until it has room", self.url, text)
        else:
            log.warning("job store %s is unreachable: %s; new compactions wait until it answers", self.url, text)
        for name in line:
            self.wake_channel(name)


class _RepeatFilter(logging.Filter):
    """Drops the records that only repeat the store's state (see :meth:`StoreHealth.quiet_store_logs`)."""

    def __init__(self, health: StoreHealth) -> None:
        super().__init__()
        self._health = health

    def filter(self, record: logging.LogRecord) -> bool:
        return not self._health._quiets(record)


def _error_text(error: BaseException | str) -> str:
    text = error if isinstance(error, str) else (str(error) or type(error).__name__)
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."
