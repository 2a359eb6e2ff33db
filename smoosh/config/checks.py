"""Checks of a loaded config against the machine it runs on: the directories it names exist, and
its store is smoosh's own file.

Loading a config reads only its file (the daemon's live reload and the Python API take a
config as written); ``smoosh run`` and ``smoosh config check`` both call
:func:`check_directories` and :func:`check_store` before anything else, so a typo in
``watch`` or ``roots`` is the same one-line error, exit 1, in both, instead of a daemon that
silently watches nothing; and so is a ``store`` that would write smoosh's tables into a file
it watches, or into an application's database (DESIGN §10: the store is never an
application's file).
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

__all__ = ["check_directories", "check_store"]


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


def check_store(config: Config, *, option: str | None = None) -> None:
    """Check that a ``sqlite:`` store is smoosh's own file: outside every watched directory and root,
    and not an application's SQLite database.

    A store inside the roots is a file the watcher reports and a channel may compact, beside the
    application's databases; one at an application's database gets smoosh's tables written into
    it. Either is refused before anything opens it. (``memory:`` and ``fdb:`` stores have no
    file here.)

    Parameters:
        config: the loaded config (``store`` as in force: after ``smoosh run --store``).
        option: the command-line option that set the store (``--store``), to name instead of
            the config's key.

    Raises:
        ConfigError: ``PATH: [smoosh] store = 'sqlite:/srv/dbs/jobs.db': inside the watched
            directory /srv/dbs ...`` or ``...: an application's SQLite database (its tables: ...)``.
    """
    from smoosh.store.sqlite import not_a_store

    url = config.store or ""
    inner = url
    while inner.startswith("faulty:"):
        parts = inner.split(":", 2)
        inner = parts[2] if len(parts) == 3 else ""
    if not inner.startswith("sqlite:") or not inner[len("sqlite:"):]:
        return
    path = os.path.realpath(inner[len("sqlite:"):])
    problem = None
    for key, entries in (("watch", config.watch), ("roots", config.roots)):
        for entry in entries:
            directory = os.path.realpath(static_prefix(entry) if glob.has_magic(entry) else entry)
            if path == directory or path.startswith(directory.rstrip(os.sep) + os.sep):
                what = "the watched directory" if key == "watch" else "the root"
                problem = (f"inside {what} {directory} ([{GLOBAL_SECTION}] {key}): smoosh's store must be none of the "
                           "files it watches and compacts; give it a path outside watch and roots (by default it "
                           "lies in state_dir)")
                break
        if problem is not None:
            break
    if problem is None:
        refused = not_a_store(path)
        if refused is not None:
            problem = (f"{path} is {refused}: smoosh would write its own tables into it; give store a file of its "
                       "own (by default it lies in state_dir)")
    if problem is None:
        return
    if option is not None:
        message = f"{option} = {url!r}: {problem}"
    else:
        message = error_message(config.path or DEFAULTS_NAME, GLOBAL_SECTION, "store", url, problem)
    raise ConfigError(message, path=config.path, section=GLOBAL_SECTION, key="store", value=url)
