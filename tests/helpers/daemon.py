"""Run `smoosh run` as a real subprocess on a temp directory, and talk to it over real HTTP."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

#: Seconds a test waits for the daemon to answer on its port.
START_TIMEOUT_S = 20.0
#: Seconds a test waits for something that must happen (an event, a state the daemon reaches
#: whatever its speed) before it fails: a bound on a hang, never a measure of speed.
HANG_S = 60.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config_text(settings: dict[str, str], *, extra_global: str = "", channels: str = "") -> str:
    """Ini text for tests: ``[smoosh]`` from ``settings`` (``extra_global`` lines replace keys),
    small ``min_size`` / ``min_priority`` on the ratio and slack channels, then ``channels``."""
    merged = dict(settings)
    for line in extra_global.splitlines():
        if "=" in line:
            key, value = line.split("=", 1)
            merged[key.strip()] = value.strip()
    body = "\n".join(f"{k} = {v}" for k, v in merged.items())
    return f"""[smoosh]
{body}

[smoosh.ratio_dbs]
min_size = 64KiB

[smoosh.slack_dbs]
min_size = 64KiB
min_priority = 64KiB
{channels}
"""


def write_config(base: Path, *, port: int, extra_global: str = "", channels: str = "", name: str = "smoosh.ini") -> Path:
    """A config under ``base`` watching ``base/dbs`` with short timings for tests.

    ``extra_global`` lines (``key = value``) replace the defaults of the same key.
    """
    (base / "dbs").mkdir(exist_ok=True)
    (base / "state").mkdir(exist_ok=True)
    settings = {
        "watch": str(base / "dbs"),
        "state_dir": str(base / "state"),
        "store": f"sqlite:{base / 'state' / 'jobs.db'}",
        "http": f"127.0.0.1:{port}",
        "node": "testnode",
        "wait_secs": "0",
        "staleness": "0",
        "job_timeout": "2s",
        "checkpoint_interval": "1s",
    }
    path = base / name
    path.write_text(config_text(settings, extra_global=extra_global, channels=channels))
    return path


class Daemon:
    """A `smoosh run` subprocess; stop() sends SIGTERM, kill() sends SIGKILL.

    Its stdout and stderr go to one file, ``log_path`` (given, or a fresh one beside the
    config); a given file is truncated, keeping its inode.
    """

    def __init__(self, config: Path, *, args: tuple[str, ...] = (), env: dict[str, str] | None = None,
                 log_path: Path | None = None) -> None:
        self.config = config
        self.port = _port_of(config)
        self.log_path = log_path or config.parent / f"daemon-{time.monotonic_ns()}.log"
        self._log = open(self.log_path, "wb")
        full_env = dict(os.environ, PYTHONUNBUFFERED="1", SMOOSH_LOG_LEVEL="DEBUG")
        full_env.update(env or {})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "smoosh", "run", "--config", str(config), *args],
            stdout=self._log, stderr=subprocess.STDOUT, env=full_env, cwd=str(config.parent),
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        wait_for(lambda: self._answers(), timeout_s, what=f"daemon on port {self.port}", daemon=self)

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.log()}")
        try:
            self.get("/status")
            return True
        except OSError:
            return False

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=HANG_S) as r:
            return json.loads(r.read())

    def post(self, path: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if not isinstance(body, bytes) else body
        # As any JSON client does: the API refuses a POST body of another type (a browser's).
        req = urllib.request.Request(self.url + path, data=data, method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=HANG_S) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def stop(self, timeout_s: float = HANG_S) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        finally:
            self._log.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(HANG_S)
        self._log.close()

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")


#: The admin API's access lines (DEBUG): in a failed wait they are mostly the test's own polls.
_ACCESS_LINE = re.compile(r'^\S+ \S+ DEBUG smoosh\.daemon\.(?:api\.)?http: \S+ "[A-Z]+ ')


def wait_for(cond: Callable[[], Any], timeout_s: float, *, what: str, daemon: Daemon | None = None, every_s: float = 0.05) -> Any:
    """Poll ``cond`` until it returns something truthy; fail naming ``what`` after ``timeout_s``
    (with the end of ``daemon``'s log, its access lines left out)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = ""
            if daemon:
                lines = [line for line in daemon.log().splitlines() if not _ACCESS_LINE.match(line)]
                detail = "\n--- daemon log, without its access lines ---\n" + "\n".join(lines)[-6000:]
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}{detail}")
        time.sleep(every_s)


def start_worker(config: Path, cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """A ``smoosh worker --config config`` process, its output dropped; the caller ends it."""
    return subprocess.Popen([sys.executable, "-m", "smoosh", "worker", "--config", str(config)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            cwd=None if cwd is None else str(cwd), env=dict(os.environ, PYTHONUNBUFFERED="1"))


@contextlib.contextmanager
def worker_process(config: Path, cwd: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A :func:`start_worker` process, terminated on leaving."""
    worker = start_worker(config, cwd)
    try:
        yield worker
    finally:
        worker.terminate()
        try:
            worker.wait(HANG_S)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def _port_of(config: Path) -> int:
    for line in config.read_text().splitlines():
        if line.strip().startswith("http") and "=" in line:
            return int(line.split("=", 1)[1].strip().rsplit(":", 1)[1])
    raise ValueError("config has no http line")
