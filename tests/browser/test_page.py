"""The operators' page (issue 49) in Chromium, against a real `smoosh run` on 127.0.0.1.

What a person does with it: opens it (no console error), watches a compaction run with its
progress and land in the history, reads the charts, suspends a channel from the page (by
keyboard, after being asked), finds that a page of another origin cannot undo that, looks at a
channel's queue and asks why a database waits, in a narrow window and in dark mode. The
screenshots of the docs (docs/images/page-*.png) are taken here (``make screenshots``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from browserlib import SKIP_PREFIX, foreign_page, missing, severe, shoot, until

from compactor.dbfactory import make_bloated_db
from helpers.chunked import STALLED_AFTER_FIRST_CHUNK, chunk_section, chunked_db
from helpers.daemon import Daemon, write_config

pytestmark = pytest.mark.skipif(missing() is not None, reason=SKIP_PREFIX + str(missing()))


def by(css: str) -> tuple[str, str]:
    from selenium.webdriver.common.by import By

    return By.CSS_SELECTOR, css


def polls(driver: Any) -> int:
    """How many times the page has read the daemon (it counts them on its body)."""
    return int(driver.find_element(*by("body")).get_attribute("data-polled") or 0)


def open_page(driver: Any, site: Daemon) -> None:
    """Load the page and wait for its first reading of the daemon."""
    driver.get(site.url + "/")
    until(lambda: polls(driver) >= 1, "the page's first reading of the daemon")


def settled(driver: Any) -> None:
    """Wait for two more readings: whatever the daemon said before this call is on the page."""
    seen = polls(driver)
    until(lambda: polls(driver) >= seen + 2, "two more readings of the daemon")


def reconfigure(site: Daemon, *, extra_global: str = "", channels: str = "") -> None:
    """Rewrite the daemon's config (it reloads itself) and wait until its I/O budget and its token show the edit."""
    port = int(site.url.rsplit(":", 1)[1])
    write_config(site.config.parent, port=port, extra_global=extra_global, channels=channels)
    rate = re.search(r"max_io_rate = (\S+)", extra_global)
    wanted = int(rate.group(1)) if rate else "infinity"
    until(lambda: site.get("/status")["io_budget"]["max_io_rate"] == wanted, f"max_io_rate {wanted} in force")
    refused = 401 if "token = " in extra_global else 404  # a POST without it, naming no channel
    until(lambda: site.post("/resume", {"channel": "nosuch"})[0] == refused, f"a POST without a token answered {refused}")


def press(driver: Any, css: str, what: str) -> None:
    """Click the element ``css`` names, found afresh until the click lands (a reading may redraw its table)."""
    until(lambda: driver.find_element(*by(css)).click() or True, what)


def rows(driver: Any, table: str) -> list[Any]:
    return driver.find_elements(*by(f"#{table} tbody tr"))


def channel_badge(driver: Any, channel: str) -> str:
    return str(driver.find_element(*by(f'#channels tr[data-channel="{channel}"] .badge')).text)


def test_the_page_loads_with_no_console_error_and_shows_every_channel(site: Daemon, browser: Any) -> None:
    open_page(browser, site)
    settled(browser)
    names = [row.get_attribute("data-channel") for row in rows(browser, "channels")]
    assert names == ["upgrade_dbs", "ratio_dbs", "slack_dbs", "index_cleanup"]
    assert browser.title == "smoosh — testnode"
    assert browser.find_element(*by("#node")).text == "on testnode"
    assert browser.find_element(*by("#running-none")).is_displayed()
    assert severe(browser) == []


