"""``smoosh demo``: the daemon on a handful of bloated SQLite files, start to finish, in seconds.

It builds five databases with plenty of dead space (WAL and rollback-journal files, plain
and ``auto_vacuum=incremental``) in a temp directory, runs :class:`smoosh.Server` in this
process with a temp store and an ephemeral admin port, shows the status table and each
compaction's progress, and prints what every database gave back::

    orders.db: reclaimed 2457600 bytes
    ...
    total: reclaimed 11296768 bytes

It reads no config file and leaves nothing behind. Exit code 0 when every database was
compacted and passes ``PRAGMA integrity_check``; 1 otherwise (or after 60 s).
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, TextIO

import apsw

from smoosh.cli import terminal
from smoosh.compactors.sqlite_open import open_database

log = logging.getLogger(__name__)

#: Seconds the demo waits for every compaction before it gives up.
DEMO_TIMEOUT_S = 60.0
#: Seconds between two redraws (terminal) or polls (pipe).
REFRESH_INTERVAL_S = 0.25
#: Random BLOB bytes per row of a demo database.
ROW_BYTES = 1000


@dataclass(frozen=True)
class DemoDatabase:
    """One demo database: its file name, journal mode, auto_vacuum mode and bloat."""

    name: str
    journal_mode: str
    auto_vacuum: str
    rows: int
    delete_fraction: float


#: The fleet: a mix of WAL and rollback journals, plain and incremental auto_vacuum, 2-5 MB each.
DATABASES = (
    DemoDatabase("orders.db", "wal", "none", 4000, 0.8),
    DemoDatabase("sessions.db", "delete", "none", 3000, 0.7),
    DemoDatabase("events.db", "wal", "incremental", 5000, 0.85),
    DemoDatabase("cache.db", "delete", "incremental", 2500, 0.75),
    DemoDatabase("tenants.db", "wal", "none", 3500, 0.6),
)


def build_database(path: str, spec: DemoDatabase) -> None:
    """Create ``path`` as ``spec`` says: fill a table, then delete its oldest rows.

    Deleting the oldest ids frees whole pages, which the free-list size estimate sees; the
    file keeps its size until a compaction gives the pages back.
    """
    # apsw, like every open of a user database in this process (DESIGN §11: two SQLite
    # libraries in one process break each other's locks); created here, so CREATE is fine.
    conn = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE)
    try:
        conn.execute(f"PRAGMA auto_vacuum={spec.auto_vacuum.upper()}")
        conn.execute(f"PRAGMA journal_mode={spec.journal_mode.upper()}")
        conn.execute("CREATE TABLE docs(id INTEGER PRIMARY KEY, key TEXT NOT NULL, body BLOB NOT NULL)")
        conn.execute(
            "INSERT INTO docs(key, body) "
            "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < ?) "
            "SELECT hex(randomblob(8)), randomblob(?) FROM n",
            (spec.rows, ROW_BYTES),
        )
        conn.execute("DELETE FROM docs WHERE id <= ?", (int(spec.rows * spec.delete_fraction),))
    finally:
        conn.close()  # the last connection of a WAL database checkpoints and removes the -wal


def disk_bytes(path: str) -> int:
    """Bytes a database occupies: the file plus its ``-wal`` (missing files count 0)."""
    total = 0
    for suffix in ("", "-wal"):
        try:
            total += os.path.getsize(path + suffix)
        except FileNotFoundError:
            pass
    return total


def integrity(path: str) -> str:
    """``PRAGMA integrity_check`` of ``path`` (``"ok"`` when the database is sound)."""
    conn = open_database(path, "ro", timeout_s=5.0)
    try:
        row = conn.execute("PRAGMA integrity_check").fetchone()
        return str(row[0]) if row else "no answer"
    finally:
        conn.close()


def demo_config_text(base: str) -> str:
    """The demo's config: everything under ``base``, no waits, no staleness, small files count."""
    return f"""[smoosh]
watch =
roots = {os.path.join(base, "dbs")}
state_dir = {os.path.join(base, "state")}
store = sqlite:{os.path.join(base, "state", "jobs.db")}
http = 127.0.0.1:0
node = demo
wait_secs = 0
staleness = 0
checkpoint_interval = 1s

[smoosh.ratio_dbs]
min_size = 64KiB

[smoosh.slack_dbs]
min_size = 64KiB
min_priority = 64KiB
"""


