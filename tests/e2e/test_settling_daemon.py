"""Issue 25: a database copied in under a temporary name is compacted under its final name only.

The trial of the issue: a start-up scan found a half-copied file under its temporary name and
compacted it; /jobs kept a crashing record of the vanished ``.tmp`` key. Now the temporary
name is never a key, and the renamed file is compacted once it is in place.
"""

from __future__ import annotations

import os
from pathlib import Path

from compactor.dbfactory import make_bloated_db
from helpers.daemon import Daemon, free_port, wait_for, write_config


def test_a_file_copied_in_under_a_temporary_name_is_compacted_only_once_renamed(
    tmp_path: Path, daemons: list[Daemon]
) -> None:
    base = Path(os.path.realpath(tmp_path))
    config = write_config(base, port=free_port())
    incoming = base / "dbs" / "tenant.db.tmp"
    make_bloated_db(str(incoming), journal_mode="delete")
    before = incoming.read_bytes()

    d = Daemon(config)
    daemons.append(d)
    d.wait_ready()
    wait_for(lambda: d.get("/status")["scan"]["scans_completed"] >= 1, 30, what="the start-up scan", daemon=d)
    status, answer = d.post("/enqueue?wait=1", {"keys": [str(incoming)]})
    assert status == 200 and answer["results"][0]["outcome"] == "rejected"
    assert incoming.read_bytes() == before  # never touched under its temporary name
    assert all(j["key"] != str(incoming) for j in d.get("/jobs")["jobs"])

    final = base / "dbs" / "tenant.db"
    size = len(before)
    os.rename(incoming, final)  # the copy is complete: renamed into place
    wait_for(lambda: final.stat().st_size < size, 60, what="the renamed database compacted", daemon=d)
    assert all(j["key"] != str(incoming) for j in d.get("/jobs")["jobs"])
