"""Where a config does something else than its author likely meant, or than CouchDB would do
with the same file: warnings, never errors (DESIGN §12, "CouchDB fidelity vs written order").

smoosh offers a key to its channels in the order written, and a list that is set replaces
the default; CouchDB sorts the channels by name and always adds its built-ins back
(``usort(BuiltIns ++ Configured)``). Both are kept on purpose, and this module says where
they matter:

- a channel that an earlier channel of its list **shadows**: the earlier one takes every key
  the later one would take, so the later one never gets work. Warned only when that is
  certain from the settings alone (see :func:`covers`);
- ``db_channels`` without a built-in that would have taken databases no listed channel
  takes: those databases are never compacted here, where CouchDB would compact them;
- ``[smoosh.ignore]`` entries that cannot name a database: a CouchDB database or shard name
  (``_users = true``), or a path outside every root.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Mapping, Sequence

from smoosh.config.defaults import DEFAULT_DB_CHANNELS, GLOBAL_SECTION
from smoosh.config.sections import ChannelConfig, SqliteConfig
from smoosh.config.values import parse_bool, resolve_glob, resolve_path, static_prefix
from smoosh.paths import CLEANUP_PREFIX, inside

__all__ = ["covers", "shadow_warnings", "dropped_builtin_warnings", "ignore_warnings"]

#: A CouchDB shard name, as CouchDB's ``[smoosh.ignore]`` holds them:
#: ``shards/00000000-1fffffff/dbname.1529510412``.
SHARD_NAME_RE = re.compile(r"shards/[0-9a-f]{8}-[0-9a-f]{8}/")


def covers(earlier: ChannelConfig, later: ChannelConfig) -> bool:
    """Whether ``earlier`` gives a priority above 0 to every key ``later`` does.

    Routing offers a key to a list's channels in order, and the first that prices it above 0
    takes it, whatever that channel's window, capacity, concurrency or suspension (they
    decide when it starts, not who takes it). So when this holds and ``earlier`` comes
    first, ``later`` never gets a key. True only when it is certain from the settings
    (``smoosh.priority.compute``'s rules): the same kind; the same method; ``earlier``'s
    ``match`` takes every key ``later``'s does; ``min_changes`` no higher; and, for ratio
    and slack, a priority range and a size range that contain ``later``'s, and an empty
    database (which gets ``min_priority`` itself) not refused by ``earlier`` alone. Cleanup
    channels take their priority from the compactor, so only ``match`` counts for them.

    Parameters:
        earlier: the channel tried first.
        later: a channel of the same list, tried after it.

    Returns:
        True when ``later`` can never be offered a key ``earlier`` refuses.
    """
    if earlier.kind != later.kind or not _match_covers(earlier.match, later.match):
        return False
    if earlier.kind == "cleanup":
        return True
    if earlier.priority != later.priority or earlier.min_changes > later.min_changes:
        return False
    if earlier.priority == "upgrade":
        return True  # 1 when the database needs an upgrade, whatever the thresholds say
    return (earlier.min_size_bytes <= later.min_size_bytes and earlier.max_size_bytes >= later.max_size_bytes
            and earlier.min_priority <= later.min_priority and earlier.max_priority >= later.max_priority
            # An empty database gets min_priority itself: 0 refuses it.
            and not (earlier.min_priority == 0 and later.min_priority > 0))


def _match_covers(earlier: tuple[str, ...], later: tuple[str, ...]) -> bool:
    """Whether every key ``later``'s patterns take, ``earlier``'s take too (certain cases only).

    No patterns take every key. A pattern covers another when they are equal, or when it is
    a fixed prefix followed by a single ``*`` (which crosses ``/``) that the other starts with.
    """
    if not earlier:
        return True
    if not later:
        return False

    def covered(pattern: str) -> bool:
        for mine in earlier:
            if mine == pattern:
                return True
            head = mine[:-1]
            if mine.endswith("*") and not glob.has_magic(head) and pattern.startswith(head):
                return True
        return False

    return all(covered(pattern) for pattern in later)


def _describe(ch: ChannelConfig) -> str:
    """A channel's acceptance rule in a few words, for a warning."""
    if ch.kind == "cleanup":
        parts = ["cleanup"]
    elif ch.priority == "upgrade":
        parts = ["upgrade"]
    else:
        unit = "" if ch.priority == "ratio" else " bytes"
        top = "" if ch.max_priority == float("inf") else f" and <= {_number(ch.max_priority)}{unit}"
        parts = [f"{ch.priority} > {_number(ch.min_priority)}{unit}{top}"]
        size_top = "" if ch.max_size_bytes == float("inf") else f" and <= {_number(ch.max_size_bytes)}"
        parts.append(f"file > {ch.min_size_bytes}{size_top} bytes")
    if ch.min_changes:
        parts.append(f"min_changes {ch.min_changes}")
    if ch.match:
        parts.append(f"match {','.join(ch.match)}")
    parts.append(f"window {ch.window}" if ch.window is not None and not ch.window.always_open else "no window")
    return ", ".join(parts)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def shadow_warnings(path: str, lists: Mapping[str, Sequence[str]], channels: Mapping[str, ChannelConfig]) -> list[str]:
    """One warning per channel that an earlier channel of its list shadows (see :func:`covers`).

    Parameters:
        path: the config file, as named in messages.
        lists: list key (``db_channels``, ...) -> its channel names, in the order written.
        channels: every channel's settings.

    Returns:
        ``PATH: [smoosh] db_channels: channel LATER never gets work: EARLIER, listed before it, ...``,
        saying what CouchDB's sorted order would do and the fix.
    """
    warnings = []
    for key, names in lists.items():
        for position, name in enumerate(names):
            later = channels[name]
            if later.kind == "view":
                continue  # they get no work anyway, and say so
            earlier = next((channels[e] for e in names[:position] if covers(channels[e], later)), None)
            if earlier is None:
                continue
            waits = ""
            if earlier.window is not None and not earlier.window.always_open and earlier.window != later.window:
                waits = f"; they wait for {earlier.name}'s window"
            couchdb = (f" (CouchDB, which tries channels in sorted name order, offers keys to {name} first)"
                       if name < earlier.name else "")
            warnings.append(
                f"{path}: [{GLOBAL_SECTION}] {key}: channel {name} never gets work: {earlier.name}, listed before it, "
                f"takes every key {name} would ({earlier.name}: {_describe(earlier)}; {name}: {_describe(later)})"
                f"{waits}: list {name} before {earlier.name}, or narrow {earlier.name}{couchdb}"
            )
    return warnings


def dropped_builtin_warnings(path: str, written: str | None, db_channels: Sequence[str],
                             channels: Mapping[str, ChannelConfig], builtins: Mapping[str, ChannelConfig],
                             sqlite: SqliteConfig) -> list[str]:
    """The warning for a ``db_channels`` that leaves out built-ins CouchDB would add back.

    A built-in is named only when it would take databases no listed channel takes: not when a
    listed channel covers it (:func:`covers`), and not ``upgrade_dbs`` while ``[smoosh.sqlite]``
    sets no upgrade target (the SQLite compactor then upgrades nothing).

    Parameters:
        path: the config file, as named in messages.
        written: ``db_channels`` as written, or None when the key is absent (the default list).
        db_channels: the list in force.
        channels: every listed channel's settings.
        builtins: each built-in db channel's settings as CouchDB would read them (its section, if any).
        sqlite: ``[smoosh.sqlite]``, for the upgrade targets.

    Returns:
        No warning, or one: ``PATH: [smoosh] db_channels = 'overnight_dbs' drops ratio_dbs, slack_dbs: ...``.
    """
    if written is None:
        return []
    dropped = []
    for name in DEFAULT_DB_CHANNELS:
        if name in db_channels:
            continue
        builtin = builtins[name]
        if builtin.priority == "upgrade" and sqlite.page_size is None and sqlite.auto_vacuum is None:
            continue
        if any(covers(channels[listed], builtin) for listed in db_channels):
            continue
        dropped.append(name)
    if not dropped:
        return []
    if db_channels:
        who = " and ".join(db_channels) if len(db_channels) <= 2 else ", ".join(db_channels)
        what = f"databases {who} refuse{'s' if len(db_channels) == 1 else ''} are never compacted"
    else:
        what = "no database is ever compacted"
    return [f"{path}: [{GLOBAL_SECTION}] db_channels = {written!r} drops {', '.join(dropped)}: {what} "
            "(CouchDB always adds the built-ins back; list them to keep them)"]


def ignore_warnings(path: str, values: Mapping[str, str], *, cwd: str, roots: Sequence[str]) -> list[str]:
    """Warnings for ``[smoosh.ignore]`` entries that cannot name a database file.

    smoosh ignores databases by path or glob pattern; CouchDB's ignore list holds database and
    shard names. A pasted ``_users = true`` would silently become ``<working directory>/_users``.
    An entry written as a bare name (no ``/``), one shaped as a CouchDB shard name, and a path
    outside every root (no key can lie there) are each warned about once. Entries set to false
    are not in force and are left alone; a value that is not a boolean is the section
    parser's error, not this.

    Parameters:
        path: the config file, as named in messages.
        values: the raw ``[smoosh.ignore]`` section.
        cwd: the directory relative entries resolve against.
        roots: the roots in force (empty: every key is refused anyway, nothing to say).

    Returns:
        One message per doubtful entry, in file order.
    """
    warnings = []
    section = f"{GLOBAL_SECTION}.ignore"
    for key, raw in values.items():
        try:
            if not parse_bool(raw.strip()):
                continue
        except ValueError:
            continue
        entry = key[len(CLEANUP_PREFIX):] if key.startswith(CLEANUP_PREFIX) else key
        magic = glob.has_magic(entry)
        resolved = resolve_glob(entry, cwd) if magic else resolve_path(entry, cwd)
        head = f"{path}: [{section}] {key}"
        if SHARD_NAME_RE.match(entry):
            warnings.append(f"{head}: a CouchDB shard name, not a path: smoosh ignores database files by path "
                            f"(or glob pattern), so this is {resolved} and matches nothing")
        elif "/" not in entry and not entry.startswith("~") and not magic:
            warnings.append(f"{head}: not a path (a CouchDB database name?): taken as {resolved}, relative to the "
                            f"working directory; write the database file's path, or ./{entry} if that is what it is")
        elif roots and not _may_match_under(resolved, magic, roots):
            warnings.append(f"{head}: matches no database: {resolved} is outside every root ({', '.join(roots)})")
    return warnings


def _may_match_under(resolved: str, magic: bool, roots: Sequence[str]) -> bool:
    """Whether an ignore entry can name a key inside one of ``roots``."""
    if not magic:
        return any(inside(resolved, root) for root in roots)
    prefix = static_prefix(resolved).rstrip(os.sep) or os.sep
    return any(inside(prefix, root) or inside(root, prefix) for root in roots)
