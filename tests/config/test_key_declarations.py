"""Every config key is declared once, with a doc string and a default that reads back as the code's.

The configuration reference of the docs is generated from these declarations
(smoosh.config.keys); these tests hold the declarations to what the parser really does.
"""

from __future__ import annotations

import math

import pytest

from smoosh.config import Config, config_fields, parse_config
from smoosh.config.defaults import GLOBAL_KEY_DEFS, GLOBAL_KEYS
from smoosh.config.keys import Key, keys_the_parser_reads
from smoosh.config.sections import CHANNEL_KEY_DEFS, CHANNEL_KEYS, SQLITE_KEY_DEFS, SQLITE_KEYS

SECTIONS = {"smoosh": GLOBAL_KEY_DEFS, "channel": CHANNEL_KEY_DEFS, "sqlite": SQLITE_KEY_DEFS}


def test_the_parser_reads_exactly_the_declared_keys() -> None:
    read = keys_the_parser_reads()
    declared = {section: {k.name for k in keys} for section, keys in SECTIONS.items()}
    assert read == declared


def test_the_key_tables_are_the_declarations() -> None:
    assert GLOBAL_KEYS == {k.name: k.field for k in GLOBAL_KEY_DEFS}
    assert CHANNEL_KEYS == {k.name: k.field for k in CHANNEL_KEY_DEFS}
    assert SQLITE_KEYS == {k.name: k.field for k in SQLITE_KEY_DEFS}
    fields = config_fields()
    assert {k.field for k in GLOBAL_KEY_DEFS} == fields["global"]
    assert {k.field for k in CHANNEL_KEY_DEFS} == fields["channel"]
    assert {k.field for k in SQLITE_KEY_DEFS} == fields["sqlite"]


@pytest.mark.parametrize("key", [k for keys in SECTIONS.values() for k in keys], ids=lambda k: k.name)
def test_every_key_has_a_doc_string_and_a_form(key: Key) -> None:
    assert key.doc.strip() and key.doc.strip()[-1] in ".)", key.name
    assert key.form.type
    assert key.default_shown()


def written(key: Key) -> str | None:
    """The default as the reference shows it, as a file would write it; None where it is a sentence."""
    if key.default_text:
        return None
    shown = key.default_shown()
    return "" if shown in ("empty", "unset") else shown


@pytest.mark.parametrize("key", [k for k in GLOBAL_KEY_DEFS if written(k) is not None], ids=lambda k: k.name)
def test_every_global_default_the_reference_shows_is_the_codes_default(key: Key, tmp_path: object) -> None:
    # Given the default as the reference shows it, written into a file
    text = f"[smoosh]\n{key.name} = {written(key)}\n"
    # Then the file means what no file means
    cwd = "/srv"
    assert getattr(parse_config(text, "t.ini", cwd=cwd), key.field) == getattr(Config.default(cwd=cwd), key.field)


@pytest.mark.parametrize("key", [k for k in CHANNEL_KEY_DEFS + SQLITE_KEY_DEFS if written(k) is not None],
                         ids=lambda k: k.name)
def test_every_channel_and_sqlite_default_the_reference_shows_is_the_codes_default(key: Key) -> None:
    section = "smoosh.sqlite" if key in SQLITE_KEY_DEFS else "smoosh.ratio_dbs"
    config = parse_config(f"[smoosh]\n[{section}]\n{key.name} = {written(key)}\n", "t.ini", cwd="/srv")
    default = Config.default(cwd="/srv")
    if key in SQLITE_KEY_DEFS:
        assert getattr(config.sqlite, key.field) == getattr(default.sqlite, key.field)
    else:
        value, expected = getattr(config.channels["ratio_dbs"], key.field), getattr(default.channels["ratio_dbs"], key.field)
        assert value == expected or (math.isinf(value) and math.isinf(expected))
