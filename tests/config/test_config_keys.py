"""Every key of [smoosh], [smoosh.<channel>] and [smoosh.sqlite]: units, defaults, errors."""

from __future__ import annotations

import math
import os
import socket
import textwrap

import pytest

from channels.window import Window
from smoosh.config import Config, parse_config
from smoosh.errors import ConfigError

PATH = "conf/smoosh.ini"


def parse(text: str, cwd: str = "/srv") -> Config:
    return parse_config(textwrap.dedent(text), PATH, cwd=cwd)


def error_of(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse(text)
    return info.value


# ------------------------------------------------------------------ defaults


def test_defaults_match_the_design(tmp_path: object) -> None:
    cwd = os.path.realpath(str(tmp_path))
    c = Config.default(cwd=cwd)
    assert c.path is None
    assert c.db_channels == ("upgrade_dbs", "ratio_dbs", "slack_dbs")
    assert c.view_channels == ()
    assert c.cleanup_channels == ("index_cleanup",)
    assert list(c.channels) == ["upgrade_dbs", "ratio_dbs", "slack_dbs", "index_cleanup"]
    assert c.staleness_s == 300.0
    assert c.persist is True
    assert c.state_dir == os.path.join(cwd, "var/smoosh")
    assert c.wait_s == 30.0
    assert c.checkpoint_interval_s == 180.0
    assert c.access_max_size == 250000
    assert c.compaction_log_level == "info"
    assert c.log_format == "text"
    assert c.store == "sqlite:" + os.path.join(cwd, "var/smoosh/jobs.db")
    assert c.watch == (os.path.join(cwd, "var/databases"),)
    assert c.roots == (os.path.join(cwd, "var/databases"),)
    assert c.node == socket.gethostname()
    assert c.http == "127.0.0.1:5986"
    assert c.token is None
    assert c.health_threshold_s == 120.0
    assert c.backoff_base_s == 30.0
    assert c.max_history == 20
    assert c.busy_retries == 10
    assert c.job_timeout_s == 30.0
    assert c.max_jobs == 4
    assert c.interval_s == 60.0
    assert c.max_churn == 20
    assert c.recheck_interval_s == 10.0
    assert c.exact_size_interval_s == 3600.0
    assert c.rescan_interval_s == 600.0
    assert c.wal_max_size_bytes == 64 * 1024 * 1024
    assert c.ignore == ()
    assert c.warnings == ()
    assert (c.sqlite.page_size, c.sqlite.auto_vacuum) == (None, None)
    assert (c.sqlite.incremental_chunk_pages, c.sqlite.busy_timeout_s) == (1000, 1.0)
    assert c.sqlite.analyze is False


def test_channel_defaults_follow_the_method_of_the_name() -> None:
    c = parse("[smoosh]\n")
    up, ratio, slack, cleanup = (c.channels[n] for n in ("upgrade_dbs", "ratio_dbs", "slack_dbs", "index_cleanup"))
    assert (up.priority, up.min_priority) == ("upgrade", 2.0)
    assert (ratio.priority, ratio.min_priority) == ("ratio", 2.0)
    assert (slack.priority, slack.min_priority) == ("slack", 536870912)
    assert (cleanup.priority, cleanup.kind) == ("ratio", "cleanup")
    assert ratio.kind == "db"
    assert ratio.max_priority == math.inf
    assert ratio.min_size_bytes == 1048576
    assert ratio.max_size_bytes == math.inf
    assert (ratio.min_changes, ratio.capacity, ratio.concurrency) == (0, 9999, 1)
    assert (ratio.window, ratio.strict_window, ratio.timezone, ratio.match) == (None, False, None, ())


# ------------------------------------------------------------------ [smoosh]


def test_global_keys_parse_with_units() -> None:
    c = parse(
        """
        [smoosh]
        staleness = 2
        persist = no
        state_dir = state
        wait_secs = 1m
        checkpoint_interval = 90
        access_max_size = 1000
        compaction_log_level = notice
        log_format = JSON
        store = sqlite:jobs/jobs.db
        node = node-a
        http = localhost:8080
        token = s3cr%t-long-enough
        health_threshold = 2m
        backoff_base = 500ms
        max_history = 5
        busy_retries = 0
        job_timeout = 45
        max_jobs = 8
        interval = 2m
        max_churn = 3
        recheck_interval = 0
        exact_size_interval = 2h
        rescan_interval = 1d
        wal_max_size = 1GB
        """
    )
    assert c.staleness_s == 120.0  # bare staleness is minutes, as in CouchDB
    assert c.persist is False
    assert c.state_dir == "/srv/state"
    assert c.wait_s == 60.0
    assert c.checkpoint_interval_s == 90.0
    assert c.access_max_size == 1000
    assert c.compaction_log_level == "info"
    assert c.log_format == "json"
    assert c.store == "sqlite:/srv/jobs/jobs.db"
    assert c.node == "node-a"
    assert c.http_host_port() == ("localhost", 8080)
    assert c.token == "s3cr%t-long-enough"  # no interpolation
    assert c.health_threshold_s == 120.0
    assert c.backoff_base_s == 0.5
    assert c.max_history == 5
    assert c.busy_retries == 0
    assert c.job_timeout_s == 45.0
    assert c.max_jobs == 8
    assert c.interval_s == 120.0
    assert c.max_churn == 3
    assert c.recheck_interval_s == 0.0
    assert c.exact_size_interval_s == 7200.0
    assert c.rescan_interval_s == 86400.0
    assert c.wal_max_size_bytes == 10**9
    assert c.warnings == ()


@pytest.mark.parametrize(
    ("store", "expected"),
    [("memory:", "memory:"), ("fdb:", "fdb:"), ("fdb:etc/fdb.cluster", "fdb:/srv/etc/fdb.cluster"),
     ("sqlite:/abs/jobs.db", "sqlite:/abs/jobs.db")],
)
def test_store_urls(store: str, expected: str) -> None:
    assert parse(f"[smoosh]\nstore = {store}\n").store == expected


def test_watch_and_roots_resolve_against_the_working_directory(tmp_path: object) -> None:
    cwd = os.path.realpath(str(tmp_path))
    os.makedirs(os.path.join(cwd, "real", "dbs"))
    os.symlink(os.path.join(cwd, "real"), os.path.join(cwd, "link"))
    c = parse("[smoosh]\nwatch = link/dbs, /data/*/shards/*.db,\n", cwd=cwd)
    assert c.watch == (os.path.join(cwd, "real", "dbs"), "/data/*/shards/*.db")
    # Roots default to the watched directories; a glob contributes its static prefix.
    assert c.roots == (os.path.join(cwd, "real", "dbs"), "/data")
    c = parse("[smoosh]\nwatch = dbs\nroots = /a, b\n", cwd=cwd)
    assert c.roots == ("/a", os.path.join(cwd, "b"))
    c = parse("[smoosh]\nwatch =\nroots = /a\n", cwd=cwd)
    assert (c.watch, c.roots) == ((), ("/a",))


@pytest.mark.parametrize(
    ("http", "host", "port"),
    [("127.0.0.1:5986", "127.0.0.1", 5986), ("[::1]:5986", "::1", 5986), ("localhost:0", "localhost", 0),
     ("127.1.2.3:65535", "127.1.2.3", 65535)],
)
def test_loopback_http_needs_no_token(http: str, host: str, port: int) -> None:
    assert parse(f"[smoosh]\nhttp = {http}\n").http_host_port() == (host, port)


def test_off_loopback_http_with_a_token_is_accepted() -> None:
    c = parse("[smoosh]\nhttp = 0.0.0.0:5986\ntoken = a-token-of-16-bytes\n")
    assert c.http_host_port() == ("0.0.0.0", 5986)
    c = parse("[smoosh]\nhttp = [2001:db8::1]:80\ntoken = a-token-of-16-bytes\n")
    assert c.http_host_port() == ("2001:db8::1", 80)
    c = parse("[smoosh]\nhttp = db-host.example.com:5986\ntoken = a-token-of-16-bytes\n")
    assert c.http_host_port() == ("db-host.example.com", 5986)


def test_off_loopback_http_without_token_names_http_and_token() -> None:
    e = error_of("[smoosh]\nhttp = 0.0.0.0:5986\n")
    assert str(e) == "conf/smoosh.ini: [smoosh] http = '0.0.0.0:5986': binding off loopback needs [smoosh] token"
    assert (e.path, e.section, e.key, e.value) == (PATH, "smoosh", "http", "0.0.0.0:5986")
    e = error_of("[smoosh]\nhttp = [::]:5986\n")
    assert str(e) == "conf/smoosh.ini: [smoosh] http = '[::]:5986': binding off loopback needs [smoosh] token"
    # A token written empty is an error of its own (issue 45): never silently no token
    e = error_of("[smoosh]\nhttp = [::]:5986\ntoken =\n")
    assert (e.key, str(e)) == ("token", "conf/smoosh.ini: [smoosh] token = '': empty: a token must be a long random "
                                        "string (at least 16 bytes); remove the line for no token")


@pytest.mark.parametrize("http", ["5986", "127.0.0.1", "127.0.0.1:65536", "::1:5986", "[::1]5986",
                                  "[nothost]:1", "bad_host!:1", ":5986", "127.0.0.1:-1"])
def test_malformed_http_is_an_error(http: str) -> None:
    e = error_of(f"[smoosh]\nhttp = {http}\ntoken = t\n")
    assert str(e) == (f"conf/smoosh.ini: [smoosh] http = {http!r}: must be HOST:PORT (port 0-65535; "
                      "an IPv6 host in brackets, e.g. [::1]:5986)")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("staleness = 5 minutes",
         "[smoosh] staleness = '5 minutes': must be a duration >= 0s (e.g. 90s, 5m, 2h; a bare number is minutes)"),
        ("wait_secs = -1",
         "[smoosh] wait_secs = '-1': must be a duration >= 0s (e.g. 90s, 5m, 2h; a bare number is seconds)"),
        ("job_timeout = 0",
         "[smoosh] job_timeout = '0': must be a duration > 0s (e.g. 90s, 5m, 2h; a bare number is seconds)"),
        ("persist = maybe", "[smoosh] persist = 'maybe': must be true or false"),
        ("max_jobs = 0", "[smoosh] max_jobs = '0': must be an integer >= 1"),
        ("max_history = 2.5", "[smoosh] max_history = '2.5': must be an integer >= 0"),
        ("busy_retries = -1", "[smoosh] busy_retries = '-1': must be an integer >= 0"),
        ("access_max_size = lots", "[smoosh] access_max_size = 'lots': must be an integer >= 0"),
        ("wal_max_size = infinity",
         "[smoosh] wal_max_size = 'infinity': must be a size in bytes >= 0 (e.g. 1048576, 512MiB, 1GB)"),
        ("compaction_log_level = loud",
         "[smoosh] compaction_log_level = 'loud': must be debug, info, notice, warning or error"),
        ("log_format = logfmt", "[smoosh] log_format = 'logfmt': must be text or json"),
        ("store = postgres://x", "[smoosh] store = 'postgres://x': must be memory:, sqlite:PATH, fdb: or fdb:CLUSTER_FILE"),
        ("store = sqlite:", "[smoosh] store = 'sqlite:': sqlite: needs a path, e.g. sqlite:var/smoosh/jobs.db"),
        ("db_channels = ratio_dbs, ratio_dbs", "[smoosh] db_channels = 'ratio_dbs, ratio_dbs': channel 'ratio_dbs' is listed twice"),
        ("db_channels = big dbs", "[smoosh] db_channels = 'big dbs': channel 'big dbs' must match [A-Za-z0-9_-]+"),
        ("db_channels = ignore", "[smoosh] db_channels = 'ignore': channel 'ignore' is a reserved section name"),
    ],
)
def test_bad_global_values_give_exact_messages(line: str, message: str) -> None:
    assert str(error_of(f"[smoosh]\n{line}\n")) == f"{PATH}: {message}"


