"""The per-section config dataclasses: ``[smoosh.<channel>]``, ``[smoosh.sqlite]``, and the
``[smoosh.ignore]`` list. :mod:`smoosh.config` assembles them into a ``Config``.
"""

from __future__ import annotations

import fnmatch
import glob
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from smoosh.paths import CLEANUP_PREFIX
from smoosh.config.defaults import GLOBAL_KEYS
from smoosh.config.keys import (
    BOOLEAN, DURATION, INTEGER, PATTERNS, SIZE, SIZE_OR_INFINITY, THRESHOLD, TIME_OF_DAY, TIME_ZONE, Key, choice,
    key_table,
)
from smoosh.units import format_size
from smoosh.sqlite_defaults import DEFAULT_BUSY_TIMEOUT_S, DEFAULT_INCREMENTAL_CHUNK_PAGES, DEFAULT_MAX_LOCK_HOLD_S
from smoosh.config.values import (
    SectionReader,
    parse_bool,
    parse_duration_at_least,
    parse_int,
    parse_list,
    parse_ratio,
    parse_threshold_size,
    resolve_glob,
    resolve_path,
    unknown_key_warning,
)

if TYPE_CHECKING:
    from channels.window import Window

__all__ = [
    "ChannelConfig",
    "SqliteConfig",
    "parse_ignore",
    "method_for",
    "suggested_method",
    "BUILTIN_METHODS",
    "CHANNEL_KEYS",
    "SQLITE_KEYS",
    "CHANNEL_KEY_DEFS",
    "SQLITE_KEY_DEFS",
    "CLEANUP_PREFIX",
]

#: The priority methods a channel can use (DESIGN 5.2).
METHODS = ("ratio", "slack", "upgrade")

#: A channel without a ``priority`` key that is not a built-in uses this (CouchDB's default).
DEFAULT_METHOD = "ratio"

#: CouchDB's built-in channels, whose name fixes their method (CouchDB ignores their ``priority``
#: key; smoosh lets the key win, with a warning). Every other channel's method is its
#: ``priority`` key, else :data:`DEFAULT_METHOD`: a name's prefix means nothing (``slack_overnight``
#: is a ratio channel unless it says ``priority = slack``), as in CouchDB.
BUILTIN_METHODS: dict[str, str] = {
    "upgrade_dbs": "upgrade", "ratio_dbs": "ratio", "slack_dbs": "slack",
    "upgrade_views": "upgrade", "ratio_views": "ratio", "slack_views": "slack",
}

#: Per method, the value a priority must exceed (ratio/upgrade: file/active; slack: bytes).
DEFAULT_MIN_PRIORITY: dict[str, float] = {"ratio": 2.0, "slack": 536870912, "upgrade": 2.0}

#: Priorities above this are not eligible; infinity = no ceiling (CouchDB's default).
DEFAULT_MAX_PRIORITY = math.inf

#: Files of this size or smaller are not worth compacting, in bytes (1 MiB).
DEFAULT_MIN_SIZE_BYTES = 1048576

#: Files larger than this are left alone, in bytes; infinity = no limit.
DEFAULT_MAX_SIZE_BYTES: int | float = math.inf

#: Changes since the last compaction a database needs before it is eligible; 0 = any.
DEFAULT_MIN_CHANGES = 0

#: Waiting keys a channel holds; past it the lowest priority is evicted.
DEFAULT_CAPACITY = 9999

#: Compactions a channel runs at once; 0 = queue but never start.
DEFAULT_CONCURRENCY = 1

#: The window's opening time when only ``to`` is set (CouchDB's default).
DEFAULT_FROM = "00:00"

#: The window's closing time when only ``from`` is set (CouchDB's default).
DEFAULT_TO = "24:00"

#: Leaving the window pauses (incremental) or interrupts (VACUUM) running work when true.
DEFAULT_STRICT_WINDOW = False

#: Run ``PRAGMA optimize`` (the query planner's statistics) after each successful compaction.
DEFAULT_ANALYZE = False

