"""The operator's verbs against a `smoosh run` subprocess, through real sockets and the real CLI (issue 14):
flush forgets staleness, enqueue --force, explain, /jobs?state=&limit=, --json on every command that prints."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
from contextlib import chdir, redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any, Iterator

import pytest
from opslib import request, smoosh_cli

from compactor.dbfactory import make_bloated_db
from helpers.daemon import HANG_S, Daemon, free_port, wait_for, write_config
from smoosh.cli import main


class Fleet:
    """A daemon whose channels stay in their start-up pause (staleness 5 min, no watcher), and its files."""

    def __init__(self, base: Path) -> None:
        self.base = Path(os.path.realpath(base))
        self.dbs = self.base / "dbs"
        self.dbs.mkdir(exist_ok=True)
        self.config = write_config(self.base, port=free_port(),
                                   extra_global=f"wait_secs = 3600\nstaleness = 5\nwatch =\nroots = {self.dbs}")
        self.daemon = Daemon(self.config)
        self.daemon.wait_ready()

    @property
    def url(self) -> str:
        return self.daemon.url

    def db(self, name: str, **kw: Any) -> str:
        path = self.dbs / name
        make_bloated_db(str(path), **kw)
        return str(path)

    def cli(self, *args: str) -> Any:
        """The CLI in this process (the daemon is the subprocess): ``main`` as ``python -m smoosh`` runs it."""
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err), chdir(self.dbs):
            code = main([*args, "--url", self.url])
        return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())

    def jobs(self, query: str = "") -> Any:
        return request(f"{self.url}/jobs{query}")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    f = Fleet(tmp_path_factory.mktemp("verbs"))
    yield f
    f.daemon.kill()


def test_after_smoosh_flush_an_enqueue_of_a_dropped_key_queues_it_again(fleet: Fleet) -> None:
    # The real command, in a process of its own
    def cli(*args: str) -> Any:
        return smoosh_cli(*args, "--url", fleet.url, cwd=fleet.dbs)

    key = fleet.db("flushed.db", delete_fraction=0.9)
    assert cli("enqueue", key).stdout.startswith(f"queued {key} in ratio_dbs")
    assert cli("enqueue", key).stdout.startswith(f"not queued {key}: stale until ")
    out = cli("flush", "ratio_dbs")
    assert (out.returncode, out.stdout) == (0, "flush: channel ratio_dbs (1 waiting key(s) dropped)\n")
    assert cli("enqueue", key).stdout.startswith(f"queued {key} in ratio_dbs")


def test_enqueue_force_compacts_a_database_below_every_threshold_during_the_pause(fleet: Fleet) -> None:
    tiny = fleet.db("tiny.db", rows=10)
    assert fleet.cli("enqueue", tiny).stdout.startswith(f"not queued {tiny}: below every channel's threshold")
    out = fleet.cli("enqueue", "--force", "tiny.db")
    assert (out.returncode, out.stdout) == (0, f"queued {tiny} in ratio_dbs at priority inf (forced)\n")
    wait_for(lambda: tiny in {j["key"] for j in fleet.jobs("?state=finished").json()["jobs"]}, HANG_S,
             what="the forced compaction", daemon=fleet.daemon)


def test_a_force_that_is_not_a_boolean_is_400_naming_it(fleet: Fleet) -> None:
    reply = request(f"{fleet.url}/enqueue", "POST", {"keys": [], "force": "yes"})
    assert (reply.status, reply.json()) == (400, {"error": "'force' must be true or false, not \"yes\""})


def test_get_explain_answers_json_per_channel_and_the_cli_prints_it(fleet: Fleet) -> None:
    key = fleet.db("explained.db", delete_fraction=0.9)
    fleet.cli("enqueue", key)
    reply = request(f"{fleet.url}/explain?key={key}")
    assert reply.status == 200 and b"Infinity" not in reply.body
    answer = reply.json()
    assert (answer["state"], answer["channel"]) == ("queued", "ratio_dbs")
    assert list(answer["channels"]) == ["upgrade_dbs", "ratio_dbs", "slack_dbs"]
    assert answer["channels"]["ratio_dbs"]["thresholds"]["max_priority"] == "infinity"
    # The CLI: a readable block per channel, or the same JSON
    out = fleet.cli("explain", "explained.db")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[:2] == [key, "  state:      queued in ratio_dbs"]
    assert lines[2].startswith("  reason:     queued in channel ratio_dbs at priority ")
    assert "  ratio_dbs: queued at priority " in out.stdout
    assert "    gives it:   priority 0 (no upgrade needed)" in lines
    as_json = json.loads(fleet.cli("explain", "--json", key).stdout)
    position = as_json["channels"]["ratio_dbs"]["position"]
    assert as_json["state"] == "queued" and f", position {position};" in as_json["reason"]


def test_explain_of_a_rejected_key_and_a_missing_parameter(fleet: Fleet, tmp_path: Path) -> None:
    answer = request(f"{fleet.url}/explain?key={tmp_path / 'elsewhere.db'}").json()
    assert (answer["state"], answer["reason"]) == ("rejected", f"outside roots ({fleet.dbs})")
    out = fleet.cli("explain", "missing.db")
    assert out.stdout.splitlines() == [str(fleet.dbs / "missing.db"), "  state:      rejected",
                                       "  reason:     no such file"]
    assert out.returncode == 1  # as `smoosh enqueue` for a rejected key
    reply = request(f"{fleet.url}/explain")
    assert (reply.status, reply.json()) == (400, {"error": "name one key: /explain?key=/path/to/db"})
    assert request(f"{fleet.url}/explain", "POST", {}).status == 405


@pytest.mark.parametrize(("query", "error"), [
    ("?state=bogus", "unknown state 'bogus': one of pending, running, crashing, starved, finished, dropped"),
    ("?state=", "unknown state '': one of pending, running, crashing, starved, finished, dropped"),
    ("?limit=0", "limit must be a whole number of at least 1, not '0'"),
    ("?limit=ten", "limit must be a whole number of at least 1, not 'ten'"),
    ("?offset=-1", "offset must be a whole number of at least 0, not '-1'"),
    ("?limit=1&limit=2", "limit given 2 times; give it once"),
    ("?page=2", "unknown parameter 'page': /jobs takes state, limit and offset"),
])
def test_jobs_refuses_a_bad_filter_naming_the_value(fleet: Fleet, query: str, error: str) -> None:
    reply = fleet.jobs(query)
    assert (reply.status, reply.json()) == (400, {"error": error})


def test_jobs_pages_by_state_and_limit_and_status_jobs_follows(fleet: Fleet) -> None:
    for name in ("page1.db", "page2.db"):
        fleet.cli("enqueue", fleet.db(name, delete_fraction=0.9))
    everything = fleet.jobs("?state=pending").json()
    assert everything["total"] >= 2 and all(j["state"] == "pending" for j in everything["jobs"])
    first = fleet.jobs("?state=pending&limit=1").json()
    assert (len(first["jobs"]), first["total"], first["offset"], first["next_offset"]) == (
        1, everything["total"], 0, 1)
    assert first["jobs"][0]["key"] == everything["jobs"][0]["key"]
    second = fleet.jobs("?state=pending,crashing&limit=1&offset=1").json()
    assert second["jobs"][0]["key"] == everything["jobs"][1]["key"]
    out = fleet.cli("status", "--state", "pending", "--limit", "1")
    assert out.returncode == 0
    assert out.stdout.splitlines()[0].startswith(f"{everything['jobs'][0]['key']}  [")
    assert out.stdout.splitlines()[-1] == f"showing 1-1 of {everything['total']}; more with --offset 1"
    out = fleet.cli("status", "--jobs", "--state", "bogus")
    assert out.returncode == 2 and "unknown state 'bogus'" in out.stderr


def test_every_command_that_prints_takes_json(fleet: Fleet) -> None:
    key = fleet.db("json.db", delete_fraction=0.9)
    enqueued = json.loads(fleet.cli("enqueue", "--json", key).stdout)
    assert enqueued["results"][0]["outcome"] == "queued"
    for action in ("suspend", "resume"):
        assert json.loads(fleet.cli(action, "--json", "slack_dbs").stdout) == {
            "ok": True, "action": action, "channel": "slack_dbs"}
    assert json.loads(fleet.cli("flush", "--json", "slack_dbs").stdout) == {
        "ok": True, "action": "flush", "channel": "slack_dbs", "dropped": 0}
    jobs = json.loads(fleet.cli("status", "--jobs", "--json", "--limit", "1").stdout)
    assert set(jobs) == {"jobs", "total", "offset", "next_offset"}
    checked = json.loads(smoosh_cli("config", "check", "--json", "--config", str(fleet.config)).stdout)  # no daemon
    assert checked == {"ok": True, "config": str(fleet.config), "error": None, "warnings": [],
                       "channels": ["upgrade_dbs", "ratio_dbs", "slack_dbs", "index_cleanup"]}


def test_config_check_json_reports_an_error_and_exits_1(tmp_path: Path) -> None:
    bad = tmp_path / "bad.ini"
    bad.write_text("[smoosh]\nmax_jobs = many\n")
    out = smoosh_cli("config", "check", "--json", "--config", str(bad))
    assert out.returncode == 1 and out.stderr == ""
    checked = json.loads(out.stdout)
    assert checked["ok"] is False and re.search(r"max_jobs.*many", checked["error"])


def test_enqueue_force_in_a_suspended_channel_says_what_holds_it_back(fleet: Fleet) -> None:
    key = fleet.db("held.db", delete_fraction=0.9)
    # Last in this module: ratio_dbs stays suspended (a resume would also end its start-up pause).
    assert fleet.cli("suspend", "ratio_dbs").returncode == 0
    reply = request(f"{fleet.url}/enqueue?wait=1", "POST", {"keys": [key], "force": True})
    assert reply.json()["results"] == [{
        "key": key, "outcome": "queued", "channel": "ratio_dbs", "priority": "infinity",
        "reason": "forced; held back: channel ratio_dbs is suspended (it starts when resumed)",
    }]
    assert fleet.cli("explain", key).stdout.splitlines()[2] == (
        "  reason:     queued in channel ratio_dbs at priority infinity, position 1, forced; "
        "held back: channel ratio_dbs is suspended (it starts when resumed)")
