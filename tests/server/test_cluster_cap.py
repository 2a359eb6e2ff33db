"""The fleet-wide cap in the daemon (``cluster_max_jobs``, issue 50): two nodes, one slot.

Two servers of this process, nodes ``a`` and ``b``, share one SQLite store with
``cluster_max_jobs = 1``. Their compactions are the real ones, through a compactor that counts
the compactions running in the whole process (both nodes) and can hold one at a gate. While
``a`` compacts, ``b``'s start is refused: its key waits in its channel, ``/status`` says since
when it waits, ``status --store`` shows who holds the slot and who waits, and nothing of ``b``
runs; the moment ``a``'s compaction ends (its finish gives the slot back), ``b``'s waiting
start is woken and runs. Never two at once.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from compactor.dbfactory import make_bloated_db
from helpers.daemon import HANG_S, wait_for
from helpers.jobs_table import record_of
from helpers.run_gates import Gate
from server.test_server import make_config
from smoosh.cli.cluster import cmd_cluster_status
from smoosh.compactors.sqlite import SqliteCompactor

RATIO = "ratio_dbs"


class Counting:
    """The real compactor; counts the compactions running in the process, and holds a key's at a gate."""

    running = 0
    most = 0
    lock = threading.Lock()

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.gates: dict[str, Gate] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def compact(self, key: str, ctx: Any) -> Any:
        with Counting.lock:
            Counting.running += 1
            Counting.most = max(Counting.most, Counting.running)
        try:
            gate = self.gates.pop(key, None)
            if gate is not None:
                gate.pass_through()
            return self._inner.compact(key, ctx)
        finally:
            with Counting.lock:
                Counting.running -= 1


def two_nodes(tmp_path: Path, running: Any) -> tuple[str, dict[str, Any], dict[str, Counting]]:
    """Nodes ``a`` and ``b`` on one SQLite store with ``cluster_max_jobs = 1``: the store's URL,
    the servers and their counting compactors, by node."""
    url = f"sqlite:{tmp_path / 'shared.db'}"
    servers, compactors = {}, {}
    for node in ("a", "b"):
        base = tmp_path / node
        base.mkdir()
        config = make_config(base, extra=f"store = {url}\nnode = {node}\ncluster_max_jobs = 1")
        compactors[node] = Counting(SqliteCompactor(config.sqlite, roots=config.roots))
        servers[node] = running(config, workers=2, compactors=[compactors[node]])
    return url, servers, compactors


def test_a_node_waits_for_the_one_slot_another_holds_and_takes_it_the_moment_it_is_given_back(
    tmp_path: Path, running: Any, capsys: Any
) -> None:
    url, servers, compactors = two_nodes(tmp_path, running)
    dbs = {}
    for node in ("a", "b"):
        dbs[node] = str(tmp_path / node / "dbs" / f"{node}.db")
        make_bloated_db(dbs[node], rows=400)
    a, b = servers["a"], servers["b"]
    # Given a's compaction running, held at a gate: a holds the one slot
    gate = compactors["a"].gates[dbs["a"]] = Gate()
    a.enqueue(dbs["a"])
    gate.wait_entered()
    assert a.status()["cluster"]["slots"] == 1
    # When b's database is queued: its start is refused, and it waits in its channel
    b.enqueue(dbs["b"])
    wait_for(lambda: b.status()["cluster"]["waiting_since"] is not None, HANG_S, what="b waiting for the slot")
    status = b.status()
    assert status["cluster"]["refusals"] >= 1 and status["cluster"]["slots"] == 0
    assert status["channels"][RATIO]["waiting"]["size"] == 1 and status["channels"][RATIO]["active"] == 0
    assert record_of(b, dbs["b"]).get("state") != "running"
    # ... and the fleet view shows who holds the slot and who waits
    nodes = fleet(capsys, url)
    assert nodes["a"]["cluster_slots"]["slots"] == 1 and nodes["a"]["cluster_max_jobs"] == 1
    assert nodes["b"]["cluster_slots"]["wanting_since"] is not None
    # When a's compaction ends, b's is woken and runs; never two at once
    gate.release()
    wait_for(lambda: record_of(b, dbs["b"]).get("state") == "finished", HANG_S, what="b's compaction")
    assert record_of(a, dbs["a"]).get("state") == "finished"
    assert Counting.most == 1
    wait_for(lambda: b.status()["cluster"]["waiting_since"] is None, HANG_S, what="b no longer waiting")


def fleet(capsys: Any, url: str) -> dict[str, Any]:
    import argparse
    import json

    capsys.readouterr()
    assert cmd_cluster_status(argparse.Namespace(store=url, json=True, store_timeout=HANG_S, config=None)) == 0
    return json.loads(capsys.readouterr().out)["nodes"]  # type: ignore[no-any-return]


def test_a_batch_holds_its_one_slot_until_its_last_database_ends(tmp_path: Path, running: Any, capsys: Any) -> None:
    url, servers, compactors = two_nodes(tmp_path, running)
    a, b = servers["a"], servers["b"]
    first, second, other = (str(tmp_path / node / "dbs" / f"{name}.db") for node, name in
                            (("a", "first"), ("a", "second"), ("b", "other")))
    make_bloated_db(first, rows=400, delete_fraction=0.9)
    make_bloated_db(second, rows=400, delete_fraction=0.6)
    make_bloated_db(other, rows=400)
    # Given a batch of a's two small databases, the second compacting (held at a gate) under the first's job
    gate = compactors["a"].gates[second] = Gate()
    a.suspend(RATIO)
    a.enqueue(first)
    a.enqueue(second)
    wait_for(lambda: a.status()["channels"][RATIO]["waiting"]["size"] == 2, HANG_S, what="both queued")
    a.resume(RATIO)
    gate.wait_entered()
    [carrier] = [r.carrier for r in a._worker._running if r.key == second]
    assert carrier is not None and carrier.key == first
    assert record_of(a, first).get("state") == "finished"
    # When a's status record is written (the cap's reconcile gives back the slots of runs a no longer follows)
    a._housekeeping._write_status(time.time())
    written = threading.Event()
    a._scheduler.background(written.set)  # (the starter writes it, in order)
    assert written.wait(HANG_S)
    # Then the batch still holds the slot its first database took
    assert a.status()["cluster"]["slots"] == 1
    assert fleet(capsys, url)["a"]["cluster_slots"]["slots"] == 1
    # ... and b's start is refused while it runs
    b.enqueue(other)
    wait_for(lambda: b.status()["cluster"]["waiting_since"] is not None, HANG_S, what="b waiting for the slot")
    assert record_of(b, other).get("state") != "running"
    # When the batch's last database ends, the slot is given back and b's compaction runs; never two at once
    gate.release()
    wait_for(lambda: record_of(b, other).get("state") == "finished", HANG_S, what="b's compaction")
    assert record_of(a, second).get("state") == "finished"
    assert Counting.most == 1
