"""A `smoosh run` subprocess for the benchmarks that need a real daemon (HTTP, RSS)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench._harness import REPO_ROOT

#: Seconds to wait for the daemon to answer on its port.
START_TIMEOUT_S = 60.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def smoosh_env(name_threads: bool = False) -> dict[str, str]:
    """The environment of a ``python -m smoosh`` subprocess: this checkout first, warnings only."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", SMOOSH_LOG_LEVEL="WARNING")
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    if name_threads:
        env["PYTHONPATH"] = os.path.join(REPO_ROOT, "bench", "_threadnames") + os.pathsep + env["PYTHONPATH"]
    return env


def stop_gently(proc: "subprocess.Popen[Any]", timeout_s: float = 30.0) -> None:
    """SIGTERM (smoosh's clean stop), then SIGKILL if it has not ended within ``timeout_s``."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


class Workers:
    """``python -m smoosh worker --config PATH`` processes, one job at a time each; ``stop()`` ends them."""

    def __init__(self, config: Path, count: int) -> None:
        self._logs = [open(config.parent / f"worker{i}.log", "wb") for i in range(count)]
        self.procs = [
            subprocess.Popen([sys.executable, "-m", "smoosh", "worker", "--config", str(config), "--concurrency", "1"],
                             stdout=log, stderr=subprocess.STDOUT, env=smoosh_env(), cwd=str(config.parent))
            for log in self._logs
        ]

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        for log in self._logs:
            log.close()


class Daemon:
    """``python -m smoosh run --config PATH`` with its log in ``base``; ``stop()`` sends SIGTERM."""

    def __init__(self, config: Path, port: int, *, name_threads: bool = False, args: tuple[str, ...] = ()) -> None:
        """``name_threads``: each thread gives the kernel its Python name (``bench/_threadnames``),
        so per-thread counters in ``/proc`` can be told apart. ``args``: more options of ``smoosh run``."""
        self.port = port
        self.log_path = config.parent / "daemon.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "smoosh", "run", "--config", str(config), *args],
                                     stdout=self._log, stderr=subprocess.STDOUT, env=smoosh_env(name_threads),
                                     cwd=str(config.parent))

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            data = None if body is None else json.dumps(body).encode()
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            return r.status, json.loads(r.read() or b"null")
        finally:
            conn.close()

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}: {self.log_path.read_text()[-3000:]}")
            try:
                self.request("GET", "/status")
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"daemon not answering on port {self.port}") from None
                time.sleep(0.05)

    def waiting(self) -> int:
        """Keys waiting in all channels, from /status."""
        _, status = self.request("GET", "/status")
        return sum(ch["waiting"]["size"] for ch in status["channels"].values())

    def stop(self) -> None:
        stop_gently(self.proc)
        self._log.close()
