"""The operators' page in a real browser: Debian's Chromium driven by its ChromeDriver through Selenium.

Skipped, with the reason naming what is missing, where the browser, its driver or Selenium is
not installed (``.ci/run`` installs the first two; Selenium is in the test extras); the end of
the run says so (tests/helpers/summary.py). One daemon and one browser serve every test of a
module (a module-scoped fixture), each test leaving the daemon as it found it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from browserlib import CHROMEDRIVER, CHROMIUM, SCREENSHOTS_ENV  # noqa: E402
from helpers.daemon import Daemon, free_port, write_config  # noqa: E402


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A real `smoosh run` on 127.0.0.1, its channels ready at once."""
    base = tmp_path_factory.mktemp("page")
    daemon = Daemon(write_config(base, port=free_port()))
    try:
        daemon.wait_ready()
        yield daemon
    finally:
        if daemon.proc.poll() is None:
            daemon.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Chromium, headless, with a fresh profile and nothing of its own on the network."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tmp_path_factory.mktemp("chromium-profile")
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
                f"--user-data-dir={profile}", "--window-size=1280,1000"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # The driver named outright: Selenium then never looks for (or downloads) one of its own.
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory the tests' screenshots go to."""
    wanted = os.environ.get(SCREENSHOTS_ENV)
    if wanted:
        path = Path(wanted)
        path.mkdir(parents=True, exist_ok=True)
        return path
    return tmp_path_factory.mktemp("screenshots")