def run_demo(out: TextIO | None = None, *, timeout_s: float = DEMO_TIMEOUT_S) -> int:
    """Run the whole demo, printing to ``out``; returns the exit code (0 ok, 1 failure).

    Parameters:
        out: where to print (default stdout); progress is redrawn only when it is a terminal.
        timeout_s: seconds to wait for every compaction before giving up.
    """
    out = out or sys.stdout
    base = tempfile.mkdtemp(prefix="smoosh-demo-")
    try:
        return _run(base, out, timeout_s)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _run(base: str, out: TextIO, timeout_s: float) -> int:
    from smoosh.config import load_config
    from smoosh.daemon.api.http import AdminServer
    from smoosh.daemon.server import Server

    dbs_dir = os.path.join(base, "dbs")
    os.makedirs(dbs_dir)
    os.makedirs(os.path.join(base, "state"))
    config_path = os.path.join(base, "demo.ini")
    with open(config_path, "w", encoding="utf-8") as f:
        f.write(demo_config_text(base))

    paths: dict[str, str] = {}
    before: dict[str, int] = {}
    for spec in DATABASES:
        path = os.path.realpath(os.path.join(dbs_dir, spec.name))
        build_database(path, spec)
        paths[spec.name] = path
        before[spec.name] = disk_bytes(path)
        mode = f"{spec.journal_mode} journal, auto_vacuum={spec.auto_vacuum}"
        print(f"built {spec.name}: {before[spec.name]} bytes ({mode}, {spec.delete_fraction:.0%} deleted)", file=out)

    config = load_config(config_path)
    server = Server(config, watch_config=False)
    server.start()
    admin = AdminServer(server, config.http)
    admin.start()
    try:
        print(f"smoosh is running in this process; admin API on http://{admin.address}", file=out)
        for path in paths.values():
            server.enqueue(path)
        states = _wait(server, paths, out, timeout_s)
    finally:
        admin.stop()
        server.stop()
    return _report(paths, before, states, out, timeout_s)


def _wait(server: Any, paths: dict[str, str], out: TextIO, timeout_s: float) -> dict[str, dict[str, Any]]:
    """Show progress until every database's compaction has ended (or the timeout); the last /jobs rows."""
    from smoosh.cli.format import format_status

    tty = terminal.is_tty(out)
    screen = terminal.Screen(out) if tty else None
    names = {path: name for name, path in paths.items()}
    reported: dict[str, str] = {}
    deadline = time.monotonic() + timeout_s
    rows: dict[str, dict[str, Any]] = {}
    while True:
        rows = {names[r["key"]]: r for r in server.jobs_table() if r.get("key") in names}
        done = all(rows.get(n, {}).get("state") in ("finished", "crashing") for n in paths)
        if screen is not None:
            screen.draw(format_status(server.status()) + "\n\n" + "\n".join(_line(n, rows.get(n)) for n in paths))
        else:
            # A pipe gets one plain line per change of state, never a redraw.
            for name in paths:
                state = rows.get(name, {}).get("state")
                if state in ("running", "finished", "crashing") and reported.get(name) != state:
                    reported[name] = state
                    print(f"{name}: {state}", file=out)
        if done or time.monotonic() > deadline:
            return rows
        time.sleep(REFRESH_INTERVAL_S)


def _line(name: str, row: dict[str, Any] | None) -> str:
    """One database's line on the terminal: its state, with a progress bar while it runs."""
    state = (row or {}).get("state") or "examining"
    if state == "running":
        return f"{name:<14} {terminal.progress_bar((row or {}).get('progress') or 0.0)}"
    return f"{name:<14} {state}"


def _report(
    paths: dict[str, str], before: dict[str, int], rows: dict[str, dict[str, Any]], out: TextIO, timeout_s: float,
) -> int:
    ok = True
    total = 0
    for name, path in paths.items():
        state = rows.get(name, {}).get("state")
        if state != "finished":
            ok = False
            reason = rows.get(name, {}).get("last_error") or f"not compacted within {timeout_s:.0f} s (state {state or 'unknown'})"
            print(f"{name}: FAILED: {reason}", file=out)
            continue
        reclaimed = max(0, before[name] - disk_bytes(path))
        total += reclaimed
        print(f"{name}: reclaimed {reclaimed} bytes", file=out)
    print(f"total: reclaimed {total} bytes", file=out)
    bad = {name: result for name, result in ((n, integrity(p)) for n, p in paths.items()) if result != "ok"}
    for name, result in bad.items():
        print(f"{name}: integrity check FAILED: {result}", file=out)
    if not bad:
        print(f"integrity check: all {len(paths)} databases ok", file=out)
    if not ok or bad:
        print(f"demo failed; gave up after {timeout_s:.0f} s" if not ok else "demo failed", file=out)
        return 1
    return 0
