"""The operator's commands against a real daemon: the status table, JSON, jobs, --watch, exit codes."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time

import pytest
from opslib import PausedDaemon, request, smoosh_cli

from helpers.daemon import HANG_S, free_port

HEADER = ["CHANNEL", "ACTIVE", "STARTING", "WAITING", "MIN", "MAX", "DEFERRED", "WINDOW", "PAUSED", "RECLAIMABLE"]


def rows(text: str) -> dict[str, list[str]]:
    """The table's rows by channel name, each split into its columns."""
    lines = text.splitlines()
    assert lines[0].split() == HEADER
    return {line.split()[0]: line.split() for line in lines[1:] if line and not line.startswith(("node ", "no ", "config", "restart", "I/O budget"))}


def test_status_prints_one_row_per_channel_with_counts_priorities_window_and_pause(paused: PausedDaemon) -> None:
    out = smoosh_cli("status", "--url", paused.url)
    assert out.returncode == 0, out.stderr
    table = rows(out.stdout)
    assert list(table) == ["upgrade_dbs", "ratio_dbs", "slack_dbs", "index_cleanup"]
    name, active, starting, waiting, _min, _max, deferred, window, pause = table["ratio_dbs"][:9]
    assert (active, starting, waiting, _max, deferred, window, pause) == ("0", "0", "3", "inf", "0", "always", "yes")
    assert out.stdout.splitlines()[-1].startswith("node testnode: ")
    assert out.stdout.splitlines()[-1].endswith(" reclaimable")


def test_status_json_is_the_daemons_body_without_infinity(paused: PausedDaemon) -> None:
    out = smoosh_cli("status", "--url", paused.url, "--json")
    assert out.returncode == 0
    assert "Infinity" not in out.stdout
    body = json.loads(out.stdout)
    served = request(paused.url + "/status").json()
    assert set(body) == set(served)
    assert body["channels"]["ratio_dbs"]["waiting"]["max"] == "infinity"


def test_status_jobs_lists_each_key_with_its_state(paused: PausedDaemon) -> None:
    out = smoosh_cli("status", "--url", paused.url, "--jobs")
    assert out.returncode == 0
    assert f"{paused.fresh}  [ratio_dbs] pending 0%  errors=0" in out.stdout.splitlines()
    as_json = json.loads(smoosh_cli("status", "--url", paused.url, "--jobs", "--json").stdout)
    assert paused.fresh in {j["key"] for j in as_json["jobs"]}


def test_status_watch_in_a_pipe_prints_once_and_exits(paused: PausedDaemon) -> None:
    # A watch that redrew in a pipe would never end: the ceiling, not a measure of speed
    out = smoosh_cli("status", "--url", paused.url, "--watch", timeout_s=HANG_S)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("CHANNEL") == 1
    assert "\x1b[" not in out.stdout  # no terminal control codes in a pipe
    assert out.stdout.rstrip().endswith("no compaction running")


