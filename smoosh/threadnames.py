"""Each thread of ``smoosh run`` and ``smoosh worker`` tells the kernel its name (Linux).

Python 3.11 leaves every thread of a process named as the process, so ``top -H``,
``ps -L`` and ``/proc/PID/task/*/comm`` cannot tell the watcher from a compaction. An operator
asking which of smoosh's threads takes the CPU reads the Python name of each thread there
instead (the kernel keeps its first 15 bytes: ``smoosh-inotify``, ``smoosh-http``,
``smoosh-compact_N``).

:func:`name_threads_for_kernel` is called once at the start of the daemon's commands, before
they start a thread; it is never applied by the library (an application embedding the server
names its own threads). It uses :func:`threading.setprofile`: each thread started afterwards
runs the hook once as it begins, which names it and removes itself, so a thread pays nothing
after its first call. Where ``prctl`` is missing (not Linux) nothing is named, silently: a name
is a convenience, never a reason to fail.
"""

from __future__ import annotations

import sys
import threading
from types import FrameType
from typing import Any

from smoosh import libc

__all__ = ["KERNEL_NAME_BYTES", "name_threads_for_kernel", "kernel_name"]

#: The kernel keeps a thread's name in 16 bytes, the last a NUL.
KERNEL_NAME_BYTES = 15
_PR_SET_NAME = 15


def kernel_name(name: str) -> bytes:
    """The bytes the kernel keeps of ``name``: its first 15 bytes of UTF-8, cut whole characters."""
    return name.encode("utf-8")[:KERNEL_NAME_BYTES].decode("utf-8", "ignore").encode("utf-8")


def name_threads_for_kernel() -> bool:
    """Have every thread started from now on give the kernel its Python name.

    Returns:
        Whether names will be given (False where ``prctl`` is missing).
    """
    # Looked up here, not at import: every smoosh command imports this module, only the two
    # daemon commands name threads.
    prctl = libc.function("prctl")
    if prctl is None:  # not Linux: no prctl in the C library
        return False

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        """A new thread's profile hook: name the thread once, then leave it without a hook."""
        sys.setprofile(None)
        prctl(_PR_SET_NAME, kernel_name(threading.current_thread().name), 0, 0, 0)

    threading.setprofile(hook)
    return True
