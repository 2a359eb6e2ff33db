"""Errors of the job layer: every one derives from :class:`JobsError` (a :class:`SmooshError`)."""

from __future__ import annotations

from typing import Union

#: A job type (as :data:`smoosh.jobs.encoding.JobType`; errors sit below the encoding).
_Type = Union[str, tuple[Union[str, int], ...], None]

from smoosh.errors import SmooshError


class JobsError(SmooshError):
    """Raised when a job-layer call fails on purpose; the root of the job layer's errors."""


class NotFound(JobsError):
    """Raised when a job (or, for ``accept``, a pending job within the timeout) does not exist."""

    def __init__(self, message: str, *, type: _Type = None, job_id: str | None = None) -> None:
        super().__init__(message)
        self.type = type
        self.job_id = job_id


class JobHalted(JobsError):
    """Raised when a worker's job was removed or re-enqueued since it accepted it: stop working on it."""

    def __init__(self, message: str, *, type: _Type = None, job_id: str | None = None) -> None:
        super().__init__(message)
        self.type = type
        self.job_id = job_id


class NoTypeTimeout(JobsError):
    """Raised when a job is added to a type that has no activity timeout (an unknown type)."""

    def __init__(self, type: _Type) -> None:
        super().__init__(f"job type {type!r} has no activity timeout: call set_type_timeout first")
        self.type = type


class EncodingError(JobsError):
    """Raised when job data, a type or an id cannot be encoded within the layer's rules and limits."""