#: SQLite ``auto_vacuum`` modes by name, with their numeric aliases.
AUTO_VACUUM_MODES: dict[str, str] = {
    "none": "none", "full": "full", "incremental": "incremental",
    "0": "none", "1": "full", "2": "incremental",
}


#: What a channel does while its databases' file system is under disk pressure: keep to its
#: window, or run outside it (``ignore_window``).
UNDER_PRESSURE = ("respect_window", "ignore_window")
DEFAULT_UNDER_PRESSURE = "respect_window"

#: Every ``[smoosh.<channel>]`` key, declared once (:mod:`smoosh.config.keys`; docs/reference/config.md
#: is generated from this table). Every key is optional.
CHANNEL_KEY_DEFS: tuple[Key, ...] = (
    Key("priority", "priority", choice(METHODS),
        "How the channel scores a database: `ratio` is file size over live data, `slack` the bytes a "
        "compaction would give back, `upgrade` 1 when the file's `page_size` or `auto_vacuum` differs "
        "from `[smoosh.sqlite]`'s targets (0 otherwise). Without the key the built-in channels use the "
        "method they are named for, and every other channel `ratio`, as in CouchDB: another channel's "
        "name means nothing (`config check` warns where it seems to).",
        default_text="the built-in's own, else ratio"),
    Key("min_priority", "min_priority", THRESHOLD,
        "A database's priority must be above this for the channel to take it (a unit on a ratio is "
        "an error). An upgrade channel's priority is always 1, whatever this and the size limits say.",
        default_text=f"{DEFAULT_MIN_PRIORITY['ratio']} (ratio), "
                     f"{format_size(DEFAULT_MIN_PRIORITY['slack'])} (slack)"),
    Key("max_priority", "max_priority", THRESHOLD,
        "Priorities above this are not eligible; `infinity` is no ceiling.",
        DEFAULT_MAX_PRIORITY),
    Key("min_size", "min_size_bytes", SIZE,
        "Files of this size or smaller are skipped.",
        DEFAULT_MIN_SIZE_BYTES),
    Key("max_size", "max_size_bytes", SIZE_OR_INFINITY,
        "Files larger than this are skipped; `infinity` is no limit.",
        DEFAULT_MAX_SIZE_BYTES),
    Key("min_changes", "min_changes", INTEGER,
        "Write transactions since smoosh last compacted the database that it needs first, counted by "
        "SQLite's file change counter; 0: any. No effect while the count is unknown: for a database "
        "this daemon has not compacted since it started, a WAL database (SQLite keeps no counter in "
        "WAL mode), and one compacted by a separate `smoosh worker`.",
        DEFAULT_MIN_CHANGES),
    Key("capacity", "capacity", INTEGER,
        "Waiting keys the channel holds; past it the lowest priority is evicted.",
        DEFAULT_CAPACITY),
    Key("concurrency", "concurrency", INTEGER,
        "Compactions the channel runs at once; 0 queues but never starts (under disk pressure a "
        "channel may run more: see `disk_pressure`).",
        DEFAULT_CONCURRENCY),
    Key("from", "window", TIME_OF_DAY,
        "Opening of the channel's daily window (with `to`). A window may wrap midnight; `from` equal "
        "to `to` is always open. It is read on the wall clock every minute, before every start, and "
        "within a second of a step of the clock.",
        default_text=f"unset (always open; {DEFAULT_FROM} when only `to` is set)"),
    Key("to", "window", TIME_OF_DAY,
        "Closing of the channel's daily window (with `from`); may be `24:00`.",
        default_text=f"unset (always open; {DEFAULT_TO} when only `from` is set)"),
    Key("timezone", "timezone", TIME_ZONE,
        "The IANA time zone of `from` and `to`, e.g. `Europe/Berlin`.",
        default_text="UTC"),
    Key("strict_window", "strict_window", BOOLEAN,
        "Leaving the window pauses incremental work between chunks and interrupts a running VACUUM "
        "(its key goes back to the queue, not counted as a failure).",
        DEFAULT_STRICT_WINDOW),
    Key("match", "match", PATTERNS,
        "Comma-separated glob patterns: the channel considers only the keys that match one "
        "(`*` also crosses `/`). Gives part of the fleet its own rules.",
        default_text="every key of the channel's kind"),
    Key("under_pressure", "under_pressure", choice(UNDER_PRESSURE),
        "`ignore_window`: while a file system under the roots is past `disk_pressure`, the channel "
        "runs outside its window.",
        DEFAULT_UNDER_PRESSURE),
)

