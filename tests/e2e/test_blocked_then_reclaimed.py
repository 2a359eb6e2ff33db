"""Reclaimed bytes are counted however the compaction ends (issue 30): a database a reader kept
``blocked``, whose WAL was checkpointed once the reader left, ended ``dropped`` (its retry found
the file already small) and its bytes appeared in no counter.

One real `smoosh run`, a real bloated WAL database, a real reader process inside a read
transaction; the retry comes after a 2 s backoff.
"""

from __future__ import annotations

import os
import re
import urllib.request
from pathlib import Path
from typing import Any

from compactor.dbfactory import make_bloated_db
from helpers.daemon import Daemon, free_port, wait_for, write_config
from helpers.locks import ChildConnection

#: Ceiling on the blocked run and on the retry (only bounds a hang).
WITHIN_S = 30.0


def footprint(db: Path) -> int:
    """The database's bytes as a compaction measures them: the file and its WAL."""
    wal = Path(f"{db}-wal")
    return db.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


def job(d: Daemon, key: Path) -> dict[str, Any]:
    return {j["key"]: j for j in d.get("/jobs")["jobs"]}.get(str(key), {})


def counted(d: Daemon) -> dict[str, float]:
    text = urllib.request.urlopen(d.url + "/metrics", timeout=10).read().decode()
    found = {m[1] + ("_" + m[2] if m[2] else ""): float(m[3]) for m in re.finditer(
        r'^smoosh_(reclaimed_bytes_total|compacted_bytes_total)\{channel="ratio_dbs"(?:,phase="(\w+)")?\} (\S+)$',
        text, re.M)}
    found["ok"] = float(re.search(r'^smoosh_compactions_total\{channel="ratio_dbs",result="ok"\} (\S+)$', text,
                                  re.M)[1])  # type: ignore[index]
    return found


def test_a_blocked_compaction_whose_wal_is_checkpointed_later_counts_its_bytes(
    tmp_path: Path, daemons: list[Daemon]
) -> None:
    base = Path(os.path.realpath(tmp_path))
    config = write_config(base, port=free_port(), extra_global=f"watch =\nroots = {base / 'dbs'}\nbackoff_base = 2s")
    db = base / "dbs" / "pinned.db"
    make_bloated_db(str(db), rows=3000, delete_fraction=0.8)
    before = footprint(db)
    d = Daemon(config)
    daemons.append(d)
    d.wait_ready()
    # Given a compaction blocked by a reader inside a read transaction (the VACUUM sits in the WAL)
    with ChildConnection(db) as reader:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM docs")
        assert d.post("/enqueue", {"keys": [str(db)]})[0] == 202
        wait_for(lambda: str(job(d, db).get("last_error")).startswith("blocked: a reader holds the WAL"), WITHIN_S,
                 what="the blocked compaction", daemon=d)
        reader.execute("COMMIT")
    # When the reader leaves (its close checkpoints the WAL: the file comes out compacted)
    after = footprint(db)
    assert after < before / 2
    # ... and the retry after the backoff finds nothing left to do
    wait_for(lambda: job(d, db).get("state") == "finished", WITHIN_S, what="the retry", daemon=d)
    # Then the bytes are counted, as before minus after, and the history says how they came back
    assert counted(d) == {"compacted_bytes_total_before": float(before), "compacted_bytes_total_after": float(after),
                          "reclaimed_bytes_total": float(before - after), "ok": 0.0}
    history = job(d, db)["history"]
    assert [e["event"] for e in history[:3]] == ["finished", "dropped", "blocked"]
    assert history[0]["reason"] == f"reclaimed {before - after} bytes once the WAL a reader pinned was checkpointed"
    assert d.stop() == 0
    assert (f"compacted {str(db)!r} in ratio_dbs once the WAL a reader pinned was checkpointed: {before} -> {after} "
            f"bytes, reclaimed {before - after} bytes") in d.log_path.read_text(errors="replace")
