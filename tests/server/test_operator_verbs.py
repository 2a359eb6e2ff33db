"""The operator's verbs in process (issue 14): flush forgets staleness, enqueue --force, explain, /jobs paging."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from compactor.dbfactory import make_bloated_db
from server.test_server import make_config

#: Channels stay in their start-up pause: what is queued stays queued.
PAUSED = "wait_secs = 3600"


def real(path: Path) -> Path:
    return Path(os.path.realpath(path))


def verdict(server: Any, key: str) -> tuple[str, str | None, str | None]:
    (v,) = server.enqueue_and_wait([key])
    return v.outcome, v.channel, v.reason


def test_a_flushed_key_enqueued_again_at_once_is_queued_not_stale(tmp_path: Path, running: Any) -> None:
    # Given a bloated database queued in its (paused) channel, fresh in the staleness table
    server = running(make_config(tmp_path, extra=PAUSED), workers=0)
    key = str(real(tmp_path) / "dbs" / "tenant.db")
    make_bloated_db(key, delete_fraction=0.9)
    assert verdict(server, key)[:2] == ("queued", "ratio_dbs")
    assert verdict(server, key)[0] == "not_queued"  # stale: the throttle works
    # When the operator flushes its channel
    assert server.flush("ratio_dbs") == 1
    # Then the key, enqueued again right away, is queued again rather than dropped as stale
    assert verdict(server, key)[:2] == ("queued", "ratio_dbs")
    assert server.channels()["ratio_dbs"].status()["waiting"]["size"] == 1


def test_a_flush_of_another_channel_keeps_the_staleness_of_keys_it_did_not_drop(
    tmp_path: Path, running: Any
) -> None:
    server = running(make_config(tmp_path, extra=PAUSED), workers=0)
    key = str(real(tmp_path) / "dbs" / "tenant.db")
    make_bloated_db(key, delete_fraction=0.9)
    assert verdict(server, key)[:2] == ("queued", "ratio_dbs")
    assert server.flush("slack_dbs") == 0
    outcome, _, reason = verdict(server, key)
    assert outcome == "not_queued" and reason is not None and reason.startswith("stale until ")
