"""The CLI speaks one way everywhere: one error prefix, exit codes as documented (0 ok, 1
operational, 2 usage), no traceback whatever `--url` says, usage errors with the subcommand's
own usage, empty pages described truly, a worker refused a store it cannot share, and a hint
when the config's `http` moved away from where the daemon still listens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from opslib import PausedDaemon, smoosh_cli

from helpers.daemon import Daemon, free_port, wait_for, write_config

# ------------------------------------------------------------------ one prefix


def test_every_problem_line_starts_with_smoosh(tmp_path: Path) -> None:
    # Given a config whose watch directory is missing, and a key in its [smoosh] that is unknown
    config = tmp_path / "smoosh.ini"
    config.write_text(f"[smoosh]\nwatch = {tmp_path / 'nope'}\n")
    warned = tmp_path / "warned.ini"
    warned.write_text(f"[smoosh]\nwatch = {tmp_path}\nstalenes = 3\n")
    store = f"sqlite:{tmp_path / 'jobs.db'}"
    from smoosh.store import open_store

    open_store(store).close()  # a store, empty (a mistyped one is an error of its own)
    # When commands of every kind fail or warn
    lines = [
        smoosh_cli("config", "check", "--config", str(config)).stderr,
        smoosh_cli("run", "--config", str(config)).stderr,
        smoosh_cli("config", "check", "--config", str(warned)).stderr,
        smoosh_cli("jobs", "--store", store, "show", "smoosh:n1", "/nope.db").stderr,
        smoosh_cli("jobs", "--store", "nosuch:x", "list").stderr,
        smoosh_cli("status", "--url", f"http://127.0.0.1:{free_port()}").stderr,
    ]
    # Then each line says "smoosh: " first, a config check and a run say the same about one config
    assert lines[0] == lines[1] == (f"smoosh: config error: {config}: [smoosh] watch = '{tmp_path / 'nope'}': "
                                    "no such directory\n")
    assert lines[2] == f"smoosh: warning: {warned}: [smoosh] stalenes: unknown key, ignored (did you mean staleness?)\n"
    assert lines[3] == "smoosh: job smoosh:n1 /nope.db not found\n"
    assert lines[4].startswith("smoosh: jobs: cannot open store nosuch:x: ")
    assert lines[5].startswith("smoosh: cannot reach smoosh at http://127.0.0.1:")


# ------------------------------------------------------------------ exit codes and --url


def test_an_unknown_state_is_a_usage_error_in_status_as_in_jobs_list(paused: PausedDaemon, tmp_path: Path) -> None:
    status = smoosh_cli("status", "--url", paused.url, "--state", "bogus")
    jobs = smoosh_cli("jobs", "--store", f"sqlite:{tmp_path / 'jobs.db'}", "list", "--state", "bogus")
    assert (status.returncode, jobs.returncode) == (2, 2)
    # with the subcommand's usage and the daemon's reason, naming the value
    assert status.stderr.startswith("usage: smoosh status ")
    assert "smoosh status: error: argument --state: unknown state 'bogus'" in status.stderr


@pytest.mark.parametrize("url, problem", [
    ("http://localhost:notaport", "'http://localhost:notaport' is not a valid URL: Port could not be cast to "
                                  "integer value as 'notaport'"),
    ("http://[::1", "'http://[::1' is not a valid URL: Invalid IPv6 URL"),
    ("127.0.0.1:5986", "'127.0.0.1:5986' is not a URL: did you mean http://127.0.0.1:5986?"),
    ("localhost:5986", "'localhost:5986' is not a URL: did you mean http://localhost:5986?"),
    ("ftp://127.0.0.1:5986", "'ftp://127.0.0.1:5986': the admin API is reached by http:// (or https:// through "
                             "a proxy), not ftp://"),
])
@pytest.mark.parametrize("command", [["status"], ["enqueue", "x.db"], ["explain", "x.db"], ["suspend"], ["flush"]])
def test_no_url_ends_in_a_traceback(url: str, problem: str, command: list[str]) -> None:
    out = smoosh_cli(*command, "--url", url)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert out.stderr.splitlines()[-1] == f"smoosh {command[0]}: error: argument --url: {problem}"


def test_a_bad_option_shows_the_subcommands_usage_not_the_list_of_commands() -> None:
    out = smoosh_cli("status", "--bogus")
    assert out.returncode == 2
    assert out.stderr.startswith("usage: smoosh status ")
    assert out.stderr.splitlines()[-1] == "smoosh status: error: unrecognized arguments: --bogus"
    nested = smoosh_cli("config", "check", "--bogus")
    assert nested.stderr.startswith("usage: smoosh config check ")


# ------------------------------------------------------------------ what an empty page says


def test_a_filter_that_matches_nothing_says_so_and_not_no_compactions_yet(paused: PausedDaemon) -> None:
    crashing = smoosh_cli("status", "--url", paused.url, "--state", "crashing")
    assert (crashing.returncode, crashing.stdout) == (0, "no keys in state crashing\n")
    two = smoosh_cli("status", "--url", paused.url, "--state", "crashing", "--state", "starved")
    assert two.stdout == "no keys in states crashing, starved\n"
    total = json.loads(smoosh_cli("status", "--url", paused.url, "--jobs", "--json").stdout)["total"]
    assert total > 0
    past = smoosh_cli("status", "--url", paused.url, "--offset", "1000")
    assert past.stdout == f"no keys past --offset 1000: {total} in all\n"
    pending = smoosh_cli("status", "--url", paused.url, "--state", "pending", "--offset", "1000", "--limit", "5")
    assert pending.stdout.startswith("no keys in state pending past --offset 1000: ")


# ------------------------------------------------------------------ a worker's store


def test_a_worker_is_refused_a_memory_store_it_could_not_share(tmp_path: Path) -> None:
    # Given --store memory: (alone, or inside a fault-injecting store)
    for url in ("memory:", "faulty:7:memory:"):
        out = smoosh_cli("worker", "--store", url, timeout_s=30)
        # Then it is a usage error at once, saying why, not a worker waiting forever
        assert out.returncode == 2
        assert out.stderr.splitlines()[-1] == (
            f"smoosh worker: error: argument --store: {url!r}: a memory: store lives inside one process, so a "
            "worker's is not the daemon's and it would wait for jobs forever; pass the daemon's store (sqlite:PATH "
            "or fdb:[CLUSTER_FILE])")
    # And a config whose store is memory: is refused by name, exit 1
    config = write_config(tmp_path, port=free_port(), extra_global="store = memory:")
    out = smoosh_cli("worker", "--config", str(config), timeout_s=30)
    assert out.returncode == 1
    assert out.stderr.splitlines()[-1] == (
        f"smoosh: config error: {config}: [smoosh] store = 'memory:': smoosh worker cannot share a memory: store "
        "with the daemon (each process has its own); use sqlite:PATH or fdb:, or pass --store")


# ------------------------------------------------------------------ an http edit


def test_after_an_http_edit_the_cli_says_where_the_daemon_still_listens(tmp_path: Path, daemons: list[Daemon]) -> None:
    # Given a daemon started on its config's http
    old_port, new_port = free_port(), free_port()
    config = write_config(tmp_path, port=old_port)
    d = Daemon(config)
    daemons.append(d)
    d.wait_ready()
    # When the config's http is edited (the daemon notes it needs a restart and stays where it is)
    config.write_text(config.read_text().replace(f"127.0.0.1:{old_port}", f"127.0.0.1:{new_port}"))
    wait_for(lambda: d.get("/status").get("restart_required") == ["http"], 20, what="the http edit seen", daemon=d)
    out = smoosh_cli("status", "--config", str(config))
    # Then the command, which reads the new address, says where the daemon still listens and how to reach it
    assert out.returncode == 1
    lines = out.stderr.splitlines()
    assert lines[0].startswith(f"smoosh: cannot reach smoosh at http://127.0.0.1:{new_port}/status: ")
    assert lines[1] == (
        f"smoosh: the smoosh daemon on this config's state_dir (pid {d.proc.pid}) listens on 127.0.0.1:{old_port}, "
        f"not on the config's http 127.0.0.1:{new_port}: http changed since it started and takes effect only when "
        f"it restarts; until then --url http://127.0.0.1:{old_port} reaches it")
    # And the --url it names reaches it, whose status says the restart is due
    reached = smoosh_cli("status", "--url", f"http://127.0.0.1:{old_port}")
    assert reached.returncode == 0 and "restart required for: http" in reached.stdout
    assert d.stop() == 0
    # With no daemon left, nothing more is said than that nothing answers
    gone = smoosh_cli("status", "--config", str(config))
    assert gone.returncode == 1 and len(gone.stderr.splitlines()) == 1