def test_a_compaction_shows_its_progress_age_and_end_then_lands_in_the_history_and_the_charts(
    site: Daemon, browser: Any, shots: Path,
) -> None:
    # Given an incremental compaction held after its first chunk by an I/O budget of one byte a
    # second (helpers/chunked.py): "running, a quarter done" is a state, not a moment to catch
    base = site.config.parent
    stats = chunked_db(base / "tenant-7.db")
    reconfigure(site, extra_global=STALLED_AFTER_FIRST_CHUNK, channels=chunk_section(stats))
    key = str(base / "dbs" / "tenant-7.db")
    os.rename(base / "tenant-7.db", key)
    until(lambda: [j for j in site.get("/jobs?state=running")["jobs"] if j["key"] == key and j["progress"] > 0],
          "the compaction under way")
    try:
        # When the page is open
        open_page(browser, site)
        row = until(lambda: browser.find_element(*by(f'#running tr[data-key="{key}"]')), "the running compaction")
        # Then it shows the run with its progress bar, its age and when it should end
        until(lambda: float(row.find_element(*by("progress")).get_attribute("value")) > 0.2, "its progress")
        cells = [cell.text for cell in row.find_elements(*by("td"))]
        assert cells[0] == key and cells[1] == "ratio_dbs"
        assert re.fullmatch(r"25%", cells[2]), cells
        assert cells[3] != "—" and cells[4].startswith("in "), cells
        assert row.find_element(*by("progress")).get_attribute("aria-label") == f"Progress of {key}"
        assert channel_badge(browser, "ratio_dbs") == "compacting"
        browser.execute_script("document.getElementById('running').scrollIntoView({block: 'center'})")
        shoot(browser, shots, "page-running.png")
    finally:
        # When the budget is lifted
        reconfigure(site, channels=chunk_section(stats))
    # Then it ends, leaves the running table and lands in the history with the bytes it gave back
    hist = until(lambda: browser.find_element(*by(f'#history tr[data-key="{key}"]')), "the compaction in the history")
    cells = [cell.text for cell in hist.find_elements(*by("td"))]
    assert cells[1:4] == [key, "ratio_dbs", "ok"], cells
    assert cells[4].endswith("MiB") or cells[4].endswith("KiB"), cells
    until(lambda: browser.find_element(*by("#running-none")).is_displayed(), "the running table emptied")
    # And the charts draw it: a bar of bytes reclaimed, a bar of ok compactions, the fleet's line
    until(lambda: browser.find_elements(*by("#chart-reclaimed svg rect.bar")), "a bar of bytes reclaimed")
    until(lambda: browser.find_elements(*by("#chart-compactions svg rect.bar.r-ok")), "a bar of ok compactions")
    until(lambda: browser.find_elements(*by("#chart-reclaimable svg path.line")), "the line of reclaimable bytes")
    legend = browser.find_element(*by("#chart-compactions .legend")).text
    assert re.search(r"\bok [1-9]", legend), legend
    label = browser.find_element(*by("#chart-compactions svg")).get_attribute("aria-label")
    assert re.search(r"by result: [1-9]\d* ok", label), label
    assert severe(browser) == []


def test_suspend_from_the_page_asks_then_stops_the_channel_and_a_page_elsewhere_cannot_undo_it(
    site: Daemon, browser: Any, shots: Path,
) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    open_page(browser, site)
    suspend = '#channels button[data-action="suspend"][data-channel="slack_dbs"]'
    assert until(lambda: browser.find_element(*by(suspend)).get_attribute("aria-label"), "the Suspend button of slack_dbs") \
        == "Suspend slack_dbs"
    # When the operator presses it from the keyboard, the page asks first, the safe answer focused
    until(lambda: browser.find_element(*by(suspend)).send_keys(Keys.ENTER) or True, "Enter on Suspend")
    dialog = browser.find_element(*by("#confirm"))
    until(lambda: dialog.get_attribute("open") is not None, "the question")
    assert browser.switch_to.active_element.get_attribute("id") == "confirm-cancel"
    assert browser.find_element(*by("#confirm-text")).text.startswith("Suspend channel slack_dbs?")
    shoot(browser, shots, "page-confirm.png")
    # And Escape changes nothing
    ActionChains(browser).send_keys(Keys.ESCAPE).perform()
    until(lambda: dialog.get_attribute("open") is None, "the question closed")
    assert site.get("/status")["channels"]["slack_dbs"]["suspended"] is False
    # While Tab to the action and Enter suspends the channel
    until(lambda: browser.find_element(*by(suspend)).send_keys(Keys.ENTER) or True, "Enter on Suspend again")
    until(lambda: dialog.get_attribute("open") is not None, "the question again")
    ActionChains(browser).send_keys(Keys.TAB).send_keys(Keys.ENTER).perform()
    until(lambda: site.get("/status")["channels"]["slack_dbs"]["suspended"] is True, "slack_dbs suspended")
    until(lambda: channel_badge(browser, "slack_dbs") == "suspended", "the page showing it suspended")
    assert severe(browser) == []

    # When a page of another origin, open in the same browser, tries to resume every channel
    before = site.log().count('"POST /resume HTTP/1.1"')
    with foreign_page(site.url) as elsewhere:
        browser.get(elsewhere)
        until(lambda: browser.title == "done", "the other page's attempts")
        said = browser.find_element(*by("body")).text
    severe(browser)  # that page's own console (a refused preflight) is not the operators' page's
    # Then the simple request reached the daemon and was refused, the JSON one never got past its preflight
    assert said == "simple request sent; json request blocked"
    log = site.log()
    assert log.count('"POST /resume HTTP/1.1" 403') == 1 and log.count('"POST /resume HTTP/1.1"') == before + 1
    assert '"OPTIONS /resume HTTP/1.1" 405' in log
    assert site.get("/status")["channels"]["slack_dbs"]["suspended"] is True

    # And the page itself resumes it, with a click this time
    open_page(browser, site)
    press(browser, '#channels button[data-action="resume"][data-channel="slack_dbs"]', "the Resume button of slack_dbs")
    dialog = browser.find_element(*by("#confirm"))
    until(lambda: dialog.get_attribute("open") is not None, "the question")
    browser.find_element(*by("#confirm-ok")).click()
    until(lambda: site.get("/status")["channels"]["slack_dbs"]["suspended"] is False, "slack_dbs resumed")
    until(lambda: browser.find_element(*by("#announce")).text == "Resume: done for channel slack_dbs.", "the page saying so")
    assert severe(browser) == []


