"""The README is the front door: short, the two commands first, the tour, and where to look next;
its release notes live in CHANGELOG.md (Keep a Changelog)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from smoosh import __version__

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
CHANGELOG = (ROOT / "CHANGELOG.md").read_text()
#: "A few hundred lines at most" (issue 47): read in five minutes.
README_MAX_LINES = 250


def test_the_readme_is_short_and_leads_with_the_two_commands() -> None:
    assert len(README.splitlines()) <= README_MAX_LINES
    first_commands = README.index("make run")
    assert first_commands < README.index("## A five-minute tour")
    assert "make test" in README[:README.index("## A five-minute tour")]


def test_the_readme_has_no_release_notes_and_the_changelog_has_them() -> None:
    assert "What changed" not in README
    assert "## [Unreleased]" in CHANGELOG
    versions = re.findall(r"^## \[([^\]]+)\]", CHANGELOG, re.M)
    # Unreleased first, then the version smoosh/__init__.py carries, newest first
    assert versions[:2] == ["Unreleased", __version__]
    for version in versions[1:]:
        section = CHANGELOG[CHANGELOG.index(f"## [{version}]"):]
        assert re.search(r"^### (Added|Changed|Deprecated|Removed|Fixed|Security)$", section, re.M), version


def test_the_readme_has_no_link_that_breaks_on_the_package_index() -> None:
    # The index page renders this README without the repository around it, and gives headings no
    # anchors: a relative link or a #fragment lands nowhere there (the project has no URL of its own).
    links = re.findall(r"\[[^\]]*\]\(([^)]*)\)", README)
    assert [link for link in links if not link.startswith(("http://", "https://"))] == []


def test_every_example_calls_the_command_one_way_and_the_readme_says_once_how_it_is_found() -> None:
    # One spelling of the command in every example: `smoosh`, put on PATH once in the tour
    assert ".venv/bin/smoosh" not in README
    assert README.count('export PATH="$PWD/.venv/bin:$PATH"') == 1
    tour = README[README.index("## A five-minute tour"):README.index("<!-- tour:end -->")]
    assert tour.index('export PATH="$PWD/.venv/bin:$PATH"') < tour.index("smoosh status")


@pytest.mark.parametrize("place", ["docs/tutorial.md", "docs/guides/", "docs/explanation/", "docs/reference/",
                                   "docs/benchmarks.md", "CHANGELOG.md"])
def test_the_readme_says_where_to_look_next_and_each_place_exists(place: str) -> None:
    assert f"`{place}`" in README
    assert (ROOT / place).exists()


def test_the_python_api_guide_says_how_keys_are_resolved() -> None:
    from smoosh import InvalidKey, Server
    from smoosh.config import Config

    guide = (ROOT / "docs" / "guides" / "python-api.md").read_text()
    assert "a relative path is not resolved against anything but\nrefused, `InvalidKey` with the reason `not an absolute path`" in guide
    # as the server does
    server = Server(Config.default(cwd="/srv"), workers=0, watch_config=False)
    with pytest.raises(InvalidKey) as caught:
        server.canonical_key("tenants/42.db")
    assert caught.value.reason == "not an absolute path"