def ctrl_c_reaches_it() -> None:
    """In the child, before exec: SIGINT back to its default, so Python turns it into KeyboardInterrupt.

    A suite started in the background (``make test &``, some CI runners, nohup) runs with SIGINT
    ignored, and an ignored signal stays ignored across exec: the CLI would never see Ctrl-C
    (``/proc/PID/status`` of the hung child showed SigIgn 0x...1006: SIGINT and SIGQUIT). A
    terminal's user has it at its default; so does the CLI here.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_status_watch_on_a_terminal_redraws_every_second_until_ctrl_c(paused: PausedDaemon) -> None:
    leader, follower = pty.openpty()
    env = dict(os.environ, TERM="xterm", COLUMNS="120", LINES="40")
    proc = subprocess.Popen([sys.executable, "-m", "smoosh", "status", "--url", paused.url, "--watch"],
                            stdin=follower, stdout=follower, stderr=follower, env=env, close_fds=True,
                            preexec_fn=ctrl_c_reaches_it)
    os.close(follower)
    seen = b""
    try:
        # Two frames: a ceiling that only bounds a hang (the second comes a second after the first)
        deadline = time.monotonic() + HANG_S
        while seen.count(b"CHANNEL") < 2 and time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.5)
            if ready:
                try:
                    seen += os.read(leader, 65536)
                except OSError:
                    break
        assert seen.count(b"CHANNEL") >= 2, seen.decode(errors="replace")
        assert b"\x1b[" in seen and b"(Ctrl-C to quit)" in seen
        proc.send_signal(signal.SIGINT)
        assert proc.wait(HANG_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(HANG_S)
        os.close(leader)


@pytest.mark.parametrize("action", ["suspend", "resume", "flush"])
def test_naming_an_unknown_channel_exits_1_with_the_daemons_reason(paused: PausedDaemon, action: str) -> None:
    out = smoosh_cli(action, "--url", paused.url, "nosuch")
    assert out.returncode == 1
    assert out.stderr == f"smoosh: POST {paused.url}/{action}: 404 unknown channel 'nosuch'\n"


def test_usage_errors_exit_2_and_an_unreachable_daemon_exits_1() -> None:
    assert smoosh_cli().returncode == 2
    assert smoosh_cli("status", "--bogus").returncode == 2
    assert smoosh_cli("status", "--url", "http://x", "--store", "memory:").returncode == 2
    assert smoosh_cli("enqueue", "--url", "http://x").returncode == 2
    port = free_port()
    out = smoosh_cli("status", "--url", f"http://127.0.0.1:{port}")
    assert out.returncode == 1
    assert out.stderr.startswith(f"smoosh: cannot reach smoosh at http://127.0.0.1:{port}/status: ")


def test_dry_run_status_lists_what_would_run_in_order() -> None:
    from smoosh.cli.format import format_status

    body = {
        "node": "n", "dry_run": True, "reclaimable_bytes": 0,
        "channels": {"ratio_dbs": {"waiting": {"size": 2, "min": 3, "max": "infinity"},
                                   "would_run": [["/db/a", "infinity"], ["/db/b", 3.5]]}},
    }
    text = format_status(body)
    assert "would run in ratio_dbs #1: /db/a (priority inf)" in text
    assert "would run in ratio_dbs #2: /db/b (priority 3.5)" in text
    assert "(dry run)" in text


def test_starved_keys_show_under_the_status_table_and_in_the_jobs_lines() -> None:
    from smoosh.cli.format import format_jobs, format_status, status_summary

    body = {"node": "n", "reclaimable_bytes": 0,
            "channels": {"ratio_dbs": {"waiting": {"size": 1, "min": 3, "max": 3}, "starved": 2},
                         "slack_dbs": {"waiting": {"size": 0, "min": 0, "max": 0}, "starved": 0}}}
    assert ("starved (busy more than busy_retries times in a row; see smoosh status --jobs): ratio_dbs 2"
            in format_status(body).splitlines())
    assert status_summary(body) == "0 active, 0 starting, 1 waiting, 2 starved"
    jobs = [{"key": "/db/a", "channel": "ratio_dbs", "state": "starved", "progress": 0.0, "error_count": 0,
             "busy_count": 11, "history": []}]
    assert format_jobs(jobs).splitlines()[0] == "/db/a  [ratio_dbs] starved 0%  errors=0  busy=11 in a row"
    starved_none = dict(body, channels={"slack_dbs": body["channels"]["slack_dbs"]})
    assert "starved" not in format_status(starved_none) and "starved" not in status_summary(starved_none)


def test_status_names_each_compaction_in_flight_and_the_waits_for_an_application() -> None:
    from smoosh.cli.format import format_status

    body = {"node": "n", "reclaimable_bytes": 0,
            "channels": {"ratio_dbs": {"waiting": {"size": 0, "min": 0, "max": 0}, "active": 1, "runs": [
                {"key": "/db/a", "state": "running", "age_s": 125.0, "progress": 0.4, "since_progress_s": 3.2},
                {"key": "/db/b", "state": "starting", "age_s": 1.0, "progress": 0.0, "since_progress_s": 1.0}]}},
            "application": {"waits": 3, "wait_seconds": 0.42, "gave_up": 1, "looks_locked": 0, "looks_lockless": 9}}
    lines = format_status(body).splitlines()
    assert "running in ratio_dbs: /db/a, 2 min 5 s, 40%, last progress 3 s ago" in lines
    assert "starting in ratio_dbs: /db/b, 1 s" in lines
    assert ("applications in a transaction: waited 3 time(s), 0.4 s in all, for a moment with none open; "
            "found none 1 time(s) (busy, retried later)") in lines
    quiet = dict(body, application={"waits": 0, "wait_seconds": 0.0, "gave_up": 0})
    assert not any(line.startswith("applications") for line in format_status(quiet).splitlines())
