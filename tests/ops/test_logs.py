"""What `smoosh run` writes on stderr, read from a real subprocess: JSON lines with the
compaction's fields, systemd priority prefixes only when stderr really is the journal, and a
format switched by a live reload (issue 14 "Logs")."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path
from typing import Any

from compactor.dbfactory import make_bloated_db
from helpers.daemon import HANG_S, Daemon, free_port, wait_for, write_config
from opslib import smoosh_cli

#: A key the config does not know: the daemon logs one WARNING about it at start-up.
UNKNOWN_KEY = "concurency = 2"
PREFIX = re.compile(r"<([0-7])>")


def lines_of(d: Daemon) -> list[str]:
    return [line for line in d.log_path.read_text(errors="replace").splitlines() if line.strip()]


def start(daemons: list[Daemon], config: Path, **kw: Any) -> Daemon:
    d = Daemon(config, **kw)
    daemons.append(d)
    d.wait_ready()
    return d


def test_json_lines_carry_the_compactions_fields(tmp_path: Path, daemons: list[Daemon]) -> None:
    # Given a daemon with log_format = json (and a config warning to log)
    config = write_config(tmp_path, port=free_port(), extra_global=f"log_format = json\n{UNKNOWN_KEY}")
    d = start(daemons, config)
    # When it compacts a bloated database and stops
    db = tmp_path / "dbs" / "tenant.db"
    make_bloated_db(str(db), rows=3000, delete_fraction=0.9)
    before = db.stat().st_size
    wait_for(lambda: '"compacted ' in d.log(), HANG_S, what="the compaction's line", daemon=d)
    assert d.stop() == 0
    # Then every line of stderr is one JSON object with the common fields
    records = [json.loads(line) for line in lines_of(d)]
    assert len(records) > 5
    for r in records:
        assert {"time", "level", "logger", "message"} <= set(r)
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", r["time"])
    assert any(r["level"] == "WARNING" and "concurency: unknown key" in r["message"] for r in records)
    # And the compaction's line has its fields, as numbers
    (done,) = [r for r in records if r["message"].startswith("compacted ")]
    assert done["level"] == "INFO"
    assert (done["key"], done["channel"], done["result"]) == (str(db), "ratio_dbs", "ok")
    assert done["size_before_bytes"] == before
    assert 0 < done["size_after_bytes"] < before
    assert done["reclaimed_bytes"] == done["size_before_bytes"] - done["size_after_bytes"]
    assert isinstance(done["duration_s"], float) and done["duration_s"] > 0
    assert done["message"] == (
        f"compacted {str(db)!r} in ratio_dbs in {done['duration_s']:.2f} s: "
        f"{before} -> {done['size_after_bytes']} bytes, reclaimed {done['reclaimed_bytes']} bytes"
    )


def test_lines_to_the_journal_start_with_their_priority(tmp_path: Path, daemons: list[Daemon]) -> None:
    # Given stderr is a file whose device and inode JOURNAL_STREAM names, as systemd sets it
    config = write_config(tmp_path, port=free_port(), extra_global=UNKNOWN_KEY)
    log_path = tmp_path / "journal.log"
    log_path.touch()
    st = log_path.stat()
    d = start(daemons, config, log_path=log_path, env={"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}",
                                                       "SMOOSH_LOG_LEVEL": "INFO"})
    assert d.stop() == 0
    # Then every line starts with <N>: 6 for INFO, 4 for the config's WARNING
    lines = lines_of(d)
    assert all(PREFIX.match(line) for line in lines), lines
    warning = [line for line in lines if "concurency: unknown key" in line]
    assert len(warning) == 1 and warning[0].startswith("<4>") and " WARNING smoosh.config: " in warning[0]
    info = [line for line in lines if " INFO " in line]
    assert info and all(line.startswith("<6>") for line in info)


def test_an_inherited_journal_stream_that_is_not_stderr_adds_no_prefix(tmp_path: Path, daemons: list[Daemon]) -> None:
    # Given JOURNAL_STREAM names another file than the daemon's stderr (a redirected child)
    config = write_config(tmp_path, port=free_port(), extra_global=UNKNOWN_KEY)
    other = tmp_path / "elsewhere"
    other.touch()
    st = other.stat()
    d = start(daemons, config, env={"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"})
    assert d.stop() == 0
    # Then no line has a prefix
    lines = lines_of(d)
    assert any("concurency: unknown key" in line for line in lines)
    assert not any(PREFIX.match(line) for line in lines), lines


def test_a_reload_switches_the_format_live(tmp_path: Path, daemons: list[Daemon]) -> None:
    # Given a daemon logging text
    config = write_config(tmp_path, port=free_port())
    d = start(daemons, config, env={"SMOOSH_LOG_LEVEL": "INFO"})
    # When the config says json and it is re-read (SIGHUP, or the file watcher: whichever first)
    config.write_text(config.read_text().replace("[smoosh]\n", "[smoosh]\nlog_format = json\n", 1))
    d.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: '"config reloaded' in d.log(), HANG_S, what="the reload's line, in JSON", daemon=d)
    assert d.stop() == 0
    # Then the lines before it are text and every line from it on is JSON
    lines = lines_of(d)
    first_json = next(i for i, line in enumerate(lines) if line.startswith("{"))
    assert first_json > 0 and " INFO " in lines[0]
    for line in lines[first_json:]:
        assert set(json.loads(line)) >= {"time", "level", "logger", "message"}


def test_a_log_level_that_names_no_level_is_one_line_and_exit_1(tmp_path: Path) -> None:
    config = write_config(tmp_path, port=free_port())
    done = smoosh_cli("run", "--config", str(config), env={"SMOOSH_LOG_LEVEL": "loud"})
    assert (done.returncode, done.stderr) == (1, "smoosh: SMOOSH_LOG_LEVEL='loud': must be DEBUG, INFO, WARNING or ERROR\n")
