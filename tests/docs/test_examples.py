"""Every shell, Python and ini example of the README and the documentation pages is run or checked
(DESIGN §11: "run or checked" examples are executed), so an example cannot rot.

The convention, for everyone who writes a page:

- a ```` ```sh ```` block: every command line is checked. `smoosh` command lines are parsed by the
  CLI's own argparse, `make` targets must exist, the tour's Python heredoc runs, a pytest run must
  name test paths that exist, an environment variable set before a command must be one the project
  reads; any other command needs a check here (the test says so);
- a ```` ```python ```` block runs as written, in a scratch directory laid out as `make run` lays
  out the checkout, beside a running daemon, and must exit 0 with nothing on stderr and without
  touching the daemon's state;
- a ```` ```ini ```` block passes `smoosh config check` with no warning;
- a block meant only to be read is a ```` ```{code-block} LANGUAGE ```` directive, or
  ```` ```text ````: it is shown, never run.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from helpers.daemon import Daemon, free_port, write_config
from helpers.summary import FDB_CLUSTER_ENV

ROOT = Path(__file__).resolve().parents[2]
#: The pages whose examples are run: the README and every page of the documentation.
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "_ext" not in p.parts)]
#: Commands an example may use besides `smoosh` and `make`, each checked its own way below.
OTHER_COMMANDS = {"ls"}
#: Environment variables an example may set before its command (the suite reads each).
ENVIRONMENT = {FDB_CLUSTER_ENV, "SMOOSH_SOAK"}
#: What a Python example prints, where it says so: a piece of its code -> a piece of its output.
PRINTS = {
    'jobs.add("resize", "img-1"': "('resize', 'img-1', 'finished'",
    "class TextLogCompactor": "finished 30000 bytes left",
}


def name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def blocks(language: str) -> list[tuple[str, int, str]]:
    """Every fenced block of ``language`` in the pages: (page, line of the fence, text)."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in re.finditer(rf"^```{language}\n(.*?)^```$", text, re.S | re.M):
            found.append((name(page), text[:match.start()].count("\n") + 1, match.group(1)))
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


SHELL = [(page, line, command, body) for page, line, text in blocks("sh") for command, body in commands(text)]
PYTHON = blocks("python")
INI = blocks("ini")


def test_the_pages_have_examples_of_each_kind() -> None:
    assert len(SHELL) >= 20
    assert len(PYTHON) >= 4
    assert len(INI) >= 3


@pytest.mark.parametrize("page, line, command, body", SHELL, ids=[f"{p}:{n}: {c}" for p, n, c, _ in SHELL])
def test_every_shell_example_runs_or_parses(page: str, line: int, command: str, body: str | None,
                                            tmp_path: Path) -> None:
    from smoosh.cli import build_parser

    where = f"{page} line {line}"
    words = shlex.split(command.split("<<", 1)[0])
    while re.fullmatch(r"[A-Z][A-Z0-9_]*=\S*", words[0]):
        variable = words.pop(0).split("=", 1)[0]
        assert variable in ENVIRONMENT, f"{where}: {variable} is not a variable the project reads"
    if ">" in words:  # `smoosh config sample > smoosh.ini`: the command is what precedes the redirection
        words = words[:words.index(">")]
    program = os.path.basename(words[0])
    if program == "smoosh":
        # Parsed by the CLI's own parser: an option renamed or removed fails here.
        try:
            args = build_parser().parse_args(words[1:])
        except SystemExit as e:
            pytest.fail(f"{where}: {command!r} does not parse (exit {e.code})")
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
        assert program in OTHER_COMMANDS, (f"{where}: no check for {command!r}: add one to tests/docs/test_examples.py, "
                                           "or show the block without running it (```{code-block} sh)")


# ------------------------------------------------------------------ Python, beside a running daemon


@pytest.fixture(scope="module")
def beside_make_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A scratch directory laid out as `make run` lays out the checkout, with a daemon running on its var/."""
    base = Path(os.path.realpath(tmp_path_factory.mktemp("beside")))
    (base / "var" / "databases").mkdir(parents=True)
    state = base / "var" / "smoosh"
    config = write_config(base, port=free_port(), extra_global=f"watch = {base / 'var' / 'databases'}\n"
                          f"state_dir = {state}\nstore = sqlite:{state / 'jobs.db'}")
    daemon = Daemon(config)
    try:
        daemon.wait_ready()
        yield base
    finally:
        daemon.kill()


@pytest.mark.parametrize("page, line, code", PYTHON, ids=[f"{p}:{n}" for p, n, _ in PYTHON])
def test_every_python_example_runs_as_written_and_leaves_the_daemons_state_alone(
    page: str, line: int, code: str, beside_make_run: Path
) -> None:
    state = beside_make_run / "var" / "smoosh"
    before = sorted(p.name for p in state.iterdir())
    out = subprocess.run([sys.executable, "-c", code], cwd=beside_make_run, capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert (out.returncode, out.stderr) == (0, ""), f"{page} line {line}"
    for piece, printed in PRINTS.items():
        if piece in code:
            assert printed in out.stdout, f"{page} line {line}: {out.stdout!r}"
    # Its checkpoints, lock and store went to directories of its own, not the running daemon's state_dir
    assert sorted(p.name for p in state.iterdir()) == before


# ------------------------------------------------------------------ ini


@pytest.mark.parametrize("page, line, text", INI, ids=[f"{p}:{n}" for p, n, _ in INI])
def test_every_ini_example_passes_config_check(page: str, line: int, text: str, tmp_path: Path) -> None:
    # Given the example as a config file, in a directory laid out as `make run` lays it out
    (tmp_path / "var" / "databases").mkdir(parents=True)
    config = tmp_path / "example.ini"
    config.write_text(text)
    # When `smoosh config check` reads it
    out = subprocess.run([sys.executable, "-m", "smoosh", "config", "check", "--config", str(config)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=30,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    # Then it is valid and draws no warning
    assert (out.returncode, out.stderr) == (0, ""), f"{page} line {line}"


# ------------------------------------------------------------------ the installed user's block


def test_the_installed_users_block_runs_as_written(tmp_path: Path) -> None:
    # Given the README's block for a user who installed from the index, and a `smoosh` on PATH
    readme = (ROOT / "README.md").read_text()
    (text,) = [t for _, t in re.findall(r"^```(sh)\n(.*?)^```$", readme, re.S | re.M) if "smoosh config sample --unit" in t]
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
