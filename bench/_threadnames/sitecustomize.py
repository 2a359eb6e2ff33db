"""Loaded by a benchmark's daemon subprocess (its PYTHONPATH names this directory): every Python
thread gives the kernel its name, so ``/proc/PID/task/*/comm`` tells the threads apart (Python
3.11 leaves them all ``python``). Linux only; a failure leaves the name as it was."""

import ctypes
import threading
from typing import Callable

_prctl: Callable[..., int] | None
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # pragma: no cover - not Linux
    _prctl = None

_PR_SET_NAME = 15
_inner = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]


def _named(self: threading.Thread) -> None:
    if _prctl is not None:
        _prctl(_PR_SET_NAME, self.name.encode()[:15], 0, 0, 0)
    _inner(self)


threading.Thread._bootstrap_inner = _named  # type: ignore[attr-defined]
