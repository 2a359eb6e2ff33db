"""The generated reference names everything the code defines: every config key, command, option,
endpoint, metric and alert; and each endpoint's doc names every field its answer carries."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

import smoosh_reference  # noqa: E402


def generated(name: str) -> str:
    markdown, problems = smoosh_reference.GENERATORS[name]()
    assert problems == []
    return markdown


def test_every_config_key_has_its_entry() -> None:
    from smoosh.config.defaults import COUCHDB_ONLY_KEYS, GLOBAL_KEYS, RESTART_KEYS
    from smoosh.config.sections import CHANNEL_KEYS, SQLITE_KEYS

    page = generated("config")
    for key in [*GLOBAL_KEYS, *CHANNEL_KEYS, *SQLITE_KEYS]:
        assert f"### `{key}`\n" in page, key
    for key in COUCHDB_ONLY_KEYS:
        assert f"- `{key}`: " in page
    entries = page.split("### `")
    restart = {entry.split("`", 1)[0] for entry in entries if "**needs a restart**" in entry.split("\n\n")[1]}
    assert restart == set(RESTART_KEYS)


def options(parser: argparse.ArgumentParser, words: list[str]) -> list[tuple[str, str]]:
    """(command, option) for every option of ``parser`` and of its subcommands."""
    found = [(" ".join(words), o) for action in parser._actions for o in action.option_strings if o not in ("-h", "--help")]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += options(sub, [*words, name])
    return found


def test_every_command_and_option_has_its_entry() -> None:
    from smoosh.cli import build_parser

    page = generated("cli")
    for command, option in options(build_parser(), ["smoosh"]):
        section = page[page.index(f"## `{command}`\n"):]
        section = section[:section.find("\n## ", 1) if "\n## " in section[1:] else len(section)]
        assert f"`{option}`" in section, (command, option)


def test_every_endpoint_and_metric_and_alert_has_its_entry() -> None:
    from smoosh.daemon.api.http import ROUTES
    from smoosh.daemon.api.metrics import METRICS

    http = generated("http")
    assert all(f"## `{r.method} {r.path}`" in http for r in ROUTES)
    metrics = generated("metrics")
    assert all(f"| `{m.name}`" in metrics for m in METRICS)
    alerts = generated("alerts")
    rules = yaml.safe_load((ROOT / "conf" / "prometheus" / "smoosh-rules.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert f"| `{rule['alert']}` |" in alerts


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What /status, /jobs and /explain answer on a server with one database queued."""
    from smoosh import Server
    from smoosh.config import parse_config

    base = tmp_path_factory.mktemp("answers")
    (base / "dbs").mkdir()
    db = base / "dbs" / "a.db"
    import sqlite3

    with sqlite3.connect(db) as connection:
        connection.execute("CREATE TABLE t (x)")
    config = parse_config(f"[smoosh]\nwatch =\nroots = {base / 'dbs'}\nstate_dir = {base / 's'}\nstore = memory:\n"
                          "node = t\n", str(base / "smoosh.ini"))
    server = Server(config, workers=0, watch_config=False)
    server.start()
    try:
        server.enqueue(str(db), force=True)
        server.enqueue_and_wait([str(db)])
        rows, _ = server.jobs_page()
        return {"status": server.status(), "jobs": rows, "explain": server.explain(str(db))}
    finally:
        server.stop()


def test_each_endpoints_doc_names_every_field_of_its_answer(answers: dict[str, Any]) -> None:
    from smoosh.daemon.api.http import ROUTES

    doc = {r.path: r.doc for r in ROUTES}
    status = answers["status"]
    assert [k for k in status if f'"{k}"' not in doc["/status"]] == []
    channel = next(iter(status["channels"].values()))
    assert [k for k in channel if f'"{k}"' not in doc["/status"]] == []
    assert answers["jobs"]
    assert [k for k in answers["jobs"][0] if f'"{k}"' not in doc["/jobs"]] == []
    explain = answers["explain"]
    assert [k for k in explain if f'"{k}"' not in doc["/explain"]] == []
    per_channel = next(iter(explain["channels"].values()))
    assert [k for k in per_channel if f'"{k}"' not in doc["/explain"]] == []