def test_a_channel_in_two_lists_is_an_error() -> None:
    e = error_of("[smoosh]\ndb_channels = a, b\ncleanup_channels = b\n")
    assert str(e) == "conf/smoosh.ini: [smoosh] cleanup_channels = 'b': channel 'b' is also in db_channels"


# ------------------------------------------------------------------ channels


def test_channel_keys_parse_with_units() -> None:
    c = parse(
        """
        [smoosh]
        db_channels = big_dbs, slack_dbs
        [smoosh.big_dbs]
        min_priority = 3.5
        max_priority = 100
        min_size = 1GiB
        max_size = 1TB
        min_changes = 10
        capacity = 50
        concurrency = 0
        from = 23:30
        to = 3:52
        timezone = Europe/Berlin
        strict_window = true
        match = dbs/big/*.db, /abs/[ab]*.sqlite
        [smoosh.slack_dbs]
        min_priority = 512MiB
        max_priority = 10GB
        max_size = infinity
        """
    )
    big = c.channels["big_dbs"]
    assert big.priority == "ratio"
    assert (big.min_priority, big.max_priority) == (3.5, 100.0)
    assert (big.min_size_bytes, big.max_size_bytes) == (1024**3, 10**12)
    assert (big.min_changes, big.capacity, big.concurrency) == (10, 50, 0)
    assert big.window == Window.parse("23:30", "3:52", "Europe/Berlin")
    assert (big.timezone, big.strict_window) == ("Europe/Berlin", True)
    assert big.match == ("/srv/dbs/big/*.db", "/abs/[ab]*.sqlite")
    slack = c.channels["slack_dbs"]
    assert (slack.min_priority, slack.max_priority, slack.max_size_bytes) == (536870912, 10**10, math.inf)


