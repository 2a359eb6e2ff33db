"""The finished compactions' history survives a restart (DESIGN §12: durable history costs no extra
commit): ``/jobs`` shows each key's last results after it, and ``smoosh jobs list`` lists them,
where it said "no jobs found" after 101 compactions.

Real `smoosh run` processes on a real SQLite job store, real bloated databases, a SIGTERM and a
second daemon on the same state_dir; the CLI as a subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from compactor.dbfactory import make_bloated_db
from helpers.daemon import Daemon, free_port, wait_for, write_config
from smoosh.cli.jobs import FINISHED_KEPT
from smoosh.daemon.results import DEFAULT_MAX_KEYS, Result, ResultLog, read_rows
from smoosh.store import open_store

#: Ceiling on the compactions finishing (only bounds a hang).
COMPACTED_WITHIN_S = 60.0
DATABASES = ("a.db", "b.db")


def jobs_by_key(d: Daemon) -> dict[str, dict[str, Any]]:
    return {j["key"]: j for j in d.get("/jobs")["jobs"]}


def test_history_of_finished_compactions_survives_a_restart(tmp_path: Path, daemons: list[Daemon]) -> None:
    # Given a daemon that compacted two databases
    base = tmp_path.resolve()
    config = write_config(base, port=free_port(), extra_global=f"watch =\nroots = {base / 'dbs'}")
    first = Daemon(config)
    daemons.append(first)
    first.wait_ready()
    keys = [str(base / "dbs" / name) for name in DATABASES]
    for key in keys:
        make_bloated_db(key, rows=3000, delete_fraction=0.9)
    assert first.post("/enqueue", {"keys": keys})[0] == 202
    wait_for(lambda: all(jobs_by_key(first).get(k, {}).get("state") == "finished" for k in keys), COMPACTED_WITHIN_S,
             what="both compactions", daemon=first)
    before = jobs_by_key(first)
    assert first.stop() == 0
    # When a new daemon starts on the same state_dir and store
    second = Daemon(config)
    daemons.append(second)
    second.wait_ready()
    after = jobs_by_key(second)
    # Then /jobs shows each key finished, with the event its compaction ended with
    for key in keys:
        assert (after[key]["state"], after[key]["channel"]) == ("finished", before[key]["channel"])
        finished = after[key]["history"][0]
        assert finished["event"] == "finished" and finished["reason"] == before[key]["history"][0]["reason"]
        assert abs(finished["at"] - before[key]["history"][0]["at"]) < 5  # ended then (its worker's clock)
    # And `smoosh jobs list` lists them as finished, the JSON with their result and bytes
    listed = subprocess.run([sys.executable, "-m", "smoosh", "jobs", "--config", str(config), "list"],
                            capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["TYPE", "ID", "STATE", "SCHEDULED"]
    assert sorted(line.split()[:3] for line in lines[1:-1]) == [["smoosh:testnode", k, "finished"] for k in keys]
    assert lines[-1] == FINISHED_KEPT
    as_json = json.loads(subprocess.run(
        [sys.executable, "-m", "smoosh", "jobs", "--config", str(config), "list", "--json"],
        capture_output=True, text=True, timeout=60).stdout)
    for row in as_json["jobs"]:
        (result,) = row["data"]["results"]
        assert result["result"] == "ok" and result["size_before_bytes"] > result["size_after_bytes"] > 0
        assert before[row["id"]]["history"][0]["reason"] == (
            f"reclaimed {result['size_before_bytes'] - result['size_after_bytes']} bytes")
    assert second.stop() == 0


def test_the_durable_history_is_bounded_per_key_and_in_total(tmp_path: Path) -> None:
    # Given a node's results written through the log, each in a transaction of its own
    store = open_store(f"sqlite:{tmp_path / 'jobs.db'}")
    try:
        log = ResultLog("n1", max_per_key=3, max_keys=2)
        for i in range(5):
            store.transact(log.write_for("/db/a", Result(float(i), "ratio_dbs", "ok", 0.1, 100 + i, 10)))
        store.transact(log.write_for("/db/b", Result(10.0, "ratio_dbs", "failed", 0.1, 5, 5, "boom")))
        # Then a key keeps its last 3 results, newest first
        rows = store.transact(lambda tr: read_rows(tr.snapshot, "n1"))
        assert [r.size_before_bytes for r in rows["/db/a"]] == [104, 103, 102]
        # When a third key finishes: the least recently finished key's row goes in the same write
        store.transact(log.write_for("/db/c", Result(11.0, "slack_dbs", "ok", 0.1, 5, 1)))
        rows = store.transact(lambda tr: read_rows(tr.snapshot, "n1"))
        assert sorted(rows) == ["/db/b", "/db/c"]
        assert rows["/db/b"][0].error == "boom"
        # And a restart's log, restored from the store, goes on from there
        again = ResultLog("n1", max_per_key=3, max_keys=2)
        again.restore(rows)
        store.transact(again.write_for("/db/d", Result(12.0, "ratio_dbs", "ok", 0.1, 5, 1)))
        assert sorted(store.transact(lambda tr: read_rows(tr.snapshot, "n1"))) == ["/db/c", "/db/d"]
    finally:
        store.close()
    assert DEFAULT_MAX_KEYS == 1000
