"""Issues 25 and 27: compactions reserve the room they write, so a small disk never runs out because of smoosh.

A real tmpfs of 40 MiB, nearly full: four bloated databases (8 MB each, a quarter live), a
filler, and an application committing small rows throughout. A VACUUM writes about its live
size in journal (~2.6 MB reserved here; the temporary copy stays in its page cache): two fit
beside ``min_free_space``, three do not. Four compaction threads
share one :class:`~smoosh.disk_room.DiskRoom`, each retrying while its room is not there (as the
daemon's backoff would). Every database ends compacted, no SQLite call anywhere meets a full
disk, and the application's writes all commit. The old check (twice the *file* size, for one
compaction at a time) refused all four on this disk; without reservations, VACUUMs side by side
ran the disk full.

Runs in a private mount namespace (``unshare --mount``, root), so SQLite's temp directory can
be pointed into the tmpfs before SQLite starts; skipped where that is not allowed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[2]

_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, threading, time
    from types import SimpleNamespace
    sys.path.insert(0, sys.argv[2])
    from compactor.dbfactory import make_bloated_db
    import apsw
    from smoosh.compactors import InsufficientSpace, SqliteCompactor
    from smoosh.disk_room import DiskRoom, MinFree

    fs = sys.argv[1]
    dbs = [os.path.join(fs, f"t{i}.db") for i in range(4)]
    for db in dbs:
        make_bloated_db(db, rows=2000, row_bytes=4000, delete_fraction=0.75, journal_mode="delete")
    app_db = os.path.join(fs, "app.db")
    app = apsw.Connection(app_db)
    app.execute("CREATE TABLE log(x BLOB)")
    # Fill the disk up to 6.5 MiB free: room for two VACUUMs (a journal of ~2.6 MB each, the
    # temporary copy in their page cache) beside min_free_space, not three.
    st = os.statvfs(fs)
    with open(os.path.join(fs, "filler"), "wb") as f:
        f.write(b"\\0" * (st.f_bavail * st.f_frsize - int(6.5 * 2**20)))
    room = DiskRoom(MinFree(bytes=2**20))
    settings = SimpleNamespace(page_size=None, auto_vacuum=None, incremental_chunk_pages=100, busy_timeout_s=5.0)
    errors, blocked, reclaimed, app_errors, app_rows = [], [0], {}, [], [0]
    done = threading.Event()
    refused_once = threading.Event()

    class Ctx:
        # The first VACUUMs hold their room (inside the statement) until a third has been
        # refused: the turns are taken for sure, not only when the threads happen to overlap.
        def progress(self, f):
            refused_once.wait(60)
        def checkpoint(self): pass
        def on_cancel(self, fn): pass
        def pause(self, seconds): time.sleep(seconds)

    def compact(db):
        compactor = SqliteCompactor(settings, disk_room=room)
        for attempt in range(2000):
            try:
                reclaimed[db] = compactor.compact(db, Ctx()).reclaimed_bytes
                return
            except InsufficientSpace:
                blocked[0] += 1
                refused_once.set()
                time.sleep(0.01)
            except Exception as e:
                errors.append(f"{db}: {type(e).__name__}: {e}")
                return

    def application():
        while not done.is_set():
            try:
                app.execute("INSERT INTO log VALUES (randomblob(200))")
                app_rows[0] += 1
            except Exception as e:
                app_errors.append(f"{type(e).__name__}: {e}")
            time.sleep(0.002)

    writer = threading.Thread(target=application)
    writer.start()
    threads = [threading.Thread(target=compact, args=(db,)) for db in dbs]
    for t in threads: t.start()
    for t in threads: t.join()
    done.set()
    writer.join()
    count = app.execute("SELECT count(*) FROM log").fetchone()[0]
    print(json.dumps({"errors": errors, "blocked": blocked[0], "reclaimed": reclaimed, "app_errors": app_errors,
                      "app_rows": app_rows[0], "app_count": count, "reserved_left": room.reserved_bytes()}))
    """
)


def test_four_vacuums_on_a_nearly_full_disk_take_turns_and_never_fill_it(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare --mount to mount a tmpfs of its own")
    fs = tmp_path / "fs"
    fs.mkdir()
    (fs / "tmp").mkdir()
    env = dict(os.environ, SQLITE_TMPDIR=str(fs / "tmp"), TMPDIR=str(fs / "tmp"),
               PYTHONPATH=os.pathsep.join([str(PROJECT), str(PROJECT / "tests")]))
    script = f"mount -t tmpfs -o size=40m tmpfs '{fs}' && mkdir '{fs}/tmp' && exec \"$0\" -c \"$1\" \"$2\" \"$3\""
    done = subprocess.run(["unshare", "--mount", "sh", "-c", script, sys.executable, _SCRIPT, str(fs),
                           str(PROJECT / "tests")], capture_output=True, text=True, timeout=600, env=env)
    if done.returncode != 0 and "mount" in done.stderr and "Traceback" not in done.stderr:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["errors"] == [] and out["app_errors"] == []  # no "database or disk is full" anywhere
    assert len(out["reclaimed"]) == 4 and all(n > 0 for n in out["reclaimed"].values())
    assert out["blocked"] > 0  # they had to take turns: two at once did not fit
    assert out["app_count"] == out["app_rows"] > 0
    assert out["reserved_left"] == 0


_PRESSURE = textwrap.dedent(
    """
    import json, os, sys, time
    sys.path.insert(0, sys.argv[2])
    from smoosh.daemon.control.pressure import DiskPressure
    fs = sys.argv[1]
    p = DiskPressure(0.9, clock=time.time)
    p.check([fs])
    before = p.on(os.path.join(fs, "t.db"))
    st = os.statvfs(fs)
    with open(os.path.join(fs, "filler"), "wb") as f:  # to 95% used
        f.write(b"\\0" * int(st.f_bavail * st.f_frsize - 0.05 * st.f_blocks * st.f_frsize))
    changed = p.check([fs])
    (used,) = [round(u.used, 2) for u in p.snapshot()]
    print(json.dumps({"before": before, "changed": changed, "after": p.on(os.path.join(fs, "t.db")), "used": used}))
    """
)


def test_a_real_file_system_filled_past_disk_pressure_is_under_pressure(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare --mount to mount a tmpfs of its own")
    fs = tmp_path / "fs"
    fs.mkdir()
    script = f"mount -t tmpfs -o size=8m tmpfs '{fs}' && exec \"$0\" -c \"$1\" \"$2\" \"$3\""
    done = subprocess.run(["unshare", "--mount", "sh", "-c", script, sys.executable, _PRESSURE, str(fs), str(PROJECT)],
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0 and "mount" in done.stderr and "Traceback" not in done.stderr:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"before": False, "changed": True, "after": True, "used": 0.95}
