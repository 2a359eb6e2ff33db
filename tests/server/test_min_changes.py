"""A channel's min_changes on SQLite: commits counted by the file change counter since smoosh's last compaction."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from compactor.dbfactory import make_bloated_db
from helpers.daemon import HANG_S, wait_for
from helpers.jobs_table import state_of
from helpers.locks import ChildConnection
from server.test_server import make_config


def bloat_again(db: Path, commits: int) -> None:
    """The application grows the file and frees it again, in ``commits`` write transactions (at least 2)."""
    with ChildConnection(db) as app:
        app.execute("INSERT INTO docs(key, body) SELECT key, randomblob(1000) FROM docs")
        app.execute("DELETE FROM docs WHERE id > (SELECT min(id) + 100 FROM docs)")
        for _ in range(commits - 2):
            app.execute("UPDATE docs SET key = hex(randomblob(8)) WHERE id = (SELECT min(id) FROM docs)")


def test_a_database_waits_for_min_changes_commits_after_its_compaction(tmp_path: Path, running: Any, dbs: Path) -> None:
    db = dbs / "tenant.db"
    make_bloated_db(str(db), rows=3000, delete_fraction=0.9, journal_mode="delete")
    config = make_config(tmp_path, extra="db_channels = busy_dbs\nstaleness = 0",
                         channels="[smoosh.busy_dbs]\npriority = ratio\nmin_size = 64KiB\nmin_changes = 5\n")
    server = running(config, workers=1)

    # Given a database smoosh never compacted: its changes are unknown, and min_changes holds nothing back
    (first,) = server.enqueue_and_wait([str(db)])
    assert (first.outcome, first.channel) == ("queued", "busy_dbs"), first
    wait_for(lambda: state_of(server, str(db)) == "finished", HANG_S, what="the first compaction")

    # When the application bloats it again in 3 commits
    bloat_again(db, 3)
    # Then it is not queued: 3 changes since smoosh compacted it, 5 needed
    (second,) = server.enqueue_and_wait([str(db)])
    assert second.outcome == "not_queued", second
    assert "changes 3 < min_changes 5" in (second.reason or ""), second.reason

    # And after 2 more commits it is
    with ChildConnection(db) as app:
        for _ in range(2):
            app.execute("UPDATE docs SET key = hex(randomblob(8)) WHERE id = (SELECT min(id) FROM docs)")
    (third,) = server.enqueue_and_wait([str(db)])
    assert (third.outcome, third.channel) == ("queued", "busy_dbs"), third