def test_a_queue_is_paged_and_explained_and_the_page_reads_in_a_narrow_window_and_in_the_dark(
    site: Daemon, browser: Any, shots: Path,
) -> None:
    from selenium.webdriver.support.select import Select

    # Given three databases waiting in a suspended channel
    assert site.post("/suspend", {"channel": "ratio_dbs"})[0] == 200
    dbs = site.config.parent / "dbs"
    keys = [str(dbs / f"tenant-{n}.db") for n in ("a", "b", "c")]
    for key in keys:
        make_bloated_db(key, rows=400, delete_fraction=0.8)
    until(lambda: site.get("/queue?channel=ratio_dbs")["total"] == 3, "three databases queued")
    try:
        # When the operator shows that channel's queue and asks why the first one waits
        open_page(browser, site)
        Select(browser.find_element(*by("#queue-channel"))).select_by_value("ratio_dbs")
        until(lambda: len(rows(browser, "queue")) == 3, "the queue on the page")
        assert browser.find_element(*by("#queue-range")).text == "1–3 of 3"
        first = rows(browser, "queue")[0]
        key = first.get_attribute("data-key")
        assert key in keys and first.find_elements(*by("td"))[0].text == "1"
        press(browser, "#queue tbody tr:first-child button[data-explain]", "Why? of the first database")
        # Then the answer of explain is shown, and the keyboard lands on it
        until(lambda: "queued" in browser.find_element(*by("#explain-body dl")).text, "the explanation")
        assert browser.find_element(*by("#explain-h")).text == f"Why: {key}"
        assert browser.switch_to.active_element.get_attribute("id") == "explain-h"
        browser.execute_script("document.getElementById('queue-panel').scrollIntoView()")
        shoot(browser, shots, "page-queue.png")
        browser.execute_script("window.scrollTo(0, 0)")
        shoot(browser, shots, "page-overview.png", full=True)

        # And every control is named for a screen reader, every chart says what it shows
        unnamed = browser.execute_script("""
            return [...document.querySelectorAll('button, input, select')]
              .filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label') && !e.textContent.trim())
              .map(e => e.outerHTML)""")
        assert unnamed == []
        for svg in browser.find_elements(*by(".chart svg")):
            assert svg.get_attribute("role") == "img" and svg.get_attribute("aria-label")

        # In a narrow window nothing runs off the side: the tables scroll inside their boxes
        size = browser.get_window_size()
        browser.set_window_size(400, 900)
        try:
            settled(browser)
            browser.execute_script("document.getElementById('channels-h').scrollIntoView()")
            width = browser.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
            assert width[0] <= width[1], width
            shoot(browser, shots, "page-narrow.png")
        finally:
            browser.set_window_size(size["width"], size["height"])

        # In dark mode the page is dark
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia",
                                {"features": [{"name": "prefers-color-scheme", "value": "dark"}]})
        try:
            background = browser.execute_script("return getComputedStyle(document.body).backgroundColor")
            channels = [int(c) for c in re.findall(r"\d+", background)[:3]]
            assert max(channels) < 60, background
            shoot(browser, shots, "page-dark.png")
        finally:
            browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
        assert severe(browser) == []
    finally:
        assert site.post("/resume", {"channel": "ratio_dbs"})[0] == 200
    until(lambda: site.get("/queue?channel=ratio_dbs")["total"] == 0, "the queue drained")


