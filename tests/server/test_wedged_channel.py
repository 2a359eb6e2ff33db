"""A run cannot be wedged: the outside trial's reproduction (issue 45).

A live edit of ``[smoosh.sqlite] auto_vacuum`` while a key sits in crash backoff: the edit makes
the upgrade channel want the key too, so it waits out the backoff in two channels, and both start
it the moment the backoff ends. The scheduler kept one record per key, and the second start
replaced the first's: the first run's end was then taken for an old run's and ignored, and its
channel showed it ACTIVE for good, holding its slot and a ``max_jobs`` slot until a restart.

A real server in process, a real corrupt SQLite file (its VACUUM fails: the crash), the real
compactor and worker; the 100 s backoff passes on an injected clock.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from compactor.dbfactory import make_bloated_db, make_corrupt_db
from helpers.clocks import FakeClock
from helpers.daemon import HANG_S, wait_for
from helpers.jobs_table import record_of
from server.test_server import make_config
from server.test_upgrade_target import with_auto_vacuum


def in_flight(server: Any) -> dict[str, tuple[int, int]]:
    """(ACTIVE, STARTING) of every channel that has either."""
    return {name: (ch["active"], ch["starting"]) for name, ch in server.status()["channels"].items()
            if ch["active"] or ch["starting"]}


def idle(server: Any) -> bool:
    """Nothing in flight anywhere: no channel's run, no global slot, no run followed."""
    return not in_flight(server) and server._slots.busy == 0 and not server._scheduler.runs()


def test_a_live_edit_of_auto_vacuum_during_a_crash_backoff_wedges_no_channel(
    tmp_path: Path, running: Any, dbs: Path,
) -> None:
    # Given a database whose VACUUM fails, waiting out its crash backoff in slack_dbs
    db = str(dbs.resolve() / "corrupt.db")
    make_corrupt_db(db)
    clock = FakeClock()
    server = running(make_config(tmp_path), workers=2, clock=clock)
    server.enqueue(db)
    wait_for(lambda: record_of(server, db).get("error_count") == 1, HANG_S, what="the first crash")
    wait_for(lambda: idle(server), HANG_S, what="the crashed run to end")
    assert server.crashing_jobs() == {"slack_dbs": 1}

    # When auto_vacuum is edited live and the key is examined again (the reload's rescan does
    # it; enqueue is the same path): the upgrade channel takes it too, into the same backoff
    server.apply_config(with_auto_vacuum(tmp_path, ""))
    server.enqueue(db)
    wait_for(lambda: sum(ch["deferred"] for ch in server.status()["channels"].values()) == 2, HANG_S,
             what="the key deferred in two channels")
    # ... and the backoff ends in both at once
    clock.advance(101)
    server.tick(clock())

    # Then one run compacts it (and crashes again), the other start is refused, and every slot
    # comes back: no channel shows a run nothing runs
    wait_for(lambda: record_of(server, db).get("error_count") == 2, HANG_S, what="the second crash, heard")
    wait_for(lambda: idle(server), HANG_S, what="every channel's runs and slots back")
    # The refused start did not erase the key's backoff: it waits in one channel, crashing
    assert sum(ch["deferred"] for ch in server.status()["channels"].values()) == 1
    assert record_of(server, db)["state"] == "crashing"

    # And the next key starts and compacts
    other = str(dbs.resolve() / "healthy.db")
    make_bloated_db(other, rows=2000, delete_fraction=0.9)
    server.enqueue(other)
    wait_for(lambda: record_of(server, other).get("state") == "finished", HANG_S, what="the next key's compaction")
    wait_for(lambda: idle(server), HANG_S, what="its run to end")
