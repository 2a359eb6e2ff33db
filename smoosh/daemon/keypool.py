"""A small pool of threads examining keys in arrival order.

``concurrent.futures.ThreadPoolExecutor`` allocates a ``Future`` (with its own
``Condition``, lock and waiter deque: ~400 bytes measured) and a work item per call; at
start-up the watcher hands the server every database of the fleet within a second, so a
100,000-database fleet held ~50 MB of futures nobody ever waited on. Here a waiting key costs
one slot in a deque. Several threads, because one slow file (an exact ``dbstat`` pass, a
stalled disk) must not hold up the rest.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Callable

__all__ = ["KeyPool"]

log = logging.getLogger(__name__)


class KeyPool:
    """Runs ``fn(key)`` for every submitted key on one of ``threads`` daemon threads, FIFO.

    Parameters:
        fn: called once per submitted key; an exception is logged and the thread goes on.
        threads: how many keys are examined at once.
        name: thread name prefix.
    """

    def __init__(self, fn: Callable[[str], None], threads: int, name: str) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, not {threads!r}")
        self._fn = fn
        self._n = threads
        self._name = name
        self._keys: deque[str] = deque()
        self._cond = threading.Condition()
        self._stopped = False
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Start the threads."""
        for i in range(self._n):
            t = threading.Thread(target=self._run, name=f"{self._name}_{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def submit(self, key: str) -> bool:
        """Queue ``key``; False when the pool is stopped (the key is not queued)."""
        with self._cond:
            if self._stopped:
                return False
            self._keys.append(key)
            self._cond.notify()
        return True

    def backlog(self) -> int:
        """Keys submitted and not yet taken by a thread."""
        return len(self._keys)

    def stop(self) -> list[str]:
        """Stop taking keys; returns the ones never taken. Threads end after their current key."""
        with self._cond:
            self._stopped = True
            dropped = list(self._keys)
            self._keys.clear()
            self._cond.notify_all()
        return dropped

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._keys and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                key = self._keys.popleft()
            try:
                self._fn(key)
            except Exception:
                log.exception("examining %r failed", key)
