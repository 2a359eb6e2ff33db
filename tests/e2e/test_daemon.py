"""The daemon as a new user meets it: `smoosh run` in a subprocess, real files, real HTTP, kill -9."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from compactor.dbfactory import make_bloated_db
from helpers.chunked import STALLED_AFTER_FIRST_CHUNK, chunk_section, chunked_db
from helpers.daemon import HANG_S, Daemon, free_port, start_worker, wait_for, write_config


def start(daemons: list[Daemon], config: Path, *args: str) -> Daemon:
    d = Daemon(config, args=args)
    daemons.append(d)
    d.wait_ready()
    return d


def integrity(db: Path) -> str:
    with sqlite3.connect(db) as conn:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]


def job(d: Daemon, key: Path) -> dict[str, Any]:
    return {j["key"]: j for j in d.get("/jobs")["jobs"]}.get(str(key), {})


def progress_in_store(config: Path, key: Path) -> float | None:
    """The running job's progress, read from the job store itself (no daemon in between)."""
    from smoosh.jobs import Jobs, NotFound
    from smoosh.store import open_store

    with open_store(f"sqlite:{config.parent / 'state' / 'jobs.db'}") as store:
        jobs = Jobs(store, monitors=False)
        try:
            if jobs.get_job_state("smoosh:testnode", str(key)) != "running":
                return None
            return float(jobs.get_job_data("smoosh:testnode", str(key)).get("progress") or 0.0)
        except NotFound:
            return None
        finally:
            jobs.close()


def mid_compaction(config: Path, key: Path) -> bool:
    progress = progress_in_store(config, key)
    return progress is not None and 0 < progress < 0.8


def smoosh_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "smoosh", *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def test_a_bloated_database_dropped_into_the_watched_directory_is_compacted(tmp_path: Path, daemons: list[Daemon]) -> None:
    d = start(daemons, write_config(tmp_path, port=free_port()))
    db = tmp_path / "dbs" / "tenant.db"
    stats = make_bloated_db(str(db), rows=6000, delete_fraction=0.9)
    before = db.stat().st_size
    wait_for(lambda: job(d, db).get("state") == "finished", HANG_S, what="the compaction", daemon=d)
    after = db.stat().st_size
    assert after < before / 4
    assert after < stats["live_bytes"] * 1.5
    assert integrity(db) == "ok"
    assert d.stop() == 0


def test_databases_present_before_the_start_are_found(tmp_path: Path, daemons: list[Daemon]) -> None:
    config = write_config(tmp_path, port=free_port())
    nested = tmp_path / "dbs" / "tenants" / "a"
    nested.mkdir(parents=True)
    db = nested / "old.db"
    make_bloated_db(str(db), delete_fraction=0.9)
    before = db.stat().st_size
    d = start(daemons, config)
    wait_for(lambda: job(d, db).get("state") == "finished", HANG_S, what="the start-up scan to find it", daemon=d)
    assert db.stat().st_size < before / 3
    # The scan records its end after it has handed the database on: it may come after the compaction
    scan = wait_for(lambda: (lambda s: s if s["scans_completed"] >= 1 else None)(d.get("/status")["scan"]), HANG_S,
                    what="the start-up scan's end", daemon=d)
    assert scan["databases_found"] == 1 and scan["duration_s"] > 0
    # The compaction's own writes are file events: they settle after the 1 s quiet period.
    wait_for(lambda: (lambda s: (s["debouncing"], s["examining"]) == (0, 0))(d.get("/status")["scan"]), HANG_S,
             what="events to settle", daemon=d)


