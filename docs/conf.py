"""Sphinx configuration of smoosh's documentation (built by `make docs`; strictly by `make test`).

Sphinx with MyST Markdown: the pages are plain Markdown, and ``_ext/smoosh_reference.py``
writes the reference pages from the code's own declarations at every build.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "_ext"))

from smoosh import __version__  # noqa: E402

project = "smoosh"
author = "the smoosh authors"
copyright = "the smoosh authors, Apache-2.0"  # noqa: A001 - Sphinx's name
version = release = __version__

extensions = ["myst_parser", "smoosh_reference"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "README.md"]

# Headings get anchors, so a page can link to a key or a section: [max_jobs](reference/config.md#max_jobs).
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence", "deflist"]
# A page that skips a heading level is style, not a broken document: pages from several hands stay welcome.
suppress_warnings = ["myst.header"]

html_theme = "furo"
html_title = f"smoosh {__version__}"
html_static_path: list[str] = []
# Nothing is fetched while building or reading: no external fonts, scripts or inventories.
html_show_sourcelink = False
