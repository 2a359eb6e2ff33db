"""The application-beside-smoosh harness's own pieces (bench/apps, issue 46): what its verdicts rest on.

The harness judges smoosh by three things it computes itself: whether every committed row is
still there (the ledger check), which application errors fell inside a compaction (the windows
from smoosh's JSON log), and whether the fleet had dead space worth compacting (the builder).
Each is checked here on real SQLite files, without the applications; the last test runs the
real applications briefly and skips when their environment (``.venv-apps``) is absent.
"""

from __future__ import annotations

import io
import json
import math
import logging
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = str(Path(__file__).resolve().parents[2])
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from bench.apps.fleet import MIN_DEAD_RATIO, build_template, fill_and_hollow  # noqa: E402
from bench.apps.ledger import check_tenant, digest, merge_ledgers, template_key  # noqa: E402
from bench.apps.windows import index_windows, inside, widen_with_history, windows_from_log  # noqa: E402
from channels.ports import Outcome  # noqa: E402
from smoosh.config.sections import DEFAULT_MIN_PRIORITY  # noqa: E402
from smoosh.daemon.record.outcomes import log_fields  # noqa: E402
from smoosh.logs import JsonFormatter  # noqa: E402

APPS_PYTHON = os.path.join(REPO_ROOT, ".venv-apps", "bin", "python")
TABLE = "items"


def _empty(path: Path) -> str:
    """A database with the applications' columns and no rows."""
    conn = sqlite3.connect(path)
    conn.execute(f'CREATE TABLE "{TABLE}" (id INTEGER PRIMARY KEY, key VARCHAR(64) NOT NULL UNIQUE, '
                 "counter INTEGER NOT NULL, payload TEXT NOT NULL)")
    conn.close()
    return str(path)


def _tenant(path: Path) -> str:
    fill_and_hollow(_empty(path), TABLE, 600_000, seed=3)
    return str(path)


def _survivors(path: str, n: int) -> list[int]:
    conn = sqlite3.connect(path)
    try:
        return [r[0] for r in conn.execute(f'SELECT id FROM "{TABLE}" ORDER BY id LIMIT ?', (n,))]
    finally:
        conn.close()


def test_fleet_builder_leaves_more_dead_space_than_smoosh_threshold(tmp_path: Path) -> None:
    # Given a tenant built as the fleet's are
    info = fill_and_hollow(_empty(tmp_path / "a.sqlite"), TABLE, 2_000_000, seed=5)
    # Then its file is more than smoosh's default ratio threshold times its live bytes (dbstat)
    assert MIN_DEAD_RATIO == DEFAULT_MIN_PRIORITY["ratio"]
    assert info.ratio > MIN_DEAD_RATIO
    assert info.file_bytes >= 2_000_000
    conn = sqlite3.connect(tmp_path / "a.sqlite")
    live = conn.execute("SELECT SUM(pgsize - unused) FROM dbstat").fetchone()[0]
    conn.close()
    assert info.live_bytes == live


def test_ledger_check_passes_a_run_as_committed_and_names_a_missing_row(tmp_path: Path) -> None:
    # Given a template and a run's copy of it, changed as the ledger says
    template = _tenant(tmp_path / "template.sqlite")
    run = str(tmp_path / "run.sqlite")
    shutil.copyfile(template, run)
    updated, deleted, untouched = _survivors(template, 3)
    conn = sqlite3.connect(run, isolation_level=None)
    conn.execute(f'UPDATE "{TABLE}" SET counter = 41, payload = ? WHERE id = ?', ("new", updated))
    conn.execute(f'DELETE FROM "{TABLE}" WHERE id = ?', (deleted,))
    created = conn.execute(f'INSERT INTO "{TABLE}"(key, counter, payload) VALUES (?, 0, ?)',
                           ("w1-0-1", "made")).lastrowid
    conn.close()
    ledger = merge_ledgers([
        {template_key(updated): [updated, 41, digest("new")], template_key(deleted): None},
        {"w1-0-1": [created, 0, digest("made")]},
    ])
    assert check_tenant(run, template, TABLE, ledger).ok

    # When a committed row and an untouched template row disappear
    conn = sqlite3.connect(run, isolation_level=None)
    conn.execute(f'DELETE FROM "{TABLE}" WHERE id IN (?, ?)', (created, untouched))
    conn.close()
    check = check_tenant(run, template, TABLE, ledger)

    # Then the check names both, and nothing else
    assert not check.ok and not check.damaged
    assert sorted(check.lost) == sorted([created, untouched])
    assert check.changed == check.resurrected == check.unexpected == []
    assert check.summary()["lost"] == 2


