"""The errors of the checkpoint package (it imports nothing from smoosh; the server maps them)."""

from __future__ import annotations


class PersistError(Exception):
    """Raised for any failure the persist package reports on purpose; the root of its errors."""


class CorruptCheckpoint(PersistError):
    """Raised when a checkpoint file exists but cannot be trusted (damaged, truncated, foreign).

    Attributes
    ----------
    path:
        The checkpoint file.
    reason:
        What is wrong, in words (``"empty file"``, ``"CRC mismatch"``, ...).
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"corrupt checkpoint {path!r}: {reason}")
        self.path = path
        self.reason = reason

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        # Keep the two-argument constructor working across copy/multiprocessing.
        return (type(self), (self.path, self.reason))


class StateDirError(PersistError, OSError):
    """Raised when the state directory is missing, not a directory, unreadable or unwritable.

    An ``OSError`` too, so code that handles file-system errors catches it.

    Attributes
    ----------
    path:
        The state directory.
    problem:
        What is wrong, in words (``"does not exist"``, ``"is not writable: ..."``).
    errno:
        The underlying error number, when there is one.
    """

    def __init__(self, path: str, problem: str, errno: int | None = None) -> None:
        # One argument, so str() is exactly the message (OSError formats errno/filename
        # itself when it gets more); errno is set afterwards for callers that test it.
        super().__init__(f"state_dir {path!r} {problem}")
        self.path = path
        self.problem = problem
        self.errno = errno

    def __reduce__(self) -> tuple[type, tuple[str, str, int | None]]:
        return (type(self), (self.path, self.problem, self.errno))
