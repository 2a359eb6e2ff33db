"""Malformed config files: every input gives a Config or a ConfigError naming the file, nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzz.fuzzlib import FAST, SOAK_EXAMPLES, fuzz_settings
from smoosh.config import CHANNEL_KEYS, GLOBAL_KEYS, SQLITE_KEYS, Config, load_config, parse_config
from smoosh.errors import ConfigError

#: The path every fuzzed text claims to come from (never read: parse_config takes the text).
CONFIG_PATH = "/fuzz/etc/smoosh-fuzz.ini"

SECTIONS = st.sampled_from(
    ["smoosh", "smoosh.ratio_dbs", "smoosh.slack_dbs", "smoosh.upgrade_dbs", "smoosh.index_cleanup",
     "smoosh.ignore", "smoosh.sqlite", "smoosh.night", "DEFAULT", "couchdb", "smoosh.", "smoosh.a.b"]
) | st.text(min_size=0, max_size=12)

KEYS = st.sampled_from(sorted(GLOBAL_KEYS) + sorted(CHANNEL_KEYS) + sorted(SQLITE_KEYS)
                       + ["from", "to", "strict_window", "timezone", "match", "token", "cleanup_index_files",
                          "/var/db/x.db", "cleanup:/x.db", "*.db"]) | st.text(min_size=0, max_size=12)

VALUES = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["true", "false", "yes", "0", "1", "infinity", "inf", "nan", "-1", "", " ", "1e309",
                     "64KiB", "1 GB", "10 PiB", "5m", "90s", "-3s", "1h30m", "0s", "23:30", "24:00", "3:52",
                     "25:61", "ratio", "slack", "upgrade", "none", "full", "incremental", "Europe/Paris",
                     "No/Such_Zone", "127.0.0.1:0", "0.0.0.0:5986", "[::1]:99999", "host:port", "memory:",
                     "sqlite:", "sqlite:var/jobs.db", "fdb:", "mysql:x", "ratio_dbs, slack_dbs", "a,,b",
                     "ratio_dbs, ratio_dbs", "ignore", "sqlite", "%(x)s", "%", "debug", "notice", "LOUD",
                     "/tmp/fuzz-dbs", "relative/dir", "/tmp/*/x", "**", "[", "\\", "\x00", "\u202e", "\ud800"]),
    st.text(max_size=40),
)


@st.composite
def ini_texts(draw: st.DrawFn) -> str:
    """Ini text shaped like a smoosh config (mostly), with hostile values and stray lines."""
    lines: list[str] = []
    for _ in range(draw(st.integers(0, 5))):
        lines.append(f"[{draw(SECTIONS)}]")
        for _ in range(draw(st.integers(0, 6))):
            lines.append(f"{draw(KEYS)} {draw(st.sampled_from(['=', ' = ', ':', '']))} {draw(VALUES)}")
        if draw(st.booleans()):
            lines.append(draw(st.text(max_size=30)))  # a stray line: comment, continuation, garbage
    return "\n".join(lines)


def assert_config_or_named_error(text: str, tmp: Path) -> None:
    """The property: a Config, or a ConfigError whose message names the file; never anything else."""
    try:
        config = parse_config(text, CONFIG_PATH, cwd=str(tmp))
    except ConfigError as e:
        assert CONFIG_PATH in str(e), f"ConfigError does not name the file: {e}"
        assert e.path == CONFIG_PATH
        return
    assert isinstance(config, Config)
    assert config.path == CONFIG_PATH
    # A config that loads is usable: the address parses and every channel is typed.
    host, port = config.http_host_port()
    assert 0 <= port <= 65535
    assert all(ch.kind in ("db", "view", "cleanup") for ch in config.channels.values())


@fuzz_settings(FAST * 5)
@given(text=ini_texts())
def test_any_config_text_gives_a_config_or_an_error_naming_the_file(text: str, tmp_path: Path) -> None:
    assert_config_or_named_error(text, tmp_path)


@fuzz_settings(FAST)
@given(text=st.text(max_size=400))
def test_random_text_gives_a_config_or_an_error_naming_the_file(text: str, tmp_path: Path) -> None:
    assert_config_or_named_error(text, tmp_path)


@fuzz_settings(FAST)
@given(raw=st.binary(max_size=300))
def test_a_config_file_of_random_bytes_loads_or_fails_naming_the_file(raw: bytes, tmp_path: Path) -> None:
    path = tmp_path / "random.ini"
    path.write_bytes(raw)
    try:
        config = load_config(str(path), cwd=str(tmp_path))
    except ConfigError as e:
        assert str(path) in str(e)
        return
    assert config.path == str(path)


@pytest.mark.slow
@fuzz_settings(SOAK_EXAMPLES * 5)
@given(text=ini_texts())
def test_any_config_text_gives_a_config_or_an_error_naming_the_file_soak(text: str, tmp_path: Path) -> None:
    assert_config_or_named_error(text, tmp_path)


@pytest.mark.slow
@fuzz_settings(SOAK_EXAMPLES)
@given(text=st.text(max_size=2000))
def test_random_text_gives_a_config_or_an_error_naming_the_file_soak(text: str, tmp_path: Path) -> None:
    assert_config_or_named_error(text, tmp_path)