def test_method_comes_from_the_key_then_a_built_ins_name_then_ratio_as_in_couchdb() -> None:
    # CouchDB: only the built-in names fix a method; any other channel reads `priority`, default ratio
    c = parse(
        """
        [smoosh]
        db_channels = upgrade_dbs, slack_dbs, ratio_dbs, upgrade_x, slack_x, plain, explicit
        view_channels = slack_views, upgrade_views
        [smoosh.explicit]
        priority = Slack
        """
    )
    assert {n: c.channels[n].priority for n in (*c.db_channels, *c.view_channels)} == {
        "upgrade_dbs": "upgrade", "slack_dbs": "slack", "ratio_dbs": "ratio", "upgrade_x": "ratio",
        "slack_x": "ratio", "plain": "ratio", "explicit": "slack", "slack_views": "slack", "upgrade_views": "upgrade",
    }
    assert c.channels["explicit"].min_priority == 536870912
    assert c.channels["slack_x"].min_priority == 2.0


def test_a_channel_named_for_slack_without_a_priority_key_is_a_ratio_channel_and_warned_about() -> None:
    # Given CouchDB's reading of [smoosh.slack_overnight] min_priority = 3.0: a ratio above 3
    c = parse(
        """
        [smoosh]
        db_channels = upgrade_dbs, ratio_dbs, slack_dbs, slack_overnight
        [smoosh.slack_overnight]
        min_priority = 3.0
        from = 20:00
        to = 06:00
        """
    )
    # Then it is a ratio channel with a ratio threshold, not a slack one of 3 bytes
    overnight = c.channels["slack_overnight"]
    assert (overnight.priority, overnight.min_priority) == ("ratio", 3.0)
    # And the name's hint is answered with what is in force and how to say otherwise
    assert c.warnings[0] == (
        "conf/smoosh.ini: [smoosh.slack_overnight]: no priority key, so the method is ratio, as in CouchDB (only "
        "the built-in channels take theirs from their name), though the name says slack: write priority = slack "
        "if that is what it is for"
    )


