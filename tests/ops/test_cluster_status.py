"""`smoosh status --store`: every node's record from one shared store, no daemon contacted (DESIGN §5.7)."""

from __future__ import annotations

import datetime
import json
import re
import time
from pathlib import Path

from opslib import smoosh_cli

from helpers.daemon import HANG_S, Daemon, free_port, wait_for, write_config


def test_two_daemons_sharing_a_store_are_both_listed_and_an_old_record_is_stale(tmp_path: Path, daemons: list[Daemon]) -> None:
    store_url = f"sqlite:{tmp_path / 'shared.db'}"
    for node in ("alpha", "beta"):
        base = tmp_path / node
        base.mkdir()
        d = Daemon(write_config(base, port=free_port(), extra_global=f"node = {node}\nstore = {store_url}"))
        daemons.append(d)
    for d in daemons:
        d.wait_ready()
    d_alpha = daemons[0]
    assert d_alpha.post("/suspend", {"channel": "slack_dbs"})[0] == 200

    def both_listed() -> dict | None:
        out = smoosh_cli("status", "--store", store_url, "--json")
        assert out.returncode == 0, out.stderr
        nodes = json.loads(out.stdout)["nodes"]
        alpha = nodes.get("alpha", {}).get("channels", {}).get("slack_dbs", {})
        return nodes if "beta" in nodes and alpha.get("suspended") else None

    nodes = wait_for(both_listed, HANG_S, what="both nodes' records, alpha's showing the suspension", daemon=d_alpha)
    assert set(nodes) == {"alpha", "beta"}
    for name, record in nodes.items():
        assert {"updated_at", "stale", "channels"} <= set(record), name
        assert record["stale"] is False
        assert abs(record["updated_at"] - time.time()) < 15
        ratio = record["channels"]["ratio_dbs"]
        assert {"active", "starting", "waiting", "paused", "suspended", "in_window", "reclaimable_bytes"} <= set(ratio)
    assert nodes["beta"]["channels"]["slack_dbs"]["suspended"] is False

    text = smoosh_cli("status", "--store", store_url)
    assert text.returncode == 0
    headers = [line for line in text.stdout.splitlines() if line.startswith("== ")]
    assert [h.split(",")[0] for h in headers] == ["== alpha", "== beta"]
    assert "(stale)" not in text.stdout


def test_a_record_older_than_15_s_is_marked_stale(tmp_path: Path) -> None:
    from smoosh.daemon.record.status import write_node_status
    from smoosh.store import open_store

    store_url = f"sqlite:{tmp_path / 'shared.db'}"
    status = {"channels": {"ratio_dbs": {"active": 0, "starting": 0, "waiting": {"size": 1, "min": 2.0, "max": float("inf")},
                                         "paused": False, "suspended": False, "in_window": True, "reclaimable_bytes": 10}},
              "reclaimable_bytes": 10}
    now = time.time()
    with open_store(store_url) as store:
        write_node_status(store, "old", status, now - 60)
        write_node_status(store, "fresh", status, now)
    out = smoosh_cli("status", "--store", store_url, "--json")
    assert out.returncode == 0, out.stderr
    assert "Infinity" not in out.stdout
    nodes = json.loads(out.stdout)["nodes"]
    assert nodes["old"]["stale"] is True and nodes["fresh"]["stale"] is False
    assert nodes["old"]["updated_at"] == now - 60
    assert 60 <= nodes["old"]["age_s"] < 75 and 0 <= nodes["fresh"]["age_s"] < 15
    assert nodes["old"]["channels"]["ratio_dbs"]["waiting"]["max"] == "infinity"
    text = smoosh_cli("status", "--store", store_url).stdout
    local = lambda t: datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")  # noqa: E731
    # The CLI ran a moment after the records were written: the age is a minute and a few seconds.
    assert re.search(rf"^== old \(stale: last record 1 min \d+ s old\), updated {re.escape(local(now - 60))}$",
                     text, re.MULTILINE), text
    assert f"== fresh, updated {local(now)}" in text


def test_a_stale_nodes_heading_gives_the_age_of_its_last_record() -> None:
    from smoosh.cli.format import format_cluster

    at = 1_700_000_000.0
    local = datetime.datetime.fromtimestamp(at).strftime("%Y-%m-%d %H:%M:%S")
    for age_s, said in [(16.4, "16 s"), (75, "1 min 15 s"), (3 * 3600 + 240, "3 h 4 min"), (2 * 86400 + 3 * 3600, "2 d 3 h")]:
        text = format_cluster({"n1": {"updated_at": at, "state": "stale", "stale": True, "age_s": age_s, "channels": {}}})
        assert heading(text) == f"== n1 (stale: last record {said} old), updated {local}"
    fresh = format_cluster({"n1": {"updated_at": at, "state": "live", "stale": False, "age_s": 3.0, "channels": {}}})
    assert heading(fresh) == f"== n1, updated {local}"


def heading(text: str) -> str:
    """The first node's heading line (after the fleet's summary)."""
    return next(line for line in text.splitlines() if line.startswith("== "))


def test_an_empty_store_says_so(tmp_path: Path) -> None:
    from smoosh.store import open_store

    open_store(f"sqlite:{tmp_path / 'empty.db'}").close()
    out = smoosh_cli("status", "--store", f"sqlite:{tmp_path / 'empty.db'}")
    assert (out.returncode, out.stdout) == (0, "no node has written a status record to this store\n")
    out = smoosh_cli("status", "--store", f"sqlite:{tmp_path / 'empty.db'}", "--json")
    assert json.loads(out.stdout) == {"nodes": {}, "holds": []}


def test_a_mistyped_store_is_an_error_naming_the_path_not_a_new_store(tmp_path: Path) -> None:
    typo = tmp_path / "jbos.db"
    for argv in (["status", "--store", f"sqlite:{typo}"], ["jobs", "--store", f"sqlite:{typo}", "list"]):
        out = smoosh_cli(*argv)
        assert out.returncode == 1 and out.stdout == "", argv
        assert f"no smoosh job store at {typo} (no such file): is the path mistyped?" in out.stderr, argv
    assert not typo.exists() and sorted(p.name for p in tmp_path.iterdir()) == []
