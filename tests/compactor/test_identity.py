"""Issue 25: the roots hold by identity, not by name.

A canonical path inside a root can name a file that lives outside: a hard link, a file on a
mount below the root, a side file that is a link. Each is refused where a key is measured
(priority 0, one WARNING), judged for an operator (``file_problem``: HTTP, the CLI,
``explain``) and where a compaction starts (``blocked``); an operator opts a root in. The
outside file is hashed before and after: smoosh must never write it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import apsw
import pytest

from compactor.contexts import RecordingContext
from compactor.dbfactory import integrity, make_bloated_db, row_count
from compactor.test_roots_at_open import fingerprint, settings
from smoosh.compactors import Blocked, SqliteCompactor

LOGGER = "smoosh.compactors.sqlite_open"
HARD_LINKS_2 = ("the file has 2 hard links: another name outside smoosh's view shares the file "
                "(allow_hard_links opts a root in)")


@pytest.fixture
def linked(tmp_path: Path) -> SimpleNamespace:
    """``outside/o.db``, a bloated database, hard-linked into the root as ``dbs/hard.db``."""
    base = Path(os.path.realpath(tmp_path))
    dbs, outside = base / "dbs", base / "outside"
    dbs.mkdir()
    outside.mkdir()
    victim = outside / "o.db"
    stats = make_bloated_db(str(victim), journal_mode="delete")
    inside = dbs / "hard.db"
    os.link(victim, inside)
    return SimpleNamespace(dbs=dbs, outside=outside, victim=victim, inside=inside, rows=stats["rows"])


def test_a_hard_linked_database_is_refused_and_the_outside_file_never_written(linked: SimpleNamespace) -> None:
    compactor = SqliteCompactor(settings(), roots=[str(linked.dbs)])
    before = fingerprint(linked.victim)
    key = str(linked.inside)

    assert compactor.sizes(key) is None  # priority 0: no channel takes it
    assert compactor.sizes(key, exact=True) is None
    assert compactor.file_problem(key) == HARD_LINKS_2  # what HTTP, the CLI and explain say
    with pytest.raises(Blocked) as info:
        compactor.compact(key, RecordingContext())
    assert str(info.value) == HARD_LINKS_2
    assert fingerprint(linked.victim) == before


def test_a_refused_file_is_warned_about_once(linked: SimpleNamespace, caplog: pytest.LogCaptureFixture) -> None:
    compactor = SqliteCompactor(settings(), roots=[str(linked.dbs)])
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(3):  # the watcher brings it back on every write
            assert compactor.sizes(str(linked.inside)) is None
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert lines == [f"Refused to compact the database {str(linked.inside)!r}: {HARD_LINKS_2}."]


def test_a_root_that_opts_in_has_its_hard_linked_databases_compacted(linked: SimpleNamespace) -> None:
    compactor = SqliteCompactor(settings(), roots=[str(linked.dbs)])
    compactor.set_roots([str(linked.dbs)], allow_hard_links=[str(linked.dbs)])
    assert compactor.file_problem(str(linked.inside)) is None
    result = compactor.compact(str(linked.inside), RecordingContext())
    assert result.reclaimed_bytes > 0
    assert integrity(str(linked.victim)) == "ok" and row_count(str(linked.victim)) == linked.rows


def test_an_opt_in_must_name_one_of_the_roots(linked: SimpleNamespace) -> None:
    with pytest.raises(ValueError) as info:
        SqliteCompactor(settings(), roots=[str(linked.dbs)]).set_roots(
            [str(linked.dbs)], allow_hard_links=[str(linked.outside)])
    assert str(info.value) == (f"allow_hard_links names {str(linked.outside)!r}, which is not one of the roots "
                               f"({linked.dbs})")


def test_a_hard_link_made_after_a_database_was_measured_blocks_its_compaction(linked: SimpleNamespace) -> None:
    # Measured alone, then linked (a nightly `cp -al` snapshot): the start's own look refuses it.
    alone = linked.dbs / "alone.db"
    make_bloated_db(str(alone), journal_mode="delete")
    compactor = SqliteCompactor(settings(), roots=[str(linked.dbs)])
    assert compactor.sizes(str(alone)) is not None
    snapshot = linked.outside / "snapshot.db"
    os.link(alone, snapshot)
    before = fingerprint(snapshot)
    with pytest.raises(Blocked):
        compactor.compact(str(alone), RecordingContext())
    assert fingerprint(snapshot) == before


def test_a_hard_linked_side_file_blocks_the_compaction(tmp_path: Path) -> None:
    base = Path(os.path.realpath(tmp_path))
    (base / "dbs").mkdir()
    db = base / "dbs" / "q.db"
    make_bloated_db(str(db), journal_mode="delete")
    outside = base / "elsewhere"
    outside.write_bytes(b"")  # an empty journal is not hot: SQLite would write into it
    os.link(outside, f"{db}-journal")
    compactor = SqliteCompactor(settings(), roots=[str(base / "dbs")])
    assert compactor.file_problem(str(db)) == "its -journal has 2 hard links (allow_hard_links opts a root in)"
    with pytest.raises(Blocked) as info:
        compactor.compact(str(db), RecordingContext())
    assert str(info.value) == "its -journal has 2 hard links (allow_hard_links opts a root in)"
    assert outside.read_bytes() == b""


# ---------------------------------------------------------------- the crash that made it matter

_COMPACT = textwrap.dedent(
    """
    import sys
    import time
    from types import SimpleNamespace
    from smoosh.compactors import Blocked, SqliteCompactor
    class Ctx:
        def progress(self, f): pass
        def checkpoint(self): pass
        def on_cancel(self, fn): pass
        def pause(self, seconds): time.sleep(seconds)
    s = SimpleNamespace(page_size=None, auto_vacuum=None, incremental_chunk_pages=50, busy_timeout_s=1.0)
    c = SqliteCompactor(s, roots=[sys.argv[1]])
    try:
        c.compact(sys.argv[2], Ctx())
        print("compacted", flush=True)
    except Blocked as e:
        print("blocked:", e, flush=True)
    sys.stdin.read()  # stay alive until killed
    """
)


def test_kill_9_of_a_compaction_of_a_hard_link_leaves_the_other_name_whole(linked: SimpleNamespace) -> None:
    # The trial: compact dbs/hard.db, kill -9 the process, then an application opens
    # the outside name and commits. Today the compaction never touches the file: its bytes are
    # those from before, and the application's commit and every old row are there.
    before = fingerprint(linked.victim)
    proc = subprocess.Popen([sys.executable, "-c", _COMPACT, str(linked.dbs), str(linked.inside)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        said = proc.stdout.readline().strip() if proc.stdout else ""
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    assert said == f"blocked: {HARD_LINKS_2}"
    assert fingerprint(linked.victim) == before
    app = apsw.Connection(str(linked.victim))
    app.execute("INSERT INTO docs(key, body) VALUES ('after the crash', x'00')")
    app.close()
    assert integrity(str(linked.victim)) == "ok"
    assert row_count(str(linked.victim)) == linked.rows + 1


# ---------------------------------------------------------------- another mount below a root

_PROBE = textwrap.dedent(
    """
    import json, sys
    from types import SimpleNamespace
    from smoosh.compactors import Blocked, SqliteCompactor
    class Ctx:
        def progress(self, f): pass
        def checkpoint(self): pass
        def on_cancel(self, fn): pass
        def pause(self, seconds): time.sleep(seconds)
    root, key, opt_in = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    s = SimpleNamespace(page_size=None, auto_vacuum=None, incremental_chunk_pages=50, busy_timeout_s=1.0)
    c = SqliteCompactor(s, roots=[root])
    c.set_roots([root], allow_mounts=[root] if opt_in else [])
    out = {"problem": c.file_problem(key)}
    try:
        out["reclaimed"] = c.compact(key, Ctx()).reclaimed_bytes
    except Blocked as e:
        out["blocked"] = str(e)
    print(json.dumps(out))
    """
)


def _in_a_mount_namespace(mounts: list[tuple[Path, Path]], *args: str) -> dict | None:
    """Run the probe where each ``(source, target)`` is bind-mounted; None when this host cannot."""
    if shutil.which("unshare") is None:
        return None
    binds = " && ".join(f"mount --bind '{src}' '{dst}'" for src, dst in mounts)
    script = f"{binds} && exec \"$0\" -c \"$1\" \"$2\" \"$3\" \"$4\""
    done = subprocess.run(["unshare", "--mount", "sh", "-c", script, sys.executable, _PROBE, *args],
                          capture_output=True, text=True, timeout=60)
    if done.returncode != 0 and "mount" in done.stderr and "Traceback" not in done.stderr:
        return None  # no CAP_SYS_ADMIN here
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("what", ["a directory", "a file"])
def test_a_database_on_a_bind_mount_below_its_root_is_refused_unless_the_root_opts_in(
    tmp_path: Path, what: str
) -> None:
    # A bind mount of the same file system keeps the device number: the mount id tells.
    base = Path(os.path.realpath(tmp_path))
    dbs, outside = base / "dbs", base / "outside"
    dbs.mkdir()
    outside.mkdir()
    victim = outside / "o.db"
    make_bloated_db(str(victim), journal_mode="delete")
    if what == "a directory":
        (dbs / "mnt").mkdir()
        mount, key = (outside, dbs / "mnt"), dbs / "mnt" / "o.db"
    else:
        (dbs / "f.db").write_bytes(b"")
        mount, key = (victim, dbs / "f.db"), dbs / "f.db"
    before = fingerprint(victim)
    refused = _in_a_mount_namespace([mount], str(dbs), str(key), "0")
    if refused is None:
        pytest.skip("needs unshare --mount and a bind mount (CAP_SYS_ADMIN)")
    reason = f"the file lies on another mount than its root {dbs} (allow_mounts opts a root in)"
    assert refused == {"problem": reason, "blocked": reason}
    assert fingerprint(victim) == before
    opted_in = _in_a_mount_namespace([mount], str(dbs), str(key), "1")
    assert opted_in is not None and opted_in["problem"] is None and opted_in["reclaimed"] > 0


# ---------------------------------------------------------------- the mount id, two ways

def _fdinfo_mount_id(fd: int) -> int | None:
    try:
        with open(f"/proc/self/fdinfo/{fd}") as info:
            for line in info:
                if line.startswith("mnt_id:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


@pytest.mark.parametrize("where", ["a file", "a directory", "/proc"])
def test_the_mount_id_statx_gives_is_the_one_fdinfo_names(tmp_path: Path, where: str) -> None:
    # The start and the enqueue compare a file's id with its root's: both must be read the
    # same way, and statx's must be the fdinfo's (the fallback where statx cannot say).
    from smoosh import identity

    target = {"a file": tmp_path / "f.db", "a directory": tmp_path, "/proc": Path("/proc/self")}[where]
    if where == "a file":
        target.write_bytes(b"")
    fd = os.open(target, os.O_RDONLY | getattr(os, "O_PATH", 0))
    try:
        expected = _fdinfo_mount_id(fd)
        if expected is None:
            pytest.skip("no /proc/self/fdinfo here")
        assert identity.mount_id(fd) == expected
        fast = identity._statx_mount_id(fd)
        assert fast in (None, expected)  # None: a kernel or libc without statx's mount id
    finally:
        os.close(fd)