#: ini key -> dataclass field, for the per-channel section (also checked against the docs).
CHANNEL_KEYS: dict[str, str] = key_table(CHANNEL_KEY_DEFS)

#: Every ``[smoosh.sqlite]`` key, declared once (:mod:`smoosh.config.keys`).
SQLITE_KEY_DEFS: tuple[Key, ...] = (
    Key("page_size", "page_size", INTEGER,
        "Upgrade target: a power of two from 512 to 65536. A database with another page size is "
        "queued to the upgrade channels. Unset: leave each database's as it is."),
    Key("auto_vacuum", "auto_vacuum", choice(("none", "full", "incremental")),
        "Upgrade target (also `0`, `1`, `2`). A database in another mode is queued to the upgrade "
        "channels; `incremental` lets smoosh compact it in short chunks beside its application. "
        "Unset: leave each database's as it is."),
    Key("incremental_chunk_pages", "incremental_chunk_pages", INTEGER,
        "Pages an incremental compaction frees per chunk, at most; between chunks it holds no lock.",
        DEFAULT_INCREMENTAL_CHUNK_PAGES),
    Key("busy_timeout", "busy_timeout_s", DURATION,
        "How long a compaction waits for a database's lock, or for a moment when no application "
        "transaction is open on it (what it waits for before taking a lock), before it reports the "
        "database busy (retried later, not a failure).",
        DEFAULT_BUSY_TIMEOUT_S),
    Key("analyze", "analyze", BOOLEAN,
        "After each successful compaction, refresh the query planner's statistics with "
        "`PRAGMA optimize`. If the application holds the write lock then, one INFO line says so and "
        "the compaction still counts as `ok`.",
        DEFAULT_ANALYZE),
    Key("max_lock_hold", "max_lock_hold_s", DURATION,
        "The longest a full VACUUM may hold the lock of a database another process has open (WAL "
        "mode: its `-shm` locks say so; rollback mode: the processes' open files, or when that cannot "
        "be told); 0: no limit. A VACUUM that could no longer end within it is rolled back "
        "and the database reported busy, before the application's writers reach their own busy "
        "timeout: keep it below theirs.",
        DEFAULT_MAX_LOCK_HOLD_S),
)

#: ini key -> dataclass field, for ``[smoosh.sqlite]``.
SQLITE_KEYS: dict[str, str] = key_table(SQLITE_KEY_DEFS)


def method_for(name: str, priority_key: str | None) -> str:
    """The channel's method: its ``priority`` key, else a built-in's own, else ratio (CouchDB's rule).

    Parameters
    ----------
    name:
        The channel name.
    priority_key:
        The ``priority`` value as written (None if absent); must be a known method.

    Returns
    -------
    "ratio", "slack" or "upgrade".

    Raises
    ------
    ValueError
        ``priority_key`` names no method.
    """
    if priority_key is not None:
        method = priority_key.strip().lower()
        if method not in METHODS:
            raise ValueError("must be ratio, slack or upgrade")
        return method
    return BUILTIN_METHODS.get(name, DEFAULT_METHOD)


def suggested_method(name: str) -> str | None:
    """The method a channel's name suggests (a word of it: ``slack_overnight``, ``big-upgrade``), or None."""
    words = set(re.split(r"[_-]", name.lower()))
    suggested = [method for method in METHODS if method in words]
    return suggested[0] if len(suggested) == 1 else None


def _parse_timezone(text: str) -> str:
    try:
        ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError("unknown time zone (use an IANA name such as Europe/Berlin)") from None
    return text


