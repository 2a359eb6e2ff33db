"""Cluster holds in the server: a hold in the shared store stops a channel beside the local suspension.

Servers here share one ``memory:`` store handle (a second daemon on the same store, as far as
the holds are concerned); the store's watch brings a hold to each server's loop, so the tests
wait on the status with a deadline and never for a timer. The same through real processes
and a ``sqlite:`` store is tests/e2e/test_multinode.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from server.test_server import make_config

from compactor.dbfactory import make_bloated_db
from helpers.daemon import HANG_S, wait_for
from smoosh.daemon.control.cluster_holds import ClusterHolds
from smoosh.daemon.record.status import read_node_statuses
from smoosh.store import open_store
from smoosh.store.base import Store

T0 = 1_700_000_000.0
#: Seconds a hold may take to reach a server (the watch fires at commit; this is a deadline).
OBEY_S = 10.0


def _server(tmp_path: Path, running: Any, store: Store, node: str, **kw: Any) -> Any:
    base = tmp_path / node
    base.mkdir(exist_ok=True)
    return running(make_config(base, extra=f"node = {node}"), store=store, **kw)


def _held(server: Any, channel: str) -> Any:
    return server.status()["channels"][channel]["held"]


def test_a_hold_set_before_start_stops_the_channel_from_its_first_moment_and_resume_lets_it_run(
    tmp_path: Path, running: Any
) -> None:
    store = open_store("memory:")
    holds = ClusterHolds(store)
    holds.hold("n1", None, by="ops@admin", at=T0)
    server = _server(tmp_path, running, store, "n1", workers=1)
    # Read at start, before any channel opened: held from the first status on.
    assert all(c["held"] is not None for c in server.status()["channels"].values())
    db = tmp_path / "n1" / "dbs" / "a.db"
    make_bloated_db(str(db))
    server.enqueue(str(db))
    wait_for(lambda: sum(c["waiting"]["size"] for c in server.status()["channels"].values()) == 1, HANG_S,
             what="the key queued")
    channels = server.status()["channels"]
    assert all(c["held"] == {"node": "n1", "channel": None, "by": "ops@admin", "at": T0} for c in channels.values())
    assert all(c["suspended"] is False and c["active"] == 0 and c["starting"] == 0 for c in channels.values())
    assert server.jobs.list_jobs() == []  # nothing reached the job layer
    from smoosh.daemon.api.metrics import render

    assert b'smoosh_channel_held{channel="ratio_dbs"} 1.0' in render(server)[0]
    assert holds.release("n1", None) == []
    wait_for(lambda: any(j["key"] == str(db) and j["state"] == "finished" for j in server.jobs_table()), HANG_S,
             what="the compaction once released")
    assert all(c["held"] is None for c in server.status()["channels"].values())
    assert b'smoosh_channel_held{channel="ratio_dbs"} 0.0' in render(server)[0]


def test_a_hold_reaches_every_server_of_the_store_and_a_node_hold_only_its_node(tmp_path: Path, running: Any) -> None:
    store = open_store("memory:")
    holds = ClusterHolds(store)
    n1 = _server(tmp_path, running, store, "n1", workers=0)
    n2 = _server(tmp_path, running, store, "n2", workers=0)
    holds.hold(None, "slack_dbs", by="ops", at=T0)
    wait_for(lambda: _held(n1, "slack_dbs") and _held(n2, "slack_dbs"), OBEY_S, what="both nodes held")
    assert _held(n1, "ratio_dbs") is None and _held(n2, "ratio_dbs") is None
    holds.hold("n2", "ratio_dbs", by="ops", at=T0)
    wait_for(lambda: _held(n2, "ratio_dbs"), OBEY_S, what="n2's ratio_dbs held")
    assert _held(n1, "ratio_dbs") is None
    # The node's record in the store shows the hold, for `smoosh status --store`.
    wait_for(lambda: read_node_statuses(store)["n2"]["channels"]["ratio_dbs"]["held"], OBEY_S,
             what="n2's record showing the hold")
    holds.release(None, None)
    wait_for(lambda: not any(_held(s, c) for s in (n1, n2) for c in ("ratio_dbs", "slack_dbs")), OBEY_S,
             what="every hold released")


def test_local_suspension_and_cluster_hold_are_two_holds_each_cleared_only_by_its_own_verb(
    tmp_path: Path, running: Any
) -> None:
    store = open_store("memory:")
    holds = ClusterHolds(store)
    server = _server(tmp_path, running, store, "n1", workers=0)
    server.suspend("ratio_dbs")
    holds.hold(None, "ratio_dbs", by="ops", at=T0)
    wait_for(lambda: _held(server, "ratio_dbs"), OBEY_S, what="the cluster hold")
    server.resume("ratio_dbs")  # the local verb: the cluster hold stays
    status = server.status()["channels"]["ratio_dbs"]
    assert status["suspended"] is False and status["held"] is not None and status["holding"] is True
    server.suspend("ratio_dbs")
    holds.release(None, "ratio_dbs")  # the cluster verb: the local suspension stays
    wait_for(lambda: _held(server, "ratio_dbs") is None, OBEY_S, what="the cluster hold released")
    status = server.status()["channels"]["ratio_dbs"]
    assert status["suspended"] is True and status["holding"] is True


def test_a_channel_added_by_a_live_edit_obeys_a_hold_on_every_channel(tmp_path: Path, running: Any) -> None:
    store = open_store("memory:")
    holds = ClusterHolds(store)
    server = _server(tmp_path, running, store, "n1", workers=0)
    holds.hold(None, None, by="ops", at=T0)
    wait_for(lambda: _held(server, "ratio_dbs"), OBEY_S, what="the hold")
    server.apply_config(make_config(tmp_path / "n1", extra="node = n1\ndb_channels = ratio_dbs, extra_dbs"))
    assert _held(server, "extra_dbs") == {"node": None, "channel": None, "by": "ops", "at": T0}
