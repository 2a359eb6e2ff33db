"""Live reload: every config key either applies to the running server or is named in restart_required.

One row per key of ``[smoosh]`` and ``[smoosh.sqlite]``: the reload changes that key alone, and
the probe reads what the running server now does with it. A key that nothing applies fails
here, so no key can be silently ignored again.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from compactor.dbfactory import make_bloated_db
from helpers.daemon import HANG_S, config_text, wait_for
from smoosh import Server, logs
from smoosh.config import GLOBAL_KEYS, RESTART_KEYS, SQLITE_KEYS, parse_config


def settings(tmp_path: Path) -> dict[str, str]:
    return {
        "watch": str(tmp_path / "dbs"),
        "roots": str(tmp_path / "dbs"),
        "state_dir": str(tmp_path / "state"),
        "store": f"sqlite:{tmp_path / 'state' / 'jobs.db'}",
        "node": "t",
        "wait_secs": "0",
        "staleness": "5",
    }


def make(tmp_path: Path, extra: str = "") -> Any:
    (tmp_path / "dbs").mkdir(exist_ok=True)
    (tmp_path / "state").mkdir(exist_ok=True)
    text = config_text(settings(tmp_path), extra_global=extra)
    return parse_config(text, str(tmp_path / "smoosh.ini"))


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    s = Server(make(tmp_path), workers=1, watch_config=False)
    s.start()
    yield s
    s.stop()
    logs.set_format(logs.DEFAULT_LOG_FORMAT)  # the choice is per process: leave the default behind


def sqlite_compactor(s: Server) -> Any:
    return s._compactors[0]


def worker(s: Server) -> Any:
    return s._worker


def live(new: str, probe: Callable[[Server], bool]) -> tuple[str, Callable[[Server], bool]]:
    return new, probe


#: key -> (its new value as written in the file, what the running server does with it).
LIVE: dict[str, tuple[str, Callable[[Server], bool]]] = {
    "db_channels": live("ratio_dbs, big_dbs", lambda s: "big_dbs" in s.channels()),
    "view_channels": live("view_dbs", lambda s: "view_dbs" in s.channels()),
    "cleanup_channels": live("wal_cleanup", lambda s: "wal_cleanup" in s.channels() and "index_cleanup" not in s.channels()),
    "staleness": live("9", lambda s: s._access.staleness_s == 540),
    "persist": live("false", lambda s: all(ch._checkpointer is None for ch in s.channels().values())),
    "wait_secs": live("3600", lambda s: s.config.wait_s == 3600),  # read when a channel starts
    "checkpoint_interval": live("7s", lambda s: all(ch._checkpoint_interval_s == 7 for ch in s.channels().values())),
    "access_max_size": live("12", lambda s: s._access.max_size == 12),
    "compaction_log_level": live("warning", lambda s: s.config.compaction_log_level == "warning"),
    # The handler `smoosh run` installs switches format (tests/ops/test_logs.py has it end to end).
    "log_format": live("json", lambda s: logs.current_format() == "json"),
    "watch": live("{other}", lambda s: [e.root for e in s._housekeeping.watcher.entries] == [s.config.watch[0]]),
    "roots": live("{other}", lambda s: sqlite_compactor(s).roots == s.config.roots),
    # Opt-ins name roots: the test sets roots = {other} beside them.
    "allow_hard_links": live("{other}", lambda s: sqlite_compactor(s).roots.allow_hard_links == set(s.config.roots)),
    "allow_mounts": live("{other}", lambda s: sqlite_compactor(s).roots.allow_mounts == set(s.config.roots)),
    "token": live("s3cret-0123456789", lambda s: s.config.token == "s3cret-0123456789"),  # the admin server reads it per request
    "health_threshold": live("7s", lambda s: s._history.health_threshold_s == 7),
    "backoff_base": live("9s", lambda s: s._history.backoff_base_s == 9),
    "max_history": live("3", lambda s: s._history.max_history == 3),
    "busy_retries": live("4", lambda s: s._history.busy_retries == 4),
    "job_timeout": live("11s", lambda s: worker(s).job_timeout_s == 11 and s.jobs.get_type_timeout(s.job_type) == 11),
    "max_jobs": live("3", lambda s: s._slots.limit == 3 and s.controller.max_jobs == 3),
    "cluster_max_jobs": live("5", lambda s: s._cap.limit == 5 and s.status()["cluster"]["max_jobs"] == 5),
    "interval": live("5s", lambda s: s._housekeeping._next_rotation <= s._clocks.monotonic() + 5),
    "max_churn": live("2", lambda s: s.config.max_churn == 2),  # read at every rotation
    "recheck_interval": live("3s", lambda s: s.intake.debouncer._recheck_interval_s == 3),
    "exact_size_interval": live("2m", lambda s: sqlite_compactor(s).exact_size_interval_s == 120),
    "rescan_interval": live("30s", lambda s: s._housekeeping.watcher._rescan_interval_s == 30),
    "wal_max_size": live("1MiB", lambda s: sqlite_compactor(s).wal_max_size_bytes == 1 << 20),
    "max_io_rate": live("5MiB", lambda s: s.io_budget.rate_bytes_per_s == 5 << 20),
    "min_free_space": live("7%", lambda s: s.disk_room.min_free.fraction == 0.07),
    "disk_pressure": live("80%", lambda s: s.pressure.threshold == 0.8),
    "min_jobs": live("2", lambda s: s.controller.min_jobs == 2),
    "backlog_full": live("1GiB", lambda s: s.controller.backlog_full_bytes == 1 << 30),
    "batch_max_size": live("1MiB", lambda s: s._batchable.__self__.config.batch_max_size_bytes == 1 << 20),
    "io_priority": live("idle", lambda s: worker(s)._io_priority() == "idle"),  # read at every start
    "ignore": live("", lambda s: True),  # not a [smoosh] key in files: skipped below
}
SQLITE_LIVE: dict[str, tuple[str, Callable[[Server], bool]]] = {
    "page_size": live("8192", lambda s: sqlite_compactor(s).page_size == 8192),
    "auto_vacuum": live("incremental", lambda s: sqlite_compactor(s).auto_vacuum == "incremental"),
    "incremental_chunk_pages": live("77", lambda s: sqlite_compactor(s).incremental_chunk_pages == 77),
    "busy_timeout": live("3s", lambda s: sqlite_compactor(s).busy_timeout_s == 3),
    "analyze": live("true", lambda s: sqlite_compactor(s).analyze is True),
    "max_lock_hold": live("250ms", lambda s: sqlite_compactor(s).max_lock_hold_s == 0.25),
}


def test_every_key_is_accounted_for() -> None:
    # A new key must get a row here: applied live, or named in RESTART_KEYS.
    keys = set(GLOBAL_KEYS) - {"ignore"}
    assert keys - set(LIVE) - set(RESTART_KEYS) == set()
    assert set(SQLITE_KEYS) == set(SQLITE_LIVE)


@pytest.mark.parametrize("key", sorted(set(GLOBAL_KEYS) - set(RESTART_KEYS) - {"ignore"}))
def test_a_global_key_applies_live(key: str, server: Server, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    value, probe = LIVE[key]
    value = value.format(other=other)
    extra = f"{key} = {value}" + (f"\nroots = {other}" if key in ("watch", "allow_hard_links", "allow_mounts") else "")
    server.apply_config(make(tmp_path, extra))
    assert server.status()["restart_required"] == []
    wait_for(lambda: probe(server), HANG_S, what=f"{key} applied")


@pytest.mark.parametrize("key", sorted(RESTART_KEYS))
def test_a_key_that_cannot_apply_live_is_named_in_restart_required(key: str, server: Server, tmp_path: Path) -> None:
    value = {"store": "memory:", "http": "127.0.0.1:9", "node": "elsewhere", "state_dir": str(tmp_path / "s2"),
             "cpu_scheduling": "normal"}[key]
    server.apply_config(make(tmp_path, f"{key} = {value}"))
    assert server.status()["restart_required"] == [key]


@pytest.mark.parametrize("key", sorted(RESTART_KEYS))
def test_an_edit_that_needed_a_restart_is_cleared_when_it_is_reverted(
    key: str, server: Server, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Given an edit of a key that cannot apply live, then a second edit of another key
    value = {"store": "memory:", "http": "127.0.0.1:9", "node": "elsewhere", "state_dir": str(tmp_path / "s2"),
             "cpu_scheduling": "normal"}[key]
    caplog.set_level(logging.INFO, logger="smoosh.daemon.server")
    server.apply_config(make(tmp_path, f"{key} = {value}"))
    server.apply_config(make(tmp_path, f"{key} = {value}\nmax_jobs = 3"))
    assert server.status()["restart_required"] == [key]
    # When the edit is put back to what the daemon started with
    server.apply_config(make(tmp_path, "max_jobs = 3"))
    # Then nothing needs a restart any more, and the log said each change once
    assert server.status()["restart_required"] == []
    said = [r.getMessage() for r in caplog.records if "restart" in r.getMessage()]
    assert said == [f"config keys changed that need a restart: {key}",
                    f"config keys that needed a restart are back to what the daemon runs with: {key}"]


@pytest.mark.parametrize("key", sorted(SQLITE_KEYS))
def test_a_sqlite_key_applies_live(key: str, server: Server, tmp_path: Path) -> None:
    value, probe = SQLITE_LIVE[key]
    config = make(tmp_path)
    text = config_text(settings(tmp_path), channels=f"[smoosh.sqlite]\n{key} = {value}\n")
    config = parse_config(text, str(tmp_path / "smoosh.ini"))
    server.apply_config(config)
    assert probe(server)


def test_the_compaction_log_level_applies_to_the_next_compaction(server: Server, tmp_path: Path, caplog: Any) -> None:
    server.apply_config(make(tmp_path, "compaction_log_level = warning"))
    db = tmp_path / "dbs" / "a.db"
    make_bloated_db(str(db), rows=3000, delete_fraction=0.9)
    with caplog.at_level(logging.INFO, logger="smoosh.daemon.server"):
        server.enqueue(str(db))
        deadline = time.monotonic() + 20
        while not any("compacted" in r.getMessage() for r in caplog.records) and time.monotonic() < deadline:
            time.sleep(0.02)
    done = [r for r in caplog.records if r.getMessage().startswith(f"compacted {str(db)!r}")]
    assert [r.levelno for r in done] == [logging.WARNING]


def test_removing_the_token_by_a_live_edit_is_a_warning_and_setting_it_is_not(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a daemon running with a token
    s = Server(make(tmp_path, "token = s3cret-0123456789"), workers=0, watch_config=False)
    s.start()
    try:
        caplog.set_level(logging.INFO, logger="smoosh.daemon.server")
        # When a live edit removes it
        s.apply_config(make(tmp_path))
        # Then that is said at WARNING: every POST on loopback is open now
        removed = [r for r in caplog.records if r.getMessage().startswith("token removed by a live edit")]
        assert [(r.levelname, r.getMessage()) for r in removed] == [(
            "WARNING", "token removed by a live edit: POST requests on loopback no longer need a bearer token "
                       "(any local process may enqueue, suspend, resume and flush)")]
        assert s.config.token is None
        # ... and setting one again is an INFO line
        caplog.clear()
        s.apply_config(make(tmp_path, "token = an0ther-0123456789"))
        assert [(r.levelname, r.getMessage()) for r in caplog.records if "token" in r.getMessage()] == [
            ("INFO", "token set by a live edit: POST requests need the new one")]
    finally:
        s.stop()
