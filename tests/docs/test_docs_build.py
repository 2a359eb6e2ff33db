"""The documentation site builds with no warning, and fails on what the code leaves undocumented.

The build is the one `make docs` runs (Sphinx, warnings as errors: a broken link, a page in no
table of contents, a key, option, endpoint or metric without documentation), in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: A build of the whole site takes seconds; this only bounds a hang.
BUILD_TIMEOUT_S = 300


def build(out: Path, prelude: str = "") -> subprocess.CompletedProcess[str]:
    """``sphinx-build -E -W --keep-going -q`` of docs/ into ``out``, after running ``prelude`` in the same process."""
    script = textwrap.dedent(prelude) + textwrap.dedent(f"""
        import sys
        from sphinx.cmd.build import main
        sys.exit(main(["-E", "-W", "--keep-going", "-q", "-b", "html", {str(ROOT / 'docs')!r}, {str(out)!r}]))
    """)
    return subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=BUILD_TIMEOUT_S, env=dict(os.environ, PYTHONPATH=str(ROOT)))


def test_the_site_builds_with_no_warning(tmp_path: Path) -> None:
    done = build(tmp_path / "html")
    assert (done.returncode, done.stderr) == (0, "")
    for page in ("index", "tutorial", "benchmarks", "changelog", "reference/config", "reference/cli",
                 "reference/http", "reference/metrics"):
        assert (tmp_path / "html" / f"{page}.html").is_file(), page


#: What the code could define without documentation, each planted before the build.
UNDOCUMENTED = """
    import smoosh.config.values as values
    from smoosh.config import keys

    # a config key the parser reads, with no declaration (and so no doc string)
    original_get = values.SectionReader.get
    def get(self, key, parse, default):
        if self.section == "smoosh" and key == "max_jobs":
            self.raw("dummy_key_nobody_documented")
        return original_get(self, key, parse, default)
    values.SectionReader.get = get

    # a metric declared with no doc
    from smoosh.daemon.api import metrics
    metrics.METRICS = metrics.METRICS + (metrics.MetricDef("smoosh_dummy_metric_total", "counter", ""),)

    # an endpoint with no doc
    from smoosh.daemon.api import http
    http.ROUTES = http.ROUTES + (http.Route("GET", "/dummy-endpoint", "_status", "", ""),)

    # an option without help
    import smoosh.cli as cli
    original_build = cli.build_parser
    def build_parser():
        parser = original_build()
        parser.add_argument("--dummy-flag-without-help", action="store_true")
        return parser
    cli.build_parser = build_parser
"""


def test_what_the_code_defines_without_documentation_fails_the_build_naming_it(tmp_path: Path) -> None:
    # Given a key, a metric, an endpoint and an option that the code defines without documentation
    # When the site is built
    done = build(tmp_path / "html", UNDOCUMENTED)
    # Then the build fails, and says what is undocumented, each by name
    assert done.returncode != 0
    for name in ("dummy_key_nobody_documented", "smoosh_dummy_metric_total", "/dummy-endpoint",
                 "--dummy-flag-without-help"):
        assert name in done.stderr, (name, done.stderr)
    assert "config key 'dummy_key_nobody_documented' of `[smoosh]` is read by the parser but not declared" in done.stderr