def test_ledger_check_names_a_changed_row_a_resurrected_one_and_a_stranger(tmp_path: Path) -> None:
    template = _tenant(tmp_path / "template.sqlite")
    run = str(tmp_path / "run.sqlite")
    shutil.copyfile(template, run)
    changed, deleted = _survivors(template, 2)
    conn = sqlite3.connect(run, isolation_level=None)
    conn.execute(f'UPDATE "{TABLE}" SET counter = counter + 1 WHERE id = ?', (changed,))  # not in the ledger
    stranger = conn.execute(f'INSERT INTO "{TABLE}"(key, counter, payload) VALUES (?, 0, ?)',
                            ("nobody", "x")).lastrowid
    conn.close()
    check = check_tenant(run, template, TABLE, {template_key(deleted): None})  # its delete "committed"; it is there
    assert (check.changed, check.resurrected, check.unexpected, check.lost) == ([changed], [deleted], [stranger], [])


def test_ledger_check_follows_rows_by_key_when_sqlite_gives_a_deleted_rows_id_to_a_new_one(tmp_path: Path) -> None:
    # Given a table without AUTOINCREMENT (SQLAlchemy's default): one thread creates a row and
    # deletes it, another creates a row, which gets the same id
    template = _tenant(tmp_path / "template.sqlite")
    run = str(tmp_path / "run.sqlite")
    shutil.copyfile(template, run)
    conn = sqlite3.connect(run, isolation_level=None)
    first = conn.execute(f'INSERT INTO "{TABLE}"(key, counter, payload) VALUES (?, 0, ?)', ("w1-0-1", "a")).lastrowid
    conn.execute(f'DELETE FROM "{TABLE}" WHERE id = ?', (first,))
    second = conn.execute(f'INSERT INTO "{TABLE}"(key, counter, payload) VALUES (?, 0, ?)', ("w1-1-1", "b")).lastrowid
    conn.close()
    assert first == second
    ledger = merge_ledgers([{"w1-0-1": None}, {"w1-1-1": [second, 0, digest("b")]}])
    # Then both threads' rows are as they committed them: nothing lost, nothing come back
    assert check_tenant(run, template, TABLE, ledger).ok


def test_a_row_in_two_threads_ledgers_is_refused() -> None:
    with pytest.raises(ValueError, match="row 'w1-0-7' is in two threads' ledgers"):
        merge_ledgers([{"w1-0-7": None}, {"w1-0-7": [7, 1, "d"]}])


def _log_line(key: str, duration_s: float, created: float, result: str = "ok", channel: str = "ratio_dbs") -> str:
    """A run's end as smoosh's JSON log writes it: its own formatter and its own fields."""
    outcome = Outcome(result=result, size_before_bytes=3000, size_after_bytes=1000, duration_s=duration_s)
    record = logging.LogRecord("smoosh.daemon.record.outcomes", logging.INFO, __file__, 1, "compacted %r", (key,), None)
    record.created = created
    for name, value in log_fields(channel, key, outcome).items():
        setattr(record, name, value)
    return JsonFormatter().format(record)


