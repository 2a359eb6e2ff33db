"""The operators' page: its files, shipped in the package (``ui/``), and the headers they are served with.

The page is plain HTML, CSS and JavaScript, with no build step and nothing fetched at run
time: ``GET /`` answers ``ui/index.html``, and ``GET /ui/NAME`` one of the few files it loads.
Only the names in :data:`FILES` are served, so no path from a request ever reaches the file
system. Each file is read once, at its first request (an idle daemon whose page nobody opens
never reads them), and kept with its ETag.

The headers keep the page to itself: a Content-Security-Policy that lets it load only its own
script and style sheet and talk only to this daemon, and that no other site may frame it (an
operator must not be tricked into a click on a page laid invisibly over another one).
"""

from __future__ import annotations

import hashlib
import importlib.resources
import threading

__all__ = ["FILES", "PAGE", "PREFIX", "HEADERS", "PageFile", "page_file"]

#: The URL path prefix of the page's own files.
PREFIX = "/ui/"
#: The page itself, answered at ``/``.
PAGE = "index.html"
#: Every file served: its name under ``ui/`` -> its content type.
FILES = {
    PAGE: "text/html; charset=utf-8",
    "page.js": "text/javascript; charset=utf-8",
    "page.css": "text/css; charset=utf-8",
}
#: Sent with every file of the page.
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # A new smoosh serves new files: the browser asks again each time, and gets 304 while its copy holds.
    "Cache-Control": "no-cache",
}


class PageFile:
    """One file of the page: its bytes, content type and ETag."""

    __slots__ = ("body", "content_type", "etag")

    def __init__(self, body: bytes, content_type: str) -> None:
        self.body = body
        self.content_type = content_type
        self.etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


_lock = threading.Lock()
_read: dict[str, PageFile] = {}


def page_file(name: str) -> PageFile | None:
    """The file ``name`` of the page (a key of :data:`FILES`), read at its first request; None for any other name.

    Raises:
        OSError: the package lacks the file (a broken install).
    """
    content_type = FILES.get(name)
    if content_type is None:
        return None
    with _lock:
        found = _read.get(name)
        if found is None:
            body = importlib.resources.files("smoosh.daemon.api").joinpath("ui", name).read_bytes()
            found = _read[name] = PageFile(body, content_type)
        return found
