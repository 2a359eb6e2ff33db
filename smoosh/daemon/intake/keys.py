"""What makes a key a key: its canonical form, and the checks every way in applies.

Every key that reaches a channel came through :func:`canonical_key` (its identity: the
realpath of an absolute path, ``cleanup:`` kept as a prefix) and :func:`check_key` (a compactor
claims it, it lies inside the roots, it is not smoosh's own file, SQLite and smoosh can carry its
name): from HTTP, the CLI, the watcher, a checkpoint and the job store alike.
"""

from __future__ import annotations

from typing import Any, Sequence

from smoosh.daemon.intake.router import Router, db_path
from smoosh.errors import InvalidKey
from smoosh.paths import (
    CLEANUP_PREFIX, MAX_COMPONENTS, TEMPORARY_SUFFIXES, canonical_path, inside_any, name_refusal, temporary_name,
)

__all__ = ["MAX_KEY_BYTES", "canonical_key", "check_key"]

#: Longest key accepted, in bytes of UTF-8 (PATH_MAX on Linux).
MAX_KEY_BYTES = 4096


def canonical_key(key: object) -> str:
    """The key's identity: the realpath of an absolute path (``cleanup:`` kept as a prefix).

    Raises:
        InvalidKey: not a string, empty, too long (bytes or path components), a NUL byte, or
            not an absolute path.
    """
    if not isinstance(key, str):
        raise InvalidKey(repr(key), "a key must be a string")
    if not key:
        raise InvalidKey(key, "empty key")
    if "\x00" in key:
        raise InvalidKey(key, "contains a NUL byte")
    try:
        size_bytes = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidKey(key, "not valid UTF-8") from None
    if size_bytes > MAX_KEY_BYTES:
        raise InvalidKey(key[:80] + "...", f"longer than {MAX_KEY_BYTES} bytes")
    prefix, path = (CLEANUP_PREFIX, key[len(CLEANUP_PREFIX):]) if key.startswith(CLEANUP_PREFIX) else ("", key)
    if not path.startswith("/"):  # os.path.isabs on POSIX, without its call
        raise InvalidKey(key, "not an absolute path")
    if path.count("/") > MAX_COMPONENTS:
        # Bounds what one key costs to resolve (a request carries up to 10,000 of them).
        raise InvalidKey(key[:80] + "...", f"more than {MAX_COMPONENTS} path components")
    return prefix + canonical_path(path)

def check_key(key: str, router: Router, roots: Sequence[str], own_paths: Sequence[str]) -> Any:
    """Check a canonical key: claimed by a compactor, inside ``roots``, not smoosh's own file, not a temporary name,
    a name SQLite and smoosh can carry (:func:`smoosh.paths.name_refusal`: UTF-8, room for ``-journal``).

    Returns:
        The compactor that claims it (the caller's next question is for it).

    Raises:
        InvalidKey: naming the key and the reason.
    """
    compactor = router.compactor_for(key)
    if compactor is None:
        raise InvalidKey(key, "no compactor claims it")
    path = db_path(key)
    if not roots:
        raise InvalidKey(key, "no roots configured: set [smoosh] roots or watch")
    if not inside_any(path, roots):
        raise InvalidKey(key, f"outside roots ({', '.join(roots)})")
    if inside_any(path, own_paths):
        raise InvalidKey(key, "smoosh's own file")
    if temporary_name(path):
        raise InvalidKey(key, f"a temporary name ({', '.join('*' + s for s in TEMPORARY_SUFFIXES)}): it is compacted "
                              "under its final name, once renamed into place")
    odd = name_refusal(path)
    if odd is not None:
        raise InvalidKey(key, odd)
    return compactor
