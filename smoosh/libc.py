"""The C library's functions that smoosh calls through ctypes (Linux system calls Python lacks).

One place loads the C library, once, with ``errno`` kept for the caller
(``ctypes.get_errno()`` after a call): ``statx`` for a file's mount (:mod:`smoosh.identity`),
``syscall`` for a thread's I/O class (:mod:`smoosh.ioprio`), ``prctl`` for a thread's name
(:mod:`smoosh.threadnames`).
"""

from __future__ import annotations

import ctypes
import functools
from _ctypes import CFuncPtr

__all__ = ["function"]


@functools.lru_cache(maxsize=None)
def _library() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)  # the process's own C library: the one Python uses
    except OSError:
        return None


def function(name: str) -> CFuncPtr | None:
    """The C library's function ``name``, or None where there is none (not Linux, an old libc).

    Each call returns a new function object: set its ``argtypes`` and ``restype`` as the caller
    needs without touching another caller's.
    """
    lib = _library()
    if lib is None:
        return None
    try:
        fn = lib[name]  # a new object each time (attribute access would share one)
    except AttributeError:
        return None
    return fn
