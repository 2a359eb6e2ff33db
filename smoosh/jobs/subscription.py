"""Subscriptions: per-job event queues, filled by the type's notifier, drained by ``wait``.

All subscriptions of one :class:`~smoosh.jobs.Jobs` share one condition variable (the hub),
so ``wait_any`` over several of them is one wait, and every event carries a global arrival
number so ``wait_any`` returns events in the order they were delivered.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from typing import Callable, Iterable, Protocol

from smoosh.jobs.model import FINISHED_STATE, NOT_FOUND_STATE
from smoosh.jobs.encoding import JobType

log = logging.getLogger(__name__)

#: An event: (type, id, state, data); data is None for "not_found".
Event = tuple[JobType, str, str, object]

#: States after which a subscription ends (no further events).
FINAL_STATES = frozenset({FINISHED_STATE, NOT_FOUND_STATE})


class Registry(Protocol):
    """What a subscription needs of the notifier that feeds it (the notifier imports this
    module, never the reverse)."""

    def unregister(self, sub: Subscription) -> None:
        """Stop delivering events to ``sub``."""


class Hub:
    """The lock and condition shared by a layer's subscriptions and notifiers."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self._order = itertools.count()
        self.closed = False

    def next_order(self) -> int:
        return next(self._order)

    def close(self) -> None:
        """Wake every waiter; later waits return None at once."""
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def wait_any(self, subs: Iterable[Subscription], state: str | None, timeout: float | None) -> Event | None:
        """The earliest queued event of any of ``subs`` (of ``state``, if given), or None.

        With ``state``, events of other states at the head of a queue are discarded (and
        still update the subscription's ``state``/``data``). Returns None when ``timeout``
        passes, when none of ``subs`` can deliver any more events (all ended or closed), or
        when the layer is closed.
        """
        subs = list(subs)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            while True:
                best: Subscription | None = None
                live = False
                for sub in subs:
                    if sub._closed:
                        continue
                    queue = sub._events
                    while queue and state is not None and queue[0][1][2] != state:
                        sub._consume(queue.popleft()[1])
                    if queue:
                        if best is None or queue[0][0] < best._events[0][0]:
                            best = sub
                    elif not sub._ended:
                        live = True
                if best is not None:
                    event = best._events.popleft()[1]
                    best._consume(event)
                    return event
                if not live or self.closed:
                    return None
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self.cond.wait(remaining)


class Subscription:
    """Events of one job: ``.wait()`` returns ``(type, id, state, data)`` or None.

    ``state`` and ``data`` start as the job's state and data at subscribe time and follow
    each event as ``wait`` returns or discards it. A running subscriber hears every update
    of the job; others hear state changes only. A "finished" or "not_found" event ends the
    subscription. Subscribing to a job that is already finished gives a subscription that
    has ended (``state == "finished"``; ``wait`` returns None at once).
    """

    def __init__(
        self,
        hub: Hub,
        notifier: Registry | None,
        job_type: JobType,
        job_id: str,
        state: str,
        data: object,
        on_event: Callable[[Event], None] | None = None,
    ) -> None:
        self.type = job_type
        self.id = job_id
        self.state = state
        self.data = data
        self._hub = hub
        self._notifier = notifier
        self._events: collections.deque[tuple[int, Event]] = collections.deque()
        self._ended = state in FINAL_STATES
        self._closed = False
        self._on_event = on_event

    def __repr__(self) -> str:
        return f"Subscription({self.type!r}, {self.id!r}, state={self.state!r})"

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def wait(self, state: str | None = None, timeout: float | None = None) -> Event | None:
        """The next event (of ``state``, if given; others are discarded), or None on timeout.

        Parameters:
            state: "pending", "running", "finished" or "not_found" to wait for that state only.
            timeout: seconds to wait; None waits until an event arrives or the subscription ends.

        Returns:
            ``(type, id, state, data)``, or None on timeout, once the subscription has ended
            and its queue is empty, or after :meth:`close`.
        """
        return self._hub.wait_any([self], state, timeout)

    def close(self) -> None:
        """Unsubscribe: queued events are discarded and no later event is delivered."""
        with self._hub.cond:
            self._closed = True
            self._events.clear()
            self._hub.cond.notify_all()
        if self._notifier is not None:
            self._notifier.unregister(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- called by the notifier with the hub's lock held ------------------------------------

    def _deliver(self, event: Event) -> None:
        if self._closed or self._ended:
            return
        if event[2] in FINAL_STATES:
            self._ended = True
        if self._on_event is not None:
            # A callback subscription queues nothing: its owner hears each event at once, on
            # the notifier's thread, with the hub's lock held (so the callback must not block).
            self._consume(event)
            try:
                self._on_event(event)
            except Exception:
                log.exception("the event callback of %r failed", self)
            return
        self._events.append((self._hub.next_order(), event))
        self._hub.cond.notify_all()

    def _consume(self, event: Event) -> None:
        self.state = event[2]
        self.data = event[3]
