"""``cpu_scheduling``: every thread of ``smoosh run`` and ``smoosh worker`` in the policy it names.

Read from outside, as an operator would (``/proc/PID/task``, ``sched_getscheduler``), on real
processes: the default daemon, one set to ``normal``, a worker process, and a process that
applies the policy and then starts threads (which must inherit it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers.daemon import HANG_S, Daemon, free_port, wait_for, worker_process, write_config
from smoosh.config import parse_config
from smoosh.cpusched import thread_policies
from smoosh.errors import ConfigError

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH") or not os.path.isdir("/proc/self/task"),
                                reason="CPU scheduling policies per thread are Linux's")


def scanned(d: Daemon) -> bool:
    scan = d.get("/status")["scan"]
    return bool(scan["scans_completed"] >= 1)


def test_by_default_every_thread_of_the_daemon_runs_in_sched_batch(tmp_path: Path, daemons: list[Daemon]) -> None:
    # Given a daemon at the default policy, serving, its start-up scan done (its threads started)
    d = Daemon(write_config(tmp_path, port=free_port()))
    daemons.append(d)
    d.wait_ready()
    wait_for(lambda: scanned(d), HANG_S, what="the start-up scan", daemon=d)
    # Then each of its threads, main thread included, is in the batch policy
    policies = thread_policies(d.proc.pid)
    assert len(policies) > 3
    assert set(policies.values()) == {"batch"}, policies


def test_normal_leaves_the_daemon_at_the_policy_it_was_started_with(tmp_path: Path, daemons: list[Daemon]) -> None:
    d = Daemon(write_config(tmp_path, port=free_port(), extra_global="cpu_scheduling = normal"))
    daemons.append(d)
    d.wait_ready()
    wait_for(lambda: scanned(d), HANG_S, what="the start-up scan", daemon=d)
    assert set(thread_policies(d.proc.pid).values()) == {"normal"}


def test_a_worker_process_runs_in_the_policy_too(tmp_path: Path) -> None:
    with worker_process(write_config(tmp_path, port=free_port()), tmp_path) as worker:
        # Its worker threads are up once it has more than its main thread
        wait_for(lambda: worker.poll() is None and len(thread_policies(worker.pid)) > 1, HANG_S,
                 what="the worker's threads")
        assert set(thread_policies(worker.pid).values()) == {"batch"}


def test_threads_running_before_are_moved_and_threads_started_after_inherit(tmp_path: Path) -> None:
    # A process of its own: the policy is per process, and this test's must stay as it is.
    script = textwrap.dedent("""
        import json, threading
        from smoosh.cpusched import apply_cpu_scheduling, thread_policies
        hold = threading.Event()
        before = threading.Thread(target=hold.wait); before.start()
        ok = apply_cpu_scheduling("batch")
        after = threading.Thread(target=hold.wait); after.start()
        print(json.dumps({"ok": ok, "policies": sorted(thread_policies().values()), "n": len(thread_policies())}))
        hold.set()
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=HANG_S, check=True)
    result = json.loads(out.stdout)
    assert result == {"ok": True, "policies": ["batch", "batch", "batch"], "n": 3}


def test_a_value_other_than_batch_or_normal_is_refused_by_name() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config("[smoosh]\ncpu_scheduling = fast\n", "conf/smoosh.ini")
    assert str(info.value) == "conf/smoosh.ini: [smoosh] cpu_scheduling = 'fast': must be normal or batch"
    assert parse_config("[smoosh]\ncpu_scheduling = Normal\n", "conf/smoosh.ini").cpu_scheduling == "normal"
    assert parse_config("", "conf/smoosh.ini").cpu_scheduling == "batch"
