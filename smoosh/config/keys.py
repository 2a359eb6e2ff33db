"""What each key of the config file is, said once: the declaration behind the configuration reference.

Every ini key is declared by one :class:`Key`, in the table of its section, beside the
defaults it names: ``GLOBAL_KEY_DEFS`` (``[smoosh]``, in :mod:`smoosh.config.defaults`),
``CHANNEL_KEY_DEFS`` and ``SQLITE_KEY_DEFS`` (``[smoosh.<channel>]`` and ``[smoosh.sqlite]``,
in :mod:`smoosh.config.sections`). A declaration gives the key's dataclass field, the
:class:`Form` its value is written in (its type, the unit of a bare number, how a value
reads), its default (the ``DEFAULT_*`` constant the parser uses, or a sentence when the
default is not a constant) and a doc string for the people who set it.

The key tables the parser and the warnings use (``GLOBAL_KEYS``, ``CHANNEL_KEYS``,
``SQLITE_KEYS``: ini key -> field) are built from these declarations, and the configuration
reference of the docs (``docs/reference/config.md``) is generated from them. Whether a key
applies live or needs a restart is not declared here: ``RESTART_KEYS`` says it, as the
daemon's reload reads it. The docs build fails when the parser reads a key that has no
declaration, or one whose doc string is empty.

To add a key: one ``Key(...)`` line in its section's table (with the doc string), its
dataclass field, and its parse in the section's ``from_section``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from smoosh.units import INFINITY, format_duration, format_size

__all__ = [
    "Key", "Form", "key_table",
    "DURATION", "DURATION_MINUTES", "SIZE", "SIZE_OR_INFINITY", "RATE", "INTEGER", "BOOLEAN", "TEXT", "SECRET",
    "NAME", "NAMES", "PATH", "PATHS", "GLOBS", "PATTERNS", "STORE_URL", "ADDRESS", "PERCENT_OR_SIZE", "PERCENT_OR_OFF",
    "TIME_OF_DAY", "TIME_ZONE", "THRESHOLD", "choice", "keys_the_parser_reads",
]


def _listed(value: Any) -> str:
    return ", ".join(value)


def _number(value: Any) -> str:
    if value == math.inf:
        return INFINITY
    if isinstance(value, float):
        return f"{value:.1f}" if value.is_integer() else f"{value:g}"
    return str(value)


def _size(value: Any) -> str:
    return INFINITY if value is None else format_size(value)


def _boolean(value: Any) -> str:
    return "true" if value else "false"


def _percent(value: Any) -> str:
    return "off" if value is None else f"{value * 100:g}%"


@dataclass(frozen=True)
class Form:
    """How a key's value is written.

    Attributes:
        type: what the value is, as the reference names it (``duration``, ``size``, ...).
        unit: the unit of a bare number (``seconds``, ``bytes``), or "" where there is none.
        show: how a value of the parsed form reads in the file (a default, in the reference).
    """

    type: str
    unit: str = ""
    show: Callable[[Any], str] = str


#: A duration: ``500ms``, ``90s``, ``5m``, ``2h``, ``1d``; a bare number is seconds.
DURATION = Form("duration", "seconds", format_duration)
#: A duration whose bare number is minutes (CouchDB's unit for ``staleness``).
DURATION_MINUTES = Form("duration", "minutes", format_duration)
#: A size: ``512MiB``, ``1GB``; a bare number is bytes.
SIZE = Form("size", "bytes", format_size)
#: A size, or ``infinity`` for no limit.
SIZE_OR_INFINITY = Form("size or infinity", "bytes", format_size)
#: Bytes per second (``20MiB``, ``50MB/s``), or ``infinity`` for unlimited (None).
RATE = Form("size per second, or infinity", "bytes per second", _size)
#: A whole number.
INTEGER = Form("integer", "", _number)
#: ``true``/``false`` (also ``yes``/``no``, ``on``/``off``, ``1``/``0``).
BOOLEAN = Form("boolean", "", _boolean)
#: Free text.
TEXT = Form("text")
#: A secret: never shown.
SECRET = Form("text (a secret)")
#: A name without spaces.
NAME = Form("name")
#: Comma-separated channel names, tried in the order written.
NAMES = Form("comma-separated channel names", "", _listed)
#: A path; relative paths resolve against the working directory.
PATH = Form("path")
#: Comma-separated directories.
PATHS = Form("comma-separated directories", "", _listed)
#: Comma-separated directories and glob patterns.
GLOBS = Form("comma-separated directories and glob patterns", "", _listed)
#: Comma-separated glob patterns.
PATTERNS = Form("comma-separated glob patterns", "", _listed)
#: A job store URL.
STORE_URL = Form("store URL (memory:, sqlite:PATH, fdb:, fdb:CLUSTER_FILE)")
#: ``HOST:PORT`` (``[::1]:5986`` for IPv6).
ADDRESS = Form("HOST:PORT")
#: A size, or a percentage of the file system.
PERCENT_OR_SIZE = Form("size, or percentage of the file system", "bytes",
                       lambda value: _percent(value.fraction) if value.fraction else format_size(value.bytes))
#: A percentage, or ``off``.
PERCENT_OR_OFF = Form("percentage, or off", "", _percent)
#: A time of day, ``H:MM`` or ``HH:MM`` (``24:00`` allowed as an end).
TIME_OF_DAY = Form("time of day (H:MM)")
#: An IANA time zone name.
TIME_ZONE = Form("IANA time zone name")
#: A priority threshold: a ratio (no unit) for ratio and upgrade channels, a size for slack channels.
THRESHOLD = Form("ratio (no unit), or size for a slack channel", "", _number)


def choice(values: Iterable[str]) -> Form:
    """The form of a key that takes one of ``values``.

    Parameters:
        values: the accepted spellings, in the order the reference lists them.

    Returns:
        A form whose type names each value.
    """
    return Form("one of " + ", ".join(values))


#: A default the parser does not set from a constant: the reference shows the key's ``default_text``.
NO_CONSTANT = object()


@dataclass(frozen=True)
class Key:
    """One key of the config file, as the configuration reference shows it.

    Attributes:
        name: the key as written in the file.
        field: the dataclass field the parser sets from it.
        form: how its value is written.
        doc: what it does, for the person who sets it (Markdown, one paragraph or a few);
            no measured figure (figures belong to the benchmark results).
        default: the default as the parser holds it (the ``DEFAULT_*`` constant it passes);
            None reads as "unset", an empty list as "empty".
        default_text: how the default reads when the constant alone would not say it
            (``the host name``, ``2.0 (ratio), 512MiB (slack)``); wins over ``default``.
    """

    name: str
    field: str
    form: Form
    doc: str
    default: Any = None
    default_text: str = ""

    def default_shown(self) -> str:
        """The default as the reference writes it."""
        if self.default_text:
            return self.default_text
        if self.default is None:
            return "unset"
        return self.form.show(self.default) or "empty"


def key_table(keys: Iterable[Key]) -> dict[str, str]:
    """Ini key -> field of a section's declarations, in their order (the table the parser's warnings use).

    Parameters:
        keys: the section's declarations.

    Returns:
        One entry per key.

    Raises:
        ValueError: a key declared twice.
    """
    table: dict[str, str] = {}
    for k in keys:
        if k.name in table:
            raise ValueError(f"config key {k.name!r} is declared twice")
        table[k.name] = k.field
    return table


def keys_the_parser_reads() -> dict[str, set[str]]:
    """Per section, the keys the config parser asks for, read off a parse of an empty file.

    Every key the parser reads is asked for whether or not the file sets it, so this is the
    parser's own list, whatever the declarations say: the docs build and the tests compare the
    two, so a key read in code without a declaration (and its doc string) fails them.

    For the docs build and the tests only: it swaps :class:`SectionReader`'s constructor for
    the time of one parse, which is not safe beside another thread parsing a config.

    Returns:
        ``{"smoosh": {...}, "channel": {...}, "sqlite": {...}}``; ``channel`` is the union
        over the default channels (each reads the same keys).
    """
    from smoosh.config import Config
    from smoosh.config.values import SectionReader

    readers: list[SectionReader] = []
    original = SectionReader.__init__

    def recording(self: SectionReader, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        readers.append(self)

    SectionReader.__init__ = recording  # type: ignore[method-assign]
    try:
        Config.from_sections({}, path=None)
    finally:
        SectionReader.__init__ = original  # type: ignore[method-assign]
    read: dict[str, set[str]] = {"smoosh": set(), "channel": set(), "sqlite": set()}
    for reader in readers:
        if reader.section == "smoosh":
            read["smoosh"] |= reader.used
        elif reader.section == "smoosh.sqlite":
            read["sqlite"] |= reader.used
        elif reader.section != "smoosh.ignore":  # [smoosh.ignore]'s keys are paths, not settings
            read["channel"] |= reader.used
    return read
