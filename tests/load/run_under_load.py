"""`make test` while other processes load the disk and a CPU: `make test-under-load` (issue 30).

Run as ``python tests/load/run_under_load.py [--runs N] [--disk-procs N] [--write-bytes N]
[--cpu-procs N] [-- COMMAND...]`` from the repository root. It starts the loaders of
``loaders.py`` (each a process of its own):

* ``--disk-procs`` disk loaders (default 1), each a loop of ``--write-bytes`` writes, every one
  followed by ``fsync``, on the filesystem of the tests' temporary directories (``TMPDIR``,
  else ``/tmp``);
* ``--cpu-procs`` busy loops (default 1: one core of the two ``make test`` runs on is taken);

measures what one SQLite commit (``synchronous = FULL``) costs on the loaded disk, then runs
COMMAND (default ``make test``) ``--runs`` times in a row (default 1), stopping at the first
failure, and measures a commit again after each run. The loaders are stopped whatever happens
(a failed run, Ctrl-C, SIGTERM; if this process is killed, the kernel stops them: see
``loaders.die_with_parent``), and an interrupted run's whole process group (make, pytest, its
workers, the daemons they started) is ended with it. It prints one line per run (its exit
code and duration) and the loaders' own figures, and exits with the first failing run's code
(0 when every run passed).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

LOADERS = str(Path(__file__).with_name("loaders.py"))
#: SQLite commits the probe times on the loaded disk.
PROBE_COMMITS = 100
#: Seconds the loaders run before the probe, so it measures them at their pace.
WARM_UP_S = 2.0


def start_loaders(disk_procs: int, write_bytes: int, cpu_procs: int, directory: str) -> list[subprocess.Popen[str]]:
    procs = []
    for _ in range(disk_procs):
        procs.append(subprocess.Popen([sys.executable, LOADERS, "disk", directory, str(write_bytes)],
                                      stdout=subprocess.PIPE, text=True))
    for _ in range(cpu_procs):
        procs.append(subprocess.Popen([sys.executable, LOADERS, "cpu"], stdout=subprocess.DEVNULL))
    return procs


def stop_loaders(procs: list[subprocess.Popen[str]]) -> list[str]:
    """SIGTERM each loader (by its own pid), wait for it, and return what the disk loaders printed."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    reports = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        if out and out.strip():
            reports.append(out.strip().splitlines()[-1])
    return reports


def probe(directory: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, LOADERS, "probe", directory, str(PROBE_COMMITS)],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def run_command(command: list[str]) -> int:
    """Run ``command`` in a process group of its own; interrupted, end the whole group (make,
    pytest, its workers and the daemons they started), not only its first process."""
    proc = subprocess.Popen(command, start_new_session=True)
    try:
        return proc.wait()
    except BaseException:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass
        raise


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1, help="runs of COMMAND in a row (default 1)")
    parser.add_argument("--disk-procs", type=int, default=1, help="disk loaders (default 1)")
    parser.add_argument("--write-bytes", type=int, default=4096, help="bytes per write of a disk loader (default 4096)")
    parser.add_argument("--cpu-procs", type=int, default=1, help="busy processes (default 1)")
    parser.add_argument("command", nargs="*", default=["make", "test"], help="what to run (default: make test)")
    args = parser.parse_args()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt  # through the finally below, which stops the loaders

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    directory = os.environ.get("TMPDIR") or tempfile.gettempdir()
    print(f"idle disk: one SQLite commit {probe(directory)}", flush=True)
    loaders = start_loaders(args.disk_procs, args.write_bytes, args.cpu_procs, directory)
    code = 0
    try:
        time.sleep(WARM_UP_S)
        print(f"load: {args.disk_procs} disk loader(s) of {args.write_bytes}-byte writes + fsync in {directory}, "
              f"{args.cpu_procs} busy process(es); one SQLite commit now {probe(directory)}", flush=True)
        for run in range(1, args.runs + 1):
            t0 = time.monotonic()
            code = run_command(args.command)
            took_s = time.monotonic() - t0
            print(f"run {run} of {args.runs}: {' '.join(args.command)} exited {code} after {took_s:.0f} s "
                  f"({int(took_s // 60)}:{int(took_s % 60):02d}); one SQLite commit now {probe(directory)}", flush=True)
            if code != 0:
                break
    except KeyboardInterrupt:
        code = 130
    finally:
        for report in stop_loaders(loaders):
            print(f"disk loader: {report}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
