"""One log line per failed compaction and per operator action (DESIGN §11: the one line per finished
compaction, at WARNING for a failed one). A failed compaction wrote two WARNING lines; `suspend`
wrote eight for four channels.

A real server in process, a real corrupt SQLite file, every logger captured.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from compactor.dbfactory import make_corrupt_db
from helpers.daemon import wait_for
from helpers.jobs_table import record_of
from server.test_server import make_config

#: Ceiling on the corrupt database's compaction failing (only bounds a hang).
FAILED_WITHIN_S = 30.0
CHANNELS = "upgrade_dbs, ratio_dbs, slack_dbs, index_cleanup"


def lines(caplog: pytest.LogCaptureFixture, level: int) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno >= level]


def test_a_failed_compaction_writes_one_warning_line(
    tmp_path: Path, running: object, dbs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a database whose pages are corrupt (its VACUUM fails), on a server with a 100 s backoff
    db = dbs.resolve() / "corrupt.db"
    make_corrupt_db(str(db))
    server = running(make_config(tmp_path), workers=1)  # type: ignore[operator]
    caplog.set_level(logging.DEBUG)
    caplog.clear()
    # When it is compacted and fails
    server.enqueue(str(db))
    wait_for(lambda: record_of(server, str(db)).get("error_count") == 1, FAILED_WITHIN_S, what="the failure")
    # Then one WARNING line says it, with the error and the wait (the traceback is at DEBUG)
    assert lines(caplog, logging.WARNING) == [("WARNING", (
        f"compaction of {str(db)!r} in slack_dbs failed (CorruptError: database disk image is malformed); "
        "retrying in 100 s"))]
    assert any(r.exc_info for r in caplog.records if r.levelno == logging.DEBUG and str(db) in r.getMessage())


def test_suspend_resume_and_flush_of_every_channel_write_one_line_each(
    tmp_path: Path, running: object, caplog: pytest.LogCaptureFixture
) -> None:
    server = running(make_config(tmp_path), workers=0)  # type: ignore[operator]
    caplog.set_level(logging.INFO)
    # (the start-up pause, wait_secs = 0, ends with a line per channel at the first tick)
    wait_for(lambda: not any(ch["paused"] for ch in server.status()["channels"].values()), FAILED_WITHIN_S,
             what="the channels' start-up pause to end")
    caplog.clear()
    server.suspend()
    assert lines(caplog, logging.INFO) == [("INFO", (
        f"suspended every channel ({CHANNELS}): nothing starts and running compactions hold until it is resumed"))]
    caplog.clear()
    server.resume()
    assert lines(caplog, logging.INFO) == [("INFO", f"resumed every channel ({CHANNELS})")]
    caplog.clear()
    server.flush()
    assert lines(caplog, logging.INFO) == [("INFO", f"flushed every channel ({CHANNELS}): 0 waiting key(s) dropped")]
    caplog.clear()
    server.suspend("ratio_dbs")
    assert lines(caplog, logging.INFO) == [("INFO", (
        "suspended channel ratio_dbs: nothing starts and running compactions hold until it is resumed"))]
