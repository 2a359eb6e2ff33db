"""``smoosh jobs list | show``: the function the lead wires into the command line."""

from __future__ import annotations

import argparse
import io
import json
import math
from pathlib import Path

import pytest

from smoosh.cli import build_parser
from smoosh.cli.jobs import FINISHED_NOT_KEPT, add_jobs_parser, jobs_command
from smoosh.cli.store_deadline import STORE_DEADLINE_S
from smoosh.jobs import Jobs
from smoosh.store import open_store


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    url = f"sqlite:{tmp_path / 'jobs.db'}"
    store = open_store(url)
    with Jobs(store, monitors=False) as jobs:
        jobs.set_type_timeout("smoosh:n1", 30)
        jobs.add("smoosh:n1", "/data/b.db", {"channel": "ratio_dbs", "priority": math.inf, "progress": 0.0})
        jobs.add("smoosh:n1", "/data/a.db", {"channel": "slack_dbs", "priority": 3.5}, 1_700_000_000)
        jobs.accept("smoosh:n1", max_sched_time=0)
    store.close()
    return url


def parse(argv: list[str], store_default: str | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="smoosh")
    add_jobs_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    args.store_default = store_default
    return args


def run(args: argparse.Namespace) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = args.func(args, stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_list_prints_a_table_of_jobs(store_url: str) -> None:
    code, out, err = run(parse(["jobs", "--store", store_url, "list"]))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == ["TYPE", "ID", "STATE", "SCHEDULED"]
    assert lines[1].split() == ["smoosh:n1", "/data/a.db", "pending", "2023-11-14T22:13:20Z"]
    assert lines[2].split() == ["smoosh:n1", "/data/b.db", "running", "-"]
    assert lines[3:] == [FINISHED_NOT_KEPT]


def test_list_filters_by_type_and_says_when_nothing_is_found(store_url: str) -> None:
    code, out, _ = run(parse(["jobs", "--store", store_url, "list", "--type", "smoosh:other"]))
    assert (code, out) == (0, "no jobs found of type smoosh:other: no such type in this store (its types: smoosh:n1)\n"
                              + FINISHED_NOT_KEPT + "\n")
    code, out, _ = run(parse(["jobs", "list", "--type", "smoosh:n1"], store_default=store_url))
    assert code == 0 and len(out.splitlines()) == 4


def test_once_jobs_finished_and_were_removed_the_list_says_finished_jobs_are_not_kept(store_url: str) -> None:
    # What a smoosh node does with a job: accept, finish, then remove its row.
    store = open_store(store_url)
    with Jobs(store, monitors=False) as jobs:
        job, _data = jobs.accept("smoosh:n1", timeout=0)
        jobs.finish(job)
        jobs.remove("smoosh:n1", job.id)
        jobs.remove("smoosh:n1", "/data/b.db")  # the one running since the fixture
    store.close()
    code, out, _ = run(parse(["jobs", "--store", store_url, "list"]))
    assert (code, out) == (0, "no jobs found\n" + FINISHED_NOT_KEPT + "\n")
    code, out, _ = run(parse(["jobs", "--store", store_url, "list", "--state", "finished"]))
    assert (code, out) == (0, "no jobs found in state finished\n" + FINISHED_NOT_KEPT + "\n")
    code, out, _ = run(parse(["jobs", "--store", store_url, "list", "--state", "running"]))
    assert (code, out) == (0, "no jobs found in state running\n")  # not asked for finished jobs: no note


def test_a_finished_job_still_in_the_store_is_listed_without_the_note(store_url: str) -> None:
    store = open_store(store_url)
    with Jobs(store, monitors=False) as jobs:
        job, _data = jobs.accept("smoosh:n1", timeout=0)
        jobs.finish(job)
    store.close()
    code, out, _ = run(parse(["jobs", "--store", store_url, "list", "--state", "finished"]))
    assert code == 0
    assert [line.split()[1:3] for line in out.splitlines()[1:]] == [["/data/a.db", "finished"]]


def test_a_store_without_job_types_is_not_mistaken_for_one_whose_jobs_finished(tmp_path: Path) -> None:
    open_store(f"sqlite:{tmp_path / 'empty.db'}").close()
    code, out, _ = run(parse(["jobs", "--store", f"sqlite:{tmp_path / 'empty.db'}", "list"]))
    assert (code, out) == (0, "no jobs found: this store has no job types (is it the store the daemons use?)\n")


def test_show_prints_state_and_data_as_json_with_infinity_as_string(store_url: str) -> None:
    code, out, _ = run(parse(["jobs", "--store", store_url, "show", "smoosh:n1", "/data/b.db"]))
    assert code == 0
    shown = json.loads(out)
    assert shown["state"] == "running"
    assert shown["data"] == {"channel": "ratio_dbs", "priority": "infinity", "progress": 0.0}
    assert "Infinity" not in out


def test_show_of_a_missing_job_exits_1_naming_it(store_url: str) -> None:
    code, out, err = run(parse(["jobs", "--store", store_url, "show", "smoosh:n1", "/nope.db"]))
    assert (code, out, err) == (1, "", "smoosh: job smoosh:n1 /nope.db not found\n")


def test_unopenable_store_exits_1(tmp_path: Path) -> None:
    code, _, err = run(parse(["jobs", "--store", "nosuch:x", "list"]))
    assert code == 1
    assert "nosuch:x" in err


def test_default_function_is_jobs_command() -> None:
    args = parse(["jobs", "list"])
    assert args.func is jobs_command


def test_list_filters_by_state_limits_and_prints_json(store_url: str) -> None:
    code, out, _ = run(parse(["jobs", "--store", store_url, "list", "--state", "running"]))
    assert code == 0 and [line.split()[1] for line in out.splitlines()[1:]] == ["/data/b.db"]
    code, out, _ = run(parse(["jobs", "--store", store_url, "list", "--limit", "1", "--json"]))
    assert code == 0
    (job,) = json.loads(out)["jobs"]
    assert (job["id"], job["state"], job["scheduled_time"]) == ("/data/a.db", "pending", 1_700_000_000)
    assert job["data"] == {"channel": "slack_dbs", "priority": 3.5}


def test_every_row_jobs_list_prints_opens_with_jobs_show_as_printed(store_url: str) -> None:
    # Given a store with a pending and a running job, a job of a tuple type, and the finished
    # compactions a node keeps in place of its removed jobs
    from smoosh.daemon.results import Result, ResultLog

    store = open_store(store_url)
    with Jobs(store, monitors=False) as jobs:
        jobs.set_type_timeout(("batch", 2), 30)
        jobs.add(("batch", 2), "/data/t.db", {"channel": "ratio_dbs"})
    log = ResultLog("n1")
    store.transact(log.write_for("/data/done.db", Result(1_700_000_100.0, "ratio_dbs", "ok", 0.5, 9000, 4000)))
    store.close()
    # When every row of `jobs list` is shown by its TYPE and ID, as printed
    code, out, _ = run(parse(["jobs", "--store", store_url, "list"]))
    assert code == 0
    rows = [line.split()[:3] for line in out.splitlines()[1:] if line.startswith(("smoosh:", "batch"))]
    assert {(t, i, st) for t, i, st in rows} == {
        ("smoosh:n1", "/data/a.db", "pending"), ("smoosh:n1", "/data/b.db", "running"),
        ("batch,2", "/data/t.db", "pending"), ("smoosh:n1", "/data/done.db", "finished")}
    for job_type, job_id, state in rows:
        code, shown, err = run(parse(["jobs", "--store", store_url, "show", job_type, job_id]))
        # Then each opens, in the shape `list --json` gives it
        assert (code, err) == (0, ""), (job_type, job_id)
        body = json.loads(shown)
        assert (body["id"], body["state"]) == (job_id, state)
    code, shown, _ = run(parse(["jobs", "--store", store_url, "show", "smoosh:n1", "/data/done.db"]))
    assert json.loads(shown)["data"]["results"][0]["result"] == "ok"


def test_the_store_options_are_taken_after_the_subcommand_too(store_url: str) -> None:
    # `smoosh jobs list --store URL`, as a user types it, reads the same store as `jobs --store URL list`
    after = parse(["jobs", "list", "--store", store_url, "--store-timeout", "7"])
    before = parse(["jobs", "--store", store_url, "--store-timeout", "7", "list"])
    assert (after.store, after.store_timeout) == (before.store, before.store_timeout) == (store_url, 7.0)
    assert run(after) == run(before)
    # ... an option given only before it stands, and the defaults are the command's
    only_before = parse(["jobs", "--store", store_url, "show", "smoosh:n1", "/db/a"])
    assert (only_before.store, only_before.store_timeout) == (store_url, STORE_DEADLINE_S)
    # ... and so does the config file, in the whole CLI
    assert build_parser().parse_args(["jobs", "list", "--config", "/etc/smoosh.ini"]).config == "/etc/smoosh.ini"
    assert build_parser().parse_args(["jobs", "--config", "/etc/smoosh.ini", "list"]).config == "/etc/smoosh.ini"
