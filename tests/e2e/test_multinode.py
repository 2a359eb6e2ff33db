"""Three nodes, one store: cluster holds through `smoosh suspend|resume --store`, obeyed by real daemons.

Three `smoosh run` processes with different ``node`` names share one ``sqlite:`` store, each
watching a directory of its own. A cluster-wide hold stops one channel on all three; a node
hold stops only its node; a local suspension and a cluster hold are two holds, each cleared
only by its own verb; once every hold is gone all three compact, each its own databases,
each exactly once. The daemons react through the store's watch: the test waits on their
``/status`` with a deadline and never sleeps for a timer.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from compactor.dbfactory import make_bloated_db
from helpers.daemon import HANG_S, Daemon, free_port, wait_for, write_config

NODES = ("n1", "n2", "n3")
CHANNEL = "ratio_dbs"
#: Deadline for a daemon to show what the store or an operator just told it.
OBEY_S = 10.0
#: Deadline for a node's compactions once it may run them.
COMPACT_S = 30.0


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "smoosh", *args], capture_output=True, text=True, timeout=60)


def channel(d: Daemon) -> dict[str, Any]:
    return d.get("/status")["channels"][CHANNEL]


def jobs(d: Daemon) -> dict[str, dict[str, Any]]:
    return {j["key"]: j for j in d.get("/jobs")["jobs"]}


def events(d: Daemon, key: Path, event: str) -> int:
    return sum(e["event"] == event for e in jobs(d).get(str(key), {}).get("history", []))


def store_jobs(store_url: str) -> list[tuple[Any, str, str]]:
    """Every job in the shared store, of every node's type: ``(type, id, state)``."""
    from smoosh.jobs import Jobs
    from smoosh.store import open_store

    with open_store(store_url) as store:
        layer = Jobs(store, monitors=False)
        try:
            return [(t, i, s) for t, i, s, _ in layer.list_jobs()]
        finally:
            layer.close()


def integrity(db: Path) -> str:
    with sqlite3.connect(db) as conn:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])


def start_nodes(tmp_path: Path, daemons: list[Daemon], store_url: str, names: tuple[str, ...]) -> dict[str, Daemon]:
    """One daemon per name on the shared store, each watching a directory of its own; all ready."""
    nodes: dict[str, Daemon] = {}
    for node in names:
        base = tmp_path / node
        base.mkdir(exist_ok=True)
        # One channel for databases, so the test knows where each key waits.
        config = write_config(base, port=free_port(),
                              extra_global=f"node = {node}\nstore = {store_url}\ndb_channels = {CHANNEL}")
        nodes[node] = Daemon(config)
        daemons.append(nodes[node])
    for d in nodes.values():
        d.wait_ready()
    return nodes


