"""Each thread of ``smoosh run`` and ``smoosh worker`` gives the kernel its name.

Read as an operator reads it (``/proc/PID/task/*/comm``, what ``top -H`` and ``ps -L`` show),
on real processes.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers.daemon import HANG_S, Daemon, free_port, wait_for, worker_process, write_config
from smoosh.threadnames import KERNEL_NAME_BYTES, kernel_name

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="thread names in /proc are Linux's")


def kernel_names(pid: int) -> list[str]:
    """The name the kernel has for each thread of process ``pid``."""
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                out.append(f.read().strip())
        except FileNotFoundError:  # the thread ended between the listing and the read
            continue
    return out


def test_the_daemons_threads_are_named_for_the_kernel(tmp_path: Path, daemons: list[Daemon]) -> None:
    # Given a daemon serving, its start-up scan done (its threads started)
    d = Daemon(write_config(tmp_path, port=free_port()))
    daemons.append(d)
    d.wait_ready()
    wait_for(lambda: d.get("/status")["scan"]["scans_completed"] >= 1, HANG_S, what="the start-up scan", daemon=d)
    # Then the watcher's and the HTTP server's threads show by their names, and only the main
    # thread keeps the process's own
    names = kernel_names(d.proc.pid)
    assert {"smoosh-inotify", "smoosh-http"} <= set(names), names
    with open(f"/proc/{d.proc.pid}/comm") as f:
        process_name = f.read().strip()
    assert names.count(process_name) == 1, names


def test_a_worker_process_names_its_threads(tmp_path: Path) -> None:
    with worker_process(write_config(tmp_path, port=free_port()), tmp_path) as worker:
        wait_for(lambda: worker.poll() is None and "smoosh-worker" in kernel_names(worker.pid), HANG_S,
                 what="the worker's dispatcher thread, by name")


def test_a_long_name_is_cut_to_what_the_kernel_keeps_at_a_whole_character() -> None:
    assert kernel_name("smoosh-store-watch /srv/db") == b"smoosh-store-wa"
    assert len(kernel_name("x" * 40)) == KERNEL_NAME_BYTES
    # A two-byte character that would straddle the limit is left out, not cut in half
    assert kernel_name("smoosh-compactä") == "smoosh-compact".encode()