def test_a_size_threshold_on_a_channel_named_for_slack_says_why_it_is_a_ratio() -> None:
    with pytest.raises(ConfigError) as caught:
        parse("[smoosh]\ndb_channels = slack_big\n[smoosh.slack_big]\nmin_priority = 512MiB\n")
    assert str(caught.value) == (
        "conf/smoosh.ini: [smoosh.slack_big] min_priority = '512MiB': a ratio threshold takes no unit; the method "
        "is ratio (no priority key; only the built-in channels take theirs from their name): for a threshold in "
        "bytes write priority = slack"
    )
    explicit = parse("[smoosh]\ndb_channels = slack_big\n[smoosh.slack_big]\npriority = slack\nmin_priority = 512MiB\n")
    assert explicit.channels["slack_big"].min_priority == 512 * 1024**2


def test_priority_key_overriding_a_built_ins_method_is_warned_about() -> None:
    c = parse("[smoosh]\ndb_channels = upgrade_dbs, ratio_dbs\n[smoosh.ratio_dbs]\npriority = slack\n")
    assert c.channels["ratio_dbs"].priority == "slack"
    assert c.warnings == (
        "conf/smoosh.ini: [smoosh.ratio_dbs] priority = 'slack': overrides the built-in ratio_dbs's method (CouchDB would use ratio)",
    )
    # A channel that is not a built-in reads its key in CouchDB too: nothing to say
    assert parse("[smoosh]\ndb_channels = ratio_dbs, slack_dbs, ratio_small\n[smoosh.ratio_small]\n"
                 "priority = slack\nmin_priority = 100MiB\n").warnings == ()


