"""The file watcher: turns file-system events under the watched directories into candidate keys.

DESIGN §7: watchdog events are mapped from ``X-wal`` / ``X-journal`` / ``X-shm`` to ``X``
(under WAL a commit touches only the ``-wal`` file; peers_perf §4.6), moves count by their
destination (atomic saves arrive as ``moved``, never ``modified``), and the watched trees are
rescanned every ``rescan_interval`` because inotify drops events when its queue overflows
(and at once, for what changed, when an observer reports an overflow:
``observers.watchdog_overflows``). The start-up scan (and one after a config change) reports
every database; a periodic rescan reports only the databases whose file or ``-wal`` changed
(mtime or ctime: a rename sets the ctime) since the previous scan started, less
``RESCAN_MARGIN_S`` (file times are wall time, so that start is too, moved back with the
wall clock when it is set back: :meth:`Watcher.wall_stepped`). An unchanged database has
nothing new to say, and re-examining a
million of them every ten minutes (an exact ``dbstat`` pass each, once its remembered size is
forgotten) would keep the disk busy for nothing. ``polling=True`` (network filesystems) uses watchdog's
PollingObserver; running out of inotify watches falls back to it too.

What ``on_path`` receives, and where the SQLite header is checked:

* Events: a canonical (realpath'd) path inside a watch entry, not excluded, naming a regular
  file of at least one SQLite page. The header is NOT read here: the server debounces the
  key and then examines it through SQLite (the compactor's ``sizes`` is None for a file that
  is not a database), once per burst instead of once per event.
* Scans: only files whose 16-byte header says SQLite (``is_sqlite_file``), never the
  ``-wal``/``-shm``/``-journal`` side files; and ``cleanup:X`` for side files whose database
  ``X`` is gone (their only way to the cleanup channel: no event comes for them).

A file whose name smoosh's keys or SQLite cannot carry (not UTF-8, a name or path that leaves
no room for SQLite's ``-journal``: :func:`smoosh.paths.name_refusal`) is never reported: it is
named once in the log (:mod:`~smoosh.daemon.watch.hostile`), and events and scans that meet it
again cost a string test each. The key check refuses the same names from every other way in.

No header read happens inside the daemon process: closing any descriptor of a database
drops the POSIX locks our own compactions hold on it (see ``smoosh.daemon.watch.scan``). Events need only
a ``stat``; scans run ``smoosh.daemon.watch.scan``'s walk in a short-lived helper process.
"""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import threading
import time
from collections import deque
from typing import Any, Callable, Iterable, Sequence

from watchdog.events import (
    EVENT_TYPE_CREATED,
    EVENT_TYPE_MODIFIED,
    EVENT_TYPE_MOVED,
    FileSystemEvent,
    FileSystemEventHandler,
)

from smoosh.daemon.watch.debounce import Debouncer
from smoosh.daemon.watch.hostile import refused_name, say_once
from smoosh.paths import CLEANUP_PREFIX, canonical_path, name_refusal
from smoosh.daemon.watch.observers import ROOT_CHECK_INTERVAL_S, WatchedRoots, watchdog_overflows
from smoosh.daemon.watch.scan_helper import discard_helper, run_scan_helper
from smoosh.daemon.watch.scan import WatchEntry, accepts, is_sqlite_file, main_db_path, resolve_watch, watch_roots

__all__ = [
    "Watcher",
    "ROOT_CHECK_INTERVAL_S",
    "Debouncer",
    "WatchEntry",
    "is_sqlite_file",
    "main_db_path",
    "resolve_watch",
    "watch_roots",
]

log = logging.getLogger(__name__)

