"""`smoosh config check` as a linter, through the real command: each finding once, "did you
mean" for near misses, one shape for parse errors, missing directories refused alike by
`config check` and `run`, and a warning for channels that can never get work."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.daemon import Daemon, free_port, write_config


def smoosh(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "smoosh", *args], capture_output=True, text=True, timeout=30,
                          cwd=cwd, env=dict(os.environ, SMOOSH_LOG_LEVEL="INFO"))


def config_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "smoosh.ini"
    path.write_text(text)
    return path


def test_each_warning_is_printed_once_with_did_you_mean_for_a_near_miss(tmp_path: Path) -> None:
    # Given a config with a misspelt key in [smoosh] and in a channel, and a channel key in [smoosh]
    config = config_file(tmp_path, f"""[smoosh]
watch = {tmp_path}
stalenes = 3
concurrency = 2
[smoosh.ratio_dbs]
concurency = 2
""")
    # When it is checked
    out = smoosh("config", "check", "--config", str(config))
    # Then each finding is one line, once, naming the key meant
    assert out.returncode == 0
    assert out.stderr.splitlines() == [
        f"smoosh: warning: {config}: [smoosh] stalenes: unknown key, ignored (did you mean staleness?)",
        f"smoosh: warning: {config}: [smoosh] concurrency: unknown key, ignored (did you mean concurrency in a channel's section?)",
        f"smoosh: warning: {config}: [smoosh.ratio_dbs] concurency: unknown key, ignored (did you mean concurrency?)",
    ]
    assert out.stdout == f"{config}: ok (4 channel(s))\n"


def test_a_key_far_from_every_known_key_gets_no_suggestion(tmp_path: Path) -> None:
    config = config_file(tmp_path, f"[smoosh]\nwatch = {tmp_path}\ndatabase_dir = ./data\n")
    out = smoosh("config", "check", "--config", str(config))
    assert out.stderr == f"smoosh: warning: {config}: [smoosh] database_dir: unknown key, ignored\n"


def test_run_logs_each_config_warning_once(tmp_path: Path) -> None:
    config = write_config(tmp_path, port=free_port(), extra_global="stalenes = 3")
    d = Daemon(config, env={"SMOOSH_LOG_LEVEL": "INFO"})
    try:
        d.wait_ready()
    finally:
        assert d.stop() == 0
    assert d.log_path.read_text().count("stalenes: unknown key") == 1


@pytest.mark.parametrize("blank_lines", [0, 7], ids=["line 1", "line 9"])
def test_an_unclosed_section_header_is_one_line_of_the_same_shape_wherever_it_is(
    tmp_path: Path, blank_lines: int
) -> None:
    head = f"[smoosh]\nwatch = {tmp_path}\n" + "\n" * (blank_lines - 2) if blank_lines else ""
    config = config_file(tmp_path, head + "[smoosh.ratio_dbs\nconcurrency = 2\n")
    line = blank_lines + 1
    out = smoosh("config", "check", "--config", str(config))
    assert out.returncode == 1
    assert out.stderr == (f"smoosh: config error: {config}:{line}: '[smoosh.ratio_dbs': "
                          "a section header without its closing ]\n")


@pytest.mark.parametrize("key", ["watch", "roots"])
def test_a_missing_directory_is_the_same_one_line_error_in_config_check_and_in_run(
    tmp_path: Path, key: str
) -> None:
    # Given a config whose watch or roots names a directory that does not exist
    missing = tmp_path / "nonexistent" / "dir"
    config = write_config(tmp_path, port=free_port(), extra_global=f"{key} = {missing}")
    message = f"{config}: [smoosh] {key} = '{missing}': no such directory"
    # When it is checked, and when the daemon is started on it
    check = smoosh("config", "check", "--config", str(config))
    run = smoosh("run", "--config", str(config))
    # Then both refuse it with the same one line, exit 1
    assert (check.returncode, check.stderr) == (1, f"smoosh: config error: {message}\n")
    assert (run.returncode, run.stderr) == (1, f"smoosh: config error: {message}\n")


def test_a_watched_glob_needs_the_directory_of_its_fixed_part(tmp_path: Path) -> None:
    config = config_file(tmp_path, f"[smoosh]\nwatch = {tmp_path}/nope/*.db\n")
    out = smoosh("config", "check", "--config", str(config))
    assert out.stderr == f"smoosh: config error: {config}: [smoosh] watch = '{tmp_path}/nope/*.db': no such directory: {tmp_path}/nope\n"


def test_a_watch_option_naming_no_directory_is_refused_by_run(tmp_path: Path) -> None:
    config = write_config(tmp_path, port=free_port())
    run = smoosh("run", "--config", str(config), "--watch", str(tmp_path / "nope"))
    assert (run.returncode, run.stderr) == (1, f"smoosh: config error: --watch '{tmp_path / 'nope'}': no such directory\n")


def test_view_channels_no_compactor_can_feed_are_a_warning_naming_them(tmp_path: Path) -> None:
    # Given a pasted CouchDB config's view channels (the SQLite compactor has no indexes)
    config = config_file(tmp_path, f"""[smoosh]
watch = {tmp_path}
view_channels = upgrade_views,ratio_views,slack_views
""")
    out = smoosh("config", "check", "--config", str(config))
    assert out.returncode == 0
    assert out.stderr == (f"smoosh: warning: {config}: [smoosh] view_channels = 'upgrade_views,ratio_views,slack_views': "
                          "no compactor has indexes, so channel(s) upgrade_views, ratio_views, slack_views "
                          "never get work\n")


def test_a_clean_config_has_no_findings(tmp_path: Path) -> None:
    config = write_config(tmp_path, port=free_port())
    out = smoosh("config", "check", "--config", str(config))
    assert (out.returncode, out.stderr, out.stdout) == (0, "", f"{config}: ok (4 channel(s))\n")
