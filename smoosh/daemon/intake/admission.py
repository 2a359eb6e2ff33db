"""A batch being admitted holds the examination back, briefly; and a request's admission has a deadline.

Admission checks each key of a ``POST /enqueue`` batch against its file (system calls, each
releasing the GIL); beside an examination thread running Python, every one of them waits to
get the GIL back. The caller is waiting for its answer, the examination is not: the
examination pauses until the batch is in, at most :data:`ADMISSION_PAUSE_MAX_S` for one
spell of batches that overlap, so a steady stream of batches cannot starve it. Between
batches, the examination lets go of the GIL after every key, so the threads bringing the next
batch in are not held to the interpreter's switch interval either.

A caller enqueueing keys one call at a time in a loop (the Python API) is held back the same
way: its canonicalisation is system calls too, and beside a running examination each one
handed the GIL over and waited to get it back, so the loop and the examination together took
longer than one after the other (bench/HISTORY.md). Its calls, while they come less than
:data:`BURST_GAP_S` apart, are one burst; an examination that finds a burst of two keys or
more under way waits for it to pause, once per burst and at most
:data:`ADMISSION_PAUSE_MAX_S`, as for a batch. A key enqueued alone is examined at once.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from typing import Callable, Iterator

__all__ = ["ADMISSION_PAUSE_MAX_S", "AdmissionGate", "RequestDeadline", "REQUEST_WORK_S", "NOT_EXAMINED",
           "YIELD_EVERY_KEYS"]

#: Longest the examination waits for one spell of admission (see AdmissionGate); after that
#: it goes on beside it: a steady stream of batches must not starve the examination.
ADMISSION_PAUSE_MAX_S = 0.1
#: Calls of a caller enqueueing key by key that come closer together than this are one burst
#: (seconds: a call takes tens of microseconds; a caller doing anything else between its
#: keys, such as reading them from a socket, leaves longer gaps and is not held).
BURST_GAP_S = 0.0003
#: Lets go of the GIL for a moment (releases it around the call; see AdmissionGate.wait_turn).
_yield = getattr(os, "sched_yield", lambda: time.sleep(0))
#: Longest one request may spend admitting its keys (canonical form, roots, the file's look),
#: in seconds; the keys left when it is spent are not examined (see RequestDeadline).
REQUEST_WORK_S = 5.0
#: Keys a request admits between two hand-overs of the GIL (see RequestDeadline.next_key).
YIELD_EVERY_KEYS = 16
#: The reason of a key a request had no time left to examine.
NOT_EXAMINED = "not examined: the request ran out of time before this key (the daemon is busy); send it again"


class RequestDeadline:
    """One request's time to admit its keys, asked before each key.

    Owner: the handler thread admitting the request (one per request; not shared).

    Parameters:
        budget_s: how long the admission may take from now (:data:`REQUEST_WORK_S` for HTTP).
        clock: monotonic seconds (tests step it).
        yield_: lets go of the GIL for a moment (every :data:`YIELD_EVERY_KEYS` keys).
    """

    def __init__(self, budget_s: float = REQUEST_WORK_S, *, clock: Callable[[], float] = time.monotonic,
                 yield_: Callable[[], None] = _yield) -> None:
        self.budget_s = budget_s
        self._clock = clock
        self._yield = yield_
        self.started = clock()
        self._deadline = self.started + budget_s
        self._admitted = 0
        #: The index of the first key not examined, once the deadline cut the request; else None.
        self.cut_at: int | None = None

    def next_key(self) -> bool:
        """Whether there is time to admit the next key; False from the deadline on (and :attr:`cut_at` set).

        The first key of a request is always admitted (its time starts as it is taken up).
        Every :data:`YIELD_EVERY_KEYS` keys the GIL is handed over: admission is system calls
        and a little Python, and without a pause the thread running ``GET /status`` waits for
        the interpreter's switch interval at each of its own steps.
        """
        if self.cut_at is not None:
            return False
        if self._admitted and self._admitted % YIELD_EVERY_KEYS == 0:
            self._yield()
        if self._admitted and self._clock() >= self._deadline:
            self.cut_at = self._admitted
            return False
        self._admitted += 1
        return True

    @property
    def elapsed_s(self) -> float:
        """Seconds since the request's admission began."""
        return self._clock() - self.started


class AdmissionGate:
    """Callers admitting batches on one side, the examination threads on the other.

    Ownership: shared by any thread admitting a batch (the one way in: :meth:`admitting`), any
    thread admitting a single key (:meth:`admitted_one`) and the examination threads (the one
    way in: :meth:`wait_turn`); ``_lock`` guards the count of batches and the spell number.
    The burst's fields are written without it by the threads admitting single keys: a lost
    update costs one wait more or one less, never a key. The spell and burst already waited
    out are written by the examination threads alone.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        """``clock`` (monotonic seconds) and ``sleep`` time a burst's pause; tests step them."""
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        # Set while no caller is admitting a batch.
        self._admitted = threading.Event()
        self._admitted.set()
        self._admitting = 0
        # Spells of admission (batches in, none between) so far, and the one the examination
        # already waited out: it waits once per spell, not once per key.
        self._spell = 0
        self._waited_spell = -1
        # The burst of single admissions (see admitted_one): its number, its keys so far, when
        # its last key came (monotonic seconds), and the burst the examination waited out.
        self._burst = 0
        self._burst_keys = 0
        self._last_single = -math.inf
        self._waited_burst = -1

    @contextlib.contextmanager
    def admitting(self) -> Iterator[None]:
        """Hold the examination back while the caller admits a batch (see the module docstring)."""
        with self._lock:
            if not self._admitting:
                self._spell += 1
            self._admitting += 1
            self._admitted.clear()
        try:
            yield
        finally:
            with self._lock:
                self._admitting -= 1
                if not self._admitting:
                    self._admitted.set()

    def admitted_one(self) -> None:
        """A caller admitted one key outside any batch (any thread): it joins the burst under way,
        or starts one (see the module docstring)."""
        if self._admitting:
            return  # inside a batch: the spell holds the examination back already
        now = self._clock()
        if now - self._last_single >= BURST_GAP_S:
            self._burst += 1
            self._burst_keys = 0
        self._burst_keys += 1
        self._last_single = now

    def wait_turn(self) -> None:
        """On an examination thread, before a key: wait out the spell of admission under way, once;
        and let go of the GIL, once, whatever happens.

        An examination that measures from the look its key's admission took runs Python alone,
        with no system call to let go of the GIL; the threads bringing the next batch in (the
        connection loop reading its body, its handler) then got it back only when the
        interpreter's switch interval forced it, several times per request, and a batch's
        answer waited that long each time. One ``sched_yield`` per key hands it over between
        keys (a ``sleep(0)`` would too, but sleeps out the kernel's timer slack).
        """
        spell = self._spell
        if spell != self._waited_spell and not self._admitted.wait(ADMISSION_PAUSE_MAX_S):
            self._waited_spell = spell  # this spell outlasted the pause: no more waiting for it
        burst = self._burst
        if burst != self._waited_burst and self._burst_keys > 1:
            self._waited_burst = burst
            self._wait_for_pause()
        _yield()

    def _wait_for_pause(self) -> None:
        """Sleep until the burst of single admissions pauses, at most :data:`ADMISSION_PAUSE_MAX_S`."""
        deadline = self._clock() + ADMISSION_PAUSE_MAX_S
        while True:
            now = self._clock()
            if now - self._last_single >= BURST_GAP_S or now >= deadline:
                return
            self._sleep(BURST_GAP_S)
