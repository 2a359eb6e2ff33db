"""SIGINT and SIGTERM stop `smoosh run` alike (DESIGN §5.1, §11 "Signals"): running
compactions are interrupted, their keys taken back and checkpointed at the top, exit 0."""

from __future__ import annotations

import math
import os
import signal
import time
from pathlib import Path

import pytest

from compactor.dbfactory import db_stats, integrity, make_bloated_db, row_count
from faults.faultlib import start_daemon
from helpers.daemon import HANG_S, Daemon, free_port, wait_for, write_config
from persist import read_checkpoint


#: Seconds a clean stop may take (DESIGN §5.1: "exit 0 within 10 s").
STOP_WITHIN_S = 10.0


def running_jobs(config: Path) -> list[str]:
    """Keys whose job the store shows running, read from the store itself."""
    from smoosh.jobs import Jobs
    from smoosh.store import open_store

    with open_store(f"sqlite:{config.parent / 'state' / 'jobs.db'}") as store:
        jobs = Jobs(store, monitors=False)
        try:
            return [str(i) for _t, i, state, _d in jobs.list_jobs("smoosh:testnode") if state == "running"]
        finally:
            jobs.close()


def compaction_running(d: Daemon, db: Path) -> bool:
    return any(j["key"] == str(db) and j["state"] == "running" for j in d.get("/jobs")["jobs"])


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_sigint_and_sigterm_alike_interrupt_a_vacuum_take_its_key_back_and_exit_0(
    tmp_path: Path, daemons: list[Daemon], sig: signal.Signals
) -> None:
    # Given a full VACUUM under way: a large file with a tenth deleted goes to slack_dbs, and
    # its compaction copies the other nine tenths (long enough to be caught in its middle)
    base = Path(os.path.realpath(tmp_path))
    config = write_config(base, port=free_port())
    db = base / "dbs" / "big.db"
    made = make_bloated_db(str(db), rows=150_000, delete_fraction=0.1)
    d = start_daemon(daemons, config)
    # /jobs says running once the worker has begun the compaction (a quick read, unlike the store)
    wait_for(lambda: compaction_running(d, db), HANG_S, what="the VACUUM to start", daemon=d, every_s=0.01)

    # When the daemon gets the signal
    d.proc.send_signal(sig)
    started = time.monotonic()
    code = d.proc.wait(STOP_WITHIN_S)

    # Then it stopped cleanly and in time, having interrupted the VACUUM (which rolled back) ...
    assert code == 0
    assert time.monotonic() - started < STOP_WITHIN_S
    log = d.log()
    assert f"Channel slack_dbs: compaction of '{db}' was interrupted; queued again at priority inf." in log
    assert "Traceback" not in log
    assert integrity(str(db)) == "ok"
    assert row_count(str(db)) == made["rows"]
    assert db_stats(str(db))["freelist_count"] == made["freelist_count"]
    # ... and took its key back: no job runs it, the channel's checkpoint holds it first in line
    assert running_jobs(config) == []
    assert read_checkpoint(base / "state" / "slack_dbs.smooshq") == {str(db): math.inf}
