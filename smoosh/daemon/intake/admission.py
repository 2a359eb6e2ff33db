"""A batch being admitted holds the examination back, briefly.

Admission checks each key of a ``POST /enqueue`` batch against its file (system calls, each
releasing the GIL); beside an examination thread running Python, every one of them waits to
get the GIL back. The caller is waiting for its answer, the examination is not: the
examination pauses until the batch is in, at most :data:`ADMISSION_PAUSE_MAX_S` for one
spell of batches that overlap, so a steady stream of batches cannot starve it. Between
batches, the examination lets go of the GIL after every key, so the threads bringing the next
batch in are not held to the interpreter's switch interval either.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Iterator

__all__ = ["ADMISSION_PAUSE_MAX_S", "AdmissionGate"]

#: Longest the examination waits for one spell of admission (see AdmissionGate); after that
#: it goes on beside it: a steady stream of batches must not starve the examination.
ADMISSION_PAUSE_MAX_S = 0.1
#: Lets go of the GIL for a moment (releases it around the call; see AdmissionGate.wait_turn).
_yield = getattr(os, "sched_yield", lambda: time.sleep(0))


class AdmissionGate:
    """Callers admitting batches on one side, the examination threads on the other.

    Ownership: shared by any thread admitting a batch (the one way in: :meth:`admitting`) and
    the examination threads (the one way in: :meth:`wait_turn`); ``_lock`` guards the count of
    batches and the spell number. The spell already waited out is written by the examination
    threads alone.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Set while no caller is admitting a batch.
        self._admitted = threading.Event()
        self._admitted.set()
        self._admitting = 0
        # Spells of admission (batches in, none between) so far, and the one the examination
        # already waited out: it waits once per spell, not once per key.
        self._spell = 0
        self._waited_spell = -1

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
        _yield()
