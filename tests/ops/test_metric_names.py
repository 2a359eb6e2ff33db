"""A real scrape passes the exposition format's naming rules: promtool's own lint where the
machine has promtool, and the same rules checked in Python everywhere (``helpers/promlint.py``)."""

from __future__ import annotations

import pytest
from opslib import PausedDaemon, request

from helpers.promlint import lint
from helpers.promtool import check_metrics


@pytest.fixture(scope="module")
def exposition(paused: PausedDaemon) -> str:
    """One real scrape of a running daemon with keys queued."""
    reply = request(paused.url + "/metrics")
    assert reply.status == 200
    return reply.body.decode()


def test_a_real_scrape_passes_the_naming_rules_promtool_lints(exposition: str) -> None:
    assert lint(exposition) == []


def test_a_real_scrape_passes_promtool_check_metrics(exposition: str) -> None:
    run = check_metrics(exposition)
    assert (run.returncode, run.stdout + run.stderr) == (0, "")


def test_the_channels_configured_are_a_gauge_named_without_a_count_suffix(exposition: str) -> None:
    assert "# TYPE smoosh_channels gauge" in exposition.splitlines()
    assert "smoosh_channels 4.0" in exposition.splitlines()
    assert "smoosh_channel_count" not in exposition


@pytest.mark.parametrize(("text", "problem"), [
    ("# HELP smoosh_channel_count Channels.\n# TYPE smoosh_channel_count gauge\nsmoosh_channel_count 4.0\n",
     'smoosh_channel_count: non-histogram and non-summary metrics should not have a "_count" suffix'),
    ("# HELP smoosh_evicted Keys.\n# TYPE smoosh_evicted counter\nsmoosh_evicted 1.0\n",
     "smoosh_evicted: a counter's name should end in \"_total\""),
    ("# HELP smoosh_jobs_total Jobs.\n# TYPE smoosh_jobs_total gauge\nsmoosh_jobs_total 1.0\n",
     'smoosh_jobs_total: a gauge should not have a "_total" suffix (it reads as a counter)'),
    ("# HELP smoosh_wait_milliseconds Wait.\n# TYPE smoosh_wait_milliseconds gauge\nsmoosh_wait_milliseconds 1.0\n",
     "smoosh_wait_milliseconds: use base unit 'seconds' instead of 'milliseconds'"),
    ("# HELP smoosh_wait_ms Wait.\n# TYPE smoosh_wait_ms gauge\nsmoosh_wait_ms 1.0\n",
     "smoosh_wait_ms: abbreviated unit 'ms': spell it out"),
    ("# TYPE smoosh_quiet gauge\nsmoosh_quiet 1.0\n", "smoosh_quiet: no help text"),
    ("# HELP smoosh_runs_gauge Runs.\n# TYPE smoosh_runs_gauge gauge\nsmoosh_runs_gauge 1.0\n",
     "smoosh_runs_gauge: the name should not include its type 'gauge'"),
    ('# HELP smoosh_x X.\n# TYPE smoosh_x gauge\nsmoosh_x{channelName="a"} 1.0\n',
     "smoosh_x: label 'channelName' is not snake_case"),
])
def test_the_in_repo_lint_refuses_what_promtool_refuses(text: str, problem: str) -> None:
    assert problem in lint(text)
    run = None
    try:
        run = check_metrics(text)
    except pytest.skip.Exception:
        return  # no promtool here: the in-repo rule alone
    assert run.returncode != 0, (text, run.stdout)
