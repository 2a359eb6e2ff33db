"""The status table tells the truth during a drain (issue 19): a running compaction counts
ACTIVE from the moment its job runs; STARTING only while a job waits for a worker."""

from __future__ import annotations

import os
from pathlib import Path

from compactor.dbfactory import make_bloated_db
from faults.faultlib import start_daemon
from helpers.daemon import HANG_S, Daemon, free_port, wait_for, write_config


#: Small bloated databases dropped into the watched directory before the start.
FLEET = 40


def test_a_drain_of_small_databases_shows_active_compactions_not_starting_ones(
    tmp_path: Path, daemons: list[Daemon]
) -> None:
    # Given small bloated databases and a daemon with free worker slots (4 workers, one
    # compaction at a time in ratio_dbs)
    base = Path(os.path.realpath(tmp_path))
    config = write_config(base, port=free_port())
    for i in range(FLEET):
        make_bloated_db(str(base / "dbs" / f"t{i:03d}.db"), rows=150, delete_fraction=0.9)
    # When the daemon drains them, its /status and /jobs polled all along
    d = start_daemon(daemons, config)
    samples: list[tuple[int, int, int]] = []  # (active, starting, compactions finished so far)

    def drained() -> bool:
        status = d.get("/status")["channels"]["ratio_dbs"]
        finished = sum(j["state"] == "finished" for j in d.get("/jobs")["jobs"])
        samples.append((status["active"], status["starting"], finished))
        return status["waiting"]["size"] == 0 and status["active"] == status["starting"] == 0 and finished >= FLEET

    wait_for(drained, HANG_S, what="the drain", daemon=d, every_s=0.0)
    # Then compactions were seen running, as ACTIVE (the bug showed every run as STARTING, for
    # the whole drain) ...
    assert max(active for active, _, _ in samples) == 1
    # ... and the channel of one compaction at a time never showed two runs at once. How long a
    # hand-off may show STARTING is not asked here: it takes a store commit, as long as the
    # disk makes it; the in-process drain test holds each compaction at a gate and checks that
    # a running one is never STARTING (tests/server/test_ownership.py, status table).
    assert all(active + starting <= 1 for active, starting, _ in samples), samples
