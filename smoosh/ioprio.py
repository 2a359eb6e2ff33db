"""``io_priority = idle``: the I/O scheduling class of the thread that runs a compaction (Linux).

Linux keeps an I/O priority per thread (``ioprio_set(2)``; ``ionice`` sets a whole process).
smoosh sets it on the compaction thread itself, for the length of one compaction, and puts
the previous value back afterwards: compaction threads are pooled and run whatever comes
next, and a reload may have turned ``io_priority`` back to ``normal`` meanwhile. The rest of
the daemon (its loop, the job store, the admin API) keeps the normal class.

``idle`` (``IOPRIO_CLASS_IDLE``) gets disk time only when no other process wants it. It
applies to the I/O the thread issues itself (reads, and the writes an ``fsync`` or a commit
waits for) and is honoured by I/O schedulers that know classes (BFQ; mq-deadline on recent
kernels); with ``none`` (common on NVMe) it changes nothing. Unprivileged processes may set
it (only the realtime class needs ``CAP_SYS_ADMIN``).

Elsewhere (macOS, the BSDs, or a kernel or sandbox that refuses the call) the setting is
ignored with one WARNING per process, never an error.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import platform
import threading
from typing import Callable

from smoosh import libc

__all__ = ["IOPRIO_CLASS_NONE", "IOPRIO_CLASS_IDLE", "IOPRIO_CLASS_BE", "get_thread_ioprio", "set_thread_ioprio",
           "apply_io_priority", "IO_PRIORITIES"]

log = logging.getLogger(__name__)

#: The values ``io_priority`` accepts.
IO_PRIORITIES = ("normal", "idle")

IOPRIO_CLASS_NONE = 0
IOPRIO_CLASS_RT = 1
IOPRIO_CLASS_BE = 2
IOPRIO_CLASS_IDLE = 3
#: ``IOPRIO_WHO_PROCESS``: with a thread id (0 = the caller) it addresses that one thread.
IOPRIO_WHO_PROCESS = 1
_IOPRIO_CLASS_SHIFT = 13

#: ``ioprio_set`` / ``ioprio_get`` syscall numbers by machine (not in the C library's API).
_SYSCALLS: dict[str, tuple[int, int]] = {
    "x86_64": (251, 252),
    "amd64": (251, 252),
    "aarch64": (30, 31),
    "arm64": (30, 31),
    "i386": (289, 290),
    "i686": (289, 290),
    "armv7l": (314, 315),
    "ppc64le": (273, 274),
    "s390x": (282, 283),
    "riscv64": (30, 31),
}

_warned = threading.Event()
_libc_syscall: Callable[..., int] | None = None


def _syscall_numbers() -> tuple[int, int] | None:
    if platform.system() != "Linux":
        return None
    return _SYSCALLS.get(platform.machine().lower())


def _syscall(number: int, *args: int) -> int:
    global _libc_syscall
    if _libc_syscall is None:
        _libc_syscall = libc.function("syscall")
        if _libc_syscall is None:
            raise OSError(errno.ENOSYS, "no syscall() in the C library")
    result = int(_libc_syscall(number, *(ctypes.c_int(a) for a in args)))
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def get_thread_ioprio() -> tuple[int, int]:
    """The calling thread's I/O priority as ``(class, level)`` (``ioprio_get(2)``).

    Raises:
        OSError: not Linux (``ENOSYS``), or the kernel refused.
    """
    numbers = _syscall_numbers()
    if numbers is None:
        raise OSError(38, "ioprio_get is Linux only")
    value = _syscall(numbers[1], IOPRIO_WHO_PROCESS, 0)
    return value >> _IOPRIO_CLASS_SHIFT, value & ((1 << _IOPRIO_CLASS_SHIFT) - 1)


def set_thread_ioprio(io_class: int, level: int = 0) -> None:
    """Set the calling thread's I/O priority (``ioprio_set(2)`` on this thread only).

    Raises:
        OSError: not Linux (``ENOSYS``), or the kernel refused (``EPERM`` for the realtime class).
    """
    numbers = _syscall_numbers()
    if numbers is None:
        raise OSError(38, "ioprio_set is Linux only")
    _syscall(numbers[0], IOPRIO_WHO_PROCESS, 0, (io_class << _IOPRIO_CLASS_SHIFT) | level)


def apply_io_priority(mode: str) -> Callable[[], None]:
    """Put the calling thread in ``mode``'s I/O class; returns what puts the previous class back.

    ``normal`` changes nothing. ``idle`` where it cannot be set logs one WARNING per process
    and goes on (the compaction runs at the normal class).

    Parameters:
        mode: ``"normal"`` or ``"idle"``.

    Returns:
        A callable restoring the thread's previous I/O priority (a no-op when nothing changed).
    """
    if mode != "idle":
        return _nothing
    try:
        previous = get_thread_ioprio()
        set_thread_ioprio(IOPRIO_CLASS_IDLE)
    except OSError as exc:
        if not _warned.is_set():
            _warned.set()
            log.warning("io_priority = idle is not available here (%s); compactions run at the normal I/O class.", exc)
        return _nothing

    def restore() -> None:
        try:
            set_thread_ioprio(*previous)
        except OSError:
            log.debug("Restoring the I/O priority of a compaction thread failed.", exc_info=True)

    return restore


def _nothing() -> None:
    return None
