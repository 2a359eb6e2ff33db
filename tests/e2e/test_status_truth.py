"""The status table tells the truth during a drain (issue 19): a running compaction counts
ACTIVE from the moment its job runs; STARTING only while a job waits for a worker."""

from __future__ import annotations

import os
import time
from pathlib import Path

from compactor.dbfactory import make_bloated_db
from faults.faultlib import start_daemon
from helpers.daemon import HANG_S, Daemon, free_port, wait_for, write_config


#: Small bloated databases dropped into the watched directory before the start.
FLEET = 100
#: Longest a run may show as starting in consecutive polls (a compaction here takes ms).
MAX_STARTING_S = 0.5


def test_a_drain_of_small_databases_shows_active_compactions_not_starting_ones(
    tmp_path: Path, daemons: list[Daemon]
) -> None:
    # Given a hundred small bloated databases and a daemon with free worker slots (4 workers,
    # one compaction at a time in ratio_dbs)
    base = Path(os.path.realpath(tmp_path))
    config = write_config(base, port=free_port())
    for i in range(FLEET):
        make_bloated_db(str(base / "dbs" / f"t{i:03d}.db"), rows=150, delete_fraction=0.9)
    # When the daemon drains them, its /status polled all along
    d = start_daemon(daemons, config)
    samples: list[tuple[int, int]] = []
    times: list[float] = []

    def drained() -> bool:
        status = d.get("/status")["channels"]["ratio_dbs"]
        samples.append((status["active"], status["starting"]))
        times.append(time.monotonic())
        return status["waiting"]["size"] == 0 and status["active"] == status["starting"] == 0 and \
            sum(j["state"] == "finished" for j in d.get("/jobs")["jobs"]) >= FLEET

    wait_for(drained, HANG_S, what="the drain", daemon=d, every_s=0.0)
    # Then compactions were seen running ...
    assert max(active for active, _ in samples) == 1
    # ... and a run showed as starting only for the moment between its start and the
    # worker's slot taking it: in few polls at all, and never for long (polls come back to
    # back, so a loaded machine may catch one moment twice; the bug this guards against
    # showed STARTING 1 for the whole drain)
    starting = [i for i, (_, n) in enumerate(samples) if n > 0]
    assert len(starting) <= max(2, len(samples) // 20), samples
    streak_start = None
    for i in range(len(samples)):
        if samples[i][1] > 0:
            streak_start = i if streak_start is None else streak_start
            assert times[i] - times[streak_start] < MAX_STARTING_S, (samples[streak_start:i + 1], times[i] - times[streak_start])
        else:
            streak_start = None
