"""The file's layout: which channels it defines, and what in it smoosh leaves unused.

The three ``[smoosh]`` channel lists name the channels and give each its kind (a name in
two lists is an error). Everything the layout leaves unused is a warning, never an error,
since a pasted CouchDB config has some: an unknown ``[smoosh]`` key, a section no channel
list names, view channels that no compactor gives work. :mod:`smoosh.config` calls these
while it assembles a ``Config``.
"""

from __future__ import annotations

from collections.abc import Mapping

from smoosh.config.defaults import CHANNEL_NAME_RE, COUCHDB_ONLY_KEYS, GLOBAL_KEYS, GLOBAL_SECTION, RESERVED_SECTIONS
from smoosh.config.sections import CHANNEL_KEYS, SQLITE_KEYS
from smoosh.config.values import SectionReader, parse_names, unknown_key_warning

__all__ = ["channel_list", "channel_kinds", "global_warnings"]


def channel_list(r: SectionReader, key: str, default: tuple[str, ...]) -> tuple[str, ...]:
    """One channel list of ``[smoosh]`` (``db_channels``, ``view_channels`` or ``cleanup_channels``).

    Parameters:
        r: the reader of ``[smoosh]``; ``key`` is marked used.
        key: the list's key.
        default: the list when the key is absent.

    Returns:
        The channel names, in list order; empty for a key that is present but empty.

    Raises:
        ConfigError: a malformed name, or one that is a reserved section name.
    """
    # Present but empty means "no channels of this kind", so raw() (empty = absent) is not used.
    r.used.add(key)
    if key not in r.values:
        return default
    value = r.values[key].strip()
    try:
        names = parse_names(value, CHANNEL_NAME_RE, "channel")
    except ValueError as exc:
        raise r.error(key, value, str(exc)) from None
    for name in names:
        if name in RESERVED_SECTIONS:
            raise r.error(key, value, f"channel {name!r} is a reserved section name")
    return names


def channel_kinds(r: SectionReader, lists: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """Every channel of the three lists mapped to its kind (``db``, ``view`` or ``cleanup``).

    Parameters:
        r: the reader of ``[smoosh]`` (for the error message).
        lists: list key -> its channel names, as :func:`channel_list` read them.

    Returns:
        Channel name -> kind, in list order.

    Raises:
        ConfigError: a channel named in two lists.
    """
    kinds: dict[str, str] = {}
    owner: dict[str, str] = {}
    for key, names in lists.items():
        kind = key.split("_")[0]
        for name in names:
            if name in kinds:
                raise r.error(key, r.values.get(key, ",".join(names)).strip(),
                              f"channel {name!r} is also in {owner[name]}")
            kinds[name], owner[name] = kind, key
    return kinds


def global_warnings(r: SectionReader, sections: Mapping[str, Mapping[str, str]], kinds: Mapping[str, str]) -> list[str]:
    """The warnings about the file as a whole, once ``[smoosh]`` has been read.

    Parameters:
        r: the reader of ``[smoosh]``, after every key it knows was read (the rest are unknown).
        sections: every section of the file.
        kinds: channel name -> kind, from :func:`channel_kinds`.

    Returns:
        One message per view channel list, unknown ``[smoosh]`` key and unused section.
    """
    warnings = []
    views = [name for name, kind in kinds.items() if kind == "view"]
    if views:
        # Index keys come only from a compactor with indexes; the built-in SQLite compactor
        # has none and the router routes no index key, so these channels can never get work
        # (a pasted CouchDB config names three of them).
        warnings.append(f"{r.path}: [{GLOBAL_SECTION}] view_channels = {r.values['view_channels'].strip()!r}: "
                        f"no compactor has indexes, so channel(s) {', '.join(views)} never get work")
    for key in r.unknown_keys():
        if key in COUCHDB_ONLY_KEYS:
            raw = r.values[key].strip()
            if key == "cleanup_index_files" and raw.lower() in ("false", "0", "no", "off"):
                warnings.append(f"{r.path}: [{GLOBAL_SECTION}] {key} = {raw!r}: not used by smoosh; "
                                "to disable index cleanup set cleanup_channels to nothing")
            continue
        warnings.append(unknown_key_warning(r.path, GLOBAL_SECTION, key, GLOBAL_KEYS,
                                            {"a channel's section": CHANNEL_KEYS, "[smoosh.sqlite]": SQLITE_KEYS}))
    for section in sections:
        if section == GLOBAL_SECTION:
            continue
        prefix, dot, name = section.partition(".")
        if prefix != GLOBAL_SECTION or not dot:
            warnings.append(f"{r.path}: [{section}]: not a smoosh section, ignored")
        elif name not in RESERVED_SECTIONS and name not in kinds:
            warnings.append(f"{r.path}: [{section}]: no channel list names {name!r}, section ignored")
    return warnings
