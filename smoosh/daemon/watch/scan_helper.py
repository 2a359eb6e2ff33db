"""The scan helper process: a tree walk in a child process, its findings streamed back.

A walk of a large tree holds the GIL for long stretches of ``os.scandir`` and ``stat`` work;
in a child process it cannot slow the daemon's own threads. The child
(``python -m smoosh.daemon.watch.scan``) reads its request as JSON on stdin and writes
NUL-separated records on stdout: ``P`` and a database path, ``W`` and a warning, ``E`` and
an error. A warning names a directory the walk skipped; the daemon says each once
(:func:`~smoosh.daemon.watch.hostile.say_once`), however many rescans meet it again.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from typing import Callable, Sequence

from smoosh.daemon.watch.hostile import say_once
from smoosh.daemon.watch.scan import WatchEntry

__all__ = ["run_scan_helper", "spawn_helper"]

log = logging.getLogger(__name__)


def spawn_helper() -> subprocess.Popen[bytes]:
    """Start a scan helper process; it waits for its request on stdin.

    The daemon starts the one for its start-up scan as its own start begins (the helper's
    interpreter then starts beside the daemon's, not after it) and hands it to the first
    scan (:func:`run_scan_helper`'s ``spare``); a helper whose stdin closes unread exits.

    Raises:
        OSError: the process could not be started.
    """
    return subprocess.Popen(
        # -S: no site-packages and no .pth files to read at start; the helper needs only the
        # standard library and smoosh, which _helper_env puts on its path.
        [sys.executable, "-S", "-m", "smoosh.daemon.watch.scan"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        # The helper writes to stderr only when Python itself fails (e.g. cannot import
        # smoosh): a short traceback, read after stdout ends, so the pipe cannot fill.
        stderr=subprocess.PIPE,
        env=_helper_env(),
        close_fds=True,
    )


def discard_helper(proc: subprocess.Popen[bytes]) -> None:
    """Kill a helper that will not be used (or has ended), reap it and close its pipes."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def run_scan_helper(
    entries: Sequence[WatchEntry],
    roots: dict[str, bool],
    changed_since: float | None,
    *,
    on_path: Callable[[str, bool], bool],
    started: Callable[[subprocess.Popen[bytes] | None], None],
    stop: threading.Event,
    spare: subprocess.Popen[bytes] | None = None,
) -> int:
    """Walk ``roots`` in a helper process; every database found goes to ``on_path``.

    Parameters:
        entries: the watch entries (what a path must match).
        roots: the directories to walk, each with whether to walk it recursively.
        changed_since: only files modified since (Unix seconds), or None for all.
        on_path: called with each database path found, and whether it is still being written
            (see :mod:`~smoosh.daemon.watch.scan`); True when it counts as found.
        started: told the helper process once it runs and None once it ended (so a stop can
            kill it).
        stop: set by a stop; a helper started after it is killed at once.
        spare: a helper :func:`spawn_helper` started ahead, used if it is still waiting (a new
            one is started otherwise); this call owns it from here.

    Returns:
        How many databases ``on_path`` counted.

    Raises:
        OSError: the helper process could not be started.
    """
    request = {
        "entries": [[e.spec, e.root, e.recursive, e.pattern] for e in entries],
        "roots": [[root, rec] for root, rec in roots.items()],
        "changed_since": changed_since,
    }
    if spare is not None and spare.poll() is not None:
        discard_helper(spare)  # it died waiting (killed by hand, say): start another
        spare = None
    proc = spare if spare is not None else spawn_helper()
    started(proc)
    if stop.is_set():
        proc.kill()  # the stop ran between its look at the running helper and started()
    count = 0
    try:
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps(request).encode())
            proc.stdin.close()
        except BrokenPipeError:
            pass  # the helper died at once; its exit code says so below
        buffer = b""
        while chunk := proc.stdout.read1(1 << 16):  # type: ignore[attr-defined]  # a BufferedReader
            buffer += chunk
            *records, buffer = buffer.split(b"\0")
            for record in records:
                count += _on_record(record, on_path)
        assert proc.stderr is not None
        errors = proc.stderr.read(1 << 16).decode("utf-8", "replace").strip()
        returncode = proc.wait()
        if returncode != 0 and not stop.is_set():
            detail = f":\n{errors}" if errors else ""
            log.error("the scan helper process exited with status %d%s", returncode, detail)
    finally:
        started(None)
        discard_helper(proc)
    return count


def _on_record(record: bytes, on_path: Callable[[str, bool], bool]) -> int:
    kind, body = record[:1], record[1:]
    if kind in (b"P", b"S"):
        return 1 if on_path(os.fsdecode(body), kind == b"S") else 0
    if kind == b"W":
        say_once(body.decode("utf-8", "replace"))
    elif kind == b"E":
        log.error("the scan helper process failed:\n%s", body.decode("utf-8", "replace"))
    return 0


def _helper_env() -> dict[str, str]:
    # The helper runs `-m smoosh.daemon.watch.scan`: make sure it imports the same smoosh package,
    # even when smoosh runs from a source tree that is not installed.
    env = dict(os.environ)
    # This file is <parent>/smoosh/daemon/watch/scan_helper.py: the helper needs <parent> on its path.
    package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    return env
