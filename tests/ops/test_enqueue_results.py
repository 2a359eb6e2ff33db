"""What became of each enqueued key (DESIGN §4.2, §11; issue 19): `POST /enqueue?wait=1`
through a real socket, and `smoosh enqueue` through the real CLI."""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest
from opslib import request, smoosh_cli

from compactor.dbfactory import make_bloated_db
from helpers.chunked import STALLED_AFTER_FIRST_CHUNK, chunk_section, chunked_db
from helpers.daemon import HANG_S, Daemon, free_port, wait_for, write_config

#: A database small enough to be below every channel's min_size (64KiB in the tests' config).
TINY_ROWS = 10


class Fleet:
    """A daemon whose channels stay paused (nothing runs), staleness 5 min, and its files."""

    def __init__(self, base: Path) -> None:
        self.base = Path(os.path.realpath(base))
        self.dbs = self.base / "dbs"
        self.dbs.mkdir(exist_ok=True)
        ignore = f"\n[smoosh.ignore]\n{self.dbs / 'ignored.db'} = true\n"
        config = write_config(self.base, port=free_port(), channels=ignore,
                              extra_global=f"wait_secs = 3600\nstaleness = 5\nwatch =\nroots = {self.dbs}")
        self.daemon = Daemon(config)
        self.daemon.wait_ready()

    def db(self, name: str, **kw: Any) -> str:
        path = self.dbs / name
        make_bloated_db(str(path), **kw)
        return str(path)

    def enqueue(self, *keys: str, wait: bool = True) -> tuple[int, Any]:
        reply = request(self.daemon.url + ("/enqueue?wait=1" if wait else "/enqueue"), "POST", {"keys": list(keys)})
        return reply.status, reply.json()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    f = Fleet(tmp_path_factory.mktemp("fleet"))
    yield f
    f.daemon.kill()


def one(fleet: Fleet, key: str) -> dict[str, Any]:
    status, body = fleet.enqueue(key)
    assert status == 200
    (result,) = body["results"]
    assert result["key"] == key
    return result


def test_a_bloated_database_is_queued_with_its_channel_and_priority(fleet: Fleet) -> None:
    key = fleet.db("bloated.db", delete_fraction=0.9)
    result = one(fleet, key)
    assert result.pop("priority") > 2.0  # file / live bytes, past ratio_dbs' min_priority
    assert result == {"key": key, "outcome": "queued", "channel": "ratio_dbs", "reason": None}


def test_a_key_taken_moments_ago_is_stale_until_a_time(fleet: Fleet) -> None:
    key = fleet.db("again.db", delete_fraction=0.9)
    assert one(fleet, key)["outcome"] == "queued"
    result = one(fleet, key)
    assert (result["outcome"], result["channel"], result["priority"]) == ("not_queued", None, None)
    assert re.fullmatch(r"stale until \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \(a channel took it less than staleness ago\)",
                        result["reason"]), result


def test_a_database_below_every_threshold_says_each_channels_numbers(fleet: Fleet) -> None:
    key = fleet.db("tiny.db", rows=TINY_ROWS)
    size = os.path.getsize(key)
    result = one(fleet, key)
    assert result["outcome"] == "not_queued"
    assert result["reason"].startswith(f"below every channel's threshold (file {size} bytes, live ")
    assert result["reason"].endswith(f"upgrade_dbs: no upgrade needed; ratio_dbs: file {size} bytes <= min_size 65536; "
                                     f"slack_dbs: file {size} bytes <= min_size 65536")


def test_an_ignored_database_says_so(fleet: Fleet) -> None:
    key = fleet.db("ignored.db", delete_fraction=0.9)
    assert one(fleet, key)["reason"] == "ignored ([smoosh.ignore])"


@pytest.mark.parametrize("name, reason", [
    ("missing.db", "no such file"),
    ("a-directory", "a directory"),
    ("random.db", "not a SQLite file"),
])
def test_a_key_naming_no_sqlite_file_is_rejected(fleet: Fleet, name: str, reason: str) -> None:
    (fleet.dbs / "a-directory").mkdir(exist_ok=True)
    (fleet.dbs / "random.db").write_bytes(os.urandom(4096))
    key = str(fleet.dbs / name)
    assert one(fleet, key) == {"key": key, "outcome": "rejected", "channel": None, "priority": None, "reason": reason}