def test_only_from_or_only_to_defaults_the_other_end() -> None:
    c = parse("[smoosh]\n[smoosh.ratio_dbs]\nfrom = 22:00\n[smoosh.slack_dbs]\nto = 6:00\n")
    assert c.channels["ratio_dbs"].window == Window.parse("22:00", "24:00")
    assert c.channels["slack_dbs"].window == Window.parse("00:00", "6:00")


def test_timezone_without_window_is_kept_and_checked() -> None:
    c = parse("[smoosh]\n[smoosh.ratio_dbs]\ntimezone = Asia/Tokyo\n")
    assert (c.channels["ratio_dbs"].timezone, c.channels["ratio_dbs"].window) == ("Asia/Tokyo", None)


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ("capacity = 0", "[smoosh.ratio_dbs] capacity = '0': must be an integer >= 1"),
        ("capacity = 10k", "[smoosh.ratio_dbs] capacity = '10k': must be an integer >= 1"),
        ("concurrency = -1", "[smoosh.ratio_dbs] concurrency = '-1': must be an integer >= 0"),
        ("min_changes = many", "[smoosh.ratio_dbs] min_changes = 'many': must be an integer >= 0"),
        ("min_priority = 2MiB", "[smoosh.ratio_dbs] min_priority = '2MiB': a ratio threshold takes no unit"),
        ("max_priority = 5 x", "[smoosh.ratio_dbs] max_priority = '5 x': a ratio threshold takes no unit"),
        ("min_priority = infinity", "[smoosh.ratio_dbs] min_priority = 'infinity': must be a number >= 0"),
        ("max_priority = lots", "[smoosh.ratio_dbs] max_priority = 'lots': must be a number >= 0 or infinity"),
        ("max_priority = 1.5", "[smoosh.ratio_dbs] max_priority = '1.5': must be greater than min_priority (2)"),
        ("min_size = big",
         "[smoosh.ratio_dbs] min_size = 'big': must be a size in bytes >= 0 (e.g. 1048576, 512MiB, 1GB)"),
        ("max_size = 1MiB", "[smoosh.ratio_dbs] max_size = '1MiB': must be greater than min_size (1048576)"),
        ("priority = fastest", "[smoosh.ratio_dbs] priority = 'fastest': must be ratio, slack or upgrade"),
        ("strict_window = sometimes", "[smoosh.ratio_dbs] strict_window = 'sometimes': must be true or false"),
        ("from = 25:00", "[smoosh.ratio_dbs] from = '25:00': invalid window time '25:00': hours must be 0-23"),
        ("from = 1:00\nto = 7pm", "[smoosh.ratio_dbs] to = '7pm': invalid window time '7pm': expected H:MM or HH:MM"),
        ("to = 24:01", "[smoosh.ratio_dbs] to = '24:01': invalid window time '24:01': hours must be 0-23"),
        ("timezone = Mars/Olympus",
         "[smoosh.ratio_dbs] timezone = 'Mars/Olympus': unknown time zone (use an IANA name such as Europe/Berlin)"),
    ],
)
def test_bad_channel_values_give_exact_messages(lines: str, message: str) -> None:
    e = error_of(f"[smoosh]\n[smoosh.ratio_dbs]\n{lines}\n")
    assert str(e) == f"{PATH}: {message}"
    assert (e.path, e.section) == (PATH, "smoosh.ratio_dbs")