def test_compaction_windows_from_smoosh_json_log_and_which_operations_fall_inside(tmp_path: Path) -> None:
    a, b = str(tmp_path / "a.sqlite"), str(tmp_path / "b.sqlite")
    # Given smoosh's log: a start-up line, a's compaction ending at t=1000.5 after 2 s, a cleanup of b
    lines = io.StringIO("\n".join([
        "2026-01-01 00:00:00 INFO smoosh: not JSON (the first lines, before the switch)",
        json.dumps({"time": "2026-01-01T00:00:00.000Z", "level": "INFO", "logger": "smoosh", "message": "x"}),
        _log_line(a, 2.0, 1000.5),
        _log_line("cleanup:" + b, 0.5, 2000.0, channel="index_cleanup"),
    ])).read().splitlines()
    windows = windows_from_log(lines, margin_s=0.25)

    # Then each run is a window: [end - duration - margin, end] (the log's milliseconds)
    assert [(w.path, w.result, w.cleanup) for w in windows] == [(a, "ok", False), (b, "ok", True)]
    wa = windows[0]
    assert wa.end == pytest.approx(1000.5, abs=1e-3)
    assert wa.start == pytest.approx(1000.5 - 2.0 - 0.25, abs=1e-3)
    assert (wa.size_before_bytes, wa.size_after_bytes, wa.reclaimed_bytes) == (3000, 1000, 2000)
    per_tenant = index_windows(windows, [a, b])
    assert [len(w) for w in per_tenant] == [1, 1]

    # And an operation is inside when its [start, start + latency] meets its own tenant's window
    assert inside(997.0, 0.1, per_tenant[0]) is None                 # ended before the margin
    assert inside(998.1, 0.2, per_tenant[0]) is wa                   # began before, ran into the margin
    assert inside(999.0, 0.001, per_tenant[0]) is wa                 # during
    assert inside(1000.49, 0.5, per_tenant[0]) is wa                 # began just before its end
    assert inside(1000.6, 0.1, per_tenant[0]) is None                # after
    assert inside(999.0, 0.001, per_tenant[1]) is None               # the same moment on another tenant
    assert inside(1999.8, 0.01, per_tenant[1]) is per_tenant[1][0]   # the cleanup's window, on b

    # And /jobs' 'started' event of the run moves its window's start back when it is earlier;
    # an older run's start, and the compaction's start for the cleanup key, do not
    jobs = [{"key": a, "history": [{"event": "finished", "at": 1000.5}, {"event": "started", "at": 998.0},
                                   {"event": "started", "at": 900.0}]},
            {"key": b, "history": [{"event": "started", "at": 1999.0}]}]
    widened, gaps = widen_with_history(windows, jobs)
    assert widened[0].start == pytest.approx(998.0) and widened[1] == windows[1]
    assert gaps == [pytest.approx(0.5, abs=1e-3)]
    assert inside(997.9, 0.15, index_windows(widened, [a, b])[0]) is widened[0]


@pytest.mark.skipif(not os.path.exists(APPS_PYTHON),
                    reason="the applications' environment .venv-apps is absent (make apps-env installs Django and "
                           "SQLAlchemy): the real applications' run is not checked")
