"""Without a browser the page's tests are skipped, and the run's closing lines say so plainly."""

from __future__ import annotations

from types import SimpleNamespace

import browserlib
import pytest

from helpers import summary


def test_what_is_missing_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(browserlib, "CHROMEDRIVER", "/nonexistent/chromedriver")
    assert browserlib.missing() == ("chromedriver not found (Debian: apt-get install chromium chromium-driver; "
                                    ".ci/run installs them)")
    monkeypatch.setattr(browserlib, "CHROMIUM", "/nonexistent/chromium")
    assert browserlib.missing().startswith("chromium and chromedriver not found")  # type: ignore[union-attr]


def test_the_closing_lines_say_how_many_browser_tests_were_skipped_and_why() -> None:
    reason = browserlib.SKIP_PREFIX + "chromedriver not found (Debian: apt-get install chromium chromium-driver; .ci/run installs them)"
    skipped = [SimpleNamespace(nodeid=f"tests/browser/test_page.py::test_{n}", longrepr=("test_page.py", 1, f"Skipped: {reason}"))
               for n in range(5)]
    lines = [line for line in summary.summary_lines(skipped) if "browser" in line]
    assert lines == ["the operators' page: 5 browser tests skipped: chromedriver not found (Debian: apt-get install "
                     "chromium chromium-driver; .ci/run installs them)"]