#: Smallest non-empty database (one page of the smallest page size); smaller files are skipped.
MIN_DB_SIZE_BYTES = 512
#: Seconds within which another event of a database already considered is no news (the debounce
#: waits for a second without events anyway): one look per database per burst of its commits.
COALESCE_S = 0.1
#: Database paths remembered for that (cleared whole past it: a bound, not a cache policy).
COALESCE_MAX_PATHS = 50_000
#: Seconds between periodic rescans (DESIGN §8 rescan_interval: inotify drops events on overflow).
DEFAULT_RESCAN_INTERVAL_S = 600.0
#: A periodic rescan reports files changed since the previous scan started, less this many
#: seconds (coarse file-system timestamps, a clock step, a network file system's skew).
RESCAN_MARGIN_S = 60.0
#: Seconds between iterations of the watcher's own thread (root checks, rescans).
THREAD_TICK_S = 1.0
#: Seconds before a scan that could not run (helper failed to start) is tried again.
SCAN_RETRY_S = 30.0
#: Seconds ``stop()`` waits for each thread it joins.
STOP_TIMEOUT_S = 5.0
_WANTED_EVENT_TYPES = frozenset({EVENT_TYPE_CREATED, EVENT_TYPE_MODIFIED, EVENT_TYPE_MOVED})
#: Seconds between two of smoosh's warnings about inotify overflows (each one still rescans).
OVERFLOW_WARNING_INTERVAL_S = 60.0
#: The last file events remembered as smoosh's own or not: an overflow's evidence of whose
#: writes flooded the kernel's queue (the events read just before it).
OVERFLOW_EVIDENCE_EVENTS = 4096
#: Share of those events on paths smoosh was compacting past which an overflow is its own
#: doing (its VACUUM's writes), said at INFO instead of WARNING; it rescans all the same.
OWN_OVERFLOW_SHARE = 0.9
# ---------------------------------------------------------------------- the watcher


class _Handler(FileSystemEventHandler):
    """Forwards every event to the watcher (kept tiny: it runs where the observer reads, on its
    thread or at a compaction's end, on the compaction's)."""

    def __init__(
        self, on_event: Callable[[FileSystemEvent], None], on_overflow: Callable[[], None],
        ignores: Callable[[str], bool],
    ) -> None:
        super().__init__()
        self._on_event = on_event
        self.on_overflow = on_overflow  # smoosh's inotify observer calls it when the kernel dropped events
        self.ignores = ignores  # smoosh's inotify observer asks it before it builds an event

    def dispatch(self, event: FileSystemEvent) -> None:
        self._on_event(event)


