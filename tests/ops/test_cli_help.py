"""Every option and argument of every command says what it is for (`smoosh CMD --help`)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from opslib import smoosh_cli

from smoosh.cli import build_parser


def actions(parser: argparse.ArgumentParser, path: str = "smoosh") -> Iterator[tuple[str, argparse.Action]]:
    """Every action of ``parser`` and of its subcommands, named by its command path."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                yield f"{path} {choice.dest}", choice
            for name, sub in action.choices.items():
                yield from actions(sub, f"{path} {name}")
        elif not isinstance(action, argparse._HelpAction):
            yield path, action


def test_every_option_argument_and_command_has_help() -> None:
    found = list(actions(build_parser()))
    assert len(found) > 30
    missing = [f"{path}: {'/'.join(a.option_strings) or a.metavar or a.dest}"
               for path, a in found if not a.help or a.help == argparse.SUPPRESS]
    assert missing == []


def test_the_options_a_new_user_asked_about_say_what_they_are_for() -> None:
    assert "the daemon's admin API" in smoosh_cli("status", "--help").stdout
    enqueue = " ".join(smoosh_cli("enqueue", "--help").stdout.split())
    assert "relative paths resolve against this directory" in enqueue
    assert "the daemon's admin API" in enqueue
    worker = " ".join(smoosh_cli("worker", "--help").stdout.split())
    assert "--store URL the job store the daemon uses" in worker
    assert "--concurrency N compactions this process runs at once" in worker


def test_top_level_help_names_the_environment_variables() -> None:
    out = smoosh_cli("--help").stdout
    for name in ("SMOOSH_CONFIG", "SMOOSH_TOKEN", "SMOOSH_LOG_LEVEL"):
        assert name in out


@pytest.mark.parametrize("argv, message", [
    (["worker", "--concurrency", "0"], "'0': must be at least 1"),
    (["worker", "--concurrency", "-3"], "'-3': must be at least 1"),
    (["jobs", "list", "--limit", "0"], "'0': must be at least 1"),
    (["run", "--workers", "-1"], "'-1': must be 0 or more"),
    (["status", "--offset", "x"], "'x' is not an integer"),
])
def test_numeric_options_name_the_bad_value(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
