"""A fleet of ``smoosh run`` processes on one store, and what it takes to prove it (issue 50).

Shared by the benchmark (``bench/fleet.py``: the figures, fifty nodes) and the test
(``tests/e2e/test_fleet.py``: the behaviour, a few nodes by default and fifty in the slow
set). Each node is a real daemon, a process of its own with its own ``node`` name, directory,
``state_dir`` and admin port, all sharing one ``sqlite:`` store file; the operator's commands
are real ``smoosh`` processes too. What the scenario does, step by step, each one a method
returning what it saw (times on the monotonic clock, for the benchmark to report and the test
to ignore):

* :meth:`Fleet.hold_all`: ``smoosh suspend --store`` and the moment every node shows it held;
* :meth:`Fleet.drain`: databases dropped in every node's directory, all compacted under the
  fleet-wide cap, and the most compactions that ran at once across the fleet, from every
  node's own history (a compaction's ``started`` comes after the commit that took its slot,
  its end before the commit that gives it back: the spans lie inside the slots' lives);
* :meth:`Fleet.kill` and :meth:`Fleet.wait_stale`: ``kill -9`` of some nodes, and the moment
  ``smoosh status --store`` shows every one of them stale;
* :meth:`Fleet.status_of_many`: ``smoosh status --store`` with many nodes' records in the store.

Every wait is for an event, bounded by a hang's timeout; none is a guess at a speed.
"""

from __future__ import annotations

import datetime
import functools
import json
import random
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from bench._daemon import free_port, smoosh_env
from bench._fixtures import make_bloated_db

#: The one database channel of the fleet's nodes (a key waits there, so a test knows where).
CHANNEL = "ratio_dbs"
#: Rows (of 400 bytes) of each node's bloated databases: small, so fifty nodes' compactions
#: cost the machine little beside the daemons themselves.
DB_ROWS = 300
#: Seconds between two looks at what the fleet shows while a step waits for it.
POLL_S = 0.05
#: What a daemon logs as it applies a change of the cluster holds.
HOLD_LINE = "cluster holds changed for"
#: A log line's time is cut to the millisecond: a line of the same millisecond as the hold counts.
LOG_STAMP_S = 0.001
#: Ports a node is given before its start fails for good (see :meth:`Fleet.start`).
PORT_TRIES = 5


class PortTaken(Exception):
    """Raised when a node exited at start because its admin port was taken meanwhile."""


@dataclass
class Node:
    """One daemon of the fleet."""

    name: str
    base: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    killed: bool = False
    dbs: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str, timeout_s: float = 30.0) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=timeout_s) as r:
            return json.loads(r.read())

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path is not None else ""


