"""A small pool of threads taking items in arrival order, with threads only while there is work.

``concurrent.futures.ThreadPoolExecutor`` allocates a ``Future`` (with its own
``Condition``, lock and waiter deque) and a work item per call; at start-up the watcher
hands the server every database of the fleet within a second, so a large fleet held tens of
megabytes of futures nobody ever waited on. Here a waiting item costs one slot in a deque.

Threads start when items arrive and end after ``idle_exit_s`` without work, so an idle
daemon keeps none of them (DESIGN §9: an idle daemon runs about a dozen threads).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Callable, Generic, TypeVar

__all__ = ["KeyPool", "DEFAULT_IDLE_EXIT_S"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds a pool thread waits for work before it ends.
DEFAULT_IDLE_EXIT_S = 30.0


class KeyPool(Generic[T]):
    """Runs ``fn(item)`` for every submitted item on up to ``threads`` daemon threads, FIFO.

    Parameters:
        fn: called once per submitted item; an exception is logged and the thread goes on.
        threads: how many items are worked on at once, at most.
        name: thread name prefix.
        idle_exit_s: seconds a thread waits for an item before it ends.
        on_idle: called (outside the pool's lock) by a thread that found no item; returns
            the seconds after which to call it again if still no item comes, or None.
        after_item: called (outside the pool's lock) by a thread after each item it worked on,
            before it takes the next. An item submitted meanwhile waits for that thread
            instead of waking another one: what ``after_item`` submits, its thread runs next.
    """

    def __init__(
        self, fn: Callable[[T], None], threads: int, name: str, *, idle_exit_s: float = DEFAULT_IDLE_EXIT_S,
        on_idle: Callable[[], float | None] | None = None, after_item: Callable[[], None] | None = None,
    ) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, not {threads!r}")
        self._fn = fn
        self._n = threads
        self._name = name
        self._idle_exit_s = idle_exit_s
        self._on_idle = on_idle
        self._after_item = after_item
        self._items: deque[T] = deque()
        self._cond = threading.Condition()
        self._stopped = False
        self._draining = False  # refuse new items, finish queued ones, then end
        self._running = 0  # threads alive
        self._idle = 0  # threads waiting for an item
        self._after = 0  # threads in after_item: each takes an item as it returns, unwoken
        # Pool threads inside expect(), by ident: how many items each submitted meanwhile.
        self._expecting: dict[int, int] = {}
        self._serial = 0

    def start(self) -> None:
        """Accept items (threads start with the first ones)."""
        with self._cond:
            self._stopped = False

    def submit(self, item: T) -> bool:
        """Queue ``item``; False when the pool is stopped (the item is not queued)."""
        with self._cond:
            if self._stopped or self._draining:
                return False
            self._items.append(item)
            expecting = self._expecting.get(threading.get_ident())
            if expecting is not None:
                self._expecting[threading.get_ident()] = expecting + 1  # its own thread takes it (expect)
            else:
                self._place_locked()
        return True

    def _place_locked(self) -> None:
        """Find a thread for the items waiting beyond those the expecting threads take (under the lock)."""
        if len(self._items) <= self._after:
            pass  # a thread in after_item takes it next (a wake-up spared, a thread not started)
        elif self._idle:
            self._cond.notify()
        elif self._running < self._n:
            self._running += 1
            self._serial += 1
            threading.Thread(target=self._run, name=f"{self._name}_{self._serial}", daemon=True).start()

    def expect(self) -> None:
        """On a pool thread inside its item: an item this thread submits until :meth:`unexpect` waits
        for it, as one submitted during ``after_item`` does (its item may be about to end)."""
        with self._cond:
            self._expecting[threading.get_ident()] = 0

    def unexpect(self, returning: bool) -> None:
        """End :meth:`expect`. ``returning``: the thread's item ends now, and it takes what it
        submitted meanwhile; otherwise other threads are found for those items."""
        with self._cond:
            held = self._expecting.pop(threading.get_ident(), 0)
            if not returning:
                for _ in range(held):
                    self._place_locked()

    def set_threads(self, threads: int) -> None:
        """Change how many items are worked on at once; threads over it end as they go idle.

        Raises:
            ValueError: fewer than one thread.
        """
        if threads < 1:
            raise ValueError(f"threads must be >= 1, not {threads!r}")
        with self._cond:
            self._n = threads

    def backlog(self) -> int:
        """Items submitted and not yet taken by a thread."""
        return len(self._items)

    def threads(self) -> int:
        """Threads alive now."""
        return self._running

    def stop(self) -> list[T]:
        """Stop taking items; returns the ones never taken. Threads end after their current item."""
        with self._cond:
            self._stopped = True
            dropped = list(self._items)
            self._items.clear()
            self._cond.notify_all()
        return dropped

    def drain(self, timeout_s: float) -> bool:
        """Stop taking new items, then wait until every queued item has been worked on.

        Returns:
            True when the pool emptied (and its threads ended) within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._draining = True
            self._cond.notify_all()
            while self._items or self._running:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            self._stopped = True
        return True

    def _run(self) -> None:
        while True:
            # Unlocked look: a wrong guess costs one call, or one more wait below.
            again_s = self._on_idle() if self._on_idle is not None and not self._items else None
            with self._cond:
                if not self._items and not self._stopped:
                    if self._draining:
                        self._running -= 1
                        self._cond.notify_all()
                        return
                    self._idle += 1
                    woken = self._cond.wait(self._idle_exit_s if again_s is None else min(again_s, self._idle_exit_s))
                    self._idle -= 1
                    if not self._items and not self._stopped:
                        if not woken and again_s is None:
                            self._running -= 1
                            return
                        continue  # woken with nothing to take, or time to call on_idle again
                if self._stopped:
                    self._running -= 1
                    self._cond.notify_all()
                    return
                item = self._items.popleft()
            try:
                self._fn(item)
            except Exception:
                log.exception("%s: working on %r failed", self._name, item)
            if self._after_item is not None:
                self._after_item_once()

    def _after_item_once(self) -> None:
        """Call ``after_item``, counted among the threads an item submitted meanwhile waits for."""
        assert self._after_item is not None
        with self._cond:
            self._after += 1
        try:
            self._after_item()
        except Exception:
            log.exception("%s: after an item", self._name)
        finally:
            with self._cond:
                self._after -= 1