def test_enqueue_with_force_and_flush_from_the_page(site: Daemon, browser: Any) -> None:
    # Given a suspended channel with two databases waiting
    assert site.post("/suspend", {"channel": "ratio_dbs"})[0] == 200
    dbs = site.config.parent / "dbs"
    keys = [str(dbs / f"tenant-{n}.db") for n in ("x", "y")]
    for key in keys:
        make_bloated_db(key, rows=400, delete_fraction=0.8)
    until(lambda: site.get("/queue?channel=ratio_dbs")["total"] == 2, "two databases queued")
    try:
        open_page(browser, site)
        # When the operator enqueues the last of them with force, and says yes
        browser.find_element(*by("#enqueue-key")).send_keys(keys[1])
        browser.find_element(*by("#enqueue-force")).click()
        browser.find_element(*by('#enqueue button[type="submit"]')).click()
        until(lambda: browser.find_element(*by("#confirm")).get_attribute("open") is not None, "the question")
        assert browser.find_element(*by("#confirm-text")).text == (
            f"Enqueue {keys[1]} with force (its thresholds, staleness and crash backoff skipped)?")
        browser.find_element(*by("#confirm-ok")).click()
        # Then the page says where it went, and the queue puts it first (the suspension still holds it)
        until(lambda: browser.find_element(*by("#enqueue-result")).text.startswith("Queued in ratio_dbs at priority ∞"),
              "the enqueue's verdict")
        assert site.get("/queue?channel=ratio_dbs&limit=1")["keys"][0] == {
            "key": keys[1], "priority": "infinity", "place": "queue", "position": 1, "forced": True}
        # When the operator flushes the channel from the page
        press(browser, '#channels button[data-action="flush"][data-channel="ratio_dbs"]', "the Flush button of ratio_dbs")
        browser.find_element(*by("#confirm-ok")).click()
        # Then its waiting databases are gone, and the page says how many
        until(lambda: site.get("/queue?channel=ratio_dbs")["total"] == 0, "the queue flushed")
        until(lambda: browser.find_element(*by("#announce")).text == "Flush: done for channel ratio_dbs (2 databases dropped).",
              "the page saying so")
        assert severe(browser) == []
    finally:
        assert site.post("/resume", {"channel": "ratio_dbs"})[0] == 200


def test_once_a_token_is_set_the_page_asks_for_it_once_and_keeps_it_in_the_tab(site: Daemon, browser: Any) -> None:
    from selenium.webdriver.common.keys import Keys

    token = "page-test-token-0123456789"
    reconfigure(site, extra_global=f"token = {token}")
    try:
        open_page(browser, site)
        # When the operator suspends a channel, the daemon wants the token: the page asks for it
        press(browser, '#channels button[data-action="suspend"][data-channel="upgrade_dbs"]', "the Suspend button of upgrade_dbs")
        browser.find_element(*by("#confirm-ok")).click()
        asked = browser.find_element(*by("#token"))
        until(lambda: asked.get_attribute("open") is not None, "the page asking for the token")
        assert browser.switch_to.active_element.get_attribute("id") == "token-input"
        assert browser.find_element(*by("#token-why")).text == "This daemon takes changes only with its token."
        browser.switch_to.active_element.send_keys(token, Keys.ENTER)
        # Then the same request goes again with it, and acts
        until(lambda: site.get("/status")["channels"]["upgrade_dbs"]["suspended"] is True, "upgrade_dbs suspended")
        assert browser.execute_script("return sessionStorage.getItem('smoosh-token')") == token
        # And the next change sends it without asking
        press(browser, '#channels button[data-action="resume"][data-channel="upgrade_dbs"]', "the Resume button of upgrade_dbs")
        browser.find_element(*by("#confirm-ok")).click()
        until(lambda: site.get("/status")["channels"]["upgrade_dbs"]["suspended"] is False, "upgrade_dbs resumed")
        assert asked.get_attribute("open") is None
        # The one console error is the refused request's own line (401), said by the browser
        errors = [e["message"] for e in severe(browser)]
        assert all("401" in message for message in errors) and len(errors) <= 1, errors
        browser.execute_script("sessionStorage.clear()")
    finally:
        reconfigure(site)