class Fleet:
    """``count`` daemons sharing the store ``base/shared.db`` (see the module docstring).

    Parameters:
        base: a directory of the fleet's own.
        count: how many nodes (``n00``, ``n01``, ...).
        cap: ``cluster_max_jobs`` of every node (None: no cap).
        hang_s: the bound of every wait (a hang's, never a speed's).
        log_level: the daemons' log level.
        store_url: the store they share (None: ``sqlite:`` a file in ``base``); one of a cluster of
            its own, never a live deployment's: :meth:`clean` takes the fleet out of it afterwards.
    """

    def __init__(self, base: Path, count: int, *, cap: int | None = None, hang_s: float = 600.0,
                 log_level: str = "INFO", store_url: str | None = None) -> None:
        self.base = base
        self.store_url = store_url or f"sqlite:{base / 'shared.db'}"
        self.cap = cap
        self.hang_s = hang_s
        self._log_level = log_level
        self.nodes = [Node(f"n{i:02d}", base / f"n{i:02d}", free_port()) for i in range(count)]
        self.killed_at = 0.0

    # -- the daemons ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start every node, then wait until every one answers."""
        for node in self.nodes:
            self._spawn(node)
        for node in self.nodes:
            for _ in range(PORT_TRIES):
                try:
                    self._wait(functools.partial(self._answers, node), f"node {node.name} answering")
                    break
                except PortTaken:
                    # Its port, free when it was chosen, was taken since by another process's
                    # connection (fifty daemons and their clients use many): another port.
                    node.port = free_port()
                    self._spawn(node)

    def _spawn(self, node: Node) -> None:
        node.base.mkdir(parents=True, exist_ok=True)
        config = node.base / "smoosh.ini"
        config.write_text(self._config(node))
        node.log_path = node.base / "daemon.log"
        env = dict(smoosh_env(), SMOOSH_LOG_LEVEL=self._log_level)
        with open(node.log_path, "wb") as log:
            node.proc = subprocess.Popen([sys.executable, "-m", "smoosh", "run", "--config", str(config)],
                                         stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(node.base))

    def _config(self, node: Node) -> str:
        (node.base / "dbs").mkdir(exist_ok=True)
        (node.base / "state").mkdir(exist_ok=True)
        cap = f"cluster_max_jobs = {self.cap}\n" if self.cap is not None else ""
        return f"""[smoosh]
node = {node.name}
store = {self.store_url}
watch = {node.base / 'dbs'}
state_dir = {node.base / 'state'}
http = 127.0.0.1:{node.port}
db_channels = {CHANNEL}
cleanup_channels =
wait_secs = 0
staleness = 0
job_timeout = 5s
{cap}
[smoosh.{CHANNEL}]
min_size = 16KiB
"""

    def _answers(self, node: Node) -> bool:
        assert node.proc is not None
        if node.proc.poll() is not None:
            if "Address already in use" in node.log():
                raise PortTaken(node.name)
            raise AssertionError(f"node {node.name} exited with {node.proc.returncode}:\n{node.log()[-4000:]}")
        try:
            node.get("/status", timeout_s=5)
            return True
        except OSError:
            return False

    def live(self) -> list[Node]:
        """The nodes not killed."""
        return [n for n in self.nodes if not n.killed]

    def kill(self, count: int, rng: random.Random) -> list[Node]:
        """``kill -9`` of ``count`` nodes chosen at random; the nodes killed (:attr:`killed_at`: when)."""
        victims = rng.sample(self.live(), count)
        self.killed_at = time.monotonic()
        for node in victims:
            assert node.proc is not None
            node.proc.send_signal(signal.SIGKILL)
            node.proc.wait(self.hang_s)
            node.killed = True
        return victims

    def stop(self) -> None:
        """Stop every node still running: SIGTERM, then SIGKILL past the hang bound."""
        for node in self.live():
            if node.proc is not None and node.proc.poll() is None:
                node.proc.send_signal(signal.SIGTERM)
        for node in self.live():
            if node.proc is None:
                continue
            try:
                node.proc.wait(self.hang_s)
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait(30)

    # -- the operator --------------------------------------------------------------------------

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``python -m smoosh ARGS``, its output captured."""
        return subprocess.run([sys.executable, "-m", "smoosh", *args], capture_output=True, text=True,
                              timeout=self.hang_s, env=smoosh_env(), cwd=str(self.base))

    def fleet_view(self) -> dict[str, Any]:
        """``smoosh status --store URL --json``: every node's record, from the store.

        With the hang's bound as its deadline: fifty daemons on two cores can starve a command
        of CPU past the default's few seconds (what a silent store does to it is proven apart).
        """
        out = self.cli("status", "--store", self.store_url, "--json", "--store-timeout", str(self.hang_s))
        assert out.returncode == 0, out.stderr
        nodes: dict[str, Any] = json.loads(out.stdout)["nodes"]
        return nodes

    # -- the steps -----------------------------------------------------------------------------

    def hold_all(self) -> float:
        """``smoosh suspend --store``, then wait until every live node shows its channel held.

        Returns:
            Seconds from the hold's time (the command takes it just before its commit) to the
            last node's applying it, as its own log line says (``cluster holds changed``, written
            on its loop as it holds its channels: to the millisecond, whatever the time this
            process takes to look at fifty nodes). Needs the daemons' log at INFO.
        """
        out = self.cli("suspend", "--store", self.store_url, "--json")
        assert out.returncode == 0, out.stderr
        at = float(json.loads(out.stdout)["hold"]["at"])
        self._wait(lambda: all(node.get("/status")["channels"][CHANNEL]["held"] for node in self.live()),
                   "every node holding its channel")
        applied = [self._logged_after(node, HOLD_LINE, at) for node in self.live()]
        return max(applied) - at

    def _logged_after(self, node: Node, text: str, at: float) -> float:
        """The wall time of ``node``'s first log line holding ``text`` at or after ``at`` (Unix seconds)."""
        for line in node.log().splitlines():
            if text not in line:
                continue
            stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if stamp >= at - LOG_STAMP_S:
                return stamp
        raise AssertionError(f"node {node.name} logged no {text!r} after {at}:\n{node.log()[-3000:]}")

    def resume_all(self) -> None:
        """``smoosh resume --store``: every hold gone."""
        out = self.cli("resume", "--store", self.store_url)
        assert out.returncode == 0, out.stderr

    def add_databases(self, per_node: int, nodes: list[Node] | None = None) -> None:
        """``per_node`` bloated databases dropped in each node's watched directory."""
        for node in nodes if nodes is not None else self.live():
            for _ in range(per_node):
                path = str(node.base / "dbs" / f"db{len(node.dbs):03d}.db")
                make_bloated_db(path, rows=DB_ROWS, row_bytes=400, delete_fraction=0.8)
                node.dbs.append(path)

    def compacted(self, node: Node) -> bool:
        """Whether every database of ``node`` has finished a compaction."""
        done = {j["key"] for j in node.get("/jobs")["jobs"]
                if any(e["event"] == "finished" for e in j.get("history", []))}
        return all(path in done for path in node.dbs)

    def drain(self, since: float | None = None) -> tuple[float, int]:
        """Wait until every live node has compacted its databases.

        Parameters:
            since: the moment the time is counted from (monotonic; None: now).

        Returns:
            ``(seconds, most)``: how long it took, and the most compactions that ran at once across
            the live nodes (from their histories).
        """
        t0 = time.monotonic() if since is None else since
        for node in self.live():
            self._wait(functools.partial(self.compacted, node), f"node {node.name}'s databases compacted", node=node)
        took = time.monotonic() - t0
        return took, overlap([span for node in self.live() for span in spans(node.get("/jobs")["jobs"])])

    def refusals(self) -> int:
        """Claims the fleet-wide cap refused, summed over the live nodes (how much they contended)."""
        return sum(int(node.get("/status")["cluster"]["refusals"]) for node in self.live())

    def wait_stale(self, victims: list[Node]) -> float:
        """Seconds from their kill until ``smoosh status --store`` shows every one of ``victims`` stale."""
        names = {n.name for n in victims}
        self._wait(lambda: all(self.fleet_view()[name]["state"] == "stale" for name in names),
                   "the killed nodes shown stale")
        return time.monotonic() - self.killed_at

    def status_of_many(self, records: int) -> tuple[float, int]:
        """``records`` more nodes' records written into the store, then one ``smoosh status --store``.

        Returns:
            ``(seconds, listed)``: the command's wall time (a process's start included), and the
            nodes it listed.
        """
        write_records(self.store_url, records)
        t0 = time.monotonic()
        out = self.cli("status", "--store", self.store_url, "--json")
        took = time.monotonic() - t0
        assert out.returncode == 0, out.stderr
        return took, len(json.loads(out.stdout)["nodes"])

    def clean(self, records: int = 0) -> None:
        """Take the fleet out of its store once it has stopped: every node forgotten (its record, jobs,
        holds, slots), and the ``records`` :meth:`status_of_many` wrote cleared. For a store that
        outlives the run (``--store fdb:...``)."""
        from smoosh.daemon.record.forget import NodeUnknown, forget_node
        from smoosh.daemon.record.status import forget_node_status
        from smoosh.store import open_store

        with open_store(self.store_url) as store:
            for node in self.nodes:
                try:
                    forget_node(store, node.name, time.time() + 3600)  # stopped or killed: none is live
                except NodeUnknown:
                    pass
            for start in range(0, records, 200):
                names = [f"many{i:05d}" for i in range(start, min(records, start + 200))]

                def body(tr: Any, names: list[str] = names) -> None:
                    for name in names:
                        forget_node_status(tr, name)

                store.transact(body)

    def _wait(self, cond: Callable[[], Any], what: str, *, node: Node | None = None) -> Any:
        deadline = time.monotonic() + self.hang_s
        while True:
            try:
                value = cond()
            except OSError:
                value = None  # a daemon busy past an HTTP timeout: looked at again
            if value:
                return value
            if time.monotonic() > deadline:
                detail = f"\n--- node {node.name}'s log ---\n{node.log()[-4000:]}" if node is not None else ""
                raise AssertionError(f"timed out after {self.hang_s} s waiting for {what}{detail}")
            time.sleep(POLL_S)


