"""`smoosh suspend|resume --store URL [--node NODE]` and `smoosh status --store`: cluster holds from the CLI.

The commands run in this process through ``smoosh.cli.main`` (the same code as the
subprocess; the daemons obeying them are tests/e2e/test_multinode.py).
"""

from __future__ import annotations

import datetime
import json
import time
from pathlib import Path

import pytest

from smoosh.cli import main
from smoosh.daemon.control.cluster_holds import ClusterHolds, operator_name
from smoosh.daemon.record.status import write_node_status
from smoosh.store import open_store

STATUS = {"channels": {"ratio_dbs": {"active": 0, "starting": 0, "waiting": {"size": 0, "min": 0, "max": 0},
                                     "paused": False, "suspended": False, "held": None, "in_window": True,
                                     "reclaimable_bytes": 0}},
          "reclaimable_bytes": 0}


def _local(t: float) -> str:
    return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    url = f"sqlite:{tmp_path / 'shared.db'}"
    with open_store(url) as store:
        write_node_status(store, "n1", STATUS, time.time())
        write_node_status(store, "n2", STATUS, time.time())
    return url


def _holds(url: str) -> list[tuple[str | None, str | None, str]]:
    with open_store(url) as store:
        return [(h.node, h.channel, h.by) for h in ClusterHolds(store).current()]


def test_suspend_with_store_writes_a_hold_saying_who_and_since_when(capsys, store_url: str) -> None:
    before = time.time()
    code, out, err = _run(capsys, "suspend", "ratio_dbs", "--store", store_url)
    assert (code, err) == (0, "")
    assert _holds(store_url) == [(None, "ratio_dbs", operator_name())]
    with open_store(store_url) as store:
        at = ClusterHolds(store).current()[0].at
    assert before <= at <= time.time()
    assert out == f"suspend: channel ratio_dbs of every node, held by {operator_name()} since {_local(at)}\n"
    # Again: the same hold, its first time kept.
    assert _run(capsys, "suspend", "ratio_dbs", "--store", store_url) == (0, out, "")


def test_a_hold_on_what_no_node_reports_is_kept_and_said(capsys, store_url: str) -> None:
    code, _, err = _run(capsys, "suspend", "--store", store_url, "--node", "n9")
    assert code == 0
    assert err == "smoosh: warning: no node named 'n9' has written a status record to this store; the hold waits for it\n"
    code, _, err = _run(capsys, "suspend", "extra_dbs", "--store", store_url, "--node", "n1")
    assert code == 0
    assert err == "smoosh: warning: no node of this store reports a channel named 'extra_dbs'; the hold waits for it\n"
    assert _holds(store_url) == [("n1", "extra_dbs", operator_name()), ("n9", None, operator_name())]


def test_a_hold_in_a_store_no_daemon_uses_is_kept_and_said(capsys, tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'unused.db'}"
    open_store(url).close()  # a store, as `smoosh run` created it, no daemon of which writes to it now
    code, _, err = _run(capsys, "suspend", "--store", url)
    assert code == 0
    assert err == ("smoosh: warning: no node has written a status record to this store (is it the store the "
                   "daemons use?); the hold waits for them\n")
    assert _holds(url) == [(None, None, operator_name())]


def test_resume_with_store_clears_its_scope_and_exits_1_naming_a_broader_hold_left(capsys, store_url: str) -> None:
    assert _run(capsys, "suspend", "--store", store_url)[0] == 0
    assert _run(capsys, "suspend", "ratio_dbs", "--store", store_url, "--node", "n2")[0] == 0
    code, out, err = _run(capsys, "resume", "ratio_dbs", "--store", store_url, "--node", "n2")
    assert code == 1
    assert out == "resume: cluster holds on channel ratio_dbs of node n2 cleared\n"
    assert err.startswith(f"smoosh: still held: every channel of every node, held by {operator_name()} since ")
    assert err.endswith(f"; `smoosh resume --store {store_url}` clears it\n")
    assert _holds(store_url) == [(None, None, operator_name())]
    code, out, err = _run(capsys, "resume", "--store", store_url)
    assert (code, out, err) == (0, "resume: cluster holds on every channel of every node cleared\n", "")
    assert _holds(store_url) == []


def test_status_with_store_lists_the_holds_and_the_nodes(capsys, store_url: str) -> None:
    with open_store(store_url) as store:
        ClusterHolds(store).hold("n2", None, by="ops@admin", at=1_700_000_000.0)
    code, out, _ = _run(capsys, "status", "--store", store_url, "--json")
    assert code == 0
    body = json.loads(out)
    assert body["holds"] == [{"node": "n2", "channel": None, "by": "ops@admin", "at": 1_700_000_000.0}]
    assert sorted(body["nodes"]) == ["n1", "n2"]
    code, out, _ = _run(capsys, "status", "--store", store_url)
    assert code == 0
    lines = out.splitlines()
    assert lines[:2] == [
        "cluster holds (`smoosh resume [CHANNEL] --store URL [--node NODE]` clears them):",
        f"  every channel of node n2, held by ops@admin since {_local(1_700_000_000.0)}",
    ]
    assert [line.split(",")[0] for line in lines if line.startswith("== ")] == ["== n1", "== n2"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["suspend", "--node", "n2"], "smoosh: --node needs --store (a node's hold lives in the store the daemons share)\n"),
        (["resume", "bad name", "--store", "memory:"],
         "smoosh: channel name 'bad name' is not a valid channel name (letters, digits, _ and -)\n"),
    ],
)
def test_usage_errors_exit_2_with_one_line(capsys, argv: list[str], message: str) -> None:
    assert _run(capsys, *argv) == (2, "", message)


@pytest.mark.parametrize("argv", [["suspend", "--store", "memory:", "--url", "http://127.0.0.1:1"],
                                  ["flush", "--store", "memory:"], ["resume", "--node", "", "--store", "memory:"]])
def test_argument_errors_exit_2(capsys, argv: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2


@pytest.mark.parametrize("verb", ["suspend", "resume"])
def test_a_mistyped_store_is_an_error_naming_the_path_not_a_new_store(capsys, tmp_path: Path, verb: str) -> None:
    # Given a store path that names no file (a typo)
    typo = tmp_path / "jbos.db"
    # When an operator suspends or resumes through it
    code, out, err = _run(capsys, verb, "--store", f"sqlite:{typo}")
    # Then it is an error naming the path, and no store was created there
    assert (code, out) == (1, "")
    assert err == (f"smoosh: no smoosh job store at {typo} (no such file): is the path mistyped? Only `smoosh run` "
                   "and `smoosh worker` create a store\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
