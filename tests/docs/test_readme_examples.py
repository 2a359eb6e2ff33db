"""Every shell and ini example of the README is run or checked (issue 19, DESIGN §11: "run or
checked" README examples are executed), so an example cannot rot: `smoosh` command lines are
parsed by the CLI's own argparse, the tour's Python heredoc runs, `make` targets exist, a
pytest run names test paths that exist, an environment variable set before a command is one
the project reads, and every ini block passes `smoosh config check`."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.summary import FDB_CLUSTER_ENV
from smoosh.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
#: Commands an example may use besides `smoosh` and `make`, each checked its own way below.
OTHER_COMMANDS = {"ls"}
#: Environment variables an example may set before its command (the suite reads each).
ENVIRONMENT = {FDB_CLUSTER_ENV, "SMOOSH_SOAK"}


def blocks(language: str) -> list[tuple[int, str]]:
    """The README's fenced blocks of ``language``: (line number of the fence, text)."""
    found = []
    for match in re.finditer(rf"^```{language}\n(.*?)^```$", README, re.S | re.M):
        found.append((README[:match.start()].count("\n") + 1, match.group(1)))
    return found


def commands(text: str) -> list[tuple[str, str | None]]:
    """The command lines of a shell block, comments dropped, each with its heredoc's text (or None)."""
    out: list[tuple[str, str | None]] = []
    lines = iter(text.splitlines())
    for line in lines:
        command = line.split("#", 1)[0].strip() if not line.lstrip().startswith("#") else ""
        if not command:
            continue
        heredoc = re.search(r"<<'?(\w+)'?", command)
        body = None
        if heredoc:
            end = heredoc.group(1)
            body_lines = []
            for inner in lines:
                if inner.strip() == end:
                    break
                body_lines.append(inner)
            body = "\n".join(body_lines) + "\n"
        out.append((command, body))
    return out


SHELL = [(line, command, body) for line, text in blocks("sh") for command, body in commands(text)]


def test_the_readme_has_shell_and_ini_examples() -> None:
    assert len(SHELL) >= 10
    assert blocks("ini")


