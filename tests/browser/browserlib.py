"""What the browser tests share: where the browser is, what is missing, waits, and a page on another origin."""

from __future__ import annotations

import importlib.util
import os
import shutil
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterator

from helpers.daemon import HANG_S

#: Where Debian's packages put them (``chromium``, ``chromium-driver``).
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
#: The page's screenshots go here when set (``make screenshots``: docs/images), else to a temp directory.
SCREENSHOTS_ENV = "SMOOSH_SCREENSHOTS"
#: Starts the reason of every browser test skipped here; the run's closing lines look for it.
SKIP_PREFIX = "browser tests skipped: "


def missing() -> str | None:
    """What the browser tests lack on this machine, in words, or None."""
    lacking = [name for name, path in (("chromium", CHROMIUM), ("chromedriver", CHROMEDRIVER))
               if not os.access(path, os.X_OK)]
    if lacking:
        return (f"{' and '.join(lacking)} not found (Debian: apt-get install chromium chromium-driver; "
                ".ci/run installs them)")
    if importlib.util.find_spec("selenium") is None:
        return "selenium is not installed (make install: it is in the test extras)"
    return None


def until(cond: Callable[[], Any], what: str) -> Any:
    """Wait for ``cond()`` to be truthy (exceptions count as not yet); the ceiling only bounds a hang."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.support.wait import WebDriverWait

    def check(_driver: Any) -> Any:
        try:
            return cond()
        except (WebDriverException, LookupError, ValueError):
            return False

    return WebDriverWait(None, HANG_S, poll_frequency=0.05).until(check, message=f"timed out waiting for {what}")


def severe(driver: Any) -> list[dict[str, Any]]:
    """The browser's console errors since the last call (reading the log empties it)."""
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def shoot(driver: Any, where: Path, name: str, *, full: bool = False) -> Path:
    """A PNG of the window (``full``: of the whole page, the window grown to its height, then restored)."""
    path = where / name
    if not full:
        driver.save_screenshot(str(path))
        return path
    size = driver.get_window_size()
    height = int(driver.execute_script("return document.documentElement.scrollHeight"))
    driver.set_window_size(size["width"], height + 140)  # the window's frame is counted in its size
    try:
        driver.save_screenshot(str(path))
    finally:
        driver.set_window_size(size["width"], size["height"])
    return path


#: A page of another origin that tries to drive the daemon as a hostile page would: a "simple"
#: request (no preflight: text/plain, no-cors), and a JSON one (which needs a preflight first).
FOREIGN_PAGE = """<!doctype html><html><head><meta charset="utf-8"><link rel="icon" href="data:,">
<title>elsewhere</title></head><body><script>
(async () => {
  const out = [];
  try {
    await fetch("TARGET/resume", {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"}, body: "{}"});
    out.push("simple request sent");
  } catch (e) { out.push("simple request failed"); }
  try {
    const r = await fetch("TARGET/resume", {method: "POST", headers: {"Content-Type": "application/json"}, body: "{}"});
    out.push("json request answered " + r.status);
  } catch (e) { out.push("json request blocked"); }
  document.body.textContent = out.join("; ");
  document.title = "done";
})();
</script></body></html>"""


@contextmanager
def foreign_page(target: str) -> Iterator[str]:
    """Serve :data:`FOREIGN_PAGE` aimed at ``target`` from another port of 127.0.0.1; yields its address."""
    body = FOREIGN_PAGE.replace("TARGET", target).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(HANG_S)
