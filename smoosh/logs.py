"""How ``smoosh run`` and ``smoosh worker`` write their log: text or JSON lines on stderr,
with syslog priority prefixes when stderr is the systemd journal.

``log_format = text`` (the default) writes ``TIME LEVEL LOGGER: MESSAGE``; ``json`` writes one
object per line (``time`` in ISO 8601 UTC, ``level``, ``logger``, ``message``, every field a
call passed with ``extra=``, and ``exc`` holding a traceback as one string), so a log shipper
needs no multi-line rules. Under systemd, when stderr *is* the journal (``$JOURNAL_STREAM``
names stderr's device and inode, as systemd.exec(5) documents), every line starts with
``<N>``, the record's syslog priority; journald strips it and files the line at that
priority, so ``journalctl -p warning`` shows warnings and worse. A stderr redirected
elsewhere (a file, a pipe) never gets the prefix, even when the variable was inherited.

Owner: the process's main thread installs the one handler (:func:`setup`) before the daemon
starts; the format is switched in place afterwards (:func:`set_format`, on a live reload, from
the server's loop thread) under the handler's own lock, so a line is never half one format.
An embedding application's logging is never touched: without :func:`setup`, :func:`set_format`
only records the choice.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import IO, Any, Mapping

__all__ = [
    "LOG_FORMATS",
    "DEFAULT_LOG_FORMAT",
    "JOURNAL_STREAM_ENV",
    "TEXT_FORMAT",
    "JsonFormatter",
    "TextFormatter",
    "journal_priority",
    "stream_is_journal",
    "setup",
    "set_format",
    "current_format",
]

#: The values ``log_format`` accepts.
LOG_FORMATS = ("text", "json")
#: The format used until the config says otherwise.
DEFAULT_LOG_FORMAT = "text"
#: Set by systemd for a service whose stdout/stderr is the journal: ``DEVICE:INODE`` in decimal.
JOURNAL_STREAM_ENV = "JOURNAL_STREAM"
#: The text line (unchanged from before ``log_format`` existed).
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}

_handler: logging.Handler | None = None
_format: str = DEFAULT_LOG_FORMAT


def journal_priority(levelno: int) -> int:
    """The syslog priority of a Python log level (sd-daemon(3)'s ``<N>`` prefixes).

    Parameters:
        levelno: ``logging.DEBUG`` ... ``logging.CRITICAL`` (levels in between round down).

    Returns:
        7 (debug), 6 (info), 4 (warning), 3 (error) or 2 (critical).
    """
    if levelno >= logging.CRITICAL:
        return 2
    if levelno >= logging.ERROR:
        return 3
    if levelno >= logging.WARNING:
        return 4
    if levelno >= logging.INFO:
        return 6
    return 7


def stream_is_journal(stream: IO[Any], environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``stream`` is the journal's socket: ``$JOURNAL_STREAM`` names its device and inode.

    systemd sets the variable for a service whose output goes to the journal; a child that
    redirects stderr inherits the variable, so it is compared with the descriptor, not trusted.

    Parameters:
        stream: the stream the log is written to (stderr).
        environ: the environment (default ``os.environ``).

    Returns:
        True only when the variable is well formed and matches the stream's ``st_dev:st_ino``.
    """
    value = (os.environ if environ is None else environ).get(JOURNAL_STREAM_ENV, "")
    dev_text, sep, ino_text = value.partition(":")
    if not sep or not dev_text.isdigit() or not ino_text.isdigit():
        return False
    try:
        st = os.fstat(stream.fileno())
    except (OSError, AttributeError, ValueError):  # no descriptor (a StringIO), or a closed one
        return False
    return st.st_dev == int(dev_text) and st.st_ino == int(ino_text)


def _prefixed(text: str, levelno: int) -> str:
    # journald takes each line as an entry of its own: a traceback's lines keep the priority too.
    prefix = f"<{journal_priority(levelno)}>"
    return "\n".join(prefix + line for line in text.split("\n"))


class TextFormatter(logging.Formatter):
    """``TIME LEVEL LOGGER: MESSAGE`` (tracebacks on the lines after), optionally with journal priorities.

    Parameters:
        journal: start every line with its record's ``<N>`` syslog priority.
    """

    def __init__(self, *, journal: bool = False) -> None:
        super().__init__(TEXT_FORMAT)
        self.journal = journal

    def format(self, record: logging.LogRecord) -> str:
        """See :meth:`logging.Formatter.format`."""
        text = super().format(record)
        return _prefixed(text, record.levelno) if self.journal else text


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (see the module docstring for its fields).

    Parameters:
        journal: start the line with the record's ``<N>`` syslog priority (journald strips it).
    """

    def __init__(self, *, journal: bool = False) -> None:
        super().__init__()
        self.journal = journal

    def format(self, record: logging.LogRecord) -> str:
        """See :meth:`logging.Formatter.format`."""
        out: dict[str, Any] = {
            "time": _iso_utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in record.__dict__.items():
            if name not in _STANDARD_ATTRS and name not in out and not name.startswith("_"):
                out[name] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        # default=str: an extra field that JSON cannot carry is shown, never a failed line.
        # json.dumps escapes newlines, so a traceback stays on this one line.
        text = json.dumps(out, default=str, ensure_ascii=False)
        return _prefixed(text, record.levelno) if self.journal else text


def _iso_utc(created: float) -> str:
    seconds = int(created)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int((created - seconds) * 1000):03d}Z"


def _formatter(log_format: str, journal: bool) -> logging.Formatter:
    if log_format == "json":
        return JsonFormatter(journal=journal)
    if log_format == "text":
        return TextFormatter(journal=journal)
    raise ValueError(f"log format {log_format!r}: must be one of {', '.join(LOG_FORMATS)}")


def setup(level: str, log_format: str = DEFAULT_LOG_FORMAT, *, stream: IO[Any] | None = None,
          environ: Mapping[str, str] | None = None) -> logging.Handler:
    """Install smoosh's handler on the root logger, replacing one an earlier call installed.

    Parameters:
        level: the root level's name (``$SMOOSH_LOG_LEVEL``: DEBUG, INFO, WARNING, ERROR).
        log_format: ``text`` or ``json``.
        stream: where lines go (default: stderr).
        environ: the environment consulted for ``$JOURNAL_STREAM`` (default ``os.environ``).

    Returns:
        The handler (the one :func:`set_format` changes).

    Raises:
        ValueError: an unknown level or format.
    """
    global _handler, _format
    stream = sys.stderr if stream is None else stream
    journal = stream_is_journal(stream, environ)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(_formatter(log_format, journal))
    root = logging.getLogger()
    root.setLevel(level.upper())
    if _handler is not None:
        root.removeHandler(_handler)
    root.addHandler(handler)
    _handler, _format = handler, log_format
    # watchdog logs every inotify event at DEBUG: far too much, even when debugging smoosh.
    logging.getLogger("watchdog").setLevel(max(logging.INFO, root.level))
    return handler


def set_format(log_format: str) -> None:
    """Switch the installed handler to ``log_format`` (``text`` or ``json``); the next line uses it.

    Without :func:`setup` (smoosh embedded in an application) only the choice is recorded.

    Raises:
        ValueError: an unknown format.
    """
    global _format
    handler = _handler
    if handler is not None:
        current = handler.formatter
        journal = bool(getattr(current, "journal", False))
        formatter = _formatter(log_format, journal)
        # The handler's lock is the one emit() holds: no record is formatted half and half.
        with handler.lock or _NullLock():
            handler.setFormatter(formatter)
    elif log_format not in LOG_FORMATS:
        raise ValueError(f"log format {log_format!r}: must be one of {', '.join(LOG_FORMATS)}")
    _format = log_format


def current_format() -> str:
    """The log format last chosen (``setup`` or ``set_format``)."""
    return _format


class _NullLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