@pytest.mark.parametrize("line, command, body", SHELL, ids=[f"line {n}: {c}" for n, c, _ in SHELL])
def test_every_shell_example_runs_or_parses(line: int, command: str, body: str | None, tmp_path: Path) -> None:
    words = shlex.split(command.split("<<", 1)[0])
    while re.fullmatch(r"[A-Z][A-Z0-9_]*=\S*", words[0]):
        name = words.pop(0).split("=", 1)[0]
        assert name in ENVIRONMENT, f"README line {line}: {name} is not a variable the project reads"
    if ">" in words:  # `smoosh config sample > smoosh.ini`: the command is what precedes the redirection
        words = words[:words.index(">")]
    program = os.path.basename(words[0])
    if program == "smoosh":
        # Parsed by the CLI's own parser: an option renamed or removed fails here.
        try:
            args = build_parser().parse_args(words[1:])
        except SystemExit as e:
            pytest.fail(f"README line {line}: {command!r} does not parse (exit {e.code})")
        assert getattr(args, "func", None) is not None, command
    elif program == "make":
        (target,) = words[1:]
        assert re.search(rf"^{re.escape(target)}:", (ROOT / "Makefile").read_text(), re.M), command
    elif program == "export":
        # The tour's one way onto the checkout's commands: the venv `make` sets up, first on PATH.
        assert words[1:] == ["PATH=$PWD/.venv/bin:$PATH"], command
        assert "VENV := .venv" in (ROOT / "Makefile").read_text()
    elif program == "python" and body is not None:
        # The tour's database builder, run as written in a scratch directory.
        out = subprocess.run([sys.executable, *words[1:]], input=body, cwd=tmp_path, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert re.fullmatch(r"\d+ bytes before\n", out.stdout), out.stdout
        assert int(out.stdout.split()[0]) > 10_000_000
    elif program == "python" and words[1:3] == ["-m", "pytest"]:
        paths = [w for w in words[3:] if w.startswith("tests/")]
        assert paths and all((ROOT / p).exists() for p in paths), command
    else:
        assert program in OTHER_COMMANDS, f"README line {line}: no check for {command!r}: add one here"


def options_of(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of ``parser`` and of its subcommands (``jobs list --type``)."""
    found = set()
    for action in parser._actions:
        found.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= options_of(sub)
    return found


def test_the_command_line_synopsis_names_only_options_the_parser_has() -> None:
    section = README[README.index("### Command line"):]
    start = section.index("```\n") + 4
    synopsis = section[start:section.index("```", start)]
    subcommands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    entries: list[str] = []
    for line in synopsis.splitlines():
        if line.startswith(" ") and entries:  # a long synopsis continues on an indented line
            entries[-1] += " " + line.strip()
        else:
            entries.append(line)
    assert len(entries) >= 8
    for entry in entries:
        words = entry.split()
        assert words[0] == "smoosh", entry
        if words[1].startswith("--"):  # an option of `smoosh` itself
            own = {o for action in build_parser()._actions for o in action.option_strings}
            assert words[1] in own, f"{entry!r}: smoosh has no {words[1]}"
            continue
        for name in words[1].split("|"):
            for option in re.findall(r"--[a-z-]+", entry):
                assert option in options_of(subcommands[name]), f"{entry!r}: smoosh {name} has no {option}"


@pytest.mark.parametrize("line, text", blocks("ini"), ids=[f"line {n}" for n, _ in blocks("ini")])
def test_every_ini_example_passes_config_check(line: int, text: str, tmp_path: Path) -> None:
    # Given the example as a config file, in a directory laid out as `make run` lays it out
    (tmp_path / "var" / "databases").mkdir(parents=True)
    config = tmp_path / "example.ini"
    config.write_text(text)
    # When `smoosh config check` reads it
    out = subprocess.run([sys.executable, "-m", "smoosh", "config", "check", "--config", str(config)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=30,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    # Then it is valid and draws no warning
    assert (out.returncode, out.stderr) == (0, ""), f"README line {line}"


def test_the_keys_the_readme_says_need_a_restart_are_the_ones_that_do() -> None:
    from smoosh.config.defaults import RESTART_KEYS

    sentence = README[:README.index(" need a restart")]
    sentence = sentence[sentence.rindex("\n\n"):]
    assert set(re.findall(r"`([a-z_]+)`", sentence)) == set(RESTART_KEYS)


def test_the_installed_users_block_runs_as_written(tmp_path: Path) -> None:
    # Given the README's block for a user who installed from the index, and a `smoosh` on PATH
    (text,) = [text for _, text in blocks("sh") if "smoosh config sample --unit" in text]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "smoosh").write_text(f"#!/bin/sh\nexec {sys.executable} -m smoosh \"$@\"\n")
    (bin_dir / "smoosh").chmod(0o755)
    # and the sample's `watch` directory, as setting `watch` to the databases would provide
    (tmp_path / "var" / "databases").mkdir(parents=True)
    # When it runs, line by line, outside the checkout
    out = subprocess.run(["bash", "-e", "-c", text], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}"))
    # Then every file it writes is the one the checkout has, and the sample config checks
    assert (out.returncode, out.stderr, out.stdout) == (0, "", "smoosh.ini: ok (4 channel(s))\n")
    for written, shipped in (("smoosh.ini", "smoosh.ini"), ("smoosh.service", "smoosh.service"),
                             ("smoosh-rules.yml", "prometheus/smoosh-rules.yml"), ("smoosh.json", "grafana/smoosh.json")):
        assert (tmp_path / written).read_text() == (ROOT / "conf" / shipped).read_text(), written


def test_the_readme_has_no_link_that_breaks_on_the_package_index() -> None:
    # The index page renders this README without the repository around it, and gives headings no
    # anchors: a relative link or a #fragment lands nowhere there (the project has no URL of its own).
    links = re.findall(r"\[[^\]]*\]\(([^)]*)\)", README)
    assert [link for link in links if not link.startswith(("http://", "https://"))] == []


def test_every_example_calls_the_command_one_way_and_the_readme_says_once_how_it_is_found() -> None:
    # One spelling of the command in every example: `smoosh`, put on PATH once in the tour
    assert ".venv/bin/smoosh" not in README
    assert README.count('export PATH="$PWD/.venv/bin:$PATH"') == 1
    tour = README[README.index("## A five-minute tour"):README.index("## How it works")]
    assert tour.index('export PATH="$PWD/.venv/bin:$PATH"') < tour.index("smoosh status")