@pytest.mark.parametrize("app", ["django", "sqlalchemy"])
def test_the_real_application_commits_only_what_its_ledger_says(tmp_path: Path, app: str) -> None:
    # Given a one-tenant fleet of the application's own schema
    template = build_template(str(tmp_path / "templates"), app, "delete", 1, 1, 0.4, 0.5, APPS_PYTHON, REPO_ROOT)
    run = str(tmp_path / "t000.sqlite")
    shutil.copyfile(template.paths()[0], run)
    out = str(tmp_path / "app.json")
    # When the application runs its workload on it for a moment
    done = subprocess.run(
        [APPS_PYTHON, "-m", f"bench.apps.{app}_app", "run", out, "1", "2", "200", "1", "t", run],
        input="go\n", capture_output=True, text=True, cwd=REPO_ROOT, env=dict(os.environ, PYTHONPATH=REPO_ROOT),
        timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    with open(out, encoding="utf-8") as f:
        record = json.load(f)
    # Then it did every kind of operation, and the tenant holds exactly what its ledger says
    assert {record["ops_names"][r[2]] for r in record["ops"]} == set(record["ops_names"])
    assert record["anomalies"] == []
    ledger = merge_ledgers(record["ledger"][0])
    assert ledger, "the workload committed nothing"
    check = check_tenant(run, template.paths()[0], template.table, ledger)
    assert check.ok, check.summary()


def _run(mode: str, errors: int, *, inside: int = 0, p99: float = 10.0, slowest: float | None = None,
         reclaimed: int = 0, lost: int = 0) -> dict[str, object]:
    """The figures of one run, as run_figures gives them, with only what the verdicts read."""
    return {"mode": mode, "errors": errors, "errors_inside_compaction": inside, "errors_inside_by_chance": 0.5,
            "latency_ms": {"all": {"p50": 1.0, "p99": p99, "max": 50.0}},
            "slowest_inside_compaction": None if slowest is None else {"latency_ms": slowest, "op": "create"},
            "reclaimed": {"smoosh_log_bytes": reclaimed}, "checks": {"damaged": 0, "lost": lost}}


def test_verdicts_judge_each_condition_of_issue_46_only_where_its_modes_ran() -> None:
    from bench.apps.summary import verdicts

    dead = 1000
    runs = [_run("none", 50, p99=10.0), _run("none", 40, p99=12.0),
            _run("watch", 45), _run("watch", 60),  # mean 52.5 > the highest without (50): a miss
            _run("compacted", 30), _run("compacted", 35),
            _run("compact", 33, slowest=900.0, reclaimed=850, p99=12.0),
            _run("compact", 35, inside=1, slowest=1_150.0, reclaimed=790, p99=13.0)]
    got = {condition.split(":")[0].split(" (")[0]: (measured, met) for condition, measured, met in verdicts(runs, dead, 1.0)}
    assert got["watching only"] == ("52.5 against 50", False)
    assert got["compacting"] == ("34.0 against 35", True)
    assert got["no error inside a compaction of the tenant"] == ("1 (by chance 1.0)", False)
    assert got["errors inside compactions no more than chance would put there"] == ("1 against 1.0 (P = 0.63)", True)
    assert got["at least 80% of the fleet's dead space reclaimed in each run"] == ("79% at the least", False)
    assert got["slowest operation inside a compaction at most max_lock_hold + 100 ms"] == ("1,150 ms", False)
    assert got["p99 within +10% of the runs without smoosh"] == ("12.5 ms against 11.0 ms", False)
    assert got["p99 within +10% of the fleet already compacted"] == ("12.5 ms against 10.0 ms", False)
    assert got["0 rows lost, 0 tenants damaged"] == ("0 lost, 0 damaged", True)

    # Without the runs a condition compares with, it is not judged; a lost row is always judged.
    alone = verdicts([_run("compact", 0, slowest=10.0, reclaimed=900, lost=2)], dead, 1.0)
    assert [c for c, _, _ in alone if c.startswith(("watching", "compacting", "p99"))] == []
    assert alone[-1][1:] == ("2 lost, 0 damaged", False)
    assert all(met for c, _, met in alone[:-1]), alone


def test_run_figures_split_latency_by_whether_an_operation_met_a_run_on_its_own_tenant() -> None:
    from bench.apps.ledger import TenantCheck
    from bench.apps.runs import RunOutcome, RunSpec
    from bench.apps.summary import group_table, run_figures
    from bench.apps.windows import Window

    # Given tenant 0 compacted over [100, 101], and 202 operations of 5 ms spread over both tenants,
    # of which four on tenant 0 waited out the compaction's lock (250 to 400 ms)
    paths = ["/fleet/t0.sqlite", "/fleet/t1.sqlite"]
    ops: list[list[object]] = [[90.05 + 0.1 * i, 0.005, 0, i % 2, -1] for i in range(198)]
    ops += [[100.1, 0.250, 0, 0, -1], [100.2, 0.300, 0, 0, -1], [100.5, 0.400, 0, 0, -1], [100.7, 0.350, 0, 0, -1]]
    record = {"ops_names": ["create"], "errors": [], "ops": ops, "start": 90.0, "end": 110.0}
    window = Window(path=paths[0], start=100.0, end=101.0, result="ok", channel="ratio_dbs",
                    size_before_bytes=3000, size_after_bytes=1000, reclaimed_bytes=2000)
    spec = RunSpec(app="django", journal_mode="delete", mode="compact", number=1, duration_s=20.0, lead_s=0.0,
                   threads=1, rate_per_s=10.0, seed=1, margin_s=0.0)
    outcome = RunOutcome(spec=spec, paths=paths, record=record, windows=[window], before_bytes=[3000, 10],
                         after_bytes=[1000, 10], checks=[TenantCheck(path=p, integrity=["ok"]) for p in paths],
                         application={"looks_locked": 2.0, "looks_lockless": 1500.0, "waits": 1.0})

    figures = run_figures(outcome)

    # Then the operations inside are tenant 0's during [100, 101] (five of 5 ms and the four waits),
    # and the rest's p99 is the 5 ms every one of them took: the waits do not raise it
    inside_ops = [o for o in ops if o[3] == 0 and float(o[0]) <= 101.0 and float(o[0]) + float(o[1]) >= 100.0]
    assert figures["latency_inside_ms"]["n"] == len(inside_ops) == 9
    assert (figures["latency_inside_ms"]["p50"], figures["latency_inside_ms"]["max"]) == (5.0, 400.0)
    assert figures["latency_outside_ms"]["n"] == 202 - 9
    assert figures["latency_outside_ms"]["p99"] == figures["latency_outside_ms"]["max"] == 5.0
    assert figures["latency_ms"]["all"]["p99"] > 5.0  # the waits alone raise the run's p99
    table = group_table([figures], ["compact"], dead_bytes=2000)
    assert "| operations on a tenant during smoosh's run on it: count, share of all, p50 / p99 ms | 9 (4.5%), 5.0 / 400 |" in table
    assert "| p99 of the other operations, ms | 5.0 |" in table
    # And smoosh's looks during the run, with a SQLite lock and without, stand beside them
    assert "| smoosh's looks at a database during the run: with a SQLite lock / without | 2 / 1,500 |" in table
    # And a sitting recorded before the harness measured them shows neither row
    older = {k: v for k, v in figures.items() if k not in ("latency_inside_ms", "latency_outside_ms", "application")}
    assert "p99 of the other operations" not in group_table([older], ["compact"], dead_bytes=2000)
    assert "smoosh's looks" not in group_table([older], ["compact"], dead_bytes=2000)


def test_config_b_keys_reach_the_smoosh_config_of_a_b_run(tmp_path: Path) -> None:
    from bench.apps.runs import HARNESS_KEYS, smoosh_config
    from smoosh.config import load_config

    fleet = tmp_path / "fleet"
    fleet.mkdir()
    path, keys = smoosh_config(tmp_path, str(fleet), 8123, watch_only=False, channels=["ratio_dbs"],
                               extra=["io_priority = idle", "max_io_rate=20MiB"])
    assert keys["io_priority"] == "idle" and keys["max_io_rate"] == "20MiB"
    config = load_config(str(path))
    assert config.io_priority == "idle"
    assert config.max_io_rate_bytes_per_s == 20 * 1024 * 1024
    plain, plain_keys = smoosh_config(tmp_path / "a", str(fleet), 8124, watch_only=False, channels=["ratio_dbs"])
    assert load_config(str(plain)).io_priority == "normal"
    # the keys --config-b may not set are the ones every run's config sets
    assert tuple(plain_keys) == HARNESS_KEYS


def test_poisson_tail_says_how_likely_chance_alone_gives_a_count() -> None:
    from bench.apps.summary import poisson_at_least

    assert poisson_at_least(0, 3.0) == 1.0
    assert abs(poisson_at_least(1, 1.5) - (1 - math.exp(-1.5))) < 1e-12
    # The WAL sitting of 2026-12-07 10:48: 12 errors inside where chance gives 3.1.
    assert poisson_at_least(12, 3.1) < 0.001
    assert poisson_at_least(3, 3.1) > 0.5