def test_enqueue_from_the_cli_refuses_a_database_outside_roots(tmp_path: Path, daemons: list[Daemon]) -> None:
    config = write_config(tmp_path, port=free_port())
    d = start(daemons, config)
    outside = tmp_path / "elsewhere.db"
    make_bloated_db(str(outside))
    out = smoosh_cli("enqueue", "--url", d.url, "elsewhere.db", cwd=tmp_path)
    assert out.returncode == 1
    assert out.stdout == f"rejected {outside}: outside roots ({tmp_path / 'dbs'})\n"
    inside = tmp_path / "dbs" / "in.db"
    make_bloated_db(str(inside))
    out = smoosh_cli("enqueue", "--url", d.url, "dbs/in.db", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    # Queued, or already taken by the start-up scan's examination: either way not rejected.
    assert out.stdout.startswith((f"queued {inside} in ", f"not queued {inside}: ")), out.stdout


def test_suspend_holds_work_and_resume_starts_it_at_once(tmp_path: Path, daemons: list[Daemon]) -> None:
    d = start(daemons, write_config(tmp_path, port=free_port()))
    assert smoosh_cli("suspend", "--url", d.url).returncode == 0
    db = tmp_path / "dbs" / "a.db"
    make_bloated_db(str(db), delete_fraction=0.9)
    wait_for(lambda: d.get("/status")["channels"]["ratio_dbs"]["waiting"]["size"] == 1, HANG_S, what="queued", daemon=d)
    status = d.get("/status")["channels"]["ratio_dbs"]
    assert status["suspended"] is True and status["active"] == 0
    out = smoosh_cli("status", "--url", d.url)
    assert "ratio_dbs" in out.stdout and "suspended" in out.stdout
    assert smoosh_cli("resume", "--url", d.url, "ratio_dbs").returncode == 0
    wait_for(lambda: job(d, db).get("state") == "finished", HANG_S, what="the compaction after resume", daemon=d)


def test_kill_9_mid_compaction_leaves_the_database_intact_and_a_restart_finishes_it(
    tmp_path: Path, daemons: list[Daemon]
) -> None:
    # Given a daemon stalled after the first chunk of an incremental compaction (helpers.chunked)
    db = tmp_path / "dbs" / "big.db"
    db.parent.mkdir()
    made = chunked_db(db)
    port = free_port()
    config = write_config(tmp_path, port=port, channels=chunk_section(made), extra_global=STALLED_AFTER_FIRST_CHUNK)
    d = start(daemons, config)
    wait_for(lambda: mid_compaction(config, db), HANG_S, what="the compaction to be under way", daemon=d)
    # When it is killed with SIGKILL
    d.kill()
    # Then the database is intact, every row in it, the compaction's work half done
    assert integrity(db) == "ok"
    assert sqlite3.connect(db).execute("SELECT count(*) FROM docs").fetchone()[0] == made["rows"]
    size_at_kill = db.stat().st_size
    # ... and a restart (its I/O budget no longer stalling) finishes it
    write_config(tmp_path, port=port, channels=chunk_section(made))
    d2 = start(daemons, config)
    wait_for(lambda: job(d2, db).get("state") == "finished", HANG_S, what="the compaction after restart", daemon=d2)
    assert db.stat().st_size < size_at_kill
    assert integrity(db) == "ok"


def test_sigterm_stops_cleanly_and_checkpoints_the_queue(tmp_path: Path, daemons: list[Daemon]) -> None:
    config = write_config(tmp_path, port=free_port(), extra_global="wait_secs = 3600")
    d = start(daemons, config)
    db = tmp_path / "dbs" / "a.db"
    make_bloated_db(str(db))
    wait_for(lambda: d.get("/status")["channels"]["ratio_dbs"]["waiting"]["size"] == 1, HANG_S, what="queued", daemon=d)
    assert d.stop() == 0  # how soon: tests/e2e/test_signals.py (DESIGN §5.1)
    from persist import read_checkpoint

    assert read_checkpoint(str(tmp_path / "state" / "ratio_dbs.smooshq")) == {str(db): pytest.approx(2.5, abs=2)}
    d2 = start(daemons, config)
    assert d2.get("/status")["channels"]["ratio_dbs"]["waiting"]["size"] == 1


def test_live_config_edits_add_and_remove_channels_and_reject_invalid_edits(tmp_path: Path, daemons: list[Daemon]) -> None:
    port = free_port()
    config = write_config(tmp_path, port=port, extra_global="wait_secs = 3600")
    d = start(daemons, config)
    db = tmp_path / "dbs" / "a.db"
    make_bloated_db(str(db))
    wait_for(lambda: d.get("/status")["channels"]["ratio_dbs"]["waiting"]["size"] == 1, HANG_S, what="queued", daemon=d)

    def replace_config(text: str) -> None:
        tmp = config.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, config)  # as editors save

    original = config.read_text()
    replace_config(original.replace("[smoosh]\n", "[smoosh]\ndb_channels = slack_dbs, night_dbs\n", 1)
                   + "\n[smoosh.night_dbs]\nfrom = 01:00\nto = 05:00\n")
    wait_for(lambda: set(d.get("/status")["channels"]) == {"slack_dbs", "night_dbs", "index_cleanup"},
             HANG_S, what="the channels of the new config", daemon=d)
    assert d.get("/status")["channels"]["night_dbs"]["window"] == "01:00-05:00 UTC"
    assert (tmp_path / "state" / "ratio_dbs.smooshq").exists()

    replace_config(original.replace("[smoosh.ratio_dbs]\n", "[smoosh.ratio_dbs]\ncapacity = 0\n"))
    wait_for(lambda: d.get("/status")["config_error"], HANG_S, what="the config error", daemon=d)
    status = d.get("/status")
    assert status["config_error"] == f"{config}: [smoosh.ratio_dbs] capacity = '0': must be an integer >= 1"
    assert set(status["channels"]) == {"slack_dbs", "night_dbs", "index_cleanup"}  # old config in force
    out = smoosh_cli("config", "check", "--config", str(config))
    assert out.returncode == 1 and "capacity = '0'" in out.stderr

    replace_config(original)
    wait_for(lambda: d.get("/status")["config_error"] is None and "ratio_dbs" in d.get("/status")["channels"],
             HANG_S, what="the fixed config", daemon=d)
    # The re-added channel restored its checkpoint.
    assert d.get("/status")["channels"]["ratio_dbs"]["waiting"]["size"] == 1