def spans(jobs: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """Each compaction of a node's ``/jobs`` rows as ``(started, ended)`` (Unix seconds)."""
    out = []
    for job in jobs:
        started = None
        for event in reversed(job.get("history", [])):  # newest first in /jobs
            if event["event"] == "started":
                started = event["at"]
            elif started is not None and event["event"] not in ("added", "pending"):
                out.append((started, event["at"]))
                started = None
    return out


def overlap(spans: list[tuple[float, float]]) -> int:
    """The most spans open at one instant (an end at the very instant of a start closes first)."""
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    now = most = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def write_records(store_url: str, count: int) -> None:
    """``count`` nodes' status records, live and of one channel each, written into the store."""
    from smoosh.daemon.record.status import put_node_status
    from smoosh.store import open_store

    status = {"channels": {CHANNEL: {"active": 0, "starting": 0, "waiting": {"size": 3, "min": 2.5, "max": 9},
                                     "paused": False, "suspended": False, "held": None, "in_window": True,
                                     "reclaimable_bytes": 1 << 20}},
              "reclaimable_bytes": 1 << 20, "version": "0.1.0", "config_digest": "0123456789ab"}
    now = time.time()
    with open_store(store_url) as store:
        for start in range(0, count, 200):
            names = [f"many{i:05d}" for i in range(start, min(count, start + 200))]

            def body(tr: Any, names: list[str] = names) -> None:
                for name in names:
                    put_node_status(tr, name, status, now)

            store.transact(body)

