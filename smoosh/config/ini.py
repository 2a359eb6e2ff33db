"""The ini text itself: CouchDB's dialect read with configparser, and its parse errors.

Every parse error has one shape, ``PATH:LINE: message``, whichever configparser error found
it, so an unclosed ``[smoosh`` reads alike on line 1 (configparser: a key before any
section) and on line 9 (configparser: a line that is not ``key = value``).
"""

from __future__ import annotations

import configparser

from smoosh.errors import ConfigError

__all__ = ["ini_parser", "read_sections", "line_error"]


def ini_parser(*, strict: bool = True) -> configparser.ConfigParser:
    """A configparser for smoosh's ini dialect.

    ``interpolation=None`` keeps a ``%`` in a token or path literal; keys are case-sensitive
    (``[smoosh.ignore]`` keys are paths). The default section gets a name no one writes, so a
    pasted ``[DEFAULT]`` is an ordinary (warned-about) section instead of leaking its keys
    into every channel. Only "=" is a delimiter, as in CouchDB's ini: ":" would split
    ``cleanup:/x.db = true`` in ``[smoosh.ignore]``. Inline comments as CouchDB's parser reads
    them: a ";" after a space or a tab ends the value (``min_priority = 2.0 ; big ones``),
    while ``v1;v2`` stays one value.

    Parameters:
        strict: refuse a section or key that appears twice (False: the last one wins).

    Returns:
        A fresh parser.
    """
    parser = configparser.ConfigParser(
        interpolation=None, default_section="\x00no default\x00", strict=strict, delimiters=("=",),
        inline_comment_prefixes=(";",),
    )
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    return parser


def read_sections(text: str, where: str) -> dict[str, dict[str, str]]:
    """The sections of ini text: section name -> raw ``key -> value``.

    Parameters:
        text: the ini text.
        where: the file it came from, as named in messages.

    Returns:
        Every section with its keys, in file order.

    Raises:
        ConfigError: the text does not parse (``PATH:LINE: message``).
    """
    parser = ini_parser()
    # Every parse error has one shape, "PATH:LINE: message", whichever configparser error
    # found it: an unclosed "[smoosh" on line 1 and on line 9 read alike.
    try:
        parser.read_string(text, source=where)
    except configparser.DuplicateSectionError as exc:
        raise ConfigError(f"{where}:{exc.lineno}: [{exc.section}]: section appears twice",
                          path=where, section=exc.section) from None
    except configparser.DuplicateOptionError as exc:
        raise ConfigError(f"{where}:{exc.lineno}: [{exc.section}] {exc.option}: key appears twice",
                          path=where, section=exc.section, key=exc.option) from None
    except configparser.MissingSectionHeaderError as exc:
        raise line_error(where, exc.lineno, exc.line, "a key before any [section]") from None
    except configparser.ParsingError as exc:
        lineno = exc.errors[0][0]
        lines = text.split("\n")  # as configparser numbers them (io.StringIO splits on "\n" only)
        line = lines[lineno - 1] if 0 < lineno <= len(lines) else ""
        raise line_error(where, lineno, line, "not a key = value line") from None
    except configparser.Error as exc:
        raise ConfigError(f"{where}: cannot parse: {exc.message}", path=where) from None
    return {name: dict(parser.items(name, raw=True)) for name in parser.sections()}


def line_error(where: str, lineno: int, line: str, problem: str) -> ConfigError:
    """The error for one bad line: ``PATH:LINE: 'text': problem``.

    A line that opens a section header without closing it is named as what it is, whichever
    problem configparser saw in it.

    Parameters:
        where: the file, as named in messages.
        lineno: the line's number, from 1.
        line: the line's text.
        problem: what is wrong with it.

    Returns:
        The ConfigError (naming the file in ``path``).
    """
    text = line.strip()
    if text.startswith("[") and "]" not in text:
        problem = "a section header without its closing ]"
    return ConfigError(f"{where}:{lineno}: {text!r}: {problem}", path=where)