def test_a_killed_worker_process_has_its_job_finished_by_another(tmp_path: Path, daemons: list[Daemon]) -> None:
    # Given a worker process stalled after the first chunk of an incremental compaction
    # (helpers.chunked), its progress in the store (heartbeats, every job_timeout / 3)
    db = tmp_path / "dbs" / "big.db"
    db.parent.mkdir()
    made = chunked_db(db)
    config = write_config(tmp_path, port=free_port(), channels=chunk_section(made), extra_global="job_timeout = 1s")
    d = start(daemons, config, "--workers", "0")
    stalled = write_config(tmp_path, port=free_port(), name="first.ini", channels=chunk_section(made),
                           extra_global=f"job_timeout = 1s\n{STALLED_AFTER_FIRST_CHUNK}")
    first = start_worker(stalled)
    try:
        wait_for(lambda: mid_compaction(config, db), HANG_S, what="the first worker to be mid-compaction", daemon=d)
        # When it is killed with SIGKILL
        first.kill()
        first.wait(HANG_S)
        assert integrity(db) == "ok"
        # Then another worker (no I/O budget stalling it) finishes the job
        second = start_worker(config)
        try:
            wait_for(lambda: job(d, db).get("state") == "finished", HANG_S, what="the second worker to finish it", daemon=d)
        finally:
            second.terminate()
            second.wait(HANG_S)
    finally:
        if first.poll() is None:
            first.kill()
    assert integrity(db) == "ok"
    assert sqlite3.connect(db).execute("SELECT count(*) FROM docs").fetchone()[0] == made["rows"]


def test_http_enqueue_validates_its_body(tmp_path: Path, daemons: list[Daemon]) -> None:
    d = start(daemons, write_config(tmp_path, port=free_port()))
    assert d.post("/enqueue", [1, 2]) == (400, {"error": "body must be a JSON object"})
    assert d.post("/enqueue", {}) == (400, {"error": "body lacks 'keys'"})
    assert d.post("/enqueue", {"keys": "x"}) == (400, {"error": "'keys' must be a list of strings"})
    assert d.post("/enqueue", {"keys": [1]}) == (400, {"error": "'keys'[0] is not a string"})
    make_bloated_db(str(tmp_path / "dbs" / "x.db"))
    code, body = d.post("/enqueue", {"keys": ["/etc/passwd", str(tmp_path / "dbs" / "x.db"), "rel",
                                              str(tmp_path / "dbs" / "missing.db")]})
    assert code == 202
    assert body["accepted"] == 1
    assert [r["key"] for r in body["rejected"]] == ["/etc/passwd", "rel", str(tmp_path / "dbs" / "missing.db")]
    assert body["rejected"][2]["reason"] == "no such file"
    assert d.post("/suspend", {"channel": "nope"}) == (404, {"error": "unknown channel 'nope'"})
    code, _ = d.post("/suspend", b"not json")
    assert code == 400
