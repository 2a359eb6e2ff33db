"""Progress bars and the in-place screen: exact text, since the text is the interface."""

from __future__ import annotations

import io

from smoosh.cli.format import status_summary
from smoosh.cli.terminal import Screen, format_running, is_tty, progress_bar


def test_a_progress_bar_fills_in_proportion_and_clamps() -> None:
    assert progress_bar(0.5, width=10) == "[#####.....]  50%"
    assert progress_bar(0.0, width=4) == "[....]   0%"
    assert progress_bar(1.7, width=4) == "[####] 100%"
    assert progress_bar(-1, width=4) == "[....]   0%"


def test_running_compactions_get_bars_on_a_terminal_and_percentages_in_a_pipe() -> None:
    jobs = [
        {"key": "/srv/a.db", "channel": "ratio_dbs", "state": "running", "progress": 0.25},
        {"key": "/srv/b.db", "channel": "ratio_dbs", "state": "finished", "progress": 1.0},
    ]
    assert format_running(jobs, bars=False) == " 25%  ratio_dbs  /srv/a.db"
    assert format_running(jobs, bars=True) == f"{progress_bar(0.25)}  ratio_dbs  /srv/a.db"
    assert format_running(jobs[1:], bars=True) == "no compaction running"


def test_a_screen_rewrites_only_its_own_previous_lines() -> None:
    out = io.StringIO()
    screen = Screen(out)
    screen.draw("one\ntwo")
    screen.draw("three")
    assert out.getvalue() == "one\ntwo\n\x1b[2F\x1b[Jthree\n"
    assert is_tty(out) is False


def test_the_systemd_status_line_sums_the_channels() -> None:
    status = {"channels": {
        "a": {"active": 2, "starting": 1, "waiting": {"size": 5}, "suspended": True},
        "b": {"active": 1, "starting": 0, "waiting": {"size": 7}, "suspended": False},
    }, "dry_run": True, "config_error": "bad"}
    assert status_summary(status) == "3 active, 1 starting, 12 waiting, 1 channel(s) suspended, dry run, config edit rejected"
