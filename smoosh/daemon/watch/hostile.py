"""What a hostile tree costs the watcher: the paths it cannot watch, read or key, each named once.

DESIGN §10: a hostile tree (too deep, odd names, files still being copied) costs at most its own
files, named once in the log; never a root's events. A directory the observer cannot watch (a
chain deeper than the path limit, no permission) is skipped and the rest of its root watched; a
directory the scan cannot read is skipped and the rest walked; a file whose name SQLite or
smoosh's keys cannot carry (:func:`smoosh.paths.name_refusal`) is never a key. Each is said here,
once per process: the observer and the scan helper meet the same directory, and the periodic
rescan and every write of the application meet it again, but the log says it one time.

The sentences are built here for both sides (the scan helper process imports this module too,
and sends them back as they are), so the daemon recognises the same news from either.

Owner: the process (one table, under its lock; any thread may say a sentence).
"""

from __future__ import annotations

import collections
import logging
import threading

from smoosh.paths import shown_path

__all__ = ["PATH_MAX_BYTES", "say_once", "too_deep", "unreadable", "refused_name"]

log = logging.getLogger("smoosh.daemon.watch.watcher")  # the watcher's lines, one logger

#: Longest path the kernel takes, in bytes, with its terminating NUL (PATH_MAX on Linux): a
#: directory whose path is longer cannot be watched, listed or opened by its name.
PATH_MAX_BYTES = 4096
#: Sentences remembered as said, at most (the oldest is forgotten first, and said again if met).
SAID_MAX = 4096

_said: collections.OrderedDict[str, None] = collections.OrderedDict()
_said_lock = threading.Lock()


def say_once(sentence: str, level: int = logging.WARNING) -> bool:
    """Log ``sentence`` at ``level`` unless this process said it already; True when it was logged.

    Parameters:
        sentence: what to say (built by :func:`too_deep`, :func:`unreadable` or :func:`refused_name`).
        level: the logging level.

    Returns:
        Whether it was logged now.
    """
    with _said_lock:
        if sentence in _said:
            return False
        _said[sentence] = None
        if len(_said) > SAID_MAX:
            _said.popitem(last=False)
    log.log(level, "%s", sentence)
    return True


def too_deep(parent: str) -> str:
    """The sentence for the directories below ``parent`` whose paths pass :data:`PATH_MAX_BYTES`.

    ``parent`` is the deepest directory of the chain that still has a path the kernel takes
    (the observer and the scan both name it, so the two say the same).
    """
    return (f"directories below {shown_path(parent)} lie deeper than the path limit ({PATH_MAX_BYTES} bytes): "
            "they are not watched or scanned, and no database in them is compacted; the rest of the tree is")


def unreadable(directory: str, error: OSError) -> str:
    """The sentence for a directory that cannot be watched or read (``error``: why, as the system said)."""
    why = error.strerror or str(error)
    return (f"cannot watch or read directory {shown_path(directory)} ({why}): its databases are not watched, nor "
            "scanned while it stays so; the rest of the tree is")


def refused_name(path: str, reason: str) -> str:
    """The sentence for a file whose name smoosh refuses (``reason``: :func:`smoosh.paths.name_refusal`'s)."""
    return f"not compacting {shown_path(path)}: {reason}"
