"""Loading whole files: CouchDB pastes, list semantics, warnings, missing and empty files,
restart-only keys, and the shipped conf/smoosh.ini."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import textwrap
from pathlib import Path

import pytest

from smoosh.config import (
    CHANNEL_KEYS,
    GLOBAL_KEYS,
    SQLITE_KEYS,
    Config,
    config_fields,
    load_config,
    parse_config,
)
from smoosh.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "conf" / "smoosh.ini"
PATH = "conf/smoosh.ini"

COUCHDB_PASTE = """\
; pasted from a CouchDB local.ini
[smoosh]
db_channels = upgrade_dbs,ratio_dbs,slack_dbs
view_channels = upgrade_views,ratio_views,slack_views
staleness = 5
wait_secs = 30
cleanup_index_files = true
persist = true
state_dir = ./data
compaction_log_level = notice

[smoosh.ratio_dbs]
priority = ratio
min_priority = 2.0

[smoosh.ratio_views]
priority = ratio
min_priority = 2.0

[smoosh.slack_dbs]
priority = slack
min_priority = 536870912

[smoosh.slack_views]
priority = slack
min_priority = 536870912

[smoosh.overnight]
from = 20:00
to = 06:00
strict_window = true

[smoosh.ignore]
shards/00000000-1fffffff/mydb.1623244354 = true
shards/x = true
shards/kept = false
"""


def parse(text: str, cwd: str = "/srv") -> Config:
    return parse_config(textwrap.dedent(text), PATH, cwd=cwd)


def test_a_pasted_couchdb_config_loads() -> None:
    c = parse(COUCHDB_PASTE)
    assert c.db_channels == ("upgrade_dbs", "ratio_dbs", "slack_dbs")
    assert c.view_channels == ("upgrade_views", "ratio_views", "slack_views")
    assert c.channels["ratio_dbs"].min_priority == 2.0
    assert c.channels["slack_dbs"].priority == "slack"
    assert c.channels["slack_dbs"].min_priority == 536870912
    assert c.channels["slack_views"].kind == "view"
    assert c.staleness_s == 300.0
    assert c.state_dir == "/srv/data"
    assert c.compaction_log_level == "info"
    assert c.ignore == ("/srv/shards/00000000-1fffffff/mydb.1623244354", "/srv/shards/x")
    # cleanup_index_files = true is CouchDB's and harmless; the warnings are the view
    # channels, which no compactor can give work, the section for a channel no list names, and
    # the ignore entries, which are CouchDB's names where smoosh takes paths.
    assert c.warnings == (
        "conf/smoosh.ini: [smoosh] view_channels = 'upgrade_views,ratio_views,slack_views': no compactor has "
        "indexes, so channel(s) upgrade_views, ratio_views, slack_views never get work",
        "conf/smoosh.ini: [smoosh.overnight]: no channel list names 'overnight', section ignored",
        "conf/smoosh.ini: [smoosh.ignore] shards/00000000-1fffffff/mydb.1623244354: a CouchDB shard name, not a "
        "path: smoosh ignores database files by path (or glob pattern), so this is "
        "/srv/shards/00000000-1fffffff/mydb.1623244354 and matches nothing",
        "conf/smoosh.ini: [smoosh.ignore] shards/x: matches no database: /srv/shards/x is outside every root "
        "(/srv/var/databases)",
    )


def test_cleanup_index_files_false_gets_a_hint() -> None:
    c = parse("[smoosh]\ncleanup_index_files = false\n")
    assert c.warnings == (
        "conf/smoosh.ini: [smoosh] cleanup_index_files = 'false': not used by smoosh; "
        "to disable index cleanup set cleanup_channels to nothing",
    )
    assert c.cleanup_channels == ("index_cleanup",)


def test_a_set_list_replaces_the_default_and_keeps_the_operators_order() -> None:
    c = parse(
        """
        [smoosh]
        db_channels = slack_dbs, big_dbs ,, ratio_dbs
        cleanup_channels =
        """
    )
    assert c.db_channels == ("slack_dbs", "big_dbs", "ratio_dbs")
    assert c.cleanup_channels == ()
    assert list(c.channels) == ["slack_dbs", "big_dbs", "ratio_dbs"]
    assert "upgrade_dbs" not in c.channels


def test_unknown_keys_and_sections_are_warned_about_by_name(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="smoosh.config"):
        c = parse(
            """
            [smoosh]
            stalenes = 10
            [smoosh.ratio_dbs]
            min_prio = 3
            [smoosh.sqlite]
            page_sise = 4096
            [couchdb]
            database_dir = ./data
            """
        )
    assert c.warnings == (
        "conf/smoosh.ini: [smoosh] stalenes: unknown key, ignored (did you mean staleness?)",
        "conf/smoosh.ini: [couchdb]: not a smoosh section, ignored",
        "conf/smoosh.ini: [smoosh.ratio_dbs] min_prio: unknown key, ignored (did you mean min_priority?)",
        "conf/smoosh.ini: [smoosh.sqlite] page_sise: unknown key, ignored (did you mean page_size?)",
    )
    assert [r.getMessage() for r in caplog.records] == list(c.warnings)
    assert c.staleness_s == 300.0


def test_keys_are_case_sensitive() -> None:
    c = parse("[smoosh]\nMax_Jobs = 9\nroots = /srv\n[smoosh.ignore]\nDBs/A.db = true\n")
    assert c.max_jobs == 4
    assert c.warnings == ("conf/smoosh.ini: [smoosh] Max_Jobs: unknown key, ignored (did you mean max_jobs?)",)
    assert c.ignore == ("/srv/DBs/A.db",)


def test_ignore_entries_are_canonical_paths_and_patterns(tmp_path: Path) -> None:
    cwd = os.path.realpath(tmp_path)
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    c = parse("[smoosh.ignore]\nlink/a.db = true\nlink/tmp/*.db = yes\ncleanup:/abs/b.db = true\n", cwd=cwd)
    assert c.ignore == (f"{cwd}/real/a.db", f"{cwd}/real/tmp/*.db", "/abs/b.db")


def test_ignore_value_must_be_a_boolean() -> None:
    with pytest.raises(ConfigError) as info:
        parse("[smoosh.ignore]\nshards/x = please\n")
    assert str(info.value) == "conf/smoosh.ini: [smoosh.ignore] shards/x = 'please': must be true or false"
    with pytest.raises(ConfigError) as info:
        parse("[smoosh.ignore]\nshards/x =\n")
    assert str(info.value) == "conf/smoosh.ini: [smoosh.ignore] shards/x = '': must be true or false"


@pytest.mark.parametrize("written", ["token =", "token =     ", "token = \t  "])
def test_a_token_written_blank_is_a_config_error_not_silently_no_token(written: str) -> None:
    # Given a token line whose value is empty or only spaces (which the ini format strips)
    with pytest.raises(ConfigError) as info:
        parse(f"[smoosh]\n{written}\n")
    # Then the config is refused, naming the key, rather than run with every POST open
    assert str(info.value) == ("conf/smoosh.ini: [smoosh] token = '': empty: a token must be a long random string "
                               "(at least 16 bytes); remove the line for no token")
    assert info.value.key == "token"
    # ... while no token line at all is no token, as before
    assert parse("[smoosh]\n").token is None


def test_percent_signs_are_literal() -> None:
    assert parse("[smoosh]\ntoken = 100%(x)s-long-enough\n").token == "100%(x)s-long-enough"


def test_default_section_does_not_leak_into_channels() -> None:
    c = parse("[DEFAULT]\ncapacity = 1\n[smoosh]\n")
    assert c.channels["ratio_dbs"].capacity == 9999
    assert c.warnings == ("conf/smoosh.ini: [DEFAULT]: not a smoosh section, ignored",)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[smoosh]\nmax_jobs = 1\nmax_jobs = 2\n", "conf/smoosh.ini:3: [smoosh] max_jobs: key appears twice"),
        ("[smoosh]\n[smoosh]\n", "conf/smoosh.ini:2: [smoosh]: section appears twice"),
        ("max_jobs = 1\n", "conf/smoosh.ini:1: 'max_jobs = 1': a key before any [section]"),
        ("[smoosh\nwatch =\n", "conf/smoosh.ini:1: '[smoosh': a section header without its closing ]"),
        ("[smoosh]\nwatch =\n" + "\n" * 6 + "[smoosh.ratio_dbs\nconcurrency = 2\n",
         "conf/smoosh.ini:9: '[smoosh.ratio_dbs': a section header without its closing ]"),
        ("[smoosh]\nwatch =\nmax_jobs\n", "conf/smoosh.ini:3: 'max_jobs': not a key = value line"),
    ],
)
def test_malformed_files_are_errors_naming_the_file(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, PATH)
    assert str(info.value) == message


# ------------------------------------------------------------------ files


def test_an_empty_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "smoosh.ini"
    path.write_text("\n  \n")
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    assert str(info.value) == f"{path}: is empty"
    assert info.value.path == str(path)


def test_a_named_missing_file_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "nope.ini"
    with pytest.raises(ConfigError) as info:
        load_config(str(missing))
    assert str(info.value) == f"{missing}: no such file"
    monkeypatch.setenv("SMOOSH_CONFIG", str(missing))
    with pytest.raises(ConfigError):
        load_config()


def test_an_unreadable_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(str(tmp_path))  # a directory
    assert str(info.value).startswith(f"{tmp_path}: cannot read: ")
    binary = tmp_path / "bin.ini"
    binary.write_bytes(b"[smoosh]\nnode = \xff\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(binary))
    assert str(info.value).startswith(f"{binary}: not UTF-8 text")


def test_missing_default_file_gives_the_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SMOOSH_CONFIG", raising=False)
    c = load_config()
    assert c.path is None
    assert c == Config.default()
    assert c.state_dir == os.path.join(os.path.realpath(tmp_path), "var/smoosh")


def test_smoosh_config_env_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "other.ini"
    path.write_text("[smoosh]\nmax_jobs = 2\n")
    monkeypatch.setenv("SMOOSH_CONFIG", str(path))
    c = load_config()
    assert (c.path, c.max_jobs) == (str(path), 2)


def test_errors_name_the_file_they_came_from(tmp_path: Path) -> None:
    path = tmp_path / "smoosh.ini"
    path.write_text("[smoosh.ratio_dbs]\ncapacity = 0\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    assert str(info.value) == f"{path}: [smoosh.ratio_dbs] capacity = '0': must be an integer >= 1"
    assert (info.value.section, info.value.key, info.value.value) == ("smoosh.ratio_dbs", "capacity", "0")


# ------------------------------------------------------------------ reload helpers


def test_restart_keys_changed_names_only_restart_keys() -> None:
    old = parse("[smoosh]\nmax_jobs = 1\n")
    assert old.restart_keys_changed(parse("[smoosh]\nmax_jobs = 7\nstaleness = 1\n")) == []
    new = parse(
        """
        [smoosh]
        store = memory:
        http = 127.0.0.1:9999
        token = a-token-of-16-bytes
        node = other
        state_dir = elsewhere
        watch = dbs2
        """
    )
    # token and watch apply live (DESIGN §11): only what truly cannot needs a restart.
    assert old.restart_keys_changed(new) == ["store", "http", "node", "state_dir"]
    assert old.restart_keys_changed(parse("[smoosh]\nwatch = dbs2\n")) == []


def test_describe_is_one_line_without_the_token() -> None:
    c = parse("[smoosh]\ntoken = hunter2-hunter2-hunter2\nhttp = 0.0.0.0:1\n")
    line = c.describe()
    assert "\n" not in line
    assert "hunter2-hunter2-hunter2" not in line
    assert "token set" in line
    assert "db=upgrade_dbs(upgrade),ratio_dbs(ratio),slack_dbs(slack)" in line


def test_configs_are_frozen() -> None:
    c = parse("[smoosh]\n")
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.max_jobs = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.channels["ratio_dbs"].capacity = 3  # type: ignore[misc]


# ------------------------------------------------------------------ shipped conf/smoosh.ini


def test_shipped_config_loads_without_warnings_and_equals_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    c = load_config(str(SHIPPED))
    assert c.warnings == ()
    assert dataclasses.replace(c, path=None) == Config.default()


def _documented_keys(text: str) -> dict[str, set[str]]:
    """Per section, the keys the file mentions, set or commented out (`;key =`)."""
    keys: dict[str, set[str]] = {}
    section = None
    for line in text.splitlines():
        header = re.fullmatch(r"\[([^\]]+)\]\s*", line)
        if header:
            section = header.group(1)
            keys.setdefault(section, set())
            continue
        key = re.match(r";?([A-Za-z_]+) =", line)
        if key and section:
            keys.setdefault(section, set()).add(key.group(1))
    return keys


def test_shipped_config_documents_every_key() -> None:
    documented = _documented_keys(SHIPPED.read_text())
    fields = config_fields()
    # Every dataclass field comes from some key, and every key is in the shipped file.
    assert set(GLOBAL_KEYS.values()) == fields["global"]
    assert set(CHANNEL_KEYS.values()) == fields["channel"]
    assert set(SQLITE_KEYS.values()) == fields["sqlite"]
    assert set(GLOBAL_KEYS) <= documented["smoosh"]
    for channel in ("smoosh.ratio_dbs", "smoosh.slack_dbs"):
        assert set(CHANNEL_KEYS) <= documented[channel], channel
    # An upgrade's priority is always 1 whatever the file's size (priority.compute, rule 2):
    # the upgrade channel lists only the keys that act on it.
    assert documented["smoosh.upgrade_dbs"] == set(CHANNEL_KEYS) - UPGRADE_IGNORES
    assert set(SQLITE_KEYS) <= documented["smoosh.sqlite"]
    assert "smoosh.ignore" in documented


def test_the_shipped_config_names_the_keys_that_need_a_restart_as_the_code_does() -> None:
    from smoosh.config.defaults import RESTART_KEYS

    # The header's sentence on restarts, its comment markers dropped
    header = " ".join(line.lstrip("; ") for line in SHIPPED.read_text().split("\n[smoosh]\n")[0].splitlines())
    sentence = header[:header.index(" take effect only after a restart")]
    sentence = sentence[sentence.rindex(".") + 1:]
    assert set(re.findall(r"[a-z_]+", sentence)) - {"and"} == set(RESTART_KEYS)
    # and the keys it says apply live, watch and token among them, are not restart keys
    assert "every other key applies live, watch and token included" in header


#: Channel keys that have no effect on an upgrade channel.
UPGRADE_IGNORES = {"min_priority", "max_priority", "min_size", "max_size"}
#: Commented-out lines of the shipped file that show an example, not the default.
EXAMPLES = {"page_size", "auto_vacuum", "token", "cluster_max_jobs"}


def test_every_default_the_shipped_config_shows_is_the_codes_default(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given the shipped file with every commented-out "key = default" line uncommented
    lines, section = [], None
    for line in SHIPPED.read_text().splitlines():
        header = re.fullmatch(r"\[([^\]]+)\]\s*", line)
        section = header.group(1) if header else section
        key = re.fullmatch(r";([A-Za-z_]+) =.*", line)
        if key and section != "smoosh.ignore" and key.group(1) not in EXAMPLES:
            line = line[1:]
        lines.append(line)
    monkeypatch.chdir(REPO)
    config = parse_config("\n".join(lines), PATH)
    # Then it loads without a warning and equals the defaults (a 00:00-24:00 window is no window)
    assert config.warnings == ()
    channels = {name: dataclasses.replace(c, window=None) if c.window and c.window.start_min == 0
                and c.window.end_min == 24 * 60 else c for name, c in config.channels.items()}
    assert dataclasses.replace(config, path=None, channels=channels) == Config.default()


def test_an_upgrade_channel_ignores_the_keys_the_shipped_config_leaves_out() -> None:
    from smoosh.priority import compute

    needs = dict(file=10, active=10, needs_upgrade=True)
    assert compute("upgrade", **needs) == 1
    assert compute("upgrade", **needs, min_priority=5.0, max_priority=0.5, min_size=1 << 20, max_size=1) == 1
    assert compute("upgrade", file=10 << 20, active=1, needs_upgrade=False) == 0


def test_the_shipped_config_describes_inline_comments_as_the_parser_reads_them() -> None:
    text = SHIPPED.read_text()
    assert "a \";\" after a value is part of it" not in text
    assert "min_priority = 2.0 ; big ones" in text
    assert parse("[smoosh.ratio_dbs]\nmin_priority = 2.0 ; big ones\n").channels["ratio_dbs"].min_priority == 2.0


def test_an_inline_comment_ends_a_value_as_in_couchdbs_parser() -> None:
    # CouchDB's ini: a ";" after a space or a tab starts a comment; "v1;v2" stays one value.
    config = parse(
        """
        [smoosh]
        node = host-a ; the FoundationDB example of the README
        staleness = 2\t; minutes

        [smoosh.ratio_dbs]
        min_priority = 3.0 ; big ones only

        [smoosh.ignore]
        /data/a;b.db = true
        """
    )
    assert config.node == "host-a"
    assert config.staleness_s == 120
    assert config.channels["ratio_dbs"].min_priority == 3.0
    assert config.ignore == ("/data/a;b.db",)
