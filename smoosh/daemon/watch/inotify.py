"""A watchdog-compatible observer over Linux inotify: one thread, events dispatched as read.

watchdog's inotify observer runs two threads per watched directory tree (a reader that
pairs moves through a delayed queue, an emitter that builds and queues events) and one
more that dispatches them. Every write smoosh's own compactions make passes through all
three before the watcher drops it. This observer reads the inotify descriptor on one
thread and calls each handler there, with the same event classes (``watchdog.events``), so
the file watcher and the config watcher take either observer unchanged. The PollingObserver
(network filesystems, inotify exhausted) stays watchdog's.

What it does, as watchdog's observer does for the events smoosh asks for:

* ``schedule(handler, path, recursive, event_filter)``: the inotify mask is narrowed to the
  event classes asked for; a recursive watch covers every directory below ``path``, and a
  directory that appears inside it (made, or moved in) is watched at once and every file
  already in it reported as created (it may have been written before its watch existed).
* beyond watchdog: a handler with ``ignores(path)`` has the creations and changes of the files
  it names dropped before any event object is built. The watcher names the files of smoosh's
  own compactions, so each of their writes costs the thread one call.
* moves are paired by cookie, across reads: the kernel queues a rename's two halves one after
  the other, and a read may fall between them, so a ``moved_from`` is held up to
  :data:`MOVE_PAIR_S` for its ``moved_to`` (as watchdog's inotify buffer holds it). A
  ``moved_to`` without its ``moved_from`` (moved in from outside) is reported as created; a
  ``moved_from`` whose hold ended unpaired (moved out), as deleted. The hold ends at a read
  (the queue is read first, so a ``moved_to`` already queued still pairs): the thread reads
  when the earliest hold ends.
* beyond watchdog: a directory below a recursive watch that cannot be watched (a chain deeper
  than the path limit, no permission) is skipped with the tree below it and named once in the
  log (:mod:`~smoosh.daemon.watch.hostile`); the rest of the root stays watched. Only inotify's
  limits (ENOSPC, EMFILE) fail a schedule.
* a watched root deleted or moved away ends its watch: :meth:`is_watching` turns False and
  the owner (``WatchedRoots``) watches the path again when a directory is back there.
* a kernel queue overflow calls ``on_overflow()`` on every handler that has one.
* beyond watchdog: :meth:`InotifyObserver.after_drain` runs a callback once every event the
  kernel queued before the call has been handled (how the watcher knows the last events of
  smoosh's own compaction are behind it). The caller reads the queue itself when no read is
  under way, so a compaction's end wakes no other thread.
* beyond watchdog: :meth:`InotifyObserver.set_quiet` names a time when most events are
  smoosh's own (its compactions run): the thread then sleeps through them, and the queue is
  read when a compaction ends (its ``after_drain``) or every :data:`QUIET_READ_S`, so a
  compaction's writes cost no wake-up of their own, and the kernel merges their repeats unread.

Owner: whoever made it (the daemon's housekeeping, a watcher or a config watcher); any
thread may schedule and unschedule, under the observer's lock. Handlers run outside that
lock, on the thread that read the events: the observer's, or one in ``after_drain``. One read
at a time (``_reading``), so handlers never run two at once and see events in order.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import select
import threading
import time
from typing import Any, Callable, Sequence

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirModifiedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
)

from smoosh.daemon.watch.hostile import say_once, too_deep, unreadable
from smoosh.daemon.watch.inotify_watch import (
    ADD_FLAGS,
    IN_ATTRIB,
    IN_CLOSE_WRITE,
    IN_CREATE,
    IN_DELETE,
    IN_DELETE_SELF,
    IN_IGNORED,
    IN_ISDIR,
    IN_MODIFY,
    IN_MOVE,
    IN_MOVE_SELF,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    IN_Q_OVERFLOW,
    SELF_EVENTS,
    TREE_EVENTS,
    Watch,
    mask_of,
)

__all__ = ["InotifyObserver", "inotify_available", "new_observer", "IN_Q_OVERFLOW", "gather_s", "fold_repeats", "max_queued_events"]

log = logging.getLogger("smoosh.daemon.watch.watcher")  # the watcher's lines, one logger

#: Seconds the thread lets events gather after the first one arrives, before it reads them:
#: one read then takes a burst of an application's commits (or a compaction's writes) instead of
#: a read each, and the kernel merges the repeats of an event not yet read. Every event is
#: debounced downstream (a second without events) anyway, so this only delays a look; what it
#: saves is CPU on a machine the application shares (issue 46).
READ_DELAY_S = 0.05
#: Seconds the events gather while an application writes on and on (its events woke the
#: thread again within :data:`BUSY_WINDOW_S` of a read that found some): one read a second
#: instead of one per burst, each file's repeated changes folded into one event (see
#: :func:`fold_repeats`). Beside a busy application on a busy machine, the CPU the reader takes
#: per event is CPU an application thread holding a SQLite lock waits for, and its other
#: threads fail meanwhile; the debounce downstream waits a second without events anyway.
BUSY_READ_DELAY_S = 1.0
#: Seconds after a read that found events within which the next events count as the same
#: busy spell (:data:`BUSY_READ_DELAY_S`).
BUSY_WINDOW_S = 1.0
#: Share of the kernel queue (``max_queued_events``) a gather may fill at the rate of the last
#: one: a gather is cut short rather than let the queue overflow (an overflow costs a rescan).
QUEUE_SHARE = 0.25
#: The kernel's bound on queued events per descriptor, where it cannot be read (Linux's default).
DEFAULT_MAX_QUEUED_EVENTS = 16384
#: Seconds the thread may leave events unread while :meth:`InotifyObserver.set_quiet` says
#: they are mostly smoosh's own: an application's write is seen at most this much later
#: (against a debounce of a second), and the kernel queue (16,384 events by default) cannot
#: fill in that time from a compaction's writes, which the kernel merges while unread.
QUIET_READ_S = 0.1
#: Seconds ``stop()`` waits for the observer's thread, unless told otherwise.
STOP_TIMEOUT_S = 5.0
#: Seconds a ``moved_from`` waits for its ``moved_to`` (on the observer's clock) before it is
#: reported as a deletion. The kernel queues the two back to back, so a read that splits them
#: finds the second in the queue at the next one; the hold only has to outlast that.
MOVE_PAIR_S = 0.5
#: errno values meaning inotify's limits are exhausted (watches, instances): a schedule fails on
#: them (its owner falls back to polling), where any other failure only costs the directory.
_LIMIT_ERRNOS = frozenset({errno.ENOSPC, errno.EMFILE})
#: errno values of a directory that went away (or was replaced by a file) as it was watched.
_GONE_ERRNOS = frozenset({errno.ENOENT, errno.ENOTDIR})


def gather_s(events: int, span_s: float, since_read_s: float, max_queued: int) -> float:
    """How long to let events gather before reading them, from what the last read found.

    Parameters:
        events: how many events the last read took (after the kernel's merging).
        span_s: the time they gathered over (from the wake-up the first of them caused, or from
            the read before when none woke the thread, to that read).
        since_read_s: seconds from the end of the last read to now (the new events' wake-up).
        max_queued: the kernel's bound on queued events (``max_queued_events``).

    Returns:
        :data:`READ_DELAY_S` for the first burst after a pause; :data:`BUSY_READ_DELAY_S` while
        events keep coming, shortened so that, at the last read's rate, the queue fills no more
        than :data:`QUEUE_SHARE` of its bound; never less than :data:`READ_DELAY_S`.
    """
    if events <= 0 or since_read_s > BUSY_WINDOW_S:
        return READ_DELAY_S
    rate_per_s = events / max(span_s, READ_DELAY_S)
    room_s = QUEUE_SHARE * max_queued / rate_per_s
    return max(READ_DELAY_S, min(BUSY_READ_DELAY_S, room_s))


def fold_repeats(events: Sequence[Any]) -> list[Any]:
    """One read's events with each file's repeated changes folded into its first one.

    A change (``IN_MODIFY``, ``IN_ATTRIB``) of a file already reported changed earlier in the
    same read says nothing more: the watcher looks at the file after the read, and once. Every
    other event is kept, in order, and ends the fold for its name: a change after a creation or
    a move of that name is reported again. Directory events are never folded.
    """
    out: list[Any] = []
    changed: set[tuple[int, str]] = set()
    for ev in events:
        mask = ev.mask
        if ev.name and not mask & IN_ISDIR:
            key = (ev.wd, ev.name)
            if mask & (IN_MODIFY | IN_ATTRIB) and not mask & ~(IN_MODIFY | IN_ATTRIB):
                if key in changed:
                    continue
                changed.add(key)
            else:
                changed.discard(key)
        out.append(ev)
    return out


def max_queued_events() -> int:
    """The kernel's bound on events queued per inotify descriptor (``max_queued_events``)."""
    try:
        with open("/proc/sys/fs/inotify/max_queued_events", "rb") as f:
            return max(1, int(f.read().strip()))
    except (OSError, ValueError):
        return DEFAULT_MAX_QUEUED_EVENTS


def inotify_available() -> bool:
    """Whether this observer can run here (Linux, with ``inotify_simple`` importable)."""
    if not os.uname().sysname == "Linux":
        return False
    try:
        import inotify_simple  # noqa: F401
    except ImportError:
        return False
    return True


def new_observer() -> Any:
    """The observer for the daemon's watches: this one on Linux, watchdog's elsewhere."""
    if inotify_available():
        return InotifyObserver()
    from watchdog.observers import Observer

    return Observer()


class InotifyObserver:
    """watchdog's observer interface (the part smoosh uses) over one inotify descriptor.

    The descriptor is opened by the first :meth:`schedule` (so running out of inotify
    instances shows there, as with watchdog: ``OSError`` with ``EMFILE``); its thread
    starts with :meth:`start`.

    Parameters:
        clock: monotonic seconds, for the hold of a move's first half (:data:`MOVE_PAIR_S`).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._inotify: Any = None
        self._watches: list[Watch] = []
        self._wd_dir: dict[int, str] = {}
        self._dir_wd: dict[str, int] = {}
        #: wd -> the live watches covering its directory (rebuilt when watches change).
        self._covering: dict[int, tuple[Watch, ...]] = {}
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        #: Callbacks for after the next read of the kernel queue (see after_drain); under the lock.
        self._after_read: list[Callable[[], None]] = []
        # Held by whoever reads the kernel queue and dispatches what it read: the thread, or an
        # after_drain that found it free. One read at a time keeps the events in the kernel's
        # order and never runs two handlers at once. Taken before the lock, never inside it.
        self._reading = threading.Lock()
        # Whether events may wait unread (see set_quiet); set by the owner, read by the thread.
        self._quiet: Callable[[], bool] = _never
        # The first halves of moves whose second has not been read yet: cookie -> (source path,
        # is a directory, hold ends at); in the order they were read (so by when their hold
        # ends). Under the lock; changed by the reader alone (one read at a time).
        self._held_moves: dict[int, tuple[str, bool, float]] = {}

    # -- watchdog's interface -------------------------------------------------------------

    def start(self) -> None:
        """Start the thread that reads events and calls the handlers."""
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="smoosh-inotify", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop reading: the thread ends at once (events not yet read are dropped)."""
        with self._lock:
            self._stopping = True
        self._wake()
        if self._thread is None:
            self._close()

    def join(self, timeout: float | None = STOP_TIMEOUT_S) -> None:
        """Wait for the thread to end."""
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def is_alive(self) -> bool:
        """Whether the thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def after_drain(self, callback: Callable[[], None]) -> bool:
        """Call ``callback`` once every event queued before now is handled.

        The kernel queue holds every event of writes made before this call. When no read is
        under way, the caller reads and dispatches it on its own thread and calls ``callback``
        (with any callbacks others asked for meanwhile) before returning: a compaction's end
        wakes no thread for its last events. When the observer's thread is reading, that read
        may have begun before those writes, so the thread is woken to read again and calls
        ``callback`` after it; at a stop, it is called all the same. Returns False, calling
        nothing, when the thread does not run. (A move's first half read without its second
        may still be held then: a move is no write of a compaction's.)
        """
        with self._lock:
            if self._thread is None or self._stopping:
                return False
        if self._reading.acquire(blocking=False):
            try:
                after, _ = self._read_queue()
            finally:
                self._reading.release()
            after.append(callback)
            self._call(after)
            return True
        with self._lock:
            self._after_read.append(callback)
        self._wake()
        return True

    def set_quiet(self, quiet: Callable[[], bool]) -> None:
        """While ``quiet()`` is True, events may wait unread: the thread reads the queue when
        woken (a stop, a schedule, :meth:`after_drain`) or :data:`QUIET_READ_S` after its last
        read, not at each event. A bounded wait that finds nothing to read ends the quiet spell
        until the next event: a compaction that writes nothing (held) costs no periodic wake-up.
        An event that ends a wait begun while ``quiet()`` was False is left unread too when
        ``quiet()`` is True by then: the compaction that started meanwhile wrote it.

        For the daemon, ``quiet`` is "a compaction of this process runs, or its slot is promised
        to one about to start" (so a drain stays quiet from one compaction to the next): nearly
        every event then is that compaction's own write, which the watcher drops, and its end
        calls :meth:`after_drain`, which reads what it queued in one go, on its own thread.
        Called by the observer's owner (one predicate: the last one set holds); ``quiet`` is
        called on the observer's thread, before each wait, and must not block.
        """
        self._quiet = quiet

    def schedule(
        self, event_handler: Any, path: str, recursive: bool = False, event_filter: Sequence[type] | None = None
    ) -> Watch:
        """Watch ``path`` (and, if ``recursive``, every directory below it) for ``event_handler``.

        Parameters:
            event_handler: has ``dispatch(event)``; optionally ``on_overflow()``, and
                ``ignores(path) -> bool``, asked under the observer's lock on the thread that
                reads the events (so it must not block or call the observer) before a file's
                creation or change is built into an event.
            path: an existing directory.
            recursive: watch the tree below it too.
            event_filter: the watchdog event classes wanted (None: created, modified,
                moved, deleted and closed, files and directories).

        Raises:
            OSError: the directory cannot be watched (missing; inotify's limits: ENOSPC for
                watches, EMFILE for instances).
        """
        watch = Watch(path=os.fsdecode(path), is_recursive=recursive, handler=event_handler, mask=mask_of(event_filter),
                      ignores=getattr(event_handler, "ignores", None))
        with self._lock:
            if self._inotify is None:
                from inotify_simple import INotify

                self._inotify = INotify(nonblocking=True)
                self._wake()  # the thread, if started, polls the new descriptor from now on
            self._watches.append(watch)
            try:
                self._add_tree(watch.path, recursive)
            except OSError:
                # The directories it did watch go too (out of watches: they count against the limit).
                self._watches.remove(watch)
                self._drop_uncovered()
                self._refresh_covering()
                raise
            self._refresh_covering()
        return watch

    def unschedule(self, watch: Any) -> None:
        """Stop delivering ``watch``'s events; directories no watch covers any more are dropped.

        Raises:
            KeyError: ``watch`` is not scheduled here (as watchdog raises).
        """
        with self._lock:
            if watch not in self._watches:
                raise KeyError(watch)
            self._watches.remove(watch)
            watch.alive = False
            self._drop_uncovered()
            self._refresh_covering()

    def unschedule_all(self) -> None:
        """Unschedule every watch."""
        with self._lock:
            for watch in self._watches:
                watch.alive = False
            self._watches.clear()
            self._drop_uncovered()
            self._refresh_covering()

    def is_watching(self, watch: Any) -> bool:
        """Whether ``watch`` is scheduled and its root still watched (not deleted or moved away)."""
        with self._lock:
            return watch in self._watches and watch.alive

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass  # already woken (the pipe is full) or closed: the thread ends or reads anyway

    def is_watching_dir(self, directory: str) -> bool:
        """Whether ``directory`` (a path as events name it) has a watch of its own now."""
        with self._lock:
            return directory in self._dir_wd

    # -- watches (under the lock) ---------------------------------------------------------

    def _mask_for(self, directory: str) -> int:
        mask = SELF_EVENTS
        for watch in self._watches:
            if watch.alive and watch.covers(directory):
                mask |= watch.mask | (TREE_EVENTS if watch.is_recursive else 0)
        return mask

    def _add_dir(self, directory: str) -> int:
        wd: int = self._inotify.add_watch(directory, self._mask_for(directory) | ADD_FLAGS)
        old = self._wd_dir.get(wd)
        if old is not None and old != directory:
            self._dir_wd.pop(old, None)  # the same directory, reached by a new name
        self._wd_dir[wd] = directory
        self._dir_wd[directory] = wd
        return wd

    def _add_tree(self, root: str, recursive: bool) -> list[str]:
        """Watch ``root`` (and, recursively, its subdirectories); the files found below it.

        A subdirectory that cannot be watched is skipped with the tree below it and named once
        (:func:`_skipped`): a chain deeper than the path limit, or one directory without
        permission, costs its own files, never the root's events.

        Raises:
            OSError: ``root`` itself cannot be watched, or inotify's limits ran out (ENOSPC,
                EMFILE) on any directory.
        """
        self._add_dir(root)
        files: list[str] = []
        if not recursive:
            return files
        for dirpath, dirnames, filenames in os.walk(root, onerror=None, followlinks=False):
            files.extend(os.path.join(dirpath, name) for name in filenames)
            watched: list[str] = []
            for name in dirnames:
                sub = os.path.join(dirpath, name)
                try:
                    self._add_dir(sub)
                except OSError as e:
                    if e.errno in _LIMIT_ERRNOS:
                        raise
                    _skipped(dirpath, sub, e)
                    continue
                watched.append(name)
            dirnames[:] = watched  # the walk goes no further into what is not watched
        return files

    def _forget_tree(self, directory: str) -> None:
        prefix = directory.rstrip("/") + "/"
        for path in [p for p in self._dir_wd if p == directory or p.startswith(prefix)]:
            wd = self._dir_wd.pop(path)
            self._wd_dir.pop(wd, None)
            try:
                self._inotify.rm_watch(wd)
            except OSError:
                pass  # already gone with its directory
        self._refresh_covering()

    def _drop_uncovered(self) -> None:
        for path in list(self._dir_wd):
            if not any(w.alive and w.covers(path) for w in self._watches):
                wd = self._dir_wd.pop(path)
                self._wd_dir.pop(wd, None)
                try:
                    self._inotify.rm_watch(wd)
                except OSError:
                    pass

    def _refresh_covering(self) -> None:
        self._covering = {
            wd: tuple(w for w in self._watches if w.alive and w.covers(d)) for wd, d in self._wd_dir.items()
        }

    # -- the thread -------------------------------------------------------------------------

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        # The wake-up pipe alone: a quiet wait, which events do not end (see set_quiet).
        woken_only = select.poll()
        woken_only.register(self._wake_r, select.POLLIN)
        registered = False
        # A quiet wait that ended on its bound with nothing to read: nothing is being written
        # (a compaction held at a chunk boundary, say), so there is no burst to gather, and
        # the thread waits for events again until one comes (no wake-up every QUIET_READ_S).
        quiet_idle = False
        # What the last read found, for the next gather (gather_s): its events, the span they
        # gathered over, when it ended. The span starts at the wake-up the first of them caused
        # (or at the read before, when none woke the thread): measured from the read before
        # alone, an idle minute would spread a burst's events over it, and a rate so low would
        # let the next gather run long enough to fill the kernel queue. On the monotonic clock:
        # a gather is a real wait.
        last_events, last_span_s, last_read_at = 0, 0.0, time.monotonic()
        max_queued = max_queued_events()
        try:
            while True:
                with self._lock:
                    if self._stopping:
                        return
                    inotify = self._inotify
                if inotify is not None and not registered:
                    poller.register(inotify.fileno(), select.POLLIN)
                    registered = True
                # Blocks until events or a wake-up (a stop, the first schedule, after_drain):
                # an idle daemon's watches cost no wakeups. While quiet, events wait for a
                # wake-up or the bound: a compaction's end reads its events in one go.
                try:
                    quiet = self._quiet() and not quiet_idle
                except Exception:
                    log.exception("the observer's quiet predicate failed")
                    quiet = False
                timed_out = False
                # A move's first half held for its second: read again when its hold ends.
                hold_ms = self._hold_ms()
                if quiet and registered:
                    bound_ms = QUIET_READ_S * 1000 if hold_ms is None else min(QUIET_READ_S * 1000, hold_ms)
                    timed_out = not woken_only.poll(bound_ms)
                else:
                    ready = poller.poll(hold_ms)
                    quiet = False
                    if registered and not quiet_idle and not any(fd == self._wake_r for fd, _ in ready):
                        # Only events, and a compaction may have started since the wait began (the
                        # wait began between two compactions): they are most likely its own writes,
                        # which its end reads in one go with the rest, instead of a read now and
                        # another at its end.
                        try:
                            if self._quiet():
                                continue
                        except Exception:
                            pass  # the predicate's failure was logged before the wait
                try:
                    os.read(self._wake_r, 64)
                except BlockingIOError:
                    pass
                gathered_from = last_read_at
                if not quiet and inotify is not None:
                    # An event woke it: let the rest of its burst gather, longer while the
                    # application keeps writing. A wake-up (a stop, an after_drain) ends the
                    # gather; a quiet wait ended when the burst was over (a compaction's end)
                    # or long after.
                    now = gathered_from = time.monotonic()
                    wait_s = gather_s(last_events, last_span_s, now - last_read_at, max_queued)
                    if woken_only.poll(wait_s * 1000):
                        try:
                            os.read(self._wake_r, 64)
                        except BlockingIOError:
                            pass
                after: list[Callable[[], None]] = []
                try:
                    with self._reading:
                        after, read = self._read_queue()
                    if read is not None:
                        quiet_idle = timed_out and read == 0
                        now = time.monotonic()
                        last_events, last_span_s, last_read_at = read, now - gathered_from, now
                finally:
                    self._call(after)
        finally:
            self._close()

    def _hold_ms(self) -> int | None:
        """Milliseconds until the earliest held move's hold ends (None: none is held)."""
        with self._lock:
            if not self._held_moves:
                return None
            until = next(iter(self._held_moves.values()))[2]
        return max(0, math.ceil((until - self._clock()) * 1000))

    def _read_queue(self) -> tuple[list[Callable[[], None]], int | None]:
        """Under ``_reading``: the callbacks asked for until now, and how many events the kernel
        queue held, read and dispatched now (None: no descriptor yet).

        The callbacks are taken before the read: every event queued before one was asked for is
        in this read or an earlier one. The descriptor is taken with them: one the first schedule
        opened while the thread slept must be read now, or its callbacks would run before the
        events queued ahead of them.
        """
        with self._lock:
            after, self._after_read = self._after_read, []
            inotify = self._inotify
        return after, (self._read_and_handle(inotify) if inotify is not None else None)

    def _read_and_handle(self, inotify: Any) -> int:
        """Read the kernel queue and dispatch it; how many events it held."""
        try:
            events = inotify.read(timeout=0)
        except OSError as e:
            log.error("reading inotify events failed: %s; relying on rescans", e)
            return 0
        try:
            self._handle(fold_repeats(events))
        except Exception:
            log.exception("handling inotify events failed")
        return len(events)

    @staticmethod
    def _call(callbacks: list[Callable[[], None]]) -> None:
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("an after_drain callback failed")

    def _close(self) -> None:
        # After any read under way: an after_drain's read must not meet a closed descriptor,
        # or another file's that reused its number.
        with self._reading, self._lock:
            inotify, self._inotify = self._inotify, None
            self._wd_dir.clear()
            self._dir_wd.clear()
            self._covering = {}
            self._held_moves.clear()
            after, self._after_read = self._after_read, []
        self._call(after)  # no more events will come: nothing is left to wait for
        if inotify is not None:
            inotify.close()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._wake_r = self._wake_w = -1

    def _handle(self, events: Sequence[Any]) -> None:
        """Turn one read's events into watchdog events, then dispatch them outside the lock.

        Moves pair with first halves held from earlier reads; a first half whose hold has ended
        unpaired is reported as a deletion here, after this read's events (see the module
        docstring). Called by the reader alone (one read at a time).
        """
        out: list[tuple[Watch, FileSystemEvent]] = []
        overflow = False
        with self._lock:
            now = self._clock()
            moves = self._held_moves  # cookie -> (source path, is a directory, hold ends at)
            for ev in events:
                mask = ev.mask
                if mask & IN_Q_OVERFLOW:
                    overflow = True
                    continue
                directory = self._wd_dir.get(ev.wd)
                if directory is None:
                    continue  # a watch removed since the kernel queued this
                if mask & (IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF):
                    self._lost_dir(ev.wd, directory, moved=bool(mask & IN_MOVE_SELF))
                    continue
                path = os.path.join(directory, ev.name) if ev.name else directory
                is_dir = bool(mask & IN_ISDIR)
                watches = self._covering.get(ev.wd, ())
                if mask & IN_MOVED_FROM:
                    moves.pop(ev.cookie, None)  # kept in the order of their holds' ends
                    moves[ev.cookie] = (path, is_dir, now + MOVE_PAIR_S)
                    if is_dir:
                        self._forget_tree(path)  # watched again under its new name, if that is inside
                    continue
                src = moves.pop(ev.cookie, None) if mask & IN_MOVED_TO else None
                # What a watch must have asked for to get it: a move whose source is unknown
                # is a creation here.
                wanted = (IN_MOVE | IN_CREATE if src is not None else IN_CREATE) if mask & IN_MOVED_TO else mask
                if is_dir and mask & (IN_CREATE | IN_MOVED_TO):
                    # Its files may have been written before its watch existed: report them.
                    for f in self._appeared_dir(path):
                        out.extend((w, FileCreatedEvent(f)) for w in self._covering_dir(path) if w.mask & IN_CREATE)
                for w in watches:
                    if not wanted & w.mask:
                        continue
                    if src is not None and w.mask & IN_MOVE == IN_MOVE:
                        out.append((w, (DirMovedEvent if is_dir else FileMovedEvent)(src[0], path)))
                    elif src is not None:  # asked for creations only: renamed into place is one
                        out.append((w, (DirCreatedEvent if is_dir else FileCreatedEvent)(path)))
                    elif is_dir or w.ignores is None or not _ignored(w.ignores, path):
                        event = _event(mask, is_dir, path)
                        if event is not None:
                            out.append((w, event))
            while moves:  # moved out of every watched directory: no second half came in time
                cookie, (src_path, is_dir, until) = next(iter(moves.items()))
                if until > now:
                    break
                del moves[cookie]
                for w in self._covering_dir(os.path.dirname(src_path)):
                    if w.mask & IN_DELETE:
                        out.append((w, (DirDeletedEvent if is_dir else FileDeletedEvent)(src_path)))
            handlers = {id(w.handler): w.handler for w in self._watches} if overflow else {}
        for watch, event in out:
            if not watch.alive:
                continue
            try:
                watch.handler.dispatch(event)
            except Exception:
                log.exception("a file-system event handler failed on %r", event)
        for handler in handlers.values():
            on_overflow = getattr(handler, "on_overflow", None)
            if on_overflow is not None:
                try:
                    on_overflow()
                except Exception:
                    log.exception("an overflow handler failed")

    def _covering_dir(self, directory: str) -> tuple[Watch, ...]:
        return tuple(w for w in self._watches if w.alive and w.covers(directory))

    def _appeared_dir(self, path: str) -> list[str]:
        """A directory appeared inside the watched trees: watch it if a recursive watch covers it."""
        if not any(w.alive and w.is_recursive and w.covers(path) for w in self._watches):
            return []
        try:
            found = self._add_tree(path, True)
        except OSError as e:
            self._refresh_covering()
            if e.errno not in _LIMIT_ERRNOS:
                _skipped(os.path.dirname(path), path, e)
            else:
                # Out of watches: the trees covering it are no longer watched whole. Their
                # owner sees is_watching() False and schedules again (falling back to polling).
                log.error("cannot watch new directory %s: %s", path, e)
                for w in self._covering_dir(path):
                    w.alive = False
                self._refresh_covering()
            return []
        self._refresh_covering()
        return found

    def _lost_dir(self, wd: int, directory: str, *, moved: bool) -> None:
        """A watched directory was deleted or moved away: its watch (and a root's) ends."""
        for w in self._watches:
            if w.alive and w.path == directory:
                w.alive = False  # the owner re-watches the path when a directory is back there
        if moved:
            self._forget_tree(directory)  # the kernel would go on watching it under its new name
        elif self._dir_wd.get(directory) == wd:
            del self._dir_wd[directory]
        self._wd_dir.pop(wd, None)
        self._refresh_covering()


def _never() -> bool:
    return False


def _skipped(parent: str, directory: str, error: OSError) -> None:
    """``directory`` (in ``parent``) could not be watched for ``error``: named once, unless it is gone."""
    if error.errno in _GONE_ERRNOS:
        return  # deleted, or replaced by a file, as it was watched: nothing to watch
    say_once(too_deep(parent) if error.errno == errno.ENAMETOOLONG else unreadable(directory, error))


def _ignored(ignores: Callable[[str], bool], path: str) -> bool:
    """A handler's ``ignores(path)``; one that fails keeps the event (logged), and the rest of the read goes on."""
    try:
        return bool(ignores(path))
    except Exception:
        log.exception("an event handler's ignores() failed on %r", path)
        return False


def _event(mask: int, is_dir: bool, path: str) -> FileSystemEvent | None:
    if mask & (IN_CREATE | IN_MOVED_TO):  # moved in from outside the watched trees: new here
        return DirCreatedEvent(path) if is_dir else FileCreatedEvent(path)
    if mask & (IN_MODIFY | IN_ATTRIB):
        return DirModifiedEvent(path) if is_dir else FileModifiedEvent(path)
    if mask & IN_DELETE:
        return DirDeletedEvent(path) if is_dir else FileDeletedEvent(path)
    if mask & IN_CLOSE_WRITE:
        return None if is_dir else FileClosedEvent(path)
    return None
