"""The log's formats (text, JSON), the journal's priority prefixes, and how stderr is recognised
as the journal: a real file's device and inode against ``$JOURNAL_STREAM``."""

from __future__ import annotations

import io
import json
import logging
import os
from pathlib import Path
from typing import Iterator

import pytest

from smoosh import logs


def record(level: int = logging.INFO, msg: str = "compacted %r", args: tuple = ("/db/a",), **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("smoosh.daemon.record.outcomes", level, __file__, 1, msg, args, None)
    rec.created = 1767323045.25  # 2026-01-02T03:04:05.250Z
    rec.__dict__.update(extra)
    return rec


def failing_record() -> logging.LogRecord:
    try:
        raise RuntimeError("disk on fire")
    except RuntimeError:
        import sys

        rec = record(logging.ERROR, "could not checkpoint %s", ("ratio_dbs",))
        rec.exc_info = sys.exc_info()
        return rec


@pytest.fixture
def root_logging() -> Iterator[None]:
    """Whatever logs.setup changes on the root logger is put back."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    watchdog_level = logging.getLogger("watchdog").level
    yield
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
    root.setLevel(level)
    logging.getLogger("watchdog").setLevel(watchdog_level)
    logs._handler = None
    logs.set_format(logs.DEFAULT_LOG_FORMAT)


@pytest.mark.parametrize(("level", "priority"), [(logging.DEBUG, 7), (logging.INFO, 6), (logging.WARNING, 4),
                                                 (logging.ERROR, 3), (logging.CRITICAL, 2), (25, 6), (5, 7)])
def test_levels_map_to_syslog_priorities(level: int, priority: int) -> None:
    assert logs.journal_priority(level) == priority


def test_a_json_line_has_time_level_logger_message_and_the_extra_fields() -> None:
    line = logs.JsonFormatter().format(record(key="/db/a", channel="ratio_dbs", reclaimed_bytes=42))
    assert "\n" not in line
    assert json.loads(line) == {
        "time": "2026-01-02T03:04:05.250Z", "level": "INFO", "logger": "smoosh.daemon.record.outcomes",
        "message": "compacted '/db/a'", "key": "/db/a", "channel": "ratio_dbs", "reclaimed_bytes": 42,
    }


def test_a_traceback_is_one_exc_field_never_extra_lines() -> None:
    line = logs.JsonFormatter().format(failing_record())
    assert "\n" not in line
    out = json.loads(line)
    assert out["message"] == "could not checkpoint ratio_dbs"
    assert out["exc"].startswith("Traceback (most recent call last):")
    assert out["exc"].endswith("RuntimeError: disk on fire")


def test_an_extra_field_json_cannot_carry_is_shown_as_text() -> None:
    out = json.loads(logs.JsonFormatter().format(record(path=Path("/db/a"))))
    assert out["path"] == "/db/a"


def test_text_lines_are_unchanged_without_the_journal() -> None:
    line = logs.TextFormatter().format(record(logging.WARNING))
    assert line.endswith(" WARNING smoosh.daemon.record.outcomes: compacted '/db/a'")
    assert not line.startswith("<")


def test_under_the_journal_every_line_of_a_record_carries_its_priority() -> None:
    text = logs.TextFormatter(journal=True).format(failing_record())
    lines = text.split("\n")
    assert len(lines) > 3  # the message and its traceback
    assert all(line.startswith("<3>") for line in lines)
    assert logs.JsonFormatter(journal=True).format(record(logging.WARNING)).startswith('<4>{"time"')


def test_stderr_is_the_journal_only_when_the_variable_names_its_device_and_inode(tmp_path: Path) -> None:
    path = tmp_path / "stderr"
    with open(path, "w") as stream:
        st = os.fstat(stream.fileno())
        assert logs.stream_is_journal(stream, {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"})
        # Inherited by a process whose stderr went elsewhere: another inode, no journal.
        assert not logs.stream_is_journal(stream, {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino + 1}"})
        assert not logs.stream_is_journal(stream, {"JOURNAL_STREAM": f"{st.st_dev + 1}:{st.st_ino}"})
        assert not logs.stream_is_journal(stream, {"JOURNAL_STREAM": "garbage"})
        assert not logs.stream_is_journal(stream, {})
    assert not logs.stream_is_journal(io.StringIO(), {"JOURNAL_STREAM": "1:2"})  # no descriptor at all


def test_set_format_switches_the_installed_handler_and_keeps_the_journal_prefix(tmp_path: Path, root_logging: None) -> None:
    with open(tmp_path / "err", "w+") as stream:
        st = os.fstat(stream.fileno())
        logs.setup("INFO", stream=stream, environ={"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"})
        log = logging.getLogger("smoosh.test")
        log.info("as text")
        logs.set_format("json")
        log.warning("as json", extra={"key": "/db/a"})
        logs.set_format("text")
        log.error("text again")
        stream.seek(0)
        lines = stream.read().splitlines()
    assert lines[0].startswith("<6>") and lines[0].endswith(" INFO smoosh.test: as text")
    assert lines[1].startswith("<4>")
    assert json.loads(lines[1][3:])["key"] == "/db/a"
    assert lines[2].startswith("<3>") and lines[2].endswith(" ERROR smoosh.test: text again")
    assert logs.current_format() == "text"


def test_an_unknown_format_is_refused_and_changes_nothing(root_logging: None) -> None:
    with pytest.raises(ValueError, match="'xml'"):
        logs.set_format("xml")
    assert logs.current_format() == "text"
