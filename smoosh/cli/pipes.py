"""Quiet pipes: a command whose reader goes away (``smoosh status | head -1``) ends quietly.

Python ignores SIGPIPE, so a write to a closed pipe raises ``BrokenPipeError`` wherever the
command happens to print, and once more when the interpreter flushes stdout at exit. The
daemon must keep ignoring SIGPIPE (a client that hangs up must not kill it), so instead
the CLI's standard streams are wrapped: output nobody reads any more is dropped, the
command runs to its end and exits with its usual code.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

__all__ = ["QuietPipe", "quiet_pipes"]


class QuietPipe:
    """A text stream that drops its output once its reader has gone away.

    On the first ``BrokenPipeError`` the stream's file descriptor is pointed at
    ``/dev/null``, so the interpreter's own flush at exit (of the buffered text that could
    not be written) is quiet too. Every other attribute is the wrapped stream's.

    Parameters:
        stream: the stream to wrap (``sys.stdout`` or ``sys.stderr``).
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.broken = False

    def write(self, text: str) -> int:
        """Write ``text``; returns its length, whether or not anyone still reads it."""
        if not self.broken:
            try:
                self._stream.write(text)
            except BrokenPipeError:
                self._silence()
        return len(text)

    def flush(self) -> None:
        """Flush the wrapped stream; a reader that went away is not an error."""
        if not self.broken:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._silence()

    def _silence(self) -> None:
        self.broken = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, self._stream.fileno())
            finally:
                os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass  # a stream without a descriptor (a test's capture) has nothing left to flush

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextmanager
def quiet_pipes() -> Iterator[None]:
    """Wrap ``sys.stdout`` and ``sys.stderr`` in :class:`QuietPipe` for the block; restore them after.

    The streams are flushed inside the block, so text still buffered when the command
    returns meets a closed pipe here, quietly, and not at interpreter exit.
    """
    saved = sys.stdout, sys.stderr
    out, err = QuietPipe(sys.stdout), QuietPipe(sys.stderr)
    sys.stdout, sys.stderr = out, err
    try:
        yield
    finally:
        out.flush()
        err.flush()
        sys.stdout, sys.stderr = saved
