"""Each node's life in the fleet view (issue 50): live, stale, stopped, forgotten.

A node's status record says who serves it (host, PID), its version of smoosh and its config's
digest; a clean stop shows ``stopped`` at once, in the text as well as in ``--json``, and never
turns ``stale``; ``smoosh forget`` takes a decommissioned node and everything of it out of the
store, and refuses a live one; the fleet's summary names mixed versions and configs; every
daemon counts the fleet's nodes by state in ``/status`` and ``smoosh_fleet_nodes``.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from helpers.daemon import HANG_S, wait_for
from server.test_server import make_config
from smoosh import Server, __version__
from smoosh.cli import main
from smoosh.config.digest import config_digest
from smoosh.daemon.api.metrics import render
from smoosh.daemon.control import control
from smoosh.daemon.control.cluster_cap import ClusterCap
from smoosh.daemon.control.cluster_holds import ClusterHolds
from smoosh.daemon.record.status import STALE_AFTER_S, read_node_statuses, write_node_status
from smoosh.daemon.results import history_row_key
from smoosh.daemon.run.startup import crash_record_key
from smoosh.jobs import Jobs
from smoosh.store import open_store

STATUS = {"channels": {}, "reclaimable_bytes": 0}


def _local(t: float) -> str:
    return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_nodes_record_names_its_host_pid_version_and_config_and_a_clean_stop_shows_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:{tmp_path / 'shared.db'}"
    config = make_config(tmp_path, extra=f"store = {url}\nnode = alpha")
    server = Server(config, workers=0, watch_config=False)
    server.start()
    try:
        record = read_node_statuses(server.store)["alpha"]
        assert record["state"] == "live" and record["stale"] is False
        assert (record["process"]["host"], record["process"]["pid"]) == (socket.gethostname(), os.getpid())
        assert (record["version"], record["config_digest"]) == (__version__, config_digest(config))
        assert server.status()["config_digest"] == config_digest(config)
    finally:
        before = time.time()
        server.stop()
    # When it stopped cleanly: stopped at once, and still stopped (never stale) however old its record
    nodes = read_node_statuses(open_store(url), time.time() + 10 * STALE_AFTER_S)
    assert nodes["alpha"]["state"] == "stopped" and nodes["alpha"]["stale"] is False
    assert before <= nodes["alpha"]["stopped_at"] <= time.time()
    code, out, _ = cli(capsys, "status", "--store", url)
    assert code == 0
    assert out.splitlines()[0] == "1 node(s): 0 live, 0 stale, 1 stopped"
    heading = next(line for line in out.splitlines() if line.startswith("== alpha"))
    assert re.fullmatch(r"== alpha \(stopped \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\), updated .+", heading), heading
    who = out.splitlines()[out.splitlines().index(heading) + 1]
    assert who == (f"host {socket.gethostname()}, pid {os.getpid()}; smoosh {__version__}; "
                   f"config {config_digest(config)}")
    assert json.loads(cli(capsys, "status", "--store", url, "--json")[1])["nodes"]["alpha"]["state"] == "stopped"


def test_the_fleet_summary_names_mixed_versions_and_configs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'shared.db'}"
    now = time.time()
    with open_store(url) as store:
        for node, version, digest in (("a", "0.1.0", "aaaaaaaaaaaa"), ("b", "0.1.0", "aaaaaaaaaaaa"),
                                      ("c", "0.2.0", "cccccccccccc")):
            write_node_status(store, node, {**STATUS, "version": version, "config_digest": digest}, now)
        write_node_status(store, "d", {**STATUS, "version": "0.1.0", "config_digest": "aaaaaaaaaaaa"}, now - 60)
    code, out, _ = cli(capsys, "status", "--store", url)
    assert code == 0
    assert out.splitlines()[:3] == [
        "4 node(s): 3 live, 1 stale, 0 stopped",
        "mixed versions: 0.1.0 on 3, 0.2.0 on 1",
        "mixed configs: aaaaaaaaaaaa on 3, cccccccccccc on 1",
    ]


def _leave_things_behind(store: Any, node: str) -> None:
    """What a node leaves in the store: a job, a crash record, a result, a hold, a pace, a cap slot."""
    jobs = Jobs(store, monitors=False)
    try:
        jobs.set_type_timeout(f"smoosh:{node}", 30)
        jobs.add(f"smoosh:{node}", "/db/a.db", {"channel": "ratio_dbs", "key": "/db/a.db"})
    finally:
        jobs.close()
    ClusterHolds(store).hold(node, None, by="ops", at=time.time())
    ClusterHolds(store).hold(None, "ratio_dbs", by="ops", at=time.time())

    def body(tr: Any) -> None:
        tr.set(crash_record_key(node, "/db/a.db"), b"x")
        tr.set(history_row_key(node, "/db/a.db"), b"x")
        control.put_pace(tr, node, 1.0, time.time())
        assert ClusterCap().take(tr, node, 7, 4, time.time()) is None

    store.transact(body)


def _everything_of(store: Any, node: str) -> list[bytes]:
    from smoosh.store import tuples

    keys = []
    for first in ("status", "crash", "history", "control", "rotate", "pace"):
        keys += [k for k, _ in store.transact(lambda tr: tr.get_range(*tuples.range((first, node))))]
        keys += [k for k in [tuples.pack((first, node))] if store.transact(lambda tr, k=k: tr.get(k)) is not None]
    jobs = Jobs(store, monitors=False)
    try:
        keys += [b"job" for _ in jobs.list_jobs(f"smoosh:{node}")]
        keys += [b"type" for t in jobs.get_types() if t == f"smoosh:{node}"]
    finally:
        jobs.close()
    keys += [b"hold" for h in ClusterHolds(store).current() if h.node == node]
    keys += [b"slot" for n, s in store.transact(lambda tr: ClusterCap().read(tr.snapshot, time.time())).items()
             if n == node]
    return keys


def test_forget_takes_a_decommissioned_node_and_everything_of_it_out_of_the_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:{tmp_path / 'shared.db'}"
    now = time.time()
    with open_store(url) as store:
        write_node_status(store, "gone", STATUS, now - 120)  # stale: its host is gone
        write_node_status(store, "other", STATUS, now)
        _leave_things_behind(store, "gone")
        _leave_things_behind(store, "other")
        assert _everything_of(store, "gone")
    code, out, err = cli(capsys, "forget", "gone", "--store", url)
    assert (code, err) == (0, "")
    assert out == ("forget: node gone (stale) forgotten: its status record, 1 job(s) and 1 cluster hold(s) naming "
                   "it, its crash records and last results\n")
    with open_store(url) as store:
        assert _everything_of(store, "gone") == []
        # ... and nothing of another node, nor the holds of every node
        assert len(_everything_of(store, "other")) == len(["status", "crash", "history", "pace", "job", "type",
                                                           "hold", "slot"])
        assert [(h.node, h.channel) for h in ClusterHolds(store).current()] == [(None, "ratio_dbs"), ("other", None)]
    code, out, _ = cli(capsys, "status", "--store", url)
    assert "== gone" not in out and "1 node(s): 1 live, 0 stale, 0 stopped" in out.splitlines()


def test_forget_refuses_a_live_node_and_says_so_of_an_unknown_one(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:{tmp_path / 'shared.db'}"
    with open_store(url) as store:
        write_node_status(store, "busy", STATUS, time.time())
    code, out, err = cli(capsys, "forget", "busy", "--store", url)
    assert (code, out) == (1, "")
    assert re.fullmatch(r"smoosh: node 'busy' is live: its daemon wrote its status record \d+ s ago; stop it first "
                        r"\(a clean stop shows it stopped at once\), then forget it\n", err), err
    code, out, err = cli(capsys, "forget", "nobody", "--store", url)
    assert (code, out) == (1, "")
    assert err == ("smoosh: no node named 'nobody' has a status record in this store: nothing to forget "
                   "(`smoosh status --store URL` lists the nodes)\n")
    assert read_node_statuses(open_store(url))["busy"]["state"] == "live"


def test_every_daemon_counts_the_fleets_nodes_by_state(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'shared.db'}"
    now = time.time()
    with open_store(url) as store:
        write_node_status(store, "killed", STATUS, now - 60)
        write_node_status(store, "peer", STATUS, now + 3600)  # (stamped ahead: live for the test's whole length)
        write_node_status(store, "done", STATUS, now)
        store.transact(lambda tr: tr.set(*_stopped(tr, "done")))
    server = Server(make_config(tmp_path, extra=f"store = {url}\nnode = me"), workers=0, watch_config=False)
    server.start()
    try:
        fleet = wait_for(lambda: server.status()["fleet"], HANG_S, what="the fleet read")
        assert {k: fleet[k] for k in ("live", "stale", "stopped")} == {"live": 2, "stale": 1, "stopped": 1}
        text = render(server)[0].decode()
        for state, n in (("live", 2), ("stale", 1), ("stopped", 1)):
            assert f'smoosh_fleet_nodes{{state="{state}"}} {n:.1f}' in text
    finally:
        server.stop()


def _stopped(tr: Any, node: str) -> tuple[bytes, bytes]:
    """``node``'s record marked stopped, as a clean stop leaves it."""
    import msgpack

    from smoosh.daemon.record.status import read_node_record, status_key

    record = read_node_record(tr, node)
    assert record is not None
    record.update(stopped=True, stopped_at=time.time())
    return status_key(node), msgpack.packb(record, use_bin_type=True)
