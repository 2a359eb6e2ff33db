"""The watches on the watched roots: one watchdog observer, a watch per root, and the fallback.

It knows which watched directories are present (by device and inode, so a directory deleted
and made again is noticed), warns once about a missing one, and re-watches a replaced one.
When inotify's limits run out it falls back to watchdog's PollingObserver over the same
roots, with one ERROR line naming the sysctl to raise. watchdog's observers report a kernel
queue overflow only in two log records: :data:`watchdog_overflows` turns them into a rescan
by every started watcher (smoosh's own observer calls the handler's ``on_overflow``).

Owner: the :class:`~smoosh.daemon.watch.watcher.Watcher`; it calls every method under its lock.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import weakref
from typing import Any, Callable

from watchdog.events import (
    DirMovedEvent,
    FileCreatedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEventHandler,
)

from smoosh.daemon.watch.scan import WatchEntry, watch_roots

__all__ = ["WatchedRoots", "watchdog_overflows", "ROOT_CHECK_INTERVAL_S", "POLL_INTERVAL_S", "INOTIFY_LIMIT_ERRNOS", "EVENT_FILTER"]

log = logging.getLogger("smoosh.daemon.watch.watcher")  # one logger for the watcher's lines

#: Seconds between checks for watched directories that are missing, deleted or replaced.
ROOT_CHECK_INTERVAL_S = 5.0
#: Seconds between two polls of the PollingObserver (network filesystems, inotify exhausted).
POLL_INTERVAL_S = 1.0
#: Seconds a stop waits for an observer thread of its own.
STOP_TIMEOUT_S = 5.0
#: errno values meaning the inotify limits are exhausted: ENOSPC (watches), EMFILE (instances).
INOTIFY_LIMIT_ERRNOS = frozenset({errno.ENOSPC, errno.EMFILE})
#: The watchdog events the watcher asks for; also narrows the inotify mask (fewer queued events).
#: Not "closed": a file written and closed has sent "modified" already (a truncation too), so
#: a close would only add an event per descriptor, smoosh's own compactions' included.
EVENT_FILTER = [FileCreatedEvent, FileModifiedEvent, FileMovedEvent, DirMovedEvent]


#: The loggers through which watchdog reports a kernel queue overflow, and the message prefix.
_WATCHDOG_OVERFLOW_LOGGERS = ("watchdog.observers.inotify_c", "watchdog.observers.inotify")
_WATCHDOG_OVERFLOW_PREFIX = "Inotify queue overflowed"


class OverflowFilter(logging.Filter):
    """Turns watchdog's two warnings per inotify overflow into a rescan by every live watcher (it calls their ``overflowed()``).

    watchdog offers no callback for an overflow, only these log records. Installed once per
    process on watchdog's loggers; watchers register while started. Runs on watchdog's
    thread: it only flags the watchers, which scan on their own threads.
    """

    def __init__(self) -> None:
        super().__init__()
        self.watchers: weakref.WeakSet[Any] = weakref.WeakSet()

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(_WATCHDOG_OVERFLOW_PREFIX):
            return True
        if record.name == _WATCHDOG_OVERFLOW_LOGGERS[0]:  # once per overflow, not once per watch
            for watcher in list(self.watchers):
                watcher.overflowed()
        return False


#: The process's one filter; a started watcher adds itself to ``watchdog_overflows.watchers``.
watchdog_overflows = OverflowFilter()
for _name in _WATCHDOG_OVERFLOW_LOGGERS:
    logging.getLogger(_name).addFilter(watchdog_overflows)


class WatchedRoots:
    """The observer and its watches (see the module docstring).

    Parameters:
        handler: receives every event of every watch.
        polling: use the PollingObserver from the start (network filesystems).
        shared_observer: a started observer to schedule on (shared with the config watcher),
            or None for one of its own. A shared one is never stopped here.
    """

    def __init__(self, handler: FileSystemEventHandler, *, polling: bool, shared_observer: Any) -> None:
        self._handler = handler
        self.polling = polling
        self._shared_observer = shared_observer
        self._observer: Any = None
        self._watches: dict[str, Any] = {}  # root -> watchdog ObservedWatch
        #: root -> (st_dev, st_ino) of the directories seen present at the last check.
        self._present: dict[str, tuple[int, int]] = {}
        self._missing_warned: set[str] = set()
        #: root -> errno of the failure last said for it (a root that cannot be watched is tried
        #: again at every check, and said again only when the reason changes or it was watched).
        self._unwatchable_said: dict[str, int | None] = {}
        self._entries: tuple[WatchEntry, ...] = ()

    def start(self) -> None:
        """Take the shared observer, or start one of our own (polling if inotify is exhausted).

        Raises:
            OSError: the observer could not start, for another reason than inotify's limits.
        """
        if self._shared_observer is not None and not self.polling:
            self._observer = self._shared_observer
            return
        self._observer = self._new_observer()
        try:
            self._observer.start()
        except OSError as e:
            if e.errno not in INOTIFY_LIMIT_ERRNOS or self.polling:
                raise
            self._fall_back_to_polling(e, "starting the observer")

    def detach(self) -> Callable[[float], None]:
        """Forget the observer and its watches; returns the release to run outside the lock.

        The release unschedules the watches from a shared observer (its owner stops it) or
        stops an observer of our own, waiting up to the seconds it is given.
        """
        observer, self._observer = self._observer, None
        watches = list(self._watches.values())
        self._watches.clear()

        def release(timeout_s: float) -> None:
            if observer is None:
                return
            if observer is self._shared_observer:
                _unschedule_all(observer, watches)
                return
            observer.stop()
            if observer.is_alive():
                observer.join(timeout_s)

        return release

    def after_drain(self, callback: Callable[[], None]) -> bool:
        """Run ``callback`` once the events queued so far are handled (smoosh's inotify observer
        only: see :meth:`~smoosh.daemon.watch.inotify.InotifyObserver.after_drain`); False when the
        observer cannot tell (watchdog's, polling, none), and nothing is called."""
        observer = self._observer
        after_drain = getattr(observer, "after_drain", None)
        return bool(after_drain(callback)) if after_drain is not None else False

    def refresh(self, entries: tuple[WatchEntry, ...]) -> list[str]:
        """(Re)schedule a watch per root of ``entries``; return the roots that newly appeared.

        A root that was deleted or replaced (another inode) loses its watch (inotify and the
        poller both stop watching a deleted directory) and gets a new one when it is back.
        """
        self._entries = entries
        wanted = watch_roots(entries)
        appeared: list[str] = []
        for root in list(self._watches):
            if root not in wanted:
                self._unschedule(root)
        for root in [r for r in self._present if r not in wanted]:
            del self._present[root]
        for root, recursive in wanted.items():
            ident = _dir_identity(root)
            if ident is None:
                if root in self._present:
                    del self._present[root]
                    log.warning("watched directory %s disappeared; watching it again when it reappears", root)
                elif root not in self._missing_warned:
                    log.warning(
                        "watched directory %s does not exist; checking for it every %.0f s",
                        root,
                        ROOT_CHECK_INTERVAL_S,
                    )
                self._missing_warned.add(root)
                self._unschedule(root)
                continue
            known = self._present.get(root)
            self._present[root] = ident
            if known is None and root in self._missing_warned:
                log.info("watched directory %s appeared; watching and scanning it", root)
                self._missing_warned.discard(root)
                appeared.append(root)
            elif known is not None and known != ident:
                log.info("watched directory %s was replaced; watching and scanning it again", root)
                self._unschedule(root)
                appeared.append(root)
            if self._observer is not None and not self._watch_alive(root, recursive):
                self._unschedule(root)
                self._schedule(root, recursive)
        return appeared

    def _new_observer(self) -> Any:
        if self.polling:
            from watchdog.observers.polling import PollingObserver

            return PollingObserver(timeout=POLL_INTERVAL_S)
        from smoosh.daemon.watch.inotify import new_observer

        return new_observer()

    def _watch_alive(self, root: str, recursive: bool) -> bool:
        watch = self._watches.get(root)
        if watch is None or watch.is_recursive != recursive:
            return False
        is_watching = getattr(self._observer, "is_watching", None)
        if is_watching is not None:  # smoosh's inotify observer
            return bool(is_watching(watch))
        return any(e.watch == watch and e.is_alive() for e in list(self._observer.emitters))

    def _schedule(self, root: str, recursive: bool) -> None:
        try:
            self._watches[root] = self._observer.schedule(
                self._handler, root, recursive=recursive, event_filter=EVENT_FILTER
            )
        except OSError as e:
            if e.errno in INOTIFY_LIMIT_ERRNOS and not self.polling:
                self._fall_back_to_polling(e, f"watching {root}")
            elif root not in self._unwatchable_said or self._unwatchable_said[root] != e.errno:
                # Tried again at every root check: said once per reason, not every few seconds.
                self._unwatchable_said[root] = e.errno
                log.warning("cannot watch %s: %s; relying on rescans for it", root, e)
        else:
            self._unwatchable_said.pop(root, None)

    def _unschedule(self, root: str) -> None:
        watch = self._watches.pop(root, None)
        if watch is not None and self._observer is not None:
            _unschedule_all(self._observer, [watch])

    def _fall_back_to_polling(self, error: OSError, doing: str) -> None:
        """Replace the inotify observer by a PollingObserver over the same roots."""
        instances = error.errno == errno.EMFILE
        limit = "fs.inotify.max_user_instances" if instances else "fs.inotify.max_user_watches"
        log.error(
            "inotify limit reached while %s (%s): raise fs.inotify.max_user_watches (watches) or "
            "fs.inotify.max_user_instances (instances), e.g. `sysctl -w %s=524288`; falling back "
            "to polling every %.0f s, which costs a walk of the watched trees per poll",
            doing,
            error,
            limit,
            POLL_INTERVAL_S,
        )
        old = self._observer
        self.polling = True
        watches = list(self._watches.values())
        self._watches.clear()
        if old is not None and old is self._shared_observer:
            _unschedule_all(old, watches)  # shared with the config watcher: leave it running
        elif old is not None:
            try:
                old.unschedule_all()
                if old.is_alive():
                    old.stop()
                    old.join(STOP_TIMEOUT_S)
            except Exception:
                log.exception("could not stop the inotify observer")
        self._observer = self._new_observer()
        self._observer.start()
        for root, recursive in watch_roots(self._entries).items():
            if root in self._present or _dir_identity(root) is not None:
                self._schedule(root, recursive)


def _unschedule_all(observer: Any, watches: list[Any]) -> None:
    for watch in watches:
        try:
            observer.unschedule(watch)
        except (KeyError, OSError):
            pass  # the emitter already stopped itself (its directory was deleted)


def _dir_identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None
