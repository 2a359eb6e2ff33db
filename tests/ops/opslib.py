"""Helpers for the operations tests: the CLI as a subprocess, raw HTTP, a paused daemon."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers.daemon import HANG_S, Daemon, free_port, wait_for, write_config

#: Seconds a CLI subprocess may take before the test fails.
CLI_TIMEOUT_S = 60.0


def smoosh_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
               timeout_s: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Run ``python -m smoosh ARGS`` and capture its output (stdout is a pipe, not a terminal)."""
    full_env = dict(os.environ)
    full_env.pop("SMOOSH_TOKEN", None)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "smoosh", *args], capture_output=True, text=True,
                          timeout=timeout_s, cwd=cwd, env=full_env)


@dataclass
class Reply:
    """One HTTP answer: status code, headers and the raw body."""

    status: int
    headers: Any
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def request(url: str, method: str = "GET", body: Any = None, *, raw: bytes | None = None,
            headers: dict[str, str] | None = None, timeout_s: float = 10.0) -> Reply:
    """A real HTTP request; error statuses are returned, not raised."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    # As any JSON client does: the API refuses a POST body of another type (a browser's).
    json_type = {"Content-Type": "application/json"} if method == "POST" else {}
    req = urllib.request.Request(url, data=data, method=method, headers={**json_type, **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return Reply(r.status, r.headers, r.read())
    except urllib.error.HTTPError as e:
        return Reply(e.code, e.headers, e.read())


@dataclass
class PausedDaemon:
    """A daemon whose channels are still in their initial pause (wait_secs = 3600).

    ratio_dbs holds a restored key at priority infinity, one at 7.5 and one live enqueue
    (``fresh``, with known sizes); slack_dbs holds one restored key.
    """

    daemon: Daemon
    base: Path
    infinite_key: str
    fresh: str

    @property
    def url(self) -> str:
        return self.daemon.url


def start_paused_daemon(base: Path) -> PausedDaemon:
    """Write checkpoints, start the daemon, enqueue one bloated database, wait until queued."""
    from compactor.dbfactory import make_bloated_db
    from persist import write_checkpoint

    base = Path(os.path.realpath(base))
    dbs = base / "dbs"
    # No watcher: the test's own enqueue is the only event, so /jobs shows exactly one "added".
    config = write_config(base, port=free_port(), extra_global=f"wait_secs = 3600\nwatch =\nroots = {dbs}")
    infinite_key = str(dbs / "interrupted.db")
    write_checkpoint(base / "state" / "ratio_dbs.smooshq", {infinite_key: math.inf, str(dbs / "other.db"): 7.5})
    write_checkpoint(base / "state" / "slack_dbs.smooshq", {str(dbs / "slack.db"): 1e6})
    daemon = Daemon(config)
    try:
        daemon.wait_ready()
        fresh = dbs / "fresh.db"
        make_bloated_db(str(fresh), delete_fraction=0.9)
        code, body = daemon.post("/enqueue", {"keys": [str(fresh)]})
        assert code == 202 and body == {"accepted": 1, "rejected": []}, body
        wait_for(lambda: daemon.get("/status")["channels"]["ratio_dbs"]["waiting"]["size"] == 3, HANG_S,
                 what="fresh.db queued in ratio_dbs", daemon=daemon)
    except BaseException:
        daemon.kill()
        raise
    return PausedDaemon(daemon, base, infinite_key, str(fresh))
