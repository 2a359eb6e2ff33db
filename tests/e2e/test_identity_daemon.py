"""Issue 25: a daemon watching a directory that holds a hard link to an outside database.

The trial of the issue as a user runs it: `ln outside/o.db dbs/hard.db` beside an ordinary
bloated database, then `smoosh run`. The ordinary one is compacted; the hard link is never
written, refused with one WARNING, and `enqueue` and `explain` say why.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from compactor.dbfactory import make_bloated_db
from helpers.daemon import Daemon, free_port, wait_for, write_config

REASON = ("the file has 2 hard links: another name outside smoosh's view shares the file "
          "(allow_hard_links opts a root in)")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_watched_hard_link_is_never_compacted_and_every_way_in_says_why(tmp_path: Path, daemons: list[Daemon]) -> None:
    base = Path(os.path.realpath(tmp_path))
    config = write_config(base, port=free_port())
    (base / "outside").mkdir()
    victim, ordinary = base / "outside" / "o.db", base / "dbs" / "ordinary.db"
    make_bloated_db(str(victim), journal_mode="delete")
    make_bloated_db(str(ordinary), journal_mode="delete")
    hard = base / "dbs" / "hard.db"
    os.link(victim, hard)
    before, ordinary_size = _digest(victim), ordinary.stat().st_size

    d = Daemon(config)
    daemons.append(d)
    d.wait_ready()
    wait_for(lambda: ordinary.stat().st_size < ordinary_size, 60, what="the ordinary database compacted", daemon=d)

    status, answer = d.post("/enqueue?wait=1", {"keys": [str(hard)], "force": True})
    assert status == 200
    assert answer["results"] == [{"key": str(hard), "outcome": "rejected", "channel": None, "priority": None,
                                  "reason": REASON}]
    explained = d.get(f"/explain?key={hard}")
    assert (explained["state"], explained["reason"]) == ("rejected", REASON)
    assert _digest(victim) == before
    warnings = [line for line in d.log().splitlines() if "WARNING" in line and str(hard) in line]
    assert warnings and all(REASON in line for line in warnings)
    assert len(warnings) == 1, warnings
