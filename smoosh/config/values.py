"""Value parsers for the config file, and the section reader that turns their complaints
into ``ConfigError``s naming file, section, key and value.

Each parser takes the raw string and raises ``ValueError(problem)`` where ``problem`` reads
well after ``"<path>: [<section>] <key> = '<value>': "`` (for example
``"must be an integer >= 1"``). :class:`SectionReader` adds that prefix, so every error
message in the config has one shape.
"""

from __future__ import annotations

import difflib
import glob
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from smoosh.errors import ConfigError
from smoosh.cpusched import CPU_SCHEDULING
from smoosh.config.defaults import LOG_FORMATS, LOG_LEVELS
from smoosh.config.address import is_loopback_host, split_host_port
from smoosh.units import INFINITY, parse_duration, parse_size

__all__ = [
    "SectionReader",
    "error_message",
    "parse_int",
    "parse_bool",
    "parse_list",
    "parse_names",
    "parse_ratio",
    "parse_threshold_size",
    "parse_duration_at_least",
    "parse_io_rate",
    "parse_io_priority",
    "parse_cpu_scheduling",
    "parse_log_level",
    "parse_log_format",
    "parse_store",
    "parse_node",
    "parse_http",
    "is_loopback_host",
    "resolve_path",
    "resolve_glob",
    "static_prefix",
]

T = TypeVar("T")
D = TypeVar("D")

#: configparser's spellings of a boolean (``strict_window = yes`` works as in CouchDB's
#: ``true``); anything else is an error rather than a silent false.
BOOLEAN_STATES: dict[str, bool] = {
    "1": True, "yes": True, "true": True, "on": True,
    "0": False, "no": False, "false": False, "off": False,
}

_INT_RE = re.compile(r"\+?[0-9]+")
_DECIMAL_RE = re.compile(r"\+?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")
_NUMBER_WITH_UNIT_RE = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[ \t]*[A-Za-z]+")


def error_message(path: str, section: str, key: str, value: str, problem: str) -> str:
    """The one shape of a config error message.

    Parameters
    ----------
    path, section, key, value, problem:
        What the error is about and what is wrong with it.

    Returns
    -------
    ``"<path>: [<section>] <key> = '<value>': <problem>"``.
    """
    return f"{path}: [{section}] {key} = {value!r}: {problem}"


class SectionReader:
    """Reads the keys of one ini section, recording which were used.

    Parameters
    ----------
    path:
        The config file, as named in messages.
    section:
        The section name without brackets.
    values:
        The section's raw ``key -> value`` strings (empty for a section that is not there).
    """

    def __init__(self, path: str, section: str, values: Mapping[str, str]) -> None:
        self.path = path
        self.section = section
        self.values = dict(values)
        self.used: set[str] = set()

    def raw(self, key: str) -> str | None:
        """The value as written (stripped), or None when the key is absent or empty."""
        self.used.add(key)
        value = self.values.get(key)
        if value is None or not value.strip():
            return None
        return value.strip()

    def get(self, key: str, parse: Callable[[str], T], default: D) -> T | D:
        """Parse ``key`` with ``parse``; absent or empty gives ``default``.

        Parameters
        ----------
        key:
            The ini key.
        parse:
            Raises ``ValueError(problem)`` for a bad value.
        default:
            The value when the key is absent or empty.

        Returns
        -------
        The parsed value or the default.

        Raises
        ------
        ConfigError
            ``parse`` rejected the value; the message names path, section, key and value.
        """
        value = self.raw(key)
        if value is None:
            return default
        try:
            return parse(value)
        except ValueError as exc:
            raise self.error(key, value, str(exc)) from None

    def error(self, key: str, value: str, problem: str) -> ConfigError:
        """Build the ConfigError for ``key = value`` with ``problem``."""
        return ConfigError(
            error_message(self.path, self.section, key, value, problem),
            path=self.path, section=self.section, key=key, value=value,
        )

    def unknown_keys(self) -> list[str]:
        """Keys present in the section that no reader asked for, in file order."""
        return [key for key in self.values if key not in self.used]


#: How alike an unknown key and a known one must be (difflib's ratio) to suggest the known
#: one: close enough for a dropped or doubled letter, not so close that every short key
#: suggests another.
DID_YOU_MEAN_CUTOFF = 0.75


