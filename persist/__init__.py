"""Checkpoint files for channel queues: atomic, versioned, checksummed; no smoosh imports.

``write_checkpoint(path, {key: priority})`` replaces the file atomically (``{}`` deletes
it); ``read_checkpoint(path)`` returns the mapping, ``{}`` when the file is missing, and
raises :class:`CorruptCheckpoint` when it is damaged; ``quarantine`` moves a damaged file
aside; ``check_setup(state_dir)`` proves at start-up that the directory is usable.
"""

from __future__ import annotations

from persist.checkpoint import (
    FORMAT_VERSION,
    MAGIC,
    quarantine,
    read_checkpoint,
    remove_stale_temp_files,
    write_checkpoint,
)
from persist.errors import CorruptCheckpoint, PersistError, StateDirError
from persist.state_dir import check_setup

__all__ = [
    "write_checkpoint",
    "read_checkpoint",
    "CorruptCheckpoint",
    "check_setup",
    "quarantine",
    "remove_stale_temp_files",
    "PersistError",
    "StateDirError",
    "MAGIC",
    "FORMAT_VERSION",
]