def test_a_key_outside_roots_is_rejected(fleet: Fleet, tmp_path: Path) -> None:
    key = str(tmp_path / "elsewhere.db")
    result = one(fleet, key)
    assert (result["outcome"], result["reason"]) == ("rejected", f"outside roots ({fleet.dbs})")


def test_without_wait_enqueue_stays_fire_and_forget_but_rejects_a_file_that_is_no_database(fleet: Fleet) -> None:
    (fleet.dbs / "noise.db").write_bytes(os.urandom(4096))
    good = fleet.db("hook.db", delete_fraction=0.9)
    status, body = fleet.enqueue(good, str(fleet.dbs / "noise.db"), wait=False)
    assert status == 202
    assert body == {"accepted": 1, "rejected": [{"key": str(fleet.dbs / "noise.db"), "reason": "not a SQLite file"}]}


def test_the_cli_prints_one_line_per_key_and_exits_1_when_one_was_rejected(fleet: Fleet) -> None:
    good = fleet.db("cli.db", delete_fraction=0.9)
    out = smoosh_cli("enqueue", "--url", fleet.daemon.url, "cli.db", "missing.db", cwd=fleet.dbs)
    assert out.returncode == 1
    queued, rejected = out.stdout.splitlines()
    assert re.fullmatch(rf"queued {re.escape(good)} in ratio_dbs at priority \d+(\.\d+)?", queued)
    assert rejected == f"rejected {fleet.dbs / 'missing.db'}: no such file"
    out = smoosh_cli("enqueue", "--url", fleet.daemon.url, good, cwd=fleet.dbs)
    assert out.returncode == 0
    assert out.stdout.startswith(f"not queued {good}: stale until ")


def test_a_key_whose_compaction_runs_is_not_queued_already_running(tmp_path: Path) -> None:
    # Given a compaction under way, stalled after its first chunk (helpers.chunked)
    base = Path(os.path.realpath(tmp_path))
    (base / "dbs").mkdir()
    key = str(base / "dbs" / "big.db")
    made = chunked_db(Path(key))
    config = write_config(base, port=free_port(), channels=chunk_section(made), extra_global=STALLED_AFTER_FIRST_CHUNK)
    d = Daemon(config)
    try:
        d.wait_ready()
        wait_for(lambda: d.get("/status")["channels"]["ratio_dbs"]["active"] == 1, HANG_S, what="the compaction", daemon=d)
        # When it is enqueued again
        reply = request(d.url + "/enqueue?wait=1", "POST", {"keys": [key]})
        # Then it is not queued: it runs already
        assert reply.json()["results"] == [{"key": key, "outcome": "not_queued", "channel": None, "priority": None,
                                            "reason": "already running in channel ratio_dbs"}]
    finally:
        d.kill()


def test_a_key_still_being_examined_when_the_wait_ends_says_so(tmp_path: Path) -> None:
    # Given a server whose compactor takes its time measuring (held by the test)
    from server.test_server import make_config

    from smoosh import Server
    from smoosh.compactors.sqlite import SqliteCompactor

    release = threading.Event()

    class Slow(SqliteCompactor):
        def sizes(self, key: str, *, exact: bool = False) -> Any:
            release.wait(HANG_S)
            return super().sizes(key, exact=exact)

    config = make_config(tmp_path)
    server = Server(config, workers=0, watch_config=False, compactors=[Slow(config.sqlite)])
    server.start()
    try:
        key = str(Path(os.path.realpath(tmp_path)) / "dbs" / "slow.db")
        make_bloated_db(key, delete_fraction=0.9)
        # When the wait ends before the examination
        (verdict,) = server.enqueue_and_wait([key], timeout_s=0)
        # Then the key is not queued (yet), "still examining"
        assert (verdict.outcome, verdict.reason) == ("not_queued", "still examining")
    finally:
        release.set()
        server.stop()
