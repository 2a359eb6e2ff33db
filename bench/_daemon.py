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


def smoosh_env() -> dict[str, str]:
    """The environment of a ``python -m smoosh`` subprocess: this checkout first, warnings only."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", SMOOSH_LOG_LEVEL="WARNING")
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def process_cpu_s(pid: int) -> float | None:
    """User + system seconds process ``pid`` has used (all its threads), or None off Linux."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            # The command name (field 2) may hold spaces: count the fields after its ')'.
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
    """``smoosh run --config PATH`` as its own process, its log in ``config``'s directory; ``stop()`` sends SIGTERM.

    By default this checkout's ``python -m smoosh`` with warnings only (:func:`smoosh_env`);
    ``command`` runs another smoosh (an installed one, a wrapper script), with ``env`` as given.
    """

    def __init__(self, config: Path, port: int, *, args: tuple[str, ...] = (),
                 command: str | None = None, env: dict[str, str] | None = None, log_name: str = "daemon.log",
                 stop_timeout_s: float = 30.0) -> None:
        """``args``: more options of ``smoosh run``. (``smoosh run`` names its threads for the kernel,
        so per-thread counters in ``/proc`` tell them apart.)"""
        self.port = port
        self.log_path = config.parent / log_name
        self._stop_timeout_s = stop_timeout_s
        self._log = open(self.log_path, "wb")
        argv = [sys.executable, "-m", "smoosh"] if command is None else [command]
        self.proc = subprocess.Popen([*argv, "run", "--config", str(config), *args],
                                     stdout=self._log, stderr=subprocess.STDOUT,
                                     env=smoosh_env() if env is None else env, cwd=str(config.parent))

    def get(self, path: str, timeout_s: float = 60.0) -> tuple[int, bytes]:
        """``GET path``: the status and the raw body (``/metrics`` is text, the rest JSON)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout_s)
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def _body(self, path: str) -> bytes | None:
        """``GET path``'s body, None when smoosh did not answer it with 200."""
        try:
            status, body = self.get(path)
        except OSError:
            return None
        return body if status == 200 else None

    def application(self) -> dict[str, float]:
        """``GET /status``'s ``application``: what the compactions saw of the application (waits for
        a quiet moment, give-ups) and how smoosh looked at the databases (``looks_locked``: with a
        SQLite lock; ``looks_lockless``: a plain read). Counted since smoosh started; empty when
        unreadable."""
        body = self._body("/status")
        seen = (json.loads(body).get("application") or {}) if body is not None else {}
        return {k: float(v) for k, v in seen.items() if isinstance(v, (int, float))}

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
                raise RuntimeError(f"smoosh exited with {self.proc.returncode}: "
                                   f"{self.log_path.read_text(errors='replace')[-3000:]}")
            try:
                self.get("/status", timeout_s=30.0)
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"smoosh not answering on port {self.port}") from None
                time.sleep(0.05)

    def waiting(self) -> int:
        """Keys waiting in all channels, from /status."""
        _, status = self.request("GET", "/status")
        return sum(ch["waiting"]["size"] for ch in status["channels"].values())

    def stop(self) -> None:
        stop_gently(self.proc, self._stop_timeout_s)
        self._log.close()
