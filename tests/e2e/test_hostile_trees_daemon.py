"""Issue 45: a hostile tree costs a real daemon at most its own files, each named once in its log.

The trial of the issue, as real processes: a directory chain deeper than the path limit, a
non-UTF-8 and a 255-byte file name present at start, and a database copied in slowly under
its final name. Before: file events off for the whole root (a WARNING every 5 s), a traceback
and a ``CantOpenError`` crash loop, and a healthy copy compacted mid-copy and reported
``CorruptError`` "malformed". Now each is said once, the rest of the tree is compacted as
usual, and the copy is compacted once it is whole.
"""

from __future__ import annotations

import os
from pathlib import Path

from compactor.dbfactory import integrity, make_bloated_db, row_count
from helpers.daemon import HANG_S, Daemon, free_port, wait_for, write_config
from helpers.slow_copy import SlowCopy
from smoosh.daemon.watch.hostile import refused_name, too_deep
from smoosh.paths import NOT_UTF8, name_refusal
from watcher.test_hostile_trees import deep_chain


def compacted(d: Daemon, path: Path) -> bool:
    return any(j["key"] == str(path) and j["state"] == "finished" for j in d.get("/jobs")["jobs"])


def test_a_hostile_tree_costs_only_its_own_files_each_named_once(tmp_path: Path, daemons: list[Daemon]) -> None:
    base = Path(os.path.realpath(tmp_path))
    config = write_config(base, port=free_port())
    dbs = base / "dbs"
    # Given, present at start: a chain deeper than the path limit, a database with a Latin-1
    # name and one with a name of 255 bytes (each made elsewhere and renamed into place: the
    # SQLite library smoosh uses takes no name that is not UTF-8, and SQLite makes no database
    # whose journal's name would be too long), and a database like any other
    reachable = deep_chain(dbs)
    latin1 = dbs / os.fsdecode(b"caf\xe9.db")
    long_name = dbs / ("L" * 252 + ".db")
    for odd in (latin1, long_name):
        make_bloated_db(str(base / "made.db"), journal_mode="delete")
        os.rename(base / "made.db", odd)
    plain = dbs / "plain.db"
    make_bloated_db(str(plain), journal_mode="delete")
    d = Daemon(config)
    daemons.append(d)
    d.wait_ready()
    wait_for(lambda: compacted(d, plain), HANG_S, what="the plain database compacted", daemon=d)
    # When the application writes the odd ones again, and a database is made after the start
    # elsewhere in the same root (seen by its file events: the next rescan is minutes away)
    for odd in (latin1, long_name):
        with open(odd, "r+b") as fh:  # a writer without a journal (journal_mode=OFF, say)
            fh.write(fh.read(100))
    later = dbs / "tenants" / "later.db"
    later.parent.mkdir()
    make_bloated_db(str(later), journal_mode="delete")
    wait_for(lambda: compacted(d, later), HANG_S, what="the database made after the start compacted", daemon=d)
    # And an operator enqueues the odd names by hand
    status, answer = d.post("/enqueue?wait=1", {"keys": [str(latin1), str(long_name)]})
    # Then the odd files were never keys, the operator is told why, and the log names each
    # hostile thing once, with no traceback
    assert status == 200
    assert [r["outcome"] for r in answer["results"]] == ["rejected", "rejected"]
    assert "not valid UTF-8" in answer["results"][0]["reason"]
    assert "leaves no room for SQLite's -journal file" in answer["results"][1]["reason"]
    keys = {j["key"] for j in d.get("/jobs")["jobs"]}
    assert keys == {str(plain), str(later)}
    assert d.stop() == 0
    log = d.log_path.read_text(errors="replace")
    for sentence in (too_deep(reachable), refused_name(str(latin1), NOT_UTF8),
                     refused_name(str(long_name), name_refusal(str(long_name)) or "")):
        assert log.count(sentence) == 1, sentence
    assert "Traceback" not in log and "CantOpenError" not in log
    assert "cannot watch" not in log


def test_a_database_copied_in_slowly_is_compacted_once_whole_and_never_called_corrupt(
    tmp_path: Path, daemons: list[Daemon]
) -> None:
    base = Path(os.path.realpath(tmp_path))
    config = write_config(base, port=free_port(), extra_global="recheck_interval = 1s")
    source = base / "source.db"
    stats = make_bloated_db(str(source), journal_mode="delete")
    d = Daemon(config)
    daemons.append(d)
    d.wait_ready()
    wait_for(lambda: d.get("/status")["scan"]["scans_completed"] >= 1, HANG_S, what="the start-up scan", daemon=d)
    copied = base / "dbs" / "tenant.db"
    copy = SlowCopy(str(source), str(copied), 4)
    try:
        # When a copy under the final name is a quarter done, and the daemon has looked at it
        copy.step()
        waiting = f"Not examining {str(copied)!r} yet: shorter than its header says"
        wait_for(lambda: waiting in d.log(), HANG_S, what="the daemon's look at the copy in progress", daemon=d)
        # Then it is not compacted while the copy goes on
        copy.step()
        copy.step()
        assert not any(j["key"] == str(copied) for j in d.get("/jobs")["jobs"])
        copy.finish()
    finally:
        copy.close()
    # And once whole it is compacted, intact, and nothing ever called it corrupt
    wait_for(lambda: compacted(d, copied), HANG_S, what="the copy compacted once whole", daemon=d)
    assert integrity(str(copied)) == "ok" and row_count(str(copied)) == stats["rows"]
    assert d.stop() == 0
    log = d.log_path.read_text(errors="replace")
    assert log.count(waiting) == 1
    assert "malformed" not in log and "CorruptError" not in log
