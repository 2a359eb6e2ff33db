"""The error roots of smoosh: every error the daemon raises on purpose derives from SmooshError."""

from __future__ import annotations

import os


class SmooshError(Exception):
    """Raised for any failure smoosh reports on purpose; the root of every smoosh error."""


class ConfigError(SmooshError):
    """Raised when a configuration file, section, key or value is invalid.

    Attributes name what the error is about, so callers (``smoosh config check``, ``/status``)
    can show it without parsing the message.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        section: str | None = None,
        key: str | None = None,
        value: str | None = None,
    ) -> None:
        super().__init__(message)
        self.path = path
        self.section = section
        self.key = key
        self.value = value


class InvalidKey(SmooshError):
    """Raised when a key cannot be enqueued: unclaimed, outside ``roots``, or smoosh's own file."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"invalid key {key!r}: {reason}")
        self.key = key
        self.reason = reason


class UnknownChannel(SmooshError):
    """Raised when an operator names a channel the config does not define."""

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown channel {name!r}")
        self.name = name


class CorruptStore(SmooshError):
    """Raised when the embedded job store's file is damaged, so the daemon cannot start on it.

    The message names the file, SQLite's words and the way forward (``smoosh run
    --reset-store``, which moves the file aside and starts with an empty store).

    Attributes:
        path: the store's file.
        reason: what SQLite says is wrong with it.
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(
            f"the job store {path} is corrupt ({reason}); run 'smoosh run --reset-store' to move it aside"
            f" (renamed {os.path.basename(path)}.corrupt-<unix seconds>, never deleted) and start with an empty store"
        )
        self.path = path
        self.reason = reason
