"""An idle daemon costs next to nothing: about a dozen threads (DESIGN §9), counted from outside.

The count is what the kernel lists for the process (``/proc/PID/task``), for a default
``smoosh run``: watching a directory and its config file, serving the admin API, the
embedded SQLite job store and in-process workers.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from helpers.daemon import HANG_S, Daemon, free_port, wait_for, write_config

#: DESIGN §9: an idle daemon runs about a dozen threads (issue 13: at most 12).
MAX_IDLE_THREADS = 12


def threads_of(pid: int) -> list[str]:
    """The kernel's list of the process's threads."""
    return os.listdir(f"/proc/{pid}/task")


def test_an_idle_daemon_runs_at_most_twelve_threads(tmp_path: Path, daemons: list[Daemon]) -> None:
    d = Daemon(write_config(tmp_path, port=free_port()))
    daemons.append(d)
    d.wait_ready()
    # Idle: the start-up scan (a thread of its own while it runs) has ended, nothing is examined.
    wait_for(lambda: (lambda s: s["scans_completed"] >= 1 and s["examining"] == 0)(d.get("/status")["scan"]), HANG_S,
             what="the start-up scan to end", daemon=d)
    wait_for(lambda: len(threads_of(d.proc.pid)) <= MAX_IDLE_THREADS, HANG_S,
             what=f"at most {MAX_IDLE_THREADS} threads", daemon=d)


def main_thread_wakeups(pid: int) -> int:
    """How often the daemon's main thread has gone to sleep and been woken (voluntary switches)."""
    with open(f"/proc/{pid}/task/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("voluntary_ctxt_switches:")).split()[1])


def main_thread_asleep(pid: int) -> bool:
    """Whether the daemon's main thread is asleep now (state S), not running or about to."""
    with open(f"/proc/{pid}/task/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "S"


def test_the_main_thread_of_an_idle_daemon_sleeps_until_a_signal(tmp_path: Path, daemons: list[Daemon]) -> None:
    d = Daemon(write_config(tmp_path, port=free_port()))
    daemons.append(d)
    d.wait_ready()
    wait_for(lambda: "effective config" in d.log(), HANG_S, what="the start-up to end", daemon=d)
    # Given the main thread asleep, and not woken for half a second (on a busy machine it may
    # still be on its way to its sleep when the start-up's last line is written)
    def settled() -> bool:
        first = main_thread_wakeups(d.proc.pid)
        time.sleep(0.5)
        return main_thread_asleep(d.proc.pid) and main_thread_wakeups(d.proc.pid) == first

    wait_for(settled, HANG_S, what="the main thread asleep", daemon=d)
    before = main_thread_wakeups(d.proc.pid)
    # When requests are served meanwhile (by other threads) and seconds pass: no clock to step
    # here; what is asserted is that nothing happens, which no slow machine can make happen.
    for _ in range(20):
        d.get("/status")
    time.sleep(2.5)
    # Then nothing woke it (it used to wake every second to look for a signal's handler) ...
    assert main_thread_wakeups(d.proc.pid) == before
    # ... and a SIGTERM, whichever thread the kernel hands it to, stops the daemon
    assert d.stop() == 0
