"""A full job store (issue 25): one WARNING when it fills and one when it has room again, a ``store``
state in ``/status``, the gauge ``smoosh_store_state``, the keys it holds back saying so in
``/jobs``, and their compactions once it has room.

The store is a real SQLite file on a small tmpfs filled to its last block (mounting needs root:
skipped otherwise). Before, every failed commit was a line of the log, several a second, and
``/jobs`` showed the keys ``pending`` with no error.
"""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from compactor.dbfactory import make_bloated_db
from faults.faultlib import fill, start_daemon, tmpfs_on
from helpers.daemon import Daemon, free_port, wait_for, write_config

#: Size of the file system holding the store: room for the store, little more.
TMPFS_SIZE = "512k"
#: Seconds the store stays full with nothing more logged: more than two status records' interval
#: (each one tries the store again).
STATUS_PROBES_S = 11.0
LINE = re.compile(r"^\S+ \S+ (?P<level>[A-Z]+) (?P<logger>\S+): (?P<message>.*)$")


@pytest.fixture
def store_dir(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "store"
    directory.mkdir()
    with tmpfs_on(directory, f"size={TMPFS_SIZE}"):
        yield directory


def logged(d: Daemon, level: str = "WARNING") -> list[tuple[str, str, str]]:
    """(level, logger, message) of the daemon's lines at ``level`` or above."""
    order = ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
    lines = [LINE.match(line) for line in d.log_path.read_text(errors="replace").splitlines()]
    return [(m["level"], m["logger"], m["message"]) for m in lines
            if m is not None and m["level"] in order and order.index(m["level"]) >= order.index(level)]


def metrics(d: Daemon) -> dict[str, float]:
    text = urllib.request.urlopen(d.url + "/metrics", timeout=10).read().decode()
    return {m[1]: float(m[2]) for m in re.finditer(r'^smoosh_store_state\{state="(\w+)"\} (\S+)$', text, re.M)}


def jobs(d: Daemon) -> dict[str, dict[str, Any]]:
    return {j["key"]: j for j in d.get("/jobs")["jobs"]}


def test_a_full_store_is_said_once_shown_and_holds_keys_until_it_has_room(
    tmp_path: Path, store_dir: Path, daemons: list[Daemon]
) -> None:
    # Given a daemon whose job store lies on a file system that then fills up
    store = store_dir / "jobs.db"
    d = start_daemon(daemons, write_config(tmp_path, port=free_port(), extra_global=f"store = sqlite:{store}"))
    assert d.get("/status")["store"]["state"] == "ok"
    filler = fill(store_dir)
    # When databases to compact appear
    dbs = [tmp_path / "dbs" / f"d{i}.db" for i in range(3)]
    for db in dbs:
        make_bloated_db(str(db), rows=300)
    # Then the store is found full: /status, the gauge, and every key held back says why
    wait_for(lambda: d.get("/status")["store"]["state"] == "full", 30, what="the store found full", daemon=d)
    state = d.get("/status")["store"]
    assert "database or disk is full" in state["error"]
    assert abs(state["since"] - time.time()) < 60
    assert metrics(d) == {"ok": 0.0, "full": 1.0, "unreachable": 0.0}
    wait_for(lambda: set(jobs(d)) >= {str(db) for db in dbs}, 30, what="the keys examined", daemon=d)
    for key, row in jobs(d).items():
        assert row["state"] == "pending", row
        assert re.fullmatch(r"the job store is full \(.*database or disk is full.*\); compactions start when it is back",
                            row["last_error"]), row
    time.sleep(STATUS_PROBES_S)  # the only sleep: nothing more may be logged while the store stays full
    # When there is room again
    filler.unlink()
    wait_for(lambda: d.get("/status")["store"]["state"] == "ok", 30, what="the store with room again", daemon=d)
    # Then the held keys are compacted
    wait_for(lambda: all(jobs(d).get(str(db), {}).get("state") == "finished" for db in dbs), 30,
             what="the compactions", daemon=d)
    assert metrics(d)["ok"] == 1.0
    # ... and the log said it once each way: the store's own first failed commit (logged before
    # anything knew the store was full), then one line when it filled and one when it had room
    lines = logged(d)
    health = [message for level, logger, message in lines if logger == "smoosh.daemon.control.store_health"]
    assert len(health) == 2, lines
    assert re.fullmatch(rf"job store sqlite:{re.escape(str(store))} is full: .*database or disk is full.*; "
                        "new compactions wait until it has room", health[0]), health
    assert re.fullmatch(rf"job store sqlite:{re.escape(str(store))} is ok again; it was full for \d+\.\d s"
                        r"(; \d+ failed store operation\(s\) meanwhile were not logged one by one)?", health[1]), health
    others = [line for line in lines if line[1] != "smoosh.daemon.control.store_health"]
    assert all(logger == "smoosh.store.sqlite" and "database or disk is full" in message
               for _level, logger, message in others), others
    assert len(others) <= 3, others
    assert d.stop() == 0