def test_slack_threshold_errors_mention_sizes() -> None:
    e = error_of("[smoosh]\n[smoosh.slack_dbs]\nmin_priority = 2.5 bytes\n")
    assert str(e) == ("conf/smoosh.ini: [smoosh.slack_dbs] min_priority = '2.5 bytes': "
                      "must be a size in bytes >= 0 (e.g. 1048576, 512MiB, 1GB)")
    e = error_of("[smoosh]\n[smoosh.slack_dbs]\nmax_priority = 100MiB\n")
    assert str(e) == ("conf/smoosh.ini: [smoosh.slack_dbs] max_priority = '100MiB': "
                      "must be greater than min_priority (536870912)")


def test_match_limits_a_channel_to_matching_keys() -> None:
    c = parse("[smoosh]\n[smoosh.ratio_dbs]\nmatch = big/*.db, /x/exact.db\n")
    ratio = c.channels["ratio_dbs"]
    assert ratio.matches("/srv/big/a.db")
    assert ratio.matches("/x/exact.db")
    assert ratio.matches("cleanup:/srv/big/a.db")
    assert not ratio.matches("/srv/small/a.db")
    assert not ratio.matches("/srv/big/a.DB")
    assert c.channels["slack_dbs"].matches("/anything")


# ------------------------------------------------------------------ [smoosh.sqlite]


def test_sqlite_section_parses() -> None:
    c = parse("[smoosh.sqlite]\npage_size = 8192\nauto_vacuum = 2\nincremental_chunk_pages = 50\nbusy_timeout = 250ms\n")
    assert (c.sqlite.page_size, c.sqlite.auto_vacuum) == (8192, "incremental")
    assert (c.sqlite.incremental_chunk_pages, c.sqlite.busy_timeout_s) == (50, 0.25)
    assert parse("[smoosh.sqlite]\nauto_vacuum = FULL\nbusy_timeout = 3\n").sqlite.auto_vacuum == "full"
    assert parse("[smoosh.sqlite]\nbusy_timeout = 3\n").sqlite.busy_timeout_s == 3.0
    assert parse("[smoosh.sqlite]\nanalyze = true\n").sqlite.analyze is True


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("page_size = 1000", "page_size = '1000': must be a power of two from 512 to 65536"),
        ("page_size = 256", "page_size = '256': must be a power of two from 512 to 65536"),
        ("page_size = 131072", "page_size = '131072': must be a power of two from 512 to 65536"),
        ("auto_vacuum = sometimes", "auto_vacuum = 'sometimes': must be none, full or incremental (or 0, 1, 2)"),
        ("incremental_chunk_pages = 0", "incremental_chunk_pages = '0': must be an integer >= 1"),
        ("busy_timeout = soon",
         "busy_timeout = 'soon': must be a duration >= 0s (e.g. 90s, 5m, 2h; a bare number is seconds)"),
        ("analyze = sometimes", "analyze = 'sometimes': must be true or false"),
    ],
)
def test_bad_sqlite_values_give_exact_messages(line: str, message: str) -> None:
    assert str(error_of(f"[smoosh.sqlite]\n{line}\n")) == f"{PATH}: [smoosh.sqlite] {message}"