def unknown_key_warning(path: str, section: str, key: str, known: Iterable[str],
                        elsewhere: Mapping[str, Iterable[str]] | None = None) -> str:
    """The warning for an unknown key, with a "did you mean" for a near miss.

    A key that differs from a known one only in case, or by a letter or two
    (``concurency``), names the key meant; a key that belongs to another section
    (``max_jobs`` in a channel) names that section.

    Parameters:
        path: the config file, as named in messages.
        section: the section the key is in.
        key: the unknown key.
        known: the keys of that section.
        elsewhere: per other section (as written in the message, e.g. ``[smoosh]``), its keys.

    Returns:
        ``PATH: [SECTION] KEY: unknown key, ignored``, plus `` (did you mean ...?)`` when one fits.
    """
    message = f"{path}: [{section}] {key}: unknown key, ignored"
    known = list(known)
    suggestion = _closest(key, known)
    if suggestion is not None:
        return f"{message} (did you mean {suggestion}?)"
    for where, keys in (elsewhere or {}).items():
        suggestion = _closest(key, list(keys))
        if suggestion is not None:
            return f"{message} (did you mean {suggestion} in {where}?)"
    return message


def _closest(key: str, known: list[str]) -> str | None:
    by_lower = {k.lower(): k for k in known}
    if key.lower() in by_lower:
        return by_lower[key.lower()]
    matches = difflib.get_close_matches(key.lower(), list(by_lower), n=1, cutoff=DID_YOU_MEAN_CUTOFF)
    return by_lower[matches[0]] if matches else None


# ---------------------------------------------------------------- scalar parsers


