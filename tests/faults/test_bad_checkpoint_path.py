"""A channel's checkpoint path that is a directory (issue 25): one line per failed read or write,
counted as a checkpoint error, no traceback; the daemon goes on compacting."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

from compactor.dbfactory import make_bloated_db
from faults.faultlib import start_daemon
from helpers.daemon import Daemon, free_port, wait_for, write_config


def checkpoint_errors_metric(d: Daemon) -> float:
    text = urllib.request.urlopen(d.url + "/metrics", timeout=10).read().decode()
    found = re.search(r'^smoosh_checkpoint_errors_total\{channel="ratio_dbs"\} (\S+)$', text, re.M)
    assert found, text
    return float(found.group(1))


def test_a_checkpoint_path_that_is_a_directory_is_one_counted_line_per_failure(
    tmp_path: Path, daemons: list[Daemon]
) -> None:
    # Given ratio_dbs's checkpoint path taken by a directory
    config = write_config(tmp_path, port=free_port())
    checkpoint = tmp_path / "state" / "ratio_dbs.smooshq"
    checkpoint.mkdir()
    # When the daemon starts, it says it cannot read it, in one line, and counts it
    d = start_daemon(daemons, config)
    read_line = f"ERROR channels.channel.ratio_dbs: Channel ratio_dbs: could not read checkpoint '{checkpoint}' " \
                "(Is a directory); starting empty."
    assert read_line in d.log()
    assert d.get("/status")["channels"]["ratio_dbs"]["checkpoint_errors"] == 1
    # When a key is queued, its checkpoint (every second here) cannot be written: one line each time
    db = tmp_path / "dbs" / "x.db"
    make_bloated_db(str(db), rows=300)
    wait_for(lambda: "could not write checkpoint" in d.log(), 20, what="a failed checkpoint write", daemon=d)
    write_line = f"WARNING channels.channel.ratio_dbs: Channel ratio_dbs: could not write checkpoint '{checkpoint}' " \
                 "(Is a directory)."
    assert write_line in d.log()
    wait_for(lambda: checkpoint_errors_metric(d) >= 2, 20, what="the failed write counted", daemon=d)
    # ... never a traceback, and the daemon goes on: the key is compacted
    wait_for(lambda: {j["key"]: j for j in d.get("/jobs")["jobs"]}.get(str(db), {}).get("state") == "finished",
             20, what="the compaction", daemon=d)
    assert d.stop() == 0
    assert "Traceback" not in d.log_path.read_text()
    assert checkpoint.is_dir()
