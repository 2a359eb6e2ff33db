"""What `pip install` gives a user: our distribution, its licence, `smoosh --version`, and the files a\ncheckout keeps in conf/ (sample config, systemd unit, Prometheus rules, Grafana dashboard)."""

from __future__ import annotations

import fnmatch
import importlib.metadata
import importlib.resources
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

import smoosh

ROOT = Path(__file__).resolve().parents[2]
DIST = "smoosh-compactor"


def _pyproject() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def test_smoosh_version_prints_the_installed_distribution_version() -> None:
    out = subprocess.run([sys.executable, "-m", "smoosh", "--version"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"smoosh {importlib.metadata.version(DIST)}"
    assert out.stdout.strip() == f"smoosh {smoosh.__version__}"


def test_the_distribution_is_not_the_unrelated_smoosh_on_the_index() -> None:
    project = _pyproject()["project"]
    # The command and the import packages keep the project's names; the distribution does not.
    assert project["name"] == DIST
    assert project["scripts"]["smoosh"] == "smoosh.cli:main"
    assert importlib.metadata.metadata(DIST)["Name"] == DIST


def test_the_licence_ships_and_the_build_floor_reads_it() -> None:
    project = _pyproject()
    assert project["project"]["license"] == "Apache-2.0"
    assert project["project"]["license-files"] == ["LICENSE"]
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    # An SPDX licence string and license-files need setuptools 77 (PEP 639).
    floor = [r for r in project["build-system"]["requires"] if r.startswith("setuptools")]
    assert floor == ["setuptools>=77"]
    assert importlib.metadata.metadata(DIST)["License-Expression"] == "Apache-2.0"


# ------------------------------------------------------------------ the files conf/ holds ship in the package

#: What `smoosh config sample` prints per option, and the checkout's file it is.
SAMPLES = {
    (): "conf/smoosh.ini",
    ("--unit",): "conf/smoosh.service",
    ("--rules",): "conf/prometheus/smoosh-rules.yml",
    ("--dashboard",): "conf/grafana/smoosh.json",
}


def _conf_files() -> list[str]:
    """Every file under the checkout's conf/, relative to conf/."""
    conf = ROOT / "conf"
    return sorted(str(p.relative_to(conf)) for p in conf.rglob("*") if p.is_file())


def test_the_package_data_is_the_checkouts_conf_itself_one_copy_of_each_file() -> None:
    # One copy: smoosh/conf_files is a link to conf/, not a second tree to keep in step
    link = ROOT / "smoosh" / "conf_files"
    assert link.is_symlink() and os.readlink(link) == "../conf"
    # Every file of conf/ is named by a package-data pattern, so none is left out of the wheel
    patterns = [p.removeprefix("conf_files/") for p in _pyproject()["tool"]["setuptools"]["package-data"]["smoosh"]
                if p.startswith("conf_files/")]
    files = _conf_files()
    assert files == ["grafana/smoosh.json", "prometheus/smoosh-rules.yml", "smoosh.ini", "smoosh.service"]
    assert [f for f in files if not any(fnmatch.fnmatch(f, p) for p in patterns)] == []
    # And the installed package reads each of them through importlib.resources
    shipped = importlib.resources.files("smoosh").joinpath("conf_files")
    for name in files:
        assert shipped.joinpath(*name.split("/")).read_text() == (ROOT / "conf" / name).read_text()


@pytest.mark.parametrize("options, name", SAMPLES.items(), ids=[" ".join(o) or "ini" for o in SAMPLES])
def test_config_sample_prints_the_shipped_file_from_any_directory(options: tuple[str, ...], name: str,
                                                                  tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "smoosh", "config", "sample", *options], cwd=tmp_path,
                         capture_output=True, text=True, timeout=30)
    assert (out.returncode, out.stderr) == (0, "")
    assert out.stdout == (ROOT / name).read_text()


def test_config_check_without_any_config_file_says_so_and_how_to_get_one(tmp_path: Path) -> None:
    # Given a directory with no conf/smoosh.ini, and no --config or $SMOOSH_CONFIG
    env = {k: v for k, v in os.environ.items() if k != "SMOOSH_CONFIG"}
    # When the config is checked there
    out = subprocess.run([sys.executable, "-m", "smoosh", "config", "check"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=30)
    # Then it names what is missing and the commands that get one, instead of judging the defaults
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr == (
        f"smoosh: config error: no config file: neither --config nor $SMOOSH_CONFIG names one, and there is no "
        f"conf/smoosh.ini in {tmp_path}; start from the shipped sample: `smoosh config sample > smoosh.ini`, "
        "set `watch` to your database directories, then `smoosh config check --config smoosh.ini`\n"
    )


def test_the_unit_installs_the_distribution_not_the_unrelated_smoosh() -> None:
    unit = (ROOT / "conf" / "smoosh.service").read_text()
    assert "pip install smoosh-compactor" in unit
    assert not re.search(r"pip install smoosh(\s|$)", unit)
    # It tells a user who has no checkout how to get the files it names
    assert "smoosh config sample > /etc/smoosh/smoosh.ini" in unit
    assert "cp conf/" not in unit


def _page_files() -> list[str]:
    """Every file of the operators' page in the checkout (smoosh/daemon/api/ui/)."""
    return sorted(p.name for p in (ROOT / "smoosh" / "daemon" / "api" / "ui").iterdir() if p.is_file())


def test_every_file_of_the_operators_page_is_package_data_and_served() -> None:
    from smoosh.daemon.api import page

    # Every file of ui/ is named by a package-data pattern, so none is left out of the wheel
    patterns = _pyproject()["tool"]["setuptools"]["package-data"]["smoosh"]
    for name in _page_files():
        assert any(fnmatch.fnmatch(f"daemon/api/ui/{name}", p) for p in patterns), name
    # And the page serves exactly those files, read through importlib.resources as an install reads them
    assert sorted(page.FILES) == _page_files()
    for name in page.FILES:
        found = page.page_file(name)
        assert found is not None and found.body == (ROOT / "smoosh" / "daemon" / "api" / "ui" / name).read_bytes()


@pytest.mark.slow
def test_a_built_wheel_installed_in_a_fresh_venv_carries_the_conf(tmp_path: Path) -> None:
    # Given the wheel pip builds from this tree, as a user's `pip install` would
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"),
                            str(ROOT)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("smoosh_compactor-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    assert {f"smoosh/conf_files/{name}" for name in _conf_files()} <= names
    assert {f"smoosh/daemon/api/ui/{name}" for name in _page_files()} <= names
    # When it is installed into a fresh venv and run from a directory outside the checkout
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    installed = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)], capture_output=True,
                               text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("SMOOSH_CONFIG", "PYTHONPATH")}

    def smoosh(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(venv / "bin" / "smoosh"), *args], cwd=outside, env=env, capture_output=True,
                              text=True, timeout=60)

    # Then `config check` with no file says so, and the sample it names makes a config that checks
    assert "no config file" in smoosh("config", "check").stderr
    for options, name in SAMPLES.items():
        assert smoosh("config", "sample", *options).stdout == (ROOT / name).read_text()
    (outside / "smoosh.ini").write_text(smoosh("config", "sample").stdout)
    (outside / "var" / "databases").mkdir(parents=True)
    checked = smoosh("config", "check", "--config", "smoosh.ini")
    assert (checked.returncode, checked.stderr, checked.stdout) == (0, "", "smoosh.ini: ok (4 channel(s))\n")
    # And the smoosh that ran is the installed one, not the checkout's
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import smoosh; print(smoosh.__file__)"], cwd=outside,
                           env=env, capture_output=True, text=True, timeout=60)
    assert where.stdout.startswith(str(venv)), where.stdout
