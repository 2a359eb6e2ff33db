"""``cpu_scheduling = batch``: the CPU scheduling policy of a process smoosh owns (Linux).

An application beside smoosh contends with itself: its threads share SQLite locks, and a
thread that holds one while it is off the CPU makes the others wait and, for a transaction
that has read and now wants to write, fail at once. smoosh's daemon wakes often while an
application writes (its file watcher hears every journal the application creates), and under
Linux's normal policy a thread that wakes may preempt the one running, which can be an
application thread holding such a lock. ``SCHED_BATCH`` gives smoosh's threads the same share
of the CPU, but a thread of it that wakes waits for the running one's turn to end instead.

The policy is set once, at the start of ``smoosh run`` and ``smoosh worker``, on every thread
the process has then (Linux keeps a policy per thread); every thread started later inherits
it from the thread that starts it. So it is a restart-only key, and it is never applied by
the library (an application embedding :class:`smoosh.daemon.server.Server` keeps its own
policy for its own threads). Unprivileged processes may move between the normal and batch
policies. Elsewhere (macOS, the BSDs, a sandbox that refuses the call) the setting is
ignored with one WARNING, never an error.
"""

from __future__ import annotations

import logging
import os

__all__ = ["CPU_SCHEDULING", "POLICY_NAMES", "thread_policies", "apply_cpu_scheduling"]

log = logging.getLogger(__name__)

#: The values ``cpu_scheduling`` accepts.
CPU_SCHEDULING = ("normal", "batch")

#: Linux's policy numbers (``sched(7)``) by the name a status or test shows.
POLICY_NAMES: dict[int, str] = {0: "normal", 1: "fifo", 2: "rr", 3: "batch", 5: "idle", 6: "deadline"}

_TASKS_DIR = "/proc/self/task"


def thread_policies(pid: int | str = "self") -> dict[int, str]:
    """The CPU scheduling policy of each thread of process ``pid`` (Linux), by thread id.

    Raises:
        OSError: no ``/proc`` (not Linux), or the process is gone.
    """
    out: dict[int, str] = {}
    for name in os.listdir(f"/proc/{pid}/task"):
        tid = int(name)
        try:
            number = os.sched_getscheduler(tid)
        except ProcessLookupError:  # the thread ended between the listing and the call
            continue
        out[tid] = POLICY_NAMES.get(number, str(number))
    return out


def apply_cpu_scheduling(mode: str) -> bool:
    """Put every thread of this process under ``mode``'s CPU policy; later threads inherit it.

    Call it before the process starts its threads, so that none misses it: a thread that a
    thread not yet moved starts while this runs would keep the old policy.

    Parameters:
        mode: ``"normal"`` (leaves the process as it is) or ``"batch"``.

    Returns:
        Whether the policy is now ``mode`` (False after the one WARNING where it cannot be set).
    """
    if mode not in CPU_SCHEDULING:
        raise ValueError(f"cpu_scheduling {mode!r}: must be one of {', '.join(CPU_SCHEDULING)}")
    if mode == "normal":
        return True
    number: int | None = getattr(os, "SCHED_BATCH", None)
    try:
        if number is None or not hasattr(os, "sched_setscheduler"):
            raise OSError(38, "sched_setscheduler is Linux only")
        tids = [int(name) for name in os.listdir(_TASKS_DIR)]
        for tid in tids:
            try:
                os.sched_setscheduler(tid, number, os.sched_param(0))
            except ProcessLookupError:  # the thread ended meanwhile: nothing to move
                continue
    except OSError as exc:
        log.warning("cpu_scheduling = %s is not available here (%s); smoosh runs at the normal CPU policy.",
                    mode, exc.strerror or exc)
        return False
    log.debug("cpu_scheduling = %s: %d thread(s) moved; later threads inherit it.", mode, len(tids))
    return True
