"""Every command that reads the store answers within a deadline when the store stops answering (issue 50).

``status --store``, ``jobs``, ``suspend --store``, ``resume --store`` and ``forget`` run in this
process (``smoosh.cli.main``) against the ``fdb:`` adapter over the stand-in for the binding,
whose cluster goes silent as one that is down does: no refusal, futures that never settle.
Each command says ``the store ... is unreachable since ...`` and exits 1 by its deadline
(``--store-timeout``); one that blocked would hang its thread past the test's bound. With the
cluster answering, the same commands work.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from helpers.daemon import HANG_S
from helpers.fdb_standin import Binding
from smoosh.cli import main
from smoosh.daemon.record.status import write_node_status
from smoosh.store.fdb import FdbStore

URL = "fdb:stand-in"
STATUS = {"channels": {"ratio_dbs": {"active": 0, "starting": 0, "waiting": {"size": 0, "min": 0, "max": 0},
                                     "paused": False, "suspended": False, "held": None, "in_window": True,
                                     "reclaimable_bytes": 0}},
          "reclaimable_bytes": 0}
#: The deadline the commands are given: short, so the suite does not wait for the default's 5 s.
DEADLINE = "0.5"
#: What every command says, after ``smoosh: `` (and ``jobs: ``).
UNREACHABLE = re.compile(r"the store fdb:stand-in is unreachable since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d "
                         r"\(no answer within 0\.5 s\)")

COMMANDS = {
    "status": ["status", "--store", URL],
    "status --json": ["status", "--store", URL, "--json"],
    "jobs list": ["jobs", "--store", URL, "list"],
    "jobs show": ["jobs", "--store", URL, "show", "smoosh:n1", "/db/a.db"],
    "suspend": ["suspend", "ratio_dbs", "--store", URL],
    "resume": ["resume", "--store", URL, "--node", "n1"],
    "forget": ["forget", "n1", "--store", URL],
}


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Binding]:
    """A stand-in cluster every ``fdb:stand-in`` the CLI opens reaches, with two nodes' records in it."""
    binding = Binding()

    def open_standin(url: str, *, create: bool = True) -> FdbStore:
        assert url == URL
        return FdbStore(None, url=URL, binding=binding)

    monkeypatch.setattr("smoosh.cli.store_deadline.open_store", open_standin)
    monkeypatch.setattr("smoosh.store.open_store", open_standin)  # jobs opens it by its own import
    monkeypatch.setenv("SMOOSH_CONFIG", str(tmp_path / "no-such.ini"))  # no daemon of this host asked
    with open_standin(URL) as store:
        write_node_status(store, "n1", STATUS, time.time() - 60)  # stale: forgettable
        write_node_status(store, "n2", STATUS, time.time())
    yield binding
    binding.cluster.close()  # answers again: the threads it held end


def run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    """The command's exit code, stdout and stderr; it must end within the test's bound."""
    result: dict[str, Any] = {}
    full = [argv[0], "--store-timeout", DEADLINE, *argv[1:]]  # (jobs takes it before its list or show)
    thread = threading.Thread(target=lambda: result.setdefault("code", main(full)), daemon=True)
    thread.start()
    thread.join(HANG_S)
    assert not thread.is_alive(), f"smoosh {' '.join(argv)} blocked on the silent store"
    out = capsys.readouterr()
    return result["code"], out.out, out.err


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_command_reading_a_silent_store_says_so_within_its_deadline(
    capsys: pytest.CaptureFixture[str], standin: Binding, command: str
) -> None:
    standin.cluster.stop_answering()
    code, out, err = run(capsys, COMMANDS[command])
    assert (code, out) == (1, "")
    prefix = "smoosh: jobs: " if command.startswith("jobs") else "smoosh: "
    assert err.startswith(prefix) and UNREACHABLE.fullmatch(err[len(prefix):].rstrip("\n")), err


@pytest.mark.parametrize("command", ["status", "jobs list", "suspend"])
def test_the_same_commands_answer_when_the_store_does(capsys: pytest.CaptureFixture[str], standin: Binding,
                                                     command: str) -> None:
    code, out, err = run(capsys, COMMANDS[command])
    assert code == 0 and err == "", err
    assert out


def test_a_store_back_in_time_answers_the_next_command(capsys: pytest.CaptureFixture[str], standin: Binding) -> None:
    standin.cluster.stop_answering()
    assert run(capsys, COMMANDS["status"])[0] == 1
    standin.cluster.answer_again()
    code, out, _ = run(capsys, COMMANDS["status"])
    assert code == 0 and "== n1 (stale: last record 1 min " in out and "== n2, updated " in out


def test_since_when_is_this_hosts_daemons_word_for_it_when_it_uses_that_store(
    capsys: pytest.CaptureFixture[str], standin: Binding, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import datetime
    import http.server
    import json

    cluster_file = tmp_path / "fdb.cluster"
    since = time.time() - 3600

    class Daemon(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            body = json.dumps({"store": {"state": "unreachable", "since": since, "error": "no answer"}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Daemon)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        config = tmp_path / "smoosh.ini"
        config.write_text(f"[smoosh]\nhttp = 127.0.0.1:{server.server_port}\nstore = fdb:{cluster_file}\n")
        monkeypatch.setenv("SMOOSH_CONFIG", str(config))
        monkeypatch.setattr("smoosh.cli.store_deadline.open_store", lambda url, create=True: FdbStore(
            None, url=url, binding=standin))
        standin.cluster.stop_answering()
        code, out, err = run(capsys, ["status", "--store", f"fdb:{cluster_file}"])
    finally:
        server.shutdown()
    when = datetime.datetime.fromtimestamp(since).strftime("%Y-%m-%d %H:%M:%S")
    assert (code, out) == (1, "")
    assert err == (f"smoosh: the store fdb:{cluster_file} is unreachable since {when} (as the daemon at "
                   f"http://127.0.0.1:{server.server_port} reports; no answer within 0.5 s)\n")