def test_three_nodes_obey_cluster_holds_node_holds_and_their_own_suspension(tmp_path: Path, daemons: list[Daemon]) -> None:
    store_url = f"sqlite:{tmp_path / 'shared.db'}"
    nodes = start_nodes(tmp_path, daemons, store_url, NODES)
    n1, n2, n3 = (nodes[n] for n in NODES)

    # A cluster-wide hold of one channel: every node shows it, and nothing of it starts.
    out = cli("suspend", CHANNEL, "--store", store_url)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"suspend: channel {CHANNEL} of every node, held by ")
    for d in nodes.values():
        wait_for(lambda: channel(d)["held"], OBEY_S, what=f"{CHANNEL} held on port {d.port}", daemon=d)
        assert channel(d)["held"]["node"] is None and channel(d)["suspended"] is False
    dbs: dict[str, Path] = {}
    sizes: dict[str, int] = {}
    for node, d in nodes.items():
        db = d.config.parent / "dbs" / f"{node}-tenant.db"
        make_bloated_db(str(db), rows=3000, delete_fraction=0.9)
        dbs[node], sizes[node] = db, db.stat().st_size
    for node, d in nodes.items():
        wait_for(lambda: channel(d)["waiting"]["size"] == 1, OBEY_S, what=f"{node}'s database queued", daemon=d)

    # Node n1 also suspended locally; node n2 held as a whole; then the cluster hold of the
    # channel is resumed: n3 runs, n1 stays suspended (its own hold), n2 stays held (its node's).
    assert cli("suspend", CHANNEL, "--url", n1.url).returncode == 0
    out = cli("suspend", "--store", store_url, "--node", "n2")
    assert out.returncode == 0, out.stderr
    cluster = json.loads(cli("status", "--store", store_url, "--json").stdout)
    assert [(h["node"], h["channel"]) for h in cluster["holds"]] == [(None, CHANNEL), ("n2", None)]
    assert set(cluster["nodes"]) == set(NODES)
    out = cli("resume", CHANNEL, "--store", store_url)
    assert out.returncode == 1  # n2's own hold still holds that channel there, and it says so
    assert "still held: every channel of node n2, held by " in out.stderr
    assert f"`smoosh resume --store {store_url} --node n2` clears it" in out.stderr
    wait_for(lambda: jobs(n3).get(str(dbs["n3"]), {}).get("state") == "finished", COMPACT_S,
             what="n3's compaction once the cluster hold is gone", daemon=n3)
    wait_for(lambda: (channel(n2)["held"] or {}).get("node") == "n2", OBEY_S,
             what="n2 shown under its node's hold", daemon=n2)
    assert channel(n2)["held"]["channel"] is None
    wait_for(lambda: channel(n1)["held"] is None, OBEY_S, what="n1's cluster hold gone", daemon=n1)
    assert channel(n1)["suspended"] is True
    for d in (n1, n2):
        status = channel(d)
        assert (status["waiting"]["size"], status["active"], status["starting"]) == (1, 0, 0), status
        assert not any(e["event"] == "started" for j in jobs(d).values() for e in j["history"])
    assert {(t, i) for t, i, _ in store_jobs(store_url)} <= {("smoosh:n3", str(dbs["n3"]))}

    # Every hold cleared by its own verb: all three have compacted, each its own database once.
    out = cli("resume", "--store", store_url, "--node", "n2")
    assert (out.returncode, out.stderr) == (0, "")
    assert cli("resume", CHANNEL, "--url", n1.url).returncode == 0
    for node, d in nodes.items():
        wait_for(lambda: jobs(d).get(str(dbs[node]), {}).get("state") == "finished", COMPACT_S,
                 what=f"{node}'s compaction", daemon=d)
    for node, d in nodes.items():
        assert set(jobs(d)) == {str(dbs[node])}  # nobody touched another node's database
        assert (events(d, dbs[node], "started"), events(d, dbs[node], "finished")) == (1, 1)
        assert dbs[node].stat().st_size < sizes[node] / 3
        assert integrity(dbs[node]) == "ok"
        status = channel(d)
        assert (status["held"], status["suspended"], status["holding"]) == (None, False, False)
    wait_for(lambda: store_jobs(store_url) == [], OBEY_S, what="every finished job removed from the store")
    assert json.loads(cli("status", "--store", store_url, "--json").stdout)["holds"] == []
    for d in nodes.values():
        assert d.stop() == 0


@pytest.mark.slow
def test_a_node_killed_with_sigkill_turns_stale_and_comes_back_under_the_hold(tmp_path: Path, daemons: list[Daemon]) -> None:
    """Soak-length (a record turns stale after 15 s): `make soak` runs it."""
    store_url = f"sqlite:{tmp_path / 'shared.db'}"
    nodes = start_nodes(tmp_path, daemons, store_url, ("n1", "n2"))
    assert cli("suspend", "--store", store_url).returncode == 0
    for d in nodes.values():
        wait_for(lambda: channel(d)["held"], OBEY_S, what="the hold", daemon=d)
    nodes["n2"].kill()

    def n2_stale() -> dict[str, Any] | None:
        body = json.loads(cli("status", "--store", store_url, "--json").stdout)
        return body if body["nodes"]["n2"]["stale"] else None

    body = wait_for(n2_stale, HANG_S, what="n2's record to turn stale", every_s=1.0)
    assert body["nodes"]["n1"]["stale"] is False
    assert [(h["node"], h["channel"]) for h in body["holds"]] == [(None, None)]
    # Restarted, it is held from its first status on: the hold is read before any channel opens.
    again = Daemon(nodes["n2"].config)
    daemons.append(again)
    again.wait_ready()
    assert channel(again)["held"]["node"] is None
    for d in (nodes["n1"], again):
        assert d.stop() == 0
