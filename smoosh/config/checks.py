"""Checks of a loaded config against the machine it runs on: the directories it names exist.

Loading a config reads only its file (the daemon's live reload and the Python API take a
config as written); ``smoosh run`` and ``smoosh config check`` both call
:func:`check_directories` before anything else, so a typo in ``watch`` or ``roots`` is the
same one-line error, exit 1, in both, instead of a daemon that silently watches nothing.
"""

from __future__ import annotations

import glob
import os
from typing import TYPE_CHECKING

from smoosh.config.defaults import CONFIG_ENV, DEFAULTS_NAME, GLOBAL_SECTION
from smoosh.config.values import error_message, static_prefix
from smoosh.errors import ConfigError

if TYPE_CHECKING:
    from smoosh.config import Config

__all__ = ["check_directories"]


def check_directories(config: Config) -> None:
    """Check that every ``watch`` entry's directory and every root exists and is a directory.

    A glob pattern in ``watch`` needs the directory its fixed part names.

    Parameters:
        config: the loaded config.

    Raises:
        ConfigError: the first missing one, ``PATH: [smoosh] watch = '/srv/dbz': no such directory``
            (``not a directory`` for a file).
    """
    where = config.path or DEFAULTS_NAME
    for key, entries in (("watch", config.watch), ("roots", config.roots)):
        for entry in entries:
            directory = static_prefix(entry) if glob.has_magic(entry) else entry
            problem = _directory_problem(directory)
            if problem is not None and directory != entry:
                problem = f"{problem}: {directory}"
            if problem is not None and config.path is None:
                # No file was read: the default directory is relative to wherever the command
                # runs, and the fix is a config file, not this directory.
                problem = (f"{problem} (no config file was found: this is the default; "
                           "`smoosh config sample > smoosh.ini` writes one to edit, and --config "
                           f"or ${CONFIG_ENV} names it)")
            if problem is not None:
                raise ConfigError(error_message(where, GLOBAL_SECTION, key, entry, problem),
                                  path=config.path, section=GLOBAL_SECTION, key=key, value=entry)


def _directory_problem(path: str) -> str | None:
    if os.path.isdir(path):
        return None
    if os.path.lexists(path):
        return "not a directory"
    return "no such directory"
