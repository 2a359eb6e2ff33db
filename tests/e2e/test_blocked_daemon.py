"""Blocked compactions as an operator sees them: /jobs, /metrics and the log at WARNING (issue 18).

One real `smoosh run` meets two databases it cannot compact: one whose WAL a reader (another
process, inside a read transaction) pins, and one under a directory that is read-only for the
daemon. Run as root, which ignores file modes, the test bind-mounts that directory read-only
in a mount namespace of the daemon's own (``unshare --mount``): the kernel then refuses every
write there (EROFS) whatever the user, and nothing outside the daemon's namespace changes.
Run as any other user, plain file modes do it.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from compactor.dbfactory import integrity, make_bloated_db
from helpers.daemon import HANG_S, Daemon, free_port, wait_for, write_config
from helpers.locks import ChildConnection
from smoosh.daemon.history import longest_backoff_s


def _can_mount_read_only(tmp_path: Path) -> bool:
    probe = tmp_path / "probe"
    probe.mkdir()
    if shutil.which("unshare") is None:
        return False
    script = f"mount --bind {probe} {probe} && mount -o remount,bind,ro {probe} {probe} && ! touch {probe}/x"
    done = subprocess.run(["unshare", "--mount", "sh", "-c", script], capture_output=True, timeout=10)
    return done.returncode == 0


class ReadOnlyDirDaemon(Daemon):
    """A `smoosh run` that sees ``read_only_dir`` through a read-only bind mount of its own."""

    def __init__(self, config: Path, read_only_dir: Path) -> None:
        self.config = config
        self.port = int(config.read_text().split("http = ", 1)[1].split("\n", 1)[0].rsplit(":", 1)[1])
        self.log_path = config.parent / f"daemon-{time.monotonic_ns()}.log"
        self._log = open(self.log_path, "wb")
        ro = shlex.quote(str(read_only_dir))
        run = " ".join(shlex.quote(a) for a in (sys.executable, "-m", "smoosh", "run", "--config", str(config)))
        script = f"mount --bind {ro} {ro} && mount -o remount,bind,ro {ro} {ro} && exec {run}"
        env = dict(os.environ, PYTHONUNBUFFERED="1", SMOOSH_LOG_LEVEL="DEBUG")
        # unshare and sh both exec: the daemon keeps this process's pid, so signals reach it.
        self.proc = subprocess.Popen(
            ["unshare", "--mount", "sh", "-c", script],
            stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=str(config.parent),
        )


def _jobs(d: Daemon) -> dict[str, dict[str, Any]]:
    return {j["key"]: j for j in d.get("/jobs")["jobs"]}


def test_a_pinned_wal_and_a_read_only_file_end_blocked_everywhere_an_operator_looks(
    tmp_path: Path, daemons: list[Daemon]
) -> None:
    as_root = os.geteuid() == 0
    if as_root and not _can_mount_read_only(tmp_path):
        pytest.skip("as root, needs unshare --mount and a bind mount (CAP_SYS_ADMIN) to make a directory read-only")
    base = Path(os.path.realpath(tmp_path))
    # As root, dbs/ro is made read-only by a bind mount: a mount below the root, which the
    # operator opts in to (smoosh refuses files on another mount than their root by default).
    config = write_config(base, port=free_port(), extra_global=f"allow_mounts = {base / 'dbs'}" if as_root else "")
    dbs = base / "dbs"
    (dbs / "ro").mkdir()
    pinned = dbs / "pinned.db"
    read_only = dbs / "ro" / "locked.db"
    make_bloated_db(str(pinned), rows=2000, delete_fraction=0.8)
    make_bloated_db(str(read_only), rows=2000, delete_fraction=0.8, journal_mode="delete")
    pinned_size = pinned.stat().st_size
    read_only_bytes = read_only.read_bytes()

    # Given a reader inside a read transaction on the WAL database, before the daemon starts
    with ChildConnection(pinned) as reader:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM docs")
        # When the daemon, which sees dbs/ro read-only, compacts both
        if as_root:
            d: Daemon = ReadOnlyDirDaemon(config, dbs / "ro")
        else:  # file modes bind every other user
            os.chmod(read_only, 0o444)
            os.chmod(dbs / "ro", 0o555)
            d = Daemon(config)
        daemons.append(d)
        d.wait_ready()

        def both_blocked() -> Any:
            jobs = _jobs(d)
            done = [jobs.get(str(k), {}) for k in (pinned, read_only)]
            return jobs if all(j.get("result") == "blocked" for j in done) else None

        jobs = wait_for(both_blocked, HANG_S, what="both keys blocked in /jobs", daemon=d)

        # Then /jobs says blocked (its result; waiting out its backoff, not "crashing"), with the
        # reason an operator can act on
        wal = os.path.getsize(str(pinned) + "-wal")
        pinned_job = jobs[str(pinned)]
        assert (pinned_job["state"], jobs[str(read_only)]["state"]) == ("pending", "pending")
        assert pinned_job["last_error"].startswith(
            f"blocked: a reader holds the WAL: {wal} bytes still in {pinned}-wal; held by pid {reader.proc.pid} (")
        assert pinned_job["history"][0]["event"] == "blocked"
        ro_job = jobs[str(read_only)]
        assert ro_job["last_error"] == "blocked: read-only"
        assert ro_job["history"][0]["event"] == "blocked"
        # retried at the longest backoff at once, not climbing to it
        assert ro_job["retry_at"] - ro_job["history"][0]["at"] == pytest.approx(longest_backoff_s(30.0))
        assert pinned.stat().st_size == pinned_size
        # And /metrics shows the pinned log, its size and age
        while_pinned = _text(d.url + "/metrics")
        assert "smoosh_wal_pinned_databases 1.0" in while_pinned
        assert f"smoosh_wal_pinned_bytes {float(os.path.getsize(str(pinned) + '-wal'))}" in while_pinned
        reader.execute("COMMIT")

    # And /metrics counts them under result="blocked"
    metrics = _text(d.url + "/metrics")
    assert re.search(r'smoosh_compactions_total\{channel="ratio_dbs",result="blocked"\} 2\.0', metrics), metrics
    assert 'result="failed"} 0.0' in metrics
    # And the log has one WARNING line each, and no traceback
    assert d.stop() == 0
    log = d.log_path.read_text(errors="replace")
    warnings = [line for line in log.splitlines() if "ended blocked" in line]
    assert len(warnings) == 2, log[-4000:]
    assert all(" WARNING " in line for line in warnings), warnings
    assert any(line.endswith(f"{str(read_only)!r} in ratio_dbs ended blocked: read-only; retrying in 30720 s")
               for line in warnings), warnings
    assert "Traceback" not in log
    assert read_only.read_bytes() == read_only_bytes
    assert integrity(str(pinned)) == "ok" and integrity(str(read_only)) == "ok"


def _text(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()