class Watcher:
    """Watches directories and glob patterns for SQLite databases that change.

    Parameters:
        watch: directories (watched recursively), glob patterns (``/data/*/*.db``: the static
            prefix is watched, paths are filtered with ``fnmatch``) and single files.
        on_path: called with a canonical candidate path (see the module docstring); called
            from watchdog's thread and the watcher's thread; exceptions are logged.
        rescan_interval_s: seconds between full rescans.
        exclude: canonical paths for which it returns True are never reported (the daemon's
            own store and state directory).
        polling: use watchdog's PollingObserver (network filesystems) instead of inotify.
        clock: monotonic seconds; tests step ``tick(now)`` with their own.
        on_scanned: receives what scans find, when it differs from ``on_path`` (events go
            through a debounce, scan results need none); defaults to ``on_path``.
        on_settling: receives what scans find still being written (a copy in progress, a
            ``-journal`` beside it: :mod:`~smoosh.daemon.watch.scan`), which is news like a file
            event and should be debounced like one; defaults to ``on_scanned``.
        observer: a started watchdog observer to schedule the watches on (shared with the
            config watcher: one observer thread for the daemon); None makes one of its own.
        busy: True for a database path smoosh itself is compacting now: events on it (and its
            side files) are ignored, checked before any system call. When its compaction ends,
            the owner calls :meth:`settle`, so the last events of it are ignored too.
        scan_helper: a scan helper process started ahead
            (:func:`~smoosh.daemon.watch.scan_helper.spawn_helper`) for the first scan to use;
            the watcher owns it from here (a stop before that scan kills it).
    """

    def __init__(
        self,
        watch: Sequence[str],
        on_path: Callable[[str], None],
        *,
        rescan_interval_s: float = DEFAULT_RESCAN_INTERVAL_S,
        exclude: Callable[[str], bool] = lambda p: False,
        polling: bool = False,
        clock: Callable[[], float] = time.monotonic,
        on_scanned: Callable[[str], None] | None = None,
        on_settling: Callable[[str], None] | None = None,
        observer: Any = None,
        busy: Callable[[str], bool] = lambda path: False,
        scan_helper: subprocess.Popen[bytes] | None = None,
    ) -> None:
        self._specs = tuple(watch)
        # A scan helper started ahead for the first scan (spawn_helper), or None; the watcher
        # owns it: the first scan takes it (under _lock), a stop before that kills it.
        self._spare_helper = scan_helper
        self._on_path = on_path
        self._on_scanned = on_scanned or on_path
        self._on_settling = on_settling or self._on_scanned
        self._busy = busy
        # Paths whose compaction ended, their last events perhaps still queued (see settle()):
        # path -> compactions settling, under _settle_lock.
        self._settling: dict[str, int] = {}
        self._settle_lock = threading.Lock()
        # Database paths considered lately and when (see _coalesced): the observer's thread's.
        self._considered: dict[str, float] = {}
        self._ticked = False  # ticked by its owner's loop: scans run on a thread of their own
        self._scan_thread: threading.Thread | None = None
        self._rescan_interval_s = float(rescan_interval_s)
        self._exclude = exclude
        self._clock = clock
        self._lock = threading.RLock()
        self._scan_lock = threading.Lock()
        self._entries: tuple[WatchEntry, ...] = tuple(resolve_watch(s) for s in self._specs)
        self._roots = WatchedRoots(_Handler(self._on_event, self.overflowed, self._ignores), polling=polling, shared_observer=observer)
        self._next_scan_at = clock() + self._rescan_interval_s
        self._next_root_check_at = float("-inf")
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._requested_full = False
        # True: the next full scan reports every database (start-up, config change); False:
        # only those changed since the previous full scan started (periodic rescans).
        self._requested_everything = True
        self._last_full_scan_wall: float | None = None
        # Seconds the wall clock was set back so far (steps back add up; under _lock): a scan
        # that ran across a step starts its successor's window that much earlier.
        self._wall_set_back_s = 0.0
        self._requested_roots: set[str] = set()
        self._scan_proc: subprocess.Popen[bytes] | None = None
        self._scans_completed = 0
        # Whether the overflow was smoosh's own -> [when it was last said, overflows since not said]
        # (under _lock): the two kinds are said apart, so an own one never silences a warning.
        self._overflows_said: dict[bool, list[float]] = {False: [float("-inf"), 0], True: [float("-inf"), 0]}
        # Whether each of the last events was on a path smoosh was compacting (True) or not.
        # Written by the observer's reader alone (_consider: one read at a time, on its thread or
        # in an after_drain), read there too (overflowed: the observer calls it after
        # dispatching the events read with the overflow's record).
        self._recent_own: deque[bool] = deque(maxlen=OVERFLOW_EVIDENCE_EVENTS)
        #: (databases found, seconds) of the start-up scan; (0, 0.0) before it completes.
        self.startup_scan: tuple[int, float] = (0, 0.0)
        #: (databases found, seconds) of the last completed scan; (0, 0.0) before the first.
        self.last_scan: tuple[int, float] = (0, 0.0)

    @property
    def entries(self) -> tuple[WatchEntry, ...]:
        """The resolved watch entries."""
        return self._entries

    @property
    def scans_completed(self) -> int:
        """How many scans have run to the end (the start-up scan is the first)."""
        return self._scans_completed

    @property
    def polling(self) -> bool:
        """Whether events come from the PollingObserver (asked for, or the inotify fallback)."""
        return self._roots.polling

    # ------------------------------------------------------------------ lifecycle

    def start(self, *, thread: bool = True) -> None:
        """Start observing, then scan every watched tree once.

        Observing starts before the scan so that no change falls between the two.

        Parameters:
            thread: run the root checks and rescans on a thread of the watcher's own; False
                when the owner's loop calls :meth:`tick` (scans then run on a short-lived
                thread each, so a large fleet's scan never blocks that loop).
        """
        with self._lock:
            if (self._thread is not None and self._thread.is_alive()) or self._ticked:
                return
            self._stop.clear()
            self._roots.start()
            self._refresh_roots()
            self._next_root_check_at = self._clock() + ROOT_CHECK_INTERVAL_S
            self._next_scan_at = self._clock() + self._rescan_interval_s
            self._requested_full = True
            self._requested_everything = True
            watchdog_overflows.watchers.add(self)
            if thread:
                self._thread = threading.Thread(target=self._run, name="smoosh-watcher", daemon=True)
                self._thread.start()
            else:
                self._ticked = True

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop the observer, any scan in progress and the watcher's thread; join them.

        Parameters:
            timeout_s: the longest to wait for each thread.
        """
        self._stop.set()
        self._wake.set()
        watchdog_overflows.watchers.discard(self)
        proc = self._scan_proc
        if proc is not None and proc.poll() is None:
            proc.kill()
        with self._lock:
            release = self._roots.detach()
            self._ticked = False
            spare, self._spare_helper = self._spare_helper, None
        if spare is not None:
            discard_helper(spare)
        release(timeout_s)
        for thread in (self._thread, self._scan_thread):
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout_s)
        self._thread = self._scan_thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick(self._clock())
                self._run_requested_scans()
            except Exception:
                log.exception("watcher loop iteration failed")
            self._wake.wait(THREAD_TICK_S)
            self._wake.clear()

    # ------------------------------------------------------------------ stepping

    def tick(self, now: float) -> float:
        """Check the watched roots and start the periodic rescan when due.

        Started: a due scan is handed to the watcher's thread, or (started without one) to
        a short-lived scan thread: a scan of a large fleet must not block the caller's loop.
        Not started: it runs here, synchronously.

        Parameters:
            now: the current time on the watcher's clock.

        Returns:
            When the next root check or rescan is due.
        """
        with self._lock:
            new_roots: list[str] = []
            if now >= self._next_root_check_at:
                self._next_root_check_at = now + ROOT_CHECK_INTERVAL_S
                new_roots = self._refresh_roots()
            if now >= self._next_scan_at:
                self._next_scan_at = now + self._rescan_interval_s
                self._requested_full = True
            self._requested_roots.update(new_roots)
            next_due = min(self._next_root_check_at, self._next_scan_at)
            if not (self._requested_full or self._requested_roots):
                return next_due
            threaded = self._thread is not None and self._thread.is_alive()
            if self._ticked:
                if self._scan_thread is None or not self._scan_thread.is_alive():
                    self._scan_thread = threading.Thread(target=self._run_requested_scans, name="smoosh-scan", daemon=True)
                    self._scan_thread.start()
                return next_due
        if threaded and threading.current_thread() is not self._thread:
            self._wake.set()
            return next_due
        self._run_requested_scans()
        return next_due

    def set_rescan_interval(self, rescan_interval_s: float) -> None:
        """Rescan every ``rescan_interval_s`` from now on (config reload); the next rescan comes no later than that."""
        with self._lock:
            self._rescan_interval_s = float(rescan_interval_s)
            self._next_scan_at = min(self._next_scan_at, self._clock() + self._rescan_interval_s)

    def request_full_scan(self) -> None:
        """Report every database again soon, changed or not (the config that prices them changed).

        Started with a thread, the scan starts at once; ticked by an owner, at its next tick.
        """
        with self._lock:
            self._requested_full = True
            self._requested_everything = True
        self._wake.set()

    def wall_stepped(self, step_s: float) -> None:
        """The wall clock stepped by ``step_s`` seconds (negative: back); any thread.

        A periodic rescan reports the files changed since the previous full scan started, by
        their times, which the kernel takes from the wall clock. Set back, the clock stamps
        every later change before that start, and rescans would miss them all for as long as
        the step: the start moves back with it. Set forward, nothing moves (what changed before
        the step still lies after the start, and what changes after it further still).
        """
        if step_s >= 0:
            return
        with self._lock:
            self._wall_set_back_s -= step_s
            if self._last_full_scan_wall is not None:
                self._last_full_scan_wall += step_s

    def overflowed(self) -> None:
        """The kernel dropped events (its inotify queue overflowed): rescan what changed since the last scan.

        Any thread (smoosh's observer calls it on its own, after the events read with the
        overflow). The events lost may be the application's, so the rescan is what keeps
        nothing hidden; the warning is rate-limited because a flood overflows again and again.
        An overflow that smoosh's own compaction caused (at least :data:`OWN_OVERFLOW_SHARE`
        of the last events were on paths it was compacting: a large VACUUM writes its WAL or
        journal faster than the queue is read) is said at INFO, not as a warning about itself.
        """
        recent = list(self._recent_own)
        self._recent_own.clear()
        own = sum(recent)
        ours = bool(recent) and own >= OWN_OVERFLOW_SHARE * len(recent)
        with self._lock:
            self._requested_full = True  # _requested_everything stays: only what changed
            said = self._overflows_said[ours]
            said[1] += 1
            now = self._clock()
            if now - said[0] >= OVERFLOW_WARNING_INTERVAL_S:
                times = "" if said[1] == 1 else f" {int(said[1])} times"
                said[:] = [now, 0]
                roots = ", ".join(sorted(watch_roots(self._entries)))
                if ours:
                    log.info("inotify queue overflowed%s while smoosh compacted (%d of the last %d file events were "
                             "its own writes); rescanning %s for databases changed since the last scan",
                             times, own, len(recent), roots)
                else:
                    log.warning("inotify queue overflowed%s: file-system events were lost; rescanning %s for databases "
                                "changed since the last scan (raise fs.inotify.max_queued_events if this repeats)",
                                times, roots)
        self._wake.set()

    def _run_requested_scans(self) -> None:
        with self._lock:
            full, roots = self._requested_full, self._requested_roots
            everything = self._requested_everything or self._last_full_scan_wall is None
            self._requested_full, self._requested_roots = False, set()
            if full:
                self._requested_everything = False
        if not (full or roots):
            return
        try:
            if full:
                since = None if everything else self._last_full_scan_wall - RESCAN_MARGIN_S  # type: ignore[operator]
                with self._lock:
                    set_back_s = self._wall_set_back_s
                started_wall = time.time()
                self._scan(None, since)
                with self._lock:
                    self._last_full_scan_wall = started_wall - (self._wall_set_back_s - set_back_s)
            else:
                self._scan(roots)  # newly appeared roots: everything in them is new
        except Exception:
            log.exception("scan of the watched directories failed; retrying in %.0f s", SCAN_RETRY_S)
            with self._lock:
                self._next_scan_at = min(self._next_scan_at, self._clock() + SCAN_RETRY_S)

    # ------------------------------------------------------------------ scans

    def scan(self) -> int:
        """Scan every watched tree now and report each SQLite database to ``on_path``.

        Returns:
            The number of databases reported.

        Raises:
            OSError: the scan helper process could not be started.
        """
        return self._scan(None)

    def _scan(self, only_roots: Iterable[str] | None, changed_since: float | None = None) -> int:
        with self._scan_lock:
            entries = self._entries
            roots = watch_roots(entries)
            if only_roots is not None:
                wanted = set(only_roots)
                roots = {r: rec for r, rec in roots.items() if r in wanted}
            if not roots or self._stop.is_set():
                return 0  # nothing to walk, or stop() was called (start() clears it)
            started = time.monotonic()
            count = self._run_helper(entries, roots, changed_since)
            self.last_scan = (count, time.monotonic() - started)
            if self._scans_completed == 0:
                self.startup_scan = self.last_scan
            self._scans_completed += 1
            log.info(
                "scan of %d watched director%s found %d SQLite database%s%s in %.1f s",
                len(roots),
                "y" if len(roots) == 1 else "ies",
                count,
                "" if count == 1 else "s",
                "" if changed_since is None else " changed since the previous scan",
                time.monotonic() - started,
            )
            return count

    def _run_helper(
        self, entries: Sequence[WatchEntry], roots: dict[str, bool], changed_since: float | None = None
    ) -> int:
        def started(proc: subprocess.Popen[bytes] | None) -> None:
            self._scan_proc = proc

        with self._lock:
            spare, self._spare_helper = self._spare_helper, None
        return run_scan_helper(entries, roots, changed_since, on_path=self._on_scan_path,
                               started=started, stop=self._stop, spare=spare)

    def _on_scan_path(self, path: str, settling: bool = False) -> bool:
        # A cleanup key is a vanished database's leftovers (scan.orphans): reported, not counted.
        orphan = path.startswith(CLEANUP_PREFIX)
        db = path[len(CLEANUP_PREFIX):] if orphan else path
        if self._exclude(db) or self._refused(db):
            return False
        try:
            # A database still being written (a copy, a transaction) is news like a file
            # event: the daemon debounces it, examined once it has been quiet.
            (self._on_settling if settling else self._on_scanned)(path)
        except Exception:
            log.exception("on_scanned callback failed for %r", path)
        return not orphan

    # ------------------------------------------------------------------ events

    def _on_event(self, event: FileSystemEvent) -> None:
        # Runs on watchdog's dispatch thread: never let an exception reach it.
        try:
            if event.is_directory or event.event_type not in _WANTED_EVENT_TYPES:
                return
            # A move's destination is the file that now holds the content (atomic saves, and
            # a file moved in from outside); moved-in files also arrive as "created".
            raw = event.dest_path if event.event_type == EVENT_TYPE_MOVED else event.src_path
            if raw:
                self._consider(os.fsdecode(raw))
        except Exception:
            log.exception("watcher could not handle %r", event)

    def settle(self, path: str) -> None:
        """smoosh's compaction of ``path`` is ending: ignore its events until the kernel's queue,
        as it is now, has been handled (any thread; call it before ``busy`` turns False).

        Events are read a little after they happen: the last writes of a compaction (its
        connection closed, its journal deleted) would otherwise come once ``busy`` is False,
        and every database compacted would be examined again as if its application wrote.
        An application's write in that instant (about a millisecond) is missed like one made
        during the compaction. Observers that cannot tell (watchdog's, polling) change nothing.
        """
        with self._settle_lock:
            self._settling[path] = self._settling.get(path, 0) + 1
        if not self._roots.after_drain(lambda: self._settled(path)):
            self._settled(path)

    def settling(self) -> int:
        """How many ended compactions' last events are still awaited (see :meth:`settle`)."""
        with self._settle_lock:  # the observer's thread settles them meanwhile
            return sum(self._settling.values())

    def _settled(self, path: str) -> None:
        with self._settle_lock:
            left = self._settling.get(path, 0) - 1
            if left > 0:
                self._settling[path] = left
            else:
                self._settling.pop(path, None)

    def _ignores(self, path: str) -> bool:
        """Whether an event on ``path`` is no news, counted as an overflow's evidence when it is
        (see :meth:`overflowed`): smoosh is compacting the file, its writes are no news (and a
        flood of them); or it is a ``-shm``, which changes with every reader too (writes show
        in ``-wal``).

        smoosh's inotify observer asks it under its lock, on the thread that reads its queue,
        before it builds an event: a compaction's own writes are most of what it reads while one
        runs, and each then costs one call, not an event object and its dispatch.
        :meth:`_consider` asks it first too, for the other observers.
        """
        db = main_db_path(path)
        own = self._busy(db) or db in self._settling
        if own or path.endswith("-shm"):
            self._recent_own.append(own)
            return True
        return False

    def _consider(self, path: str) -> None:
        if self._ignores(path):
            return
        self._recent_own.append(False)  # an overflow's evidence (see overflowed)
        db = main_db_path(path)
        if self._coalesced(db):
            return
        real = canonical_path(db)
        if not accepts(self._entries, real) or self._exclude(real):
            return
        try:
            st = os.stat(real)  # a stat takes no descriptor, so no SQLite lock is at risk
        except OSError:
            return  # deleted meanwhile: a missing database is nothing to compact
        if stat.S_ISREG(st.st_mode) and st.st_size >= MIN_DB_SIZE_BYTES and not self._refused(real):
            self._emit(real)
            if len(self._considered) >= COALESCE_MAX_PATHS:
                self._considered.clear()
            self._considered[db] = self._clock()

    def _coalesced(self, db: str) -> bool:
        """Whether ``db`` was handed on less than :data:`COALESCE_S` ago: then this event says
        nothing new. The key's debounce waits for a second without events after the one handed
        on, so it looks at the file well after the writes of the events dropped here; an event
        that was not handed on (a file too small yet, say) drops none after it.

        An application committing a few times a second makes several events a commit (its
        journal created, written, deleted; the database written), and each cost a canonical
        path, a ``stat`` and a hand-off: the CPU it took (on a machine the application shares)
        was part of what an application noticed of smoosh watching (issue 46). Called on the
        observer's thread only; the memory is bounded by clearing it whole.
        """
        seen = self._considered.get(db)
        return seen is not None and self._clock() - seen < COALESCE_S

    @staticmethod
    def _refused(path: str) -> bool:
        """Whether ``path``'s name can be no key (:func:`smoosh.paths.name_refusal`): said once, then True."""
        reason = name_refusal(path)
        if reason is None:
            return False
        say_once(refused_name(path, reason))
        return True

    def _emit(self, path: str) -> None:
        try:
            self._on_path(path)
        except Exception:
            log.exception("on_path callback failed for %r", path)

    def _refresh_roots(self) -> list[str]:
        """Re-resolve the entries and (re)schedule watches; the roots that newly appeared.

        Caller holds ``self._lock``.
        """
        self._entries = tuple(resolve_watch(s) for s in self._specs)
        return self._roots.refresh(self._entries)