@dataclass(frozen=True)
class ChannelConfig:
    """One channel's settings, from ``[smoosh.<name>]`` (every key optional).

    Sizes are bytes; ``min_priority``/``max_priority`` are ratios, or bytes for a slack
    channel; ``math.inf`` where CouchDB accepts ``infinity``. ``match`` holds absolute glob
    patterns; a channel without any considers every key of its kind.
    """

    name: str
    kind: str = "db"
    priority: str = DEFAULT_METHOD
    min_priority: float = DEFAULT_MIN_PRIORITY[DEFAULT_METHOD]
    max_priority: float = DEFAULT_MAX_PRIORITY
    min_size_bytes: int = DEFAULT_MIN_SIZE_BYTES
    max_size_bytes: int | float = DEFAULT_MAX_SIZE_BYTES
    min_changes: int = DEFAULT_MIN_CHANGES
    capacity: int = DEFAULT_CAPACITY
    concurrency: int = DEFAULT_CONCURRENCY
    window: Window | None = None
    strict_window: bool = DEFAULT_STRICT_WINDOW
    timezone: str | None = None
    match: tuple[str, ...] = ()
    #: Under disk pressure: ``respect_window`` (the default) or ``ignore_window`` (run outside it).
    under_pressure: str = DEFAULT_UNDER_PRESSURE

    def matches(self, key: str) -> bool:
        """Whether this channel considers ``key`` (a cleanup key by its database path).

        Parameters
        ----------
        key:
            A canonical key: an absolute path or ``cleanup:<path>``.

        Returns
        -------
        True without ``match`` patterns, else whether one matches (``fnmatch``, case
        sensitive; ``*`` also crosses ``/``).
        """
        if not self.match:
            return True
        path = key[len(CLEANUP_PREFIX):] if key.startswith(CLEANUP_PREFIX) else key
        return any(fnmatch.fnmatchcase(path, pattern) for pattern in self.match)

    @classmethod
    def from_section(
        cls,
        name: str,
        kind: str,
        values: Mapping[str, str],
        *,
        path: str,
        cwd: str,
        warnings: list[str],
    ) -> ChannelConfig:
        """Build a channel's settings from its section (defaults when ``values`` is empty).

        Parameters
        ----------
        name:
            The channel name (already validated).
        kind:
            "db", "view" or "cleanup": the list the channel is in.
        values:
            The raw ``[smoosh.<name>]`` keys.
        path:
            The config file, for messages.
        cwd:
            The directory ``match`` patterns are made absolute against.
        warnings:
            Unknown keys and other doubtful settings are appended here, by name.

        Returns
        -------
        The channel's settings.

        Raises
        ------
        ConfigError
            A bad value; the message names path, section, key and value.
        """
        section = f"smoosh.{name}"
        r = SectionReader(path, section, values)
        method = r.get("priority", lambda text: method_for(name, text), method_for(name, None))
        written = r.raw("priority")
        builtin = BUILTIN_METHODS.get(name)
        if written is not None and builtin is not None and method != builtin:
            # CouchDB ignores a built-in's priority key; smoosh lets the key win (DESIGN 5.2). Say so,
            # because a pasted config would now behave differently.
            warnings.append(
                f"{path}: [{section}] priority = {written!r}: overrides the built-in {name}'s method "
                f"(CouchDB would use {builtin})"
            )
        suggested = suggested_method(name)
        defaulted = written is None and builtin is None
        if defaulted and suggested not in (None, method):
            warnings.append(
                f"{path}: [{section}]: no priority key, so the method is {method}, as in CouchDB (only the "
                f"built-in channels take theirs from their name), though the name says {suggested}: "
                f"write priority = {suggested} if that is what it is for"
            )
        if method == "slack":
            min_parse, max_parse = parse_threshold_size(allow_infinity=False), parse_threshold_size(allow_infinity=True)
        else:
            min_parse, max_parse = parse_ratio(allow_infinity=False), parse_ratio(allow_infinity=True)
            if defaulted:
                # A size here was likely written for a slack channel the name suggests: say why it is a ratio.
                hint = (f"the method is {method} (no priority key; only the built-in channels take theirs from "
                        "their name): for a threshold in bytes write priority = slack")
                min_parse, max_parse = _hinted(min_parse, hint), _hinted(max_parse, hint)
        min_priority = r.get("min_priority", min_parse, DEFAULT_MIN_PRIORITY[method])
        max_priority = r.get("max_priority", max_parse, DEFAULT_MAX_PRIORITY)
        if method != "upgrade" and max_priority <= min_priority:
            raise r.error("max_priority", r.raw("max_priority") or "", f"must be greater than min_priority ({_number(min_priority)})")
        min_size = r.get("min_size", parse_threshold_size(allow_infinity=False), DEFAULT_MIN_SIZE_BYTES)
        max_size = r.get("max_size", parse_threshold_size(allow_infinity=True), DEFAULT_MAX_SIZE_BYTES)
        if max_size <= min_size:
            raise r.error("max_size", r.raw("max_size") or "", f"must be greater than min_size ({min_size})")
        timezone = r.get("timezone", _parse_timezone, None)
        window = _window(r, timezone)
        config = cls(
            name=name,
            kind=kind,
            priority=method,
            min_priority=min_priority,
            max_priority=max_priority,
            min_size_bytes=int(min_size),
            max_size_bytes=max_size,
            min_changes=r.get("min_changes", parse_int(0), DEFAULT_MIN_CHANGES),
            capacity=r.get("capacity", parse_int(1), DEFAULT_CAPACITY),
            concurrency=r.get("concurrency", parse_int(0), DEFAULT_CONCURRENCY),
            window=window,
            strict_window=r.get("strict_window", parse_bool, DEFAULT_STRICT_WINDOW),
            timezone=timezone,
            match=r.get("match", lambda text: tuple(resolve_glob(p, cwd) for p in parse_list(text)), ()),
            under_pressure=r.get("under_pressure", _parse_under_pressure, DEFAULT_UNDER_PRESSURE),
        )
        for key in r.unknown_keys():
            warnings.append(unknown_key_warning(path, section, key, CHANNEL_KEYS,
                                                {"[smoosh]": GLOBAL_KEYS, "[smoosh.sqlite]": SQLITE_KEYS}))
        return config


