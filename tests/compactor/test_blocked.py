"""Blocked is not failed: a reader pinning the WAL, a read-only file or directory (issue 18).

The reader is a real connection in another process holding a read transaction on a real WAL
database. The read-only cases must really be read-only for the compactor: the suite runs as
root, which ignores file modes, so the compactor then runs in a child process that drops to
the ``nobody`` user after its imports (``os.setresuid``), and the child proves first that it
cannot write the file (``os.access``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from compactor.contexts import RecordingContext
from compactor.dbfactory import integrity, make_bloated_db
from helpers.locks import ChildConnection
from smoosh.compactors import READ_ONLY, Blocked, SqliteCompactor
from smoosh.compactors.sqlite_file import footprint_bytes
from smoosh.config.sections import SqliteConfig

#: The unprivileged user the read-only child runs as when the suite runs as root.
NOBODY = 65534


def settings(busy_timeout_s: float = 0.2) -> SqliteConfig:
    return SqliteConfig(busy_timeout_s=busy_timeout_s)


def test_a_reader_pinning_the_wal_blocks_the_compaction_and_names_the_bytes(tmp_path: Path) -> None:
    # Given a bloated WAL database and a reader (another process) inside a read transaction
    path = str(tmp_path / "w.db")
    make_bloated_db(path, rows=2000, delete_fraction=0.8)
    file_before = os.path.getsize(path)
    with ChildConnection(path) as reader:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM docs")
        # When it is compacted
        with pytest.raises(Blocked) as caught:
            SqliteCompactor(settings()).compact(path, RecordingContext())
        # Then it is blocked, not "ok, reclaimed 0 bytes": the file kept its size, and the
        # reason names the bytes the reader keeps in the WAL and the reader (pid, command line)
        wal = os.path.getsize(path + "-wal")
        assert wal > 0
        assert str(caught.value).startswith(
            f"a reader holds the WAL: {wal} bytes still in {path}-wal; held by pid {reader.proc.pid} ({sys.executable} -c ")
        assert not caught.value.read_only
        assert os.path.getsize(path) == file_before
        # And a retry while the reader stays is blocked again without writing another copy
        with pytest.raises(Blocked) as again:
            SqliteCompactor(settings()).compact(path, RecordingContext())
        assert str(again.value) == str(caught.value)
        assert os.path.getsize(path + "-wal") == wal
        reader.execute("COMMIT")
    # And once the reader is gone the next compaction gives the space back
    result = SqliteCompactor(settings()).compact(path, RecordingContext())
    assert result.size_after_bytes < file_before / 2
    assert footprint_bytes(path) == result.size_after_bytes
    assert integrity(path) == "ok"


# Runs the compactor as an unprivileged user: imports first (the interpreter lives where
# nobody may read), then the privileges go, then the proof that the file is not writable.
_CHILD = """
import json, os, sys
from smoosh.compactors import Blocked, SqliteCompactor
from smoosh.config.sections import SqliteConfig
sys.path.insert(0, sys.argv[2])
from compactor.contexts import RecordingContext
if os.geteuid() == 0:
    os.setgroups([])
    os.setresgid(%(uid)d, %(uid)d, %(uid)d)
    os.setresuid(%(uid)d, %(uid)d, %(uid)d)
path = sys.argv[1]
report = {"file_writable": os.access(path, os.W_OK), "dir_writable": os.access(os.path.dirname(path), os.W_OK)}
try:
    SqliteCompactor(SqliteConfig(busy_timeout_s=0.2)).compact(path, RecordingContext())
    report["raised"] = None
except Blocked as exc:
    report.update(raised="Blocked", message=str(exc), read_only=exc.read_only)
except Exception as exc:
    report.update(raised=type(exc).__name__, message=str(exc))
print(json.dumps(report))
""" % {"uid": NOBODY}


def _compact_unprivileged(path: str) -> dict:
    tests_dir = str(Path(__file__).resolve().parent.parent)
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, path, tests_dir], capture_output=True, text=True, timeout=30,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A temp directory the unprivileged child can reach (pytest's own is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="smoosh-ro-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("what", ["file", "directory"])
def test_a_read_only_database_is_blocked_read_only_and_untouched(open_dir: Path, what: str) -> None:
    tmp_path = open_dir
    # Given a bloated database that the compactor's user cannot write: the file itself, or
    # its directory (no journal can be created there)
    directory = tmp_path / "dbs"
    directory.mkdir()
    path = str(directory / "ro.db")
    make_bloated_db(path, rows=1000, delete_fraction=0.8, journal_mode="delete")
    if what == "file":
        os.chmod(path, 0o444)
        os.chmod(directory, 0o777)
    else:
        os.chmod(path, 0o666)
        os.chmod(directory, 0o555)
    digest = _digest(path)
    try:
        # When it is compacted
        report = _compact_unprivileged(path)
    finally:
        os.chmod(directory, 0o755)
    # Then the child really could not write it, and the compaction ended blocked: read-only,
    # with the database's bytes unchanged
    assert report["file_writable" if what == "file" else "dir_writable"] is False
    assert report == {**report, "raised": "Blocked", "message": READ_ONLY, "read_only": True}
    assert _digest(path) == digest
    assert not os.path.exists(path + "-journal")
    assert integrity(path) == "ok"

