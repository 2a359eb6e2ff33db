"""The start-up scan's helper process is started ahead: ``Server.start`` spawns it first, so
that its interpreter starts beside the rest of the daemon's start, and the first scan hands it
its request. A helper that died waiting is replaced; one nobody used is killed, never left.

Real helper processes, a real directory of SQLite files.
"""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path
from typing import Any

from smoosh.daemon.watch.scan import resolve_watch, watch_roots
from smoosh.daemon.watch.scan_helper import run_scan_helper, spawn_helper
from smoosh.daemon.watch.watcher import Watcher
from watcher.test_watcher import Seen, make_db

#: Ceiling on a helper process's walk of a few files (only bounds a hang).
HANG_S = 30.0


def _scan(directory: Path, spare: subprocess.Popen[bytes] | None) -> tuple[int, list[str], list[Any]]:
    """One scan of ``directory`` through ``run_scan_helper``: (count, paths found, helpers it ran)."""
    entries = [resolve_watch(str(directory))]
    found: list[str] = []
    ran: list[Any] = []

    def on_path(path: str, settling: bool) -> bool:
        found.append(path)
        return True

    count = run_scan_helper(entries, watch_roots(entries), None, on_path=on_path,
                            started=lambda proc: ran.append(proc), stop=threading.Event(), spare=spare)
    return count, found, ran


def test_a_scan_hands_its_request_to_the_helper_started_ahead(tmp_path: Path) -> None:
    db = make_db(tmp_path / "a.db")
    spare = spawn_helper()
    count, found, ran = _scan(tmp_path, spare)
    assert (count, found) == (1, [os.path.realpath(db)])
    assert ran[0] is spare, "the scan started a helper of its own"
    assert spare.returncode == 0  # it walked and ended: not killed, not left waiting
    assert spare.stdout is not None and spare.stdout.closed


def test_a_helper_that_died_waiting_is_replaced_and_the_scan_still_finds_everything(tmp_path: Path) -> None:
    db = make_db(tmp_path / "a.db")
    spare = spawn_helper()
    spare.kill()
    spare.wait(HANG_S)
    count, found, ran = _scan(tmp_path, spare)
    assert (count, found) == (1, [os.path.realpath(db)])
    assert ran[0] is not spare and ran[0].returncode == 0
    assert spare.stdout is not None and spare.stdout.closed  # the dead one's pipes are not left open


def test_the_watcher_gives_its_helper_to_the_first_scan_only(tmp_path: Path) -> None:
    make_db(tmp_path / "a.db")
    spare = spawn_helper()
    w = Watcher([str(tmp_path)], Seen(), scan_helper=spare)
    try:
        assert w.scan() == 1
        assert spare.returncode == 0
        assert w.scan() == 1  # a later scan starts its own: the spare is spent
    finally:
        w.stop()


def test_a_watcher_stopped_before_its_first_scan_kills_the_helper(tmp_path: Path) -> None:
    spare = spawn_helper()
    w = Watcher([str(tmp_path)], Seen(), scan_helper=spare)
    w.stop()
    assert spare.returncode is not None and spare.returncode != 0
    assert spare.stdin is not None and spare.stdin.closed