def _parse_under_pressure(text: str) -> str:
    value = text.strip().lower()
    if value not in UNDER_PRESSURE:
        raise ValueError(f"must be one of {', '.join(UNDER_PRESSURE)}")
    return value


def _hinted(parse: Callable[[str], float], hint: str) -> Callable[[str], float]:
    """``parse`` whose complaint about a unit also says why the threshold is a ratio."""

    def parse_with_hint(text: str) -> float:
        try:
            return parse(text)
        except ValueError as exc:
            if "takes no unit" not in str(exc):
                raise
            raise ValueError(f"{exc}; {hint}") from None

    return parse_with_hint


def _number(value: float) -> str:
    """A threshold as an operator would write it: 536870912, not 5.36871e+08."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _window(r: SectionReader, timezone: str | None) -> Window | None:
    """``from``/``to`` as a Window; None when neither is set (always open)."""
    start, end = r.raw("from"), r.raw("to")
    if start is None and end is None:
        return None
    from channels.window import Window  # imported here: config loads without channels too

    start_text, end_text = start or DEFAULT_FROM, end or DEFAULT_TO
    try:
        return Window.parse(start_text, end_text, timezone)
    except ValueError as exc:
        # Name the key the operator wrote; when both are set and the message cannot tell
        # which one is wrong, re-parse each alone.
        key, value = ("from", start_text) if start is not None else ("to", end_text)
        if start is not None and end is not None:
            try:
                Window.parse(start_text, DEFAULT_TO, timezone)
            except ValueError:
                pass
            else:
                key, value = "to", end_text
        raise r.error(key, value, str(exc)) from None


@dataclass(frozen=True)
class SqliteConfig:
    """``[smoosh.sqlite]``: how the SQLite compactor treats databases.

    ``page_size``/``auto_vacuum`` are upgrade targets (None: leave the database as it is);
    ``analyze`` runs ``PRAGMA optimize`` after each successful compaction.
    """

    page_size: int | None = None
    auto_vacuum: str | None = None
    incremental_chunk_pages: int = DEFAULT_INCREMENTAL_CHUNK_PAGES
    busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S
    analyze: bool = DEFAULT_ANALYZE
    max_lock_hold_s: float = DEFAULT_MAX_LOCK_HOLD_S

    @classmethod
    def from_section(cls, values: Mapping[str, str], *, path: str, warnings: list[str]) -> SqliteConfig:
        """Build from the raw ``[smoosh.sqlite]`` keys (defaults when empty).

        Parameters
        ----------
        values:
            The raw keys.
        path:
            The config file, for messages.
        warnings:
            Unknown keys are appended here, by name.

        Returns
        -------
        The settings.

        Raises
        ------
        ConfigError
            A bad value; the message names path, section, key and value.
        """
        r = SectionReader(path, "smoosh.sqlite", values)
        config = cls(
            page_size=r.get("page_size", _parse_page_size, None),
            auto_vacuum=r.get("auto_vacuum", _parse_auto_vacuum, None),
            incremental_chunk_pages=r.get("incremental_chunk_pages", parse_int(1), DEFAULT_INCREMENTAL_CHUNK_PAGES),
            busy_timeout_s=r.get("busy_timeout", parse_duration_at_least(1.0, 0.0), DEFAULT_BUSY_TIMEOUT_S),
            analyze=r.get("analyze", parse_bool, DEFAULT_ANALYZE),
            max_lock_hold_s=r.get("max_lock_hold", parse_duration_at_least(1.0, 0.0), DEFAULT_MAX_LOCK_HOLD_S),
        )
        for key in r.unknown_keys():
            warnings.append(unknown_key_warning(path, "smoosh.sqlite", key, SQLITE_KEYS,
                                                {"[smoosh]": GLOBAL_KEYS, "a channel's section": CHANNEL_KEYS}))
        return config


def _parse_page_size(text: str) -> int:
    problem = "must be a power of two from 512 to 65536"
    try:
        value = parse_int(512, 65536)(text)
    except ValueError:
        raise ValueError(problem) from None
    if value & (value - 1):
        raise ValueError(problem)
    return value


def _parse_auto_vacuum(text: str) -> str:
    mode = AUTO_VACUUM_MODES.get(text.lower())
    if mode is None:
        raise ValueError("must be none, full or incremental (or 0, 1, 2)")
    return mode


def parse_ignore(values: Mapping[str, str], *, path: str, cwd: str) -> tuple[str, ...]:
    """``[smoosh.ignore]``: the entries whose value is true, canonicalised.

    CouchDB writes ``name = true``; ``false`` keeps an entry listed but not ignored. Exact
    paths are realpath'd (keys are realpaths); glob patterns keep their pattern part.

    Parameters
    ----------
    values:
        The raw section.
    path:
        The config file, for messages.
    cwd:
        The directory relative entries resolve against.

    Returns
    -------
    Absolute paths and patterns, in file order, without duplicates.

    Raises
    ------
    ConfigError
        A value that is not a boolean.
    """
    r = SectionReader(path, "smoosh.ignore", values)
    entries: list[str] = []
    for key, raw in values.items():
        try:
            # An empty value is an error, not a default: CouchDB ignores only "true".
            if not parse_bool(raw.strip()):
                continue
        except ValueError as exc:
            raise r.error(key, raw.strip(), str(exc)) from None
        entry = key[len(CLEANUP_PREFIX):] if key.startswith(CLEANUP_PREFIX) else key
        entry = resolve_glob(entry, cwd) if glob.has_magic(entry) else resolve_path(entry, cwd)
        if entry not in entries:
            entries.append(entry)
    return tuple(entries)

