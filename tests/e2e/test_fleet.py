"""A fleet of nodes on one store, proven (issue 50): a few nodes by default, fifty in the slow set.

Real ``smoosh run`` processes, each its own ``node``, share one ``sqlite:`` store on this
machine (``bench/_fleet.py``, which ``bench/fleet.py`` runs for the figures). The test asserts
what the fleet does and waits for each event under a hang's bound; how long each took is the
benchmark's to report:

* a cluster hold reaches every node;
* with ``cluster_max_jobs`` set, every node compacts its databases and the fleet never runs
  more at once than the cap (from every node's history);
* ``kill -9`` of some nodes at random leaves nothing stuck: the others compact what they are
  given meanwhile (a killed node's slots stop counting), and ``status --store`` shows the
  killed ones stale;
* ``status --store`` answers with many more nodes' records in the store;
* a clean stop shows every remaining node stopped at once, never stale.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from bench._fleet import Fleet


@pytest.mark.parametrize(("nodes", "kill", "cap", "per_node", "records", "hang_s"), [
    pytest.param(3, 1, 2, 3, 200, 120.0, id="3-nodes"),
    pytest.param(50, 10, 4, 2, 1000, 900.0, id="50-nodes", marks=pytest.mark.slow),
])
def test_a_fleet_on_one_store_obeys_holds_and_its_cap_survives_kills_and_shows_each_nodes_life(
    tmp_path: Path, nodes: int, kill: int, cap: int, per_node: int, records: int, hang_s: float
) -> None:
    fleet = Fleet(tmp_path, nodes, cap=cap, hang_s=hang_s)
    try:
        fleet.start()
        # A hold reaches every node, and the work dropped meanwhile waits
        fleet.hold_all()
        fleet.add_databases(per_node)
        # Released: every node compacts its own, never more at once across the fleet than the cap
        fleet.resume_all()
        _took, most = fleet.drain()
        assert 1 <= most <= cap
        # kill -9 of some nodes as more work arrives: the others compact theirs all the same,
        # and the fleet view shows the killed ones stale
        fleet.add_databases(per_node)
        victims = fleet.kill(kill, random.Random(nodes))
        _took, most = fleet.drain()
        assert most <= cap
        fleet.wait_stale(victims)
        view = fleet.fleet_view()
        assert {n.name for n in victims} == {name for name, r in view.items() if r["state"] == "stale"}
        assert all(view[n.name]["state"] == "live" for n in fleet.live())
        # Nothing of the cap is stuck: no live node waits for a slot, and no dead node's slot counts
        assert not any(r["cluster_slots"]["wanting_since"] for r in view.values())
        assert not any(view[n.name]["cluster_slots"]["counted"] for n in victims)
        # The fleet view answers with many more nodes' records in the store
        _took, listed = fleet.status_of_many(records)
        assert listed == nodes + records
        # A clean stop: every remaining node stopped at once
        fleet.stop()
        view = fleet.fleet_view()
        assert all(view[n.name]["state"] == "stopped" for n in fleet.live())
    finally:
        fleet.stop()
