"""Reload the config file when it changes: watchdog on its directory, debounced.

Editors save by writing a temporary file and renaming it over the original, so a watch on
the file itself goes dead after the first save (watchexec#179). The directory is watched
instead, and any created / modified / moved / deleted / closed-after-write event whose path
or destination is the config file counts as an edit. The reload runs ``settle_s`` after the
last such event, so a save made of several events reloads once, after it is complete.

An invalid edit (empty, unreadable, a bad value) is delivered as the ``ConfigError``: the
caller keeps the config it has. The debounce is a steppable core (``note_event(now)`` /
``tick(now)``) so tests drive it with a fake clock; ``start()`` adds the real observer and a
thread that ticks it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from smoosh.config import Config, load_config
from smoosh.errors import ConfigError

__all__ = ["ConfigWatcher", "DEFAULT_SETTLE_S"]

log = logging.getLogger(__name__)

#: Seconds of quiet after the last event on the config file before it is reloaded.
DEFAULT_SETTLE_S = 0.5

#: watchdog event types that can mean new content. Opened / closed-without-write are left
#: out on purpose: our own read of the file produces them, and counting them would reload
#: forever. Attribute changes are left out for the same reason (atime).
EDIT_EVENT_TYPES = frozenset({"created", "modified", "moved", "deleted", "closed"})


class ConfigWatcher:
    """Watches one config file and reports each settled change to ``on_change``.

    Parameters
    ----------
    path:
        The config file.
    on_change:
        Called with the new ``Config``, or the ``ConfigError`` of an invalid edit. Runs on
        the watcher's thread (or the caller's, for ``tick``/``reload_now``); an exception
        from it is logged and the watcher goes on.
    settle_s:
        Quiet time after the last event before reloading.
    clock:
        Monotonic seconds; injected so tests can step the debounce.
    """

    def __init__(
        self,
        path: str,
        on_change: Callable[[Config | ConfigError], None],
        *,
        settle_s: float = DEFAULT_SETTLE_S,
        clock: Callable[[], float] = time.monotonic,
        on_edit: Callable[[], None] = lambda: None,
    ) -> None:
        self.path = os.path.abspath(path)
        self.directory = os.path.dirname(self.path)
        self.settle_s = settle_s
        self._on_change = on_change
        self._on_edit = on_edit
        self._clock = clock
        self._cond = threading.Condition()
        self._due: float | None = None
        self._stopping = False
        self._observer: Any = None
        self._owns_observer = False
        self._watch: Any = None
        self._thread: threading.Thread | None = None
        #: Reloads delivered so far (for status and tests).
        self.reloads = 0

    # ------------------------------------------------------------ steppable core

    def note_event(self, now: float) -> None:
        """Record an edit at ``now``: the reload moves to ``now + settle_s``."""
        with self._cond:
            self._due = now + self.settle_s
            self._cond.notify_all()
        self._on_edit()

    def next_due(self) -> float | None:
        """When the pending edit settles (None: no edit pending)."""
        with self._cond:
            return self._due

    @property
    def pending(self) -> bool:
        """True while an edit is waiting for its settle time."""
        with self._cond:
            return self._due is not None

    def tick(self, now: float) -> bool:
        """Reload if the last edit has settled by ``now``.

        Parameters
        ----------
        now:
            The current time on the watcher's clock.

        Returns
        -------
        True when a reload was delivered.
        """
        with self._cond:
            if self._due is None or now < self._due:
                return False
            self._due = None
        self.reload_now()
        return True

    def reload_now(self) -> Config | ConfigError:
        """Load the file now and deliver the result (SIGHUP); also returns it.

        Returns
        -------
        The new Config, or the ConfigError that rejected the edit.
        """
        result: Config | ConfigError
        try:
            result = load_config(self.path)
        except ConfigError as exc:
            result = exc
        self.reloads += 1
        try:
            self._on_change(result)
        except Exception:
            log.exception("config change handler failed for %s", self.path)
        return result

    def is_edit(self, event: Any) -> bool:
        """Whether a watchdog event touches the config file in a way that can change it."""
        if getattr(event, "is_directory", False) or event.event_type not in EDIT_EVENT_TYPES:
            return False
        paths = [event.src_path, getattr(event, "dest_path", "") or ""]
        return any(p and os.path.abspath(os.fsdecode(p)) == self.path for p in paths)

    def on_event(self, event: Any) -> None:
        """watchdog callback: note an edit of the config file."""
        if self.is_edit(event):
            log.debug("config file event %s on %s", event.event_type, self.path)
            self.note_event(self._clock())

    # ------------------------------------------------------------ threads

    def start(self, *, ticker: bool = True, observer: Any = None) -> None:
        """Start watching. If the directory cannot be watched (inotify limits), log it and
        rely on SIGHUP; the daemon does not fail for it.

        Parameters
        ----------
        ticker:
            Also start the thread that reloads once an edit has settled. An owner that
            ticks the watcher from its loop, and tests stepping ``tick(now)``, pass False.
        observer:
            A started watchdog observer to schedule the watch on (the daemon shares one);
            None starts one of its own.
        """
        from watchdog.events import FileSystemEventHandler

        from smoosh.daemon.watch.inotify import new_observer

        watcher = self

        class _Handler(FileSystemEventHandler):
            def on_any_event(self, event: Any) -> None:
                watcher.on_event(event)

        with self._cond:
            self._stopping = False
        if ticker:
            self._thread = threading.Thread(target=self._run, name="smoosh-config-watch", daemon=True)
            self._thread.start()
        shared = observer is not None
        observer = observer if shared else new_observer()
        try:
            self._watch = observer.schedule(_Handler(), self.directory, recursive=False)
            if not shared:
                observer.start()
        except OSError as exc:
            log.warning("cannot watch %s for config edits (%s); send SIGHUP to reload", self.directory, exc)
            return
        self._observer = observer
        self._owns_observer = not shared

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the observer and the tick thread; a pending reload is dropped."""
        observer, self._observer = self._observer, None
        if observer is not None and not self._owns_observer:
            try:
                observer.unschedule(self._watch)
            except (KeyError, OSError):
                pass
        elif observer is not None:
            observer.stop()
            observer.join(timeout_s)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and (self._due is None or self._clock() < self._due):
                    delay = None if self._due is None else self._due - self._clock()
                    self._cond.wait(delay)
                if self._stopping:
                    return
            try:
                self.tick(self._clock())
            except Exception:  # never let one bad reload end live reloading
                log.exception("config reload of %s failed", self.path)
