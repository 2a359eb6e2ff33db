"""A CouchDB local.ini pasted into smoosh behaves as in CouchDB, or `config check` says where and why not
(DESIGN §12, "CouchDB fidelity vs written order"): a channel an earlier one shadows, built-ins
left out of `db_channels`, a channel's method, and `[smoosh.ignore]` entries that are CouchDB
names. The examples are CouchDB's own (its docs' `local.ini` sections, and the issue's paste)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from compactor.dbfactory import make_bloated_db
from helpers.clocks import FakeClock
from helpers.daemon import Daemon, config_text, free_port, write_config
from smoosh import Server
from smoosh.config import ChannelConfig, Config, parse_config
from smoosh.config.fidelity import covers
from smoosh.config.watch import ConfigWatcher
from smoosh.priority import compute

PATH = "local.ini"

#: The issue's night channel, as CouchDB's docs write one, listed after the built-ins.
OVERNIGHT = """
[smoosh]
db_channels = upgrade_dbs,ratio_dbs,slack_dbs,overnight_dbs
watch = {watch}

[smoosh.overnight_dbs]
priority = ratio
min_priority = 5.0
min_size = 10485760
from = 20:00
to = 06:00
strict_window = true

[smoosh.ignore]
_users = true
"""

SHADOWED = (
    "[smoosh] db_channels: channel overnight_dbs never gets work: ratio_dbs, listed before it, takes every key "
    "overnight_dbs would (ratio_dbs: ratio > 2, file > 1048576 bytes, no window; overnight_dbs: ratio > 5, "
    "file > 10485760 bytes, window 20:00-06:00 UTC): list overnight_dbs before ratio_dbs, or narrow ratio_dbs "
    "(CouchDB, which tries channels in sorted name order, offers keys to overnight_dbs first)"
)


def parse(text: str, cwd: str = "/srv") -> Config:
    return parse_config(textwrap.dedent(text), PATH, cwd=cwd)


def smoosh(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "smoosh", *args], capture_output=True, text=True, timeout=30,
                          cwd=cwd, env=dict(os.environ, SMOOSH_LOG_LEVEL="INFO"))


# ------------------------------------------------------------------ shadowed channels


def test_config_check_names_a_night_channel_that_ratio_dbs_listed_before_it_shadows(tmp_path: Path) -> None:
    # Given CouchDB's overnight_dbs listed after the built-ins, as a CouchDB operator writes it
    config = tmp_path / "local.ini"
    (tmp_path / "dbs").mkdir()
    config.write_text(OVERNIGHT.format(watch=tmp_path / "dbs"))  # the default store (var/smoosh) beside it
    # When it is checked
    out = smoosh("config", "check", "--config", str(config), cwd=tmp_path)
    # Then it is valid, and one warning names both channels, why, and the fix
    assert out.returncode == 0, out.stderr
    assert f"smoosh: warning: {config}: {SHADOWED}\n" in out.stderr
    assert out.stderr.count("never gets work") == 1


def test_listed_first_the_night_channel_is_not_shadowed() -> None:
    c = parse(OVERNIGHT.replace("upgrade_dbs,ratio_dbs,slack_dbs,overnight_dbs",
                                "overnight_dbs,upgrade_dbs,ratio_dbs,slack_dbs").format(watch="/srv/dbs"))
    assert [w for w in c.warnings if "never gets work" in w] == []


def test_the_warning_is_true_the_router_gives_ratio_dbs_what_the_night_channel_would_take(tmp_path: Path) -> None:
    # Given the night channel listed after a ratio channel that takes what it takes, its window
    # open now (thresholds scaled down so a small file qualifies for both)
    dbs = tmp_path / "dbs"
    dbs.mkdir()
    db = dbs / "tenant.db"
    make_bloated_db(str(db), rows=3000, delete_fraction=0.9)
    settings = {"watch": "", "roots": str(dbs), "state_dir": str(tmp_path / "state"), "store": "memory:",
                "node": "t", "wait_secs": "3600", "db_channels": "ratio_dbs,overnight_dbs"}
    night = "[smoosh.overnight_dbs]\npriority = ratio\nmin_priority = 5.0\nmin_size = 128KiB\nfrom = 20:00\nto = 06:00\n"
    config = parse_config(config_text(settings, channels=night), str(tmp_path / "smoosh.ini"))
    assert any("channel overnight_dbs never gets work" in w for w in config.warnings)
    clock = FakeClock(dt.datetime(2026, 11, 24, 22, 0, tzinfo=dt.timezone.utc).timestamp())
    server = Server(config, workers=0, clock=clock, watch_config=False)
    server.start()
    try:
        # When the database is offered, inside the night channel's window
        (verdict,) = server.enqueue_and_wait([str(db)])
        assert server.explain(str(db))["channels"]["overnight_dbs"]["priority"] > 5
    finally:
        server.stop()
    # Then ratio_dbs took it, although the night channel prices it above its own threshold
    assert (verdict.outcome, verdict.channel) == ("queued", "ratio_dbs")


def channel(**settings: object) -> ChannelConfig:
    return dataclasses.replace(ChannelConfig(name="x"), **settings)  # type: ignore[arg-type]


LATER = channel(name="later", min_priority=5.0, min_size_bytes=10 << 20)


@pytest.mark.parametrize("earlier", [
    channel(name="earlier", min_priority=6.0),
    channel(name="earlier", min_size_bytes=20 << 20),
    channel(name="earlier", max_size_bytes=1 << 30),
    channel(name="earlier", max_priority=100.0),
    channel(name="earlier", priority="slack", min_priority=1.0),
    channel(name="earlier", min_changes=10),
    channel(name="earlier", match=("/srv/a/*",)),
    channel(name="earlier", kind="cleanup"),
], ids=["higher min_priority", "higher min_size", "a max_size", "a max_priority", "another method",
        "more changes needed", "a narrower match", "another kind"])
def test_a_channel_that_refuses_some_key_the_later_one_takes_does_not_shadow_it(earlier: ChannelConfig) -> None:
    assert not covers(earlier, LATER)


@pytest.mark.parametrize("earlier", [
    channel(name="earlier"),
    channel(name="earlier", window=LATER.window, concurrency=0, capacity=1, strict_window=True),
    channel(name="earlier", match=("/srv/*",)),
    channel(name="earlier", min_priority=5.0, min_size_bytes=10 << 20),
], ids=["defaults", "concurrency 0, capacity 1", "a match that takes every key of the later one", "equal"])
def test_what_decides_when_a_key_starts_does_not_make_a_channel_refuse_it(earlier: ChannelConfig) -> None:
    later = dataclasses.replace(LATER, match=("/srv/b/*.db",)) if earlier.match else LATER
    assert covers(earlier, later)


def test_a_zero_min_priority_refuses_empty_databases_so_it_shadows_only_its_like() -> None:
    # An empty database (no live bytes) gets min_priority itself: 0 means "not eligible"
    assert not covers(channel(min_priority=0.0), channel(min_priority=1.0))
    assert covers(channel(min_priority=0.0), channel(min_priority=0.0, min_size_bytes=2 << 20))


def test_two_cleanup_channels_without_match_shadow_the_second() -> None:
    c = parse("[smoosh]\ncleanup_channels = index_cleanup, wal_cleanup\n")
    assert c.warnings == (
        f"{PATH}: [smoosh] cleanup_channels: channel wal_cleanup never gets work: index_cleanup, listed before it, "
        "takes every key wal_cleanup would (index_cleanup: cleanup, no window; wal_cleanup: cleanup, no window): "
        "list wal_cleanup before index_cleanup, or narrow index_cleanup",
    )


#: Per method, a channel whose every threshold is set (the later one of each pair), and the
#: values each field of either channel takes in turn: below, at and above the base's.
MiB = 1 << 20
BASE = {
    "ratio": channel(min_priority=2.0, max_priority=10.0, min_size_bytes=MiB, max_size_bytes=1 << 30,
                     min_changes=2, match=("/srv/a/*",)),
    "slack": channel(priority="slack", min_priority=2.0 * MiB, max_priority=10.0 * MiB, min_size_bytes=MiB,
                     max_size_bytes=1 << 30, min_changes=2, match=("/srv/a/*",)),
    "upgrade": channel(priority="upgrade", min_changes=2, match=("/srv/a/*",)),
}
VARIED = {
    "min_priority": [0.0, 1.0, 2.0, 3.0],
    "max_priority": [5.0, 10.0, 20.0, math.inf],
    "min_size_bytes": [0, MiB // 2, MiB, 2 * MiB],
    "max_size_bytes": [1 << 29, 1 << 30, 1 << 31, math.inf],
    "min_changes": [0, 1, 2, 3],
}
PATTERNS = [(), ("/srv/*",), ("/srv/a/*",), ("/srv/a/x.db",), ("/srv/a/x.dz",), ("/srv/a/x.d*",)]
KEYS = ["/srv/a/x.db", "/srv/a/x.dz", "/srv/a/y.db", "/srv/b/x.db"]


def _pairs(method: str) -> list[tuple[ChannelConfig, ChannelConfig]]:
    """Pairs that differ from the base in one field of one side, and every pair of match patterns."""
    base = BASE[method]
    scale = MiB if method == "slack" else 1
    out = []
    for field, values in VARIED.items():
        for value in values:
            if field in ("min_priority", "max_priority"):
                value *= scale
            changed = dataclasses.replace(base, **{field: value})
            out += [(changed, base), (base, changed)]
    out += [(dataclasses.replace(base, match=a), dataclasses.replace(base, match=b)) for a in PATTERNS for b in PATTERNS]
    return out


def _takes(ch: ChannelConfig, key: str, file: int, active: int, changes: int | None, needs_upgrade: bool) -> bool:
    """As the router offers a key (``match`` first) and prices it (``Router.priority``)."""
    return ch.matches(key) and bool(compute(
        ch.priority, file=file, active=active, min_priority=ch.min_priority, max_priority=ch.max_priority,
        min_size=ch.min_size_bytes, max_size=ch.max_size_bytes, changes=changes, min_changes=ch.min_changes,
        needs_upgrade=needs_upgrade and ch.priority == "upgrade"))


@pytest.mark.parametrize("method", sorted(BASE))
def test_when_covers_says_so_no_key_the_later_channel_takes_is_refused_by_the_earlier(method: str) -> None:
    # Given pairs of channels one field apart, and databases at and just past every edge of both:
    # sizes at each size limit, live data putting the priority just either side of each threshold
    wrong = []
    for earlier, later in _pairs(method):
        if not covers(earlier, later):
            continue
        sizes = {int(v) + d for ch in (earlier, later) for v in (ch.min_size_bytes, ch.max_size_bytes)
                 if v != math.inf for d in (0, 1)} | {3 * MiB, 1 << 31}
        edges = {t for ch in (earlier, later) for t in (ch.min_priority, ch.max_priority) if t != math.inf}
        for file in sizes:
            if method == "ratio":
                near = {int(file / (t + d)) for t in edges for d in (-0.25, 0.25) if t + d > 0}
            else:
                near = {file - int(t) + d for t in edges for d in (-1, 1)}
            for active in {0, 1, file} | {a for a in near if 0 <= a <= file}:
                for changes in (None, 0, 1, 2, 3):
                    for key in KEYS:
                        for needs_upgrade in (False, True):
                            args = (key, file, active, changes, needs_upgrade)
                            # When covers() says the earlier channel shadows the later one
                            if _takes(later, *args) and not _takes(earlier, *args):
                                wrong.append((earlier, later, args))
    # Then the later channel takes no database the earlier one refuses
    assert wrong[:3] == []


# ------------------------------------------------------------------ built-ins left out of db_channels


def test_db_channels_without_the_built_ins_names_what_is_no_longer_compacted() -> None:
    c = parse("[smoosh]\ndb_channels = overnight_dbs\n[smoosh.overnight_dbs]\npriority = ratio\n"
              "min_priority = 5.0\nfrom = 20:00\nto = 06:00\n")
    assert c.warnings == (
        f"{PATH}: [smoosh] db_channels = 'overnight_dbs' drops ratio_dbs, slack_dbs: databases overnight_dbs "
        "refuses are never compacted (CouchDB always adds the built-ins back; list them to keep them)",
    )


def test_upgrade_dbs_is_named_only_when_there_is_an_upgrade_target() -> None:
    # Without a [smoosh.sqlite] target the SQLite compactor upgrades nothing: leaving it out loses nothing
    assert parse("[smoosh]\ndb_channels = ratio_dbs, slack_dbs\n").warnings == ()
    c = parse("[smoosh]\ndb_channels = ratio_dbs, slack_dbs\n[smoosh.sqlite]\npage_size = 4096\n")
    assert c.warnings == (
        f"{PATH}: [smoosh] db_channels = 'ratio_dbs, slack_dbs' drops upgrade_dbs: databases ratio_dbs and "
        "slack_dbs refuse are never compacted (CouchDB always adds the built-ins back; list them to keep them)",
    )


def test_a_listed_channel_that_takes_all_a_built_in_would_stands_in_for_it() -> None:
    # big_ratio takes every database ratio_dbs would: only slack_dbs is missed
    c = parse("[smoosh]\ndb_channels = big_ratio\n[smoosh.big_ratio]\nmin_priority = 1.5\n")
    assert c.warnings == (
        f"{PATH}: [smoosh] db_channels = 'big_ratio' drops slack_dbs: databases big_ratio refuses are never "
        "compacted (CouchDB always adds the built-ins back; list them to keep them)",
    )
    # and the built-in as CouchDB would read it is its own section, even when unlisted
    stricter = parse("[smoosh]\ndb_channels = big_ratio, slack_dbs\n[smoosh.big_ratio]\nmin_priority = 3\n"
                     "[smoosh.ratio_dbs]\nmin_priority = 4\n")
    assert [w for w in stricter.warnings if "drops" in w] == []


def test_an_empty_db_channels_says_nothing_is_compacted() -> None:
    assert parse("[smoosh]\ndb_channels =\n").warnings == (
        f"{PATH}: [smoosh] db_channels = '' drops ratio_dbs, slack_dbs: no database is ever compacted "
        "(CouchDB always adds the built-ins back; list them to keep them)",
    )


# ------------------------------------------------------------------ [smoosh.ignore]


@pytest.mark.parametrize("entry, warning", [
    ("_users", "_users: not a path (a CouchDB database name?): taken as /srv/_users, relative to the working "
               "directory; write the database file's path, or ./_users if that is what it is"),
    ("shards/00000000-1fffffff/_users.1529510412",
     "shards/00000000-1fffffff/_users.1529510412: a CouchDB shard name, not a path: smoosh ignores database "
     "files by path (or glob pattern), so this is /srv/shards/00000000-1fffffff/_users.1529510412 and matches "
     "nothing"),
    ("/elsewhere/a.db", "/elsewhere/a.db: matches no database: /elsewhere/a.db is outside every root (/srv/dbs)"),
    ("/elsewhere/*.db", "/elsewhere/*.db: matches no database: /elsewhere/*.db is outside every root (/srv/dbs)"),
])
def test_an_ignore_entry_that_cannot_name_a_database_is_warned_about(entry: str, warning: str) -> None:
    c = parse(f"[smoosh]\nwatch = /srv/dbs\n[smoosh.ignore]\n{entry} = true\n")
    assert c.warnings == (f"{PATH}: [smoosh.ignore] {warning}",)


@pytest.mark.parametrize("entry", ["dbs/scratch.db = true", "./dbs = true", "/srv/dbs/tmp/*.db = true",
                                   "/srv/*/tmp.db = true", "*.tmp.db = true", "_users = false"])
def test_paths_and_patterns_that_can_match_are_quiet(entry: str) -> None:
    assert parse(f"[smoosh]\nwatch = /srv/dbs\n[smoosh.ignore]\n{entry}\n").warnings == ()


# ------------------------------------------------------------------ where the warnings reach the operator


def test_a_reload_logs_the_fidelity_warnings(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = tmp_path / "local.ini"
    (tmp_path / "dbs").mkdir()
    config.write_text(OVERNIGHT.format(watch=tmp_path / "dbs"))  # the default store (var/smoosh) beside it
    delivered: list[object] = []
    watcher = ConfigWatcher(str(config), delivered.append)
    with caplog.at_level(logging.WARNING, logger="smoosh.config"):
        watcher.reload_now()
    assert isinstance(delivered[0], Config)
    assert f"{config}: {SHADOWED}" in [r.getMessage() for r in caplog.records]


def test_the_daemon_logs_them_once_at_start(tmp_path: Path) -> None:
    # Given the paste in a config the test daemon runs on (its own port, state and watched directory)
    config = write_config(tmp_path, port=free_port(), extra_global="db_channels = upgrade_dbs,ratio_dbs,slack_dbs,"
                          "overnight_dbs", channels=OVERNIGHT.split("\n\n", 2)[2])
    # When the daemon starts on it
    d = Daemon(config, env={"SMOOSH_LOG_LEVEL": "INFO"})
    try:
        d.wait_ready()
    finally:
        assert d.stop() == 0
    # Then each warning is in its log once
    log = d.log_path.read_text()
    assert log.count("channel overnight_dbs never gets work") == 1
    assert log.count("[smoosh.ignore] _users: not a path") == 1
