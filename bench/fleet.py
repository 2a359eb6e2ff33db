"""Fifty nodes on one store (issue 50): ``smoosh run`` processes sharing one ``sqlite:`` store file.

Fifty real daemons on this machine, each its own ``node``, directory, ``state_dir`` and admin
port, share one store (``bench/_fleet.py``; ``tests/e2e/test_fleet.py`` proves the same
behaviour), every one with ``cluster_max_jobs = 4``. Measured, in this order:

* a cluster hold (``smoosh suspend --store``) reaching every node: from the hold's time (taken
  by the command just before its commit) to the last node's log line saying it applied it.
  Budget: 2 s;
* two bloated databases dropped into every node's directory, compacted by the fleet under the
  cap: the time to drain them, the claims the cap refused (how much the nodes contended for its
  slots), and the most compactions that ran at once across all fifty nodes, from their
  histories. Budget: no more than the cap;
* ``kill -9`` of ten nodes at random while a second batch arrives: the forty others drain it
  (nothing stuck behind the dead nodes' slots), and the fleet view shows the ten stale: from
  the kill to the moment ``smoosh status --store`` shows them all so (a node is stale once its
  record is older than three status intervals, 15 s);
* ``smoosh status --store --json`` with 1,000 more nodes' records in the store: the command's
  wall time, its process's start included. Budget: 1 s.

On two cores fifty Python daemons are mostly waiting on each other for CPU: the figures say
what a crowded host does, not what fifty hosts would. The FoundationDB figures for the same
steps are measured by hand on a cluster of its own (never a live deployment's): ``--store
fdb:CLUSTER_FILE`` runs the fleet on it, prints the figures (RESULTS.md is left alone) and
takes the fleet out of it afterwards (every node forgotten, the extra records cleared).

Usage: python -m bench.fleet [--quick] [--runs N] [--nodes N] [--store URL]
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._fleet import Fleet  # noqa: E402
from bench._harness import Metric, parse_args, repeat, report  # noqa: E402

#: The fleet's nodes, the ones killed, its cap, the databases per node per batch, the records read.
NODES = 50
KILLED = 10
CAP = 4
PER_NODE = 2
RECORDS = 1000
#: Bound of every wait of a run (a hang's, not a speed's).
HANG_S = 900.0


def one(nodes: int, killed: int, records: int, store_url: str | None = None) -> dict[str, float]:
    """One fleet, start to stop: the figures of the module docstring."""
    with tempfile.TemporaryDirectory(prefix="smoosh-bench-fleet-") as d:
        # The log at INFO: the hold's lines.
        fleet = Fleet(Path(d), nodes, cap=CAP, hang_s=HANG_S, store_url=store_url)
        try:
            fleet.start()
            hold_s = fleet.hold_all()
            fleet.add_databases(PER_NODE)
            fleet.resume_all()
            drain_s, most = fleet.drain()
            refused = fleet.refusals()
            fleet.add_databases(PER_NODE)
            victims = fleet.kill(killed, random.Random())
            stale_s = fleet.wait_stale(victims)
            drain2_s, most2 = fleet.drain(since=fleet.killed_at)
            status_s, listed = fleet.status_of_many(records)
            assert listed == nodes + records
        finally:
            fleet.stop()
            if store_url is not None:
                fleet.clean(records)
    return {"hold": hold_s, "drain": drain_s, "refused": float(refused), "most": float(max(most, most2)),
            "drain_killed": drain2_s, "stale": stale_s, "status": status_s}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv, extra=lambda ap: (
        ap.add_argument("--nodes", type=int, default=None, help=f"nodes of the fleet (default {NODES}; --quick: 5)"),
        ap.add_argument("--store", metavar="URL", help="the store the fleet shares (a FoundationDB cluster of its "
                        "own, by hand): the figures are printed, RESULTS.md left alone, the fleet taken out after")))
    nodes = args.nodes or (5 if args.quick else NODES)
    killed = max(1, nodes * KILLED // NODES)
    if args.store:
        args.no_write = True
    res = repeat(lambda: one(nodes, killed, RECORDS, args.store), args.runs)
    metrics = [
        Metric(f"a cluster hold reaching all {nodes} nodes", "s", res["hold"], higher_is_better=False, budget=2.0,
               note="from the hold's time (the command takes it just before its commit) to the last node's log line "
                    "saying it holds its channels"),
        Metric(f"{nodes} nodes x {PER_NODE} databases compacted under cluster_max_jobs = {CAP}", "s", res["drain"],
               higher_is_better=False),
        Metric("claims the cap refused meanwhile", "", res["refused"],
               note="a refused node keeps the database queued and waits for a slot given back anywhere"),
        Metric(f"most compactions at once across the fleet (cluster_max_jobs = {CAP})", "", res["most"],
               higher_is_better=False, budget=float(CAP),
               note="from every node's history: a compaction's start follows the commit that took its slot, its "
                    "end precedes the one that gives it back"),
        Metric(f"the next batch drained by the {nodes - killed} nodes left after kill -9 of {killed} (from the kill)", "s",
               res["drain_killed"], higher_is_better=False,
               note="nothing stuck: a killed node's slots stop counting once its lease ends (15 s)"),
        Metric(f"kill -9 of {killed} nodes to `status --store` showing them all stale", "s", res["stale"],
               higher_is_better=False, note="from the kill: a record is stale once 15 s old, the floor of this "
               "figure, read by `status --store` processes one after the other"),
        Metric(f"`smoosh status --store --json` with {nodes + RECORDS} nodes' records", "s", res["status"],
               higher_is_better=False, budget=1.0, note="the command's wall time, its Python process's start included"),
    ]
    where = f"the store {args.store}" if args.store else "one `sqlite:` store file"
    notes = [f"{nodes} `smoosh run` processes on {where}, on this machine (2 cores), "
             f"cluster_max_jobs = {CAP} on every node; {args.runs} run(s)."]
    report("fleet", "Fifty nodes on one store", metrics, args, notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