def parse_int(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """A parser for a plain decimal integer in ``[minimum, maximum]``."""
    if maximum is None:
        problem = f"must be an integer >= {minimum}"
    else:
        problem = f"must be an integer from {minimum} to {maximum}"

    def parse(text: str) -> int:
        if not _INT_RE.fullmatch(text):
            raise ValueError(problem)
        value = int(text)
        if value < minimum or (maximum is not None and value > maximum):
            raise ValueError(problem)
        return value

    return parse


def parse_bool(text: str) -> bool:
    """``true/false``, ``yes/no``, ``on/off``, ``1/0`` (any case)."""
    value = BOOLEAN_STATES.get(text.lower())
    if value is None:
        raise ValueError("must be true or false")
    return value


def parse_list(text: str) -> tuple[str, ...]:
    """Comma-separated items, whitespace trimmed, empties dropped, order kept."""
    return tuple(item.strip() for item in text.split(",") if item.strip())


def parse_names(text: str, pattern: re.Pattern[str], what: str) -> tuple[str, ...]:
    """A comma-separated list of names matching ``pattern``; a duplicate is an error."""
    names = parse_list(text)
    seen: set[str] = set()
    for name in names:
        if not pattern.fullmatch(name):
            raise ValueError(f"{what} {name!r} must match {pattern.pattern}")
        if name in seen:
            raise ValueError(f"{what} {name!r} is listed twice")
        seen.add(name)
    return names


def parse_ratio(*, allow_infinity: bool) -> Callable[[str], float]:
    """A parser for a ratio threshold: a plain non-negative number, no unit."""
    problem = "must be a number >= 0" + (" or infinity" if allow_infinity else "")

    def parse(text: str) -> float:
        if text.lower() == INFINITY:
            if allow_infinity:
                return math.inf
            raise ValueError(problem)
        if _NUMBER_WITH_UNIT_RE.fullmatch(text):
            raise ValueError("a ratio threshold takes no unit")
        if not _DECIMAL_RE.fullmatch(text):
            raise ValueError(problem)
        return float(text)

    return parse


def parse_threshold_size(*, allow_infinity: bool) -> Callable[[str], int | float]:
    """A parser for a size in bytes (units allowed), optionally ``infinity``."""

    def parse(text: str) -> int | float:
        try:
            return parse_size(text, allow_infinity=allow_infinity)
        except ValueError:
            raise ValueError(
                "must be a size in bytes >= 0 (e.g. 1048576, 512MiB, 1GB)"
                + (" or infinity" if allow_infinity else "")
            ) from None

    return parse


def parse_duration_at_least(bare_unit_s: float, minimum_s: float, *, strict: bool = False) -> Callable[[str], float]:
    """A parser for a duration (``90s``, ``5m``, ``2h``; bare numbers in ``bare_unit_s``)."""
    bare = "minutes" if bare_unit_s == 60.0 else "seconds"
    bound = f"> {minimum_s:g}" if strict else f">= {minimum_s:g}"
    problem = f"must be a duration {bound}s (e.g. 90s, 5m, 2h; a bare number is {bare})"

    def parse(text: str) -> float:
        try:
            value = parse_duration(text, bare_unit_s)
        except ValueError:
            raise ValueError(problem) from None
        if value < minimum_s or (strict and value == minimum_s):
            raise ValueError(problem)
        return value

    return parse


def parse_io_rate(text: str) -> float | None:
    """``max_io_rate``: bytes per second (``20MiB``, ``20MiB/s``, ``5000000``) > 0; ``infinity`` is None (unlimited)."""
    value = text.strip()
    if value.lower().endswith("/s"):
        value = value[:-2]
    try:
        rate = parse_size(value, allow_infinity=True)
    except ValueError:
        rate = 0
    if rate == math.inf:
        return None
    if not rate:
        raise ValueError("must be a rate in bytes per second > 0 (e.g. 20MiB, 50MB/s) or infinity")
    return float(rate)


def parse_io_priority(text: str) -> str:
    """``io_priority``: ``normal`` or ``idle`` (any case)."""
    value = text.strip().lower()
    if value not in ("normal", "idle"):
        raise ValueError("must be normal or idle")
    return value


def parse_cpu_scheduling(text: str) -> str:
    """``cpu_scheduling``: one of :data:`smoosh.cpusched.CPU_SCHEDULING` (any case)."""
    value = text.strip().lower()
    if value not in CPU_SCHEDULING:
        raise ValueError("must be " + " or ".join(CPU_SCHEDULING))
    return value


# ---------------------------------------------------------------- [smoosh] names


def parse_log_level(text: str) -> str:
    """``compaction_log_level``: a CouchDB level name (any case); ``notice`` is ``info``."""
    level = LOG_LEVELS.get(text.lower())
    if level is None:
        raise ValueError("must be debug, info, notice, warning or error")
    return level


def parse_log_format(text: str) -> str:
    """``log_format``: one of ``LOG_FORMATS`` (any case)."""
    value = text.strip().lower()
    if value not in LOG_FORMATS:
        raise ValueError(f"must be {' or '.join(LOG_FORMATS)}")
    return value


def parse_store(text: str, cwd: str) -> str:
    """``store``: ``memory:``, ``sqlite:PATH`` or ``fdb:[CLUSTER_FILE]``, a path made absolute against ``cwd``."""
    scheme, sep, rest = text.partition(":")
    if not sep or scheme not in ("memory", "sqlite", "fdb"):
        raise ValueError("must be memory:, sqlite:PATH, fdb: or fdb:CLUSTER_FILE")
    if scheme == "memory":
        if rest:
            raise ValueError("memory: takes no path")
        return "memory:"
    if scheme == "sqlite":
        if not rest.strip():
            raise ValueError("sqlite: needs a path, e.g. sqlite:var/smoosh/jobs.db")
        return "sqlite:" + resolve_path(rest.strip(), cwd)
    return "fdb:" + (resolve_path(rest.strip(), cwd) if rest.strip() else "")


def parse_node(text: str) -> str:
    """``node``: a name without spaces or control characters (the default is the host name)."""
    if not text or any(ch.isspace() or not ch.isprintable() for ch in text):
        raise ValueError("must be a name without spaces or control characters")
    return text


# ---------------------------------------------------------------- http


def parse_http(text: str) -> str:
    """Validate ``host:port`` (``[::1]:5986`` for IPv6); returns it stripped."""
    split_host_port(text)
    return text


# ---------------------------------------------------------------- paths


def static_prefix(pattern: str) -> str:
    """The leading path components of a glob that contain no glob characters."""
    parts = pattern.split(os.sep)
    static: list[str] = []
    for part in parts:
        if glob.has_magic(part):
            break
        static.append(part)
    return os.sep.join(static) or (os.sep if pattern.startswith(os.sep) else ".")


def resolve_path(path: str, cwd: str) -> str:
    """``path`` made absolute against ``cwd`` with symlinks resolved (a db key's form)."""
    return os.path.realpath(os.path.join(cwd, os.path.expanduser(path)))


def resolve_glob(pattern: str, cwd: str) -> str:
    """A glob made absolute: its static prefix realpath'd, the pattern part kept as written.

    Keys are realpaths, so the prefix must be resolved the same way or a pattern under a
    symlinked directory would never match.
    """
    pattern = os.path.expanduser(pattern)
    if not glob.has_magic(pattern):
        return resolve_path(pattern, cwd)
    absolute = os.path.join(cwd, pattern)
    prefix = static_prefix(absolute)
    rest = absolute[len(prefix):].lstrip(os.sep)
    return os.path.join(os.path.realpath(prefix), rest)
