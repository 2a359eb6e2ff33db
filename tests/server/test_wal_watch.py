"""Issue 27: a busy database's WAL is looked at on its events, so a log outgrowing wal_max_size is a cleanup job at once.

A database written without pause never falls quiet, and one no channel takes is held for
recheck_interval: its examination (which looks at the WAL) comes every ten seconds at best.
The intake looks at the WAL itself, at most once a second per key, as events arrive.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from compactor.dbfactory import app_with_grown_wal, make_bloated_db
from helpers.clocks import FakeClock
from helpers.daemon import wait_for
from server.test_server import make_config


def test_an_event_on_a_database_whose_wal_outgrew_wal_max_size_queues_its_cleanup_at_once(
    tmp_path: Path, running: Any, dbs: Path
) -> None:
    clock = FakeClock()
    server = running(make_config(tmp_path, extra="wal_max_size = 64KiB\nwait_secs = 0"), workers=0, clock=clock)
    db = dbs / "busy.db"
    with app_with_grown_wal(str(db)):
        # An event arrives (no tick: the debounce would hold the key for its quiet second)
        server.intake.on_event(str(db))
        cleanup = server.channels()["index_cleanup"]
        wait_for(lambda: cleanup.status()["waiting"]["size"] + cleanup.status()["starting"] == 1, 30,
                 what="the cleanup key queued")
        assert server.intake.debouncer.is_busy(str(db))  # the database key itself still settles
        # More events within the second cost no more looks
        looked = dict(server.intake._wal_looked)
        for _ in range(50):
            server.intake.on_event(str(db))
        assert server.intake._wal_looked == looked


def test_a_quiet_wal_below_wal_max_size_queues_no_cleanup(tmp_path: Path, running: Any, dbs: Path) -> None:
    server = running(make_config(tmp_path, extra="wait_secs = 0"), workers=0, clock=FakeClock())
    db = dbs / "calm.db"
    make_bloated_db(str(db), rows=200)
    server.intake.on_event(str(db))
    assert server.intake.examining() == 0
    assert server.channels()["index_cleanup"].status()["waiting"]["size"] == 0


def test_a_cleanup_key_whose_job_ended_is_queued_again_by_the_next_event_within_staleness(
    tmp_path: Path, running: Any, dbs: Path
) -> None:
    # The log's size is what calls for the key: a log that grows again minutes within
    # `staleness` of its last job must not wait those minutes
    server = running(make_config(tmp_path, extra="wal_max_size = 64KiB\nwait_secs = 0"), workers=0, clock=FakeClock())
    db = dbs / "busy.db"
    key = "cleanup:" + str(db)
    with app_with_grown_wal(str(db)):
        server.intake.access.record(key)  # as when a channel took it for its last job
        server.intake.access.record(str(db))
        server.intake.forget(key)  # that job ended (the outcome's forget)
        server.intake.forget(str(db))
        assert not server.intake.access.is_fresh(key)
        assert server.intake.access.is_fresh(str(db))  # a database key keeps its staleness
        server.intake.on_event(str(db))
        cleanup = server.channels()["index_cleanup"]
        wait_for(lambda: cleanup.status()["waiting"]["size"] + cleanup.status()["starting"] == 1, 30,
                 what="the cleanup key queued again")
