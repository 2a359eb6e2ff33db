"""The store is never an application's file (issue 45, DESIGN §10).

A ``store`` inside a watched directory or a root, or at an application's SQLite database, had
smoosh's tables written into the application's file. Now ``smoosh run`` and ``smoosh config
check`` refuse it at start in the same one line (exit 1, naming the key and the path), and the
SQLite store itself refuses a file whose tables are not its own, whoever opens it.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from opslib import smoosh_cli

from helpers.daemon import free_port, write_config
from smoosh.store import StoreUnavailable, open_store


def an_application_database(path: Path) -> bytes:
    """An application's SQLite database (two tables and a row); its bytes."""
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE users(id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("CREATE TABLE orders(id INTEGER PRIMARY KEY, user INTEGER)")
    conn.execute("INSERT INTO users(name) VALUES ('ada')")
    conn.commit()
    conn.close()
    return path.read_bytes()


def tables(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return sorted(name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
    finally:
        conn.close()


@pytest.mark.parametrize("where", ["watch", "roots"])
def test_a_store_inside_a_watched_directory_or_a_root_is_refused_by_run_and_config_check(
    tmp_path: Path, where: str
) -> None:
    # Given a config whose store lies in its watched directory (or in a root beside it)
    (tmp_path / "dbs").mkdir()
    (tmp_path / "more").mkdir()
    store = tmp_path / ("dbs" if where == "watch" else "more") / "jobs.db"
    extra = f"store = sqlite:{store}" + (f"\nroots = {tmp_path / 'dbs'}, {tmp_path / 'more'}" if where == "roots" else "")
    config = write_config(tmp_path, port=free_port(), extra_global=extra)
    # When it is checked, and when it is run
    check = smoosh_cli("config", "check", "--config", str(config))
    run = smoosh_cli("run", "--config", str(config))
    # Then both refuse it in the same one line, naming the key, the path and where it lies
    directory = tmp_path / ("dbs" if where == "watch" else "more")
    what = "the watched directory" if where == "watch" else "the root"
    expected = (f"smoosh: config error: {config}: [smoosh] store = 'sqlite:{store}': inside {what} {directory} "
                f"([smoosh] {where}): smoosh's store must be none of the files it watches and compacts; give it a path "
                "outside watch and roots (by default it lies in state_dir)\n")
    assert (check.returncode, check.stderr) == (1, expected)
    assert (run.returncode, run.stderr) == (1, expected)
    assert not store.exists()


def test_a_store_at_an_applications_database_is_refused_and_the_file_left_as_it_was(tmp_path: Path) -> None:
    # Given an application's database outside the roots, named as the store
    app = tmp_path / "app.db"
    before = an_application_database(app)
    config = write_config(tmp_path, port=free_port(), extra_global=f"store = sqlite:{app}")
    # When the config is checked, run, and run with the same file given by --store
    check = smoosh_cli("config", "check", "--config", str(config))
    run = smoosh_cli("run", "--config", str(config))
    other = write_config(tmp_path, port=free_port(), name="other.ini")
    run_option = smoosh_cli("run", "--config", str(other), "--store", f"sqlite:{app}")
    # Then each refuses it in one line naming the key (or the option), the path and its tables
    problem = (f"{app} is an application's SQLite database (its tables: orders, users), not a smoosh job store: "
               "smoosh would write its own tables into it; give store a file of its own (by default it lies in "
               "state_dir)\n")
    assert (check.returncode, check.stderr) == (1, f"smoosh: config error: {config}: [smoosh] store = 'sqlite:{app}': "
                                                   + problem)
    assert (run.returncode, run.stderr) == (1, check.stderr)
    assert (run_option.returncode, run_option.stderr) == (1, f"smoosh: config error: --store = 'sqlite:{app}': "
                                                             + problem)
    # ... and the application's file is byte for byte as it was, its tables its own
    assert app.read_bytes() == before and tables(app) == ["orders", "users"]


def test_the_sqlite_store_refuses_an_applications_database_whoever_opens_it(tmp_path: Path) -> None:
    # Given an application's database
    app = tmp_path / "app.db"
    before = an_application_database(app)
    # When the Python API or a stand-alone worker opens it as a store
    with pytest.raises(StoreUnavailable) as refused:
        open_store(f"sqlite:{app}")
    worker = smoosh_cli("worker", "--config", str(write_config(tmp_path, port=free_port())), "--store", f"sqlite:{app}")
    # Then it is refused, naming it, and nothing was written
    assert str(refused.value) == (f"refusing to open {app} as the job store: it is an application's SQLite database "
                                  "(its tables: orders, users), not a smoosh job store; smoosh would write its own "
                                  "tables into it")
    assert worker.returncode == 1 and f"smoosh: {refused.value}\n" in worker.stderr
    assert app.read_bytes() == before


def test_a_store_smoosh_made_and_an_empty_file_are_stores(tmp_path: Path) -> None:
    made = tmp_path / "jobs.db"
    open_store(f"sqlite:{made}").close()
    open_store(f"sqlite:{made}", create=False).close()
    empty = tmp_path / "empty.db"
    empty.touch()
    open_store(f"sqlite:{empty}").close()
    assert tables(empty) == ["commit_log", "kv", "meta"]
