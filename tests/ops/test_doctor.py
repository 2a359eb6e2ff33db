"""`smoosh doctor`: each check against real files, directories, locks and processes, then the
command end to end (issue 14 "Operator verbs", issue 15 "client and cluster versions").

The suite runs as root, which ignores file modes: the permission checks then run in a child
that drops to the ``nobody`` user first (as tests/compactor/test_blocked.py does), so a
``chmod`` means to them what it means to a daemon running as an ordinary user.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any, Iterator

import pytest

from compactor.dbfactory import make_bloated_db
from helpers.daemon import free_port
from helpers.fake_fdb import FakeBinding, install_fake_fdb
from opslib import PausedDaemon, smoosh_cli
from smoosh.cli import doctor
from smoosh.cli.doctor import FAIL, OK, WARN, Finding, Survey
from smoosh.cli.doctor.store import FDB_BINDING_FIX, FDB_FIX, check_fdb_store, check_store
from smoosh.store import fdb as fdb_store

#: The unprivileged user the permission checks run as when the suite runs as root.
NOBODY = 65534
ROOT_DIR = str(Path(__file__).resolve().parents[2])
LINE = re.compile(r"(ok  |warn|fail)  [^:]+: .+|      fix: .+|\d+ ok, \d+ warning\(s\), \d+ failure\(s\)|")


def statuses(findings: list[Finding]) -> list[str]:
    return [f.status for f in findings]


# ------------------------------------------------------------------ config


def test_a_config_that_does_not_load_is_the_one_finding(tmp_path: Path) -> None:
    config = tmp_path / "smoosh.ini"
    config.write_text("[smoosh]\nmax_jobs = lots\n")
    findings = doctor.run_checks(str(config))
    assert findings == [Finding(FAIL, "config", f"{config}: [smoosh] max_jobs = 'lots': must be an integer >= 1",
                                "correct the file (then `smoosh config check` says ok)")]


def test_config_warnings_are_warnings(tmp_path: Path) -> None:
    (tmp_path / "dbs").mkdir()
    config = tmp_path / "smoosh.ini"
    config.write_text(f"[smoosh]\nwatch = {tmp_path / 'dbs'}\nconcurency = 2\n")
    loaded, findings = doctor.check_config(str(config))
    assert loaded is not None
    assert statuses(findings) == [OK, WARN]
    assert "concurency: unknown key" in findings[1].finding


def test_an_open_check_that_is_not_built_is_a_warning_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    from smoosh.compactors import sqlite_guard

    assert doctor.check_open_check().status == OK  # make test's environment builds it
    monkeypatch.setattr(sqlite_guard, "_installed", [])
    assert doctor.check_open_check() == Finding(
        WARN, "open check", sqlite_guard.NOT_BUILT, "install a C compiler and Python's headers, then reinstall smoosh")


# ------------------------------------------------------------------ the walk


def test_the_walk_counts_directories_and_finds_the_largest_database(tmp_path: Path) -> None:
    dbs = tmp_path / "dbs"
    (dbs / "a" / "b").mkdir(parents=True)
    make_bloated_db(str(dbs / "small.db"), rows=200)
    make_bloated_db(str(dbs / "a" / "b" / "big.db"), rows=2000)
    (dbs / "a" / "notes.txt").write_text("not a database")
    (dbs / "a" / "b" / "big.db-wal").write_bytes(b"x" * 100)
    outside = tmp_path / "outside"
    outside.mkdir()
    (dbs / "link").symlink_to(outside)  # a directory symlink: not followed, as inotify does not
    s = doctor.survey([str(dbs)], [str(dbs)])
    assert s.watched_dirs == 3  # dbs, dbs/a, dbs/a/b
    assert s.databases == 2
    ((path, size),) = s.largest.values()
    assert (path, size) == (str(dbs / "a" / "b" / "big.db"), (dbs / "a" / "b" / "big.db").stat().st_size)
    assert not s.truncated and s.unwritable == []


def test_the_walk_stops_at_its_bound_and_says_so(tmp_path: Path) -> None:
    for i in range(10):
        (tmp_path / f"f{i}").write_text("x")
    s = doctor.survey([str(tmp_path)], [str(tmp_path)], max_files=3)
    assert (s.truncated, s.files_seen) == (True, 3)
    (finding,) = doctor.check_databases_writable(s)
    assert finding.finding.endswith("(the walk stopped after 3 files: at least that many)")


# ------------------------------------------------------------------ inotify


def limits(tmp_path: Path, watches: int, instances: int = 128, queued: int = 16384) -> str:
    proc = tmp_path / "inotify"
    proc.mkdir()
    for name, value in (("max_user_watches", watches), ("max_user_instances", instances), ("max_queued_events", queued)):
        (proc / name).write_text(f"{value}\n")
    return str(proc)


def test_enough_inotify_watches_is_ok(tmp_path: Path) -> None:
    findings = doctor.check_inotify(Survey(watched_dirs=99), usage=(3, 200), rescan_interval_s=600,
                                    proc_dir=limits(tmp_path, 8192))
    assert statuses(findings) == [OK, OK, OK]
    assert findings[0].finding.startswith("max_user_watches 8192 >= 100 directories to watch, 200 in use by ")


def test_fewer_watches_than_directories_fails_with_the_sysctl_to_raise(tmp_path: Path) -> None:
    s = Survey(watched_dirs=9000)
    watches = doctor.check_inotify(s, usage=(0, 0), rescan_interval_s=600, proc_dir=limits(tmp_path, 8192))[0]
    assert watches.status == FAIL
    assert "max_user_watches 8192 < 9001 directories to watch" in watches.finding
    assert "polling" in watches.finding
    assert watches.fix is not None and watches.fix.startswith("sysctl -w fs.inotify.max_user_watches=524288")


def test_watches_other_processes_hold_make_it_a_warning(tmp_path: Path) -> None:
    watches = doctor.check_inotify(Survey(watched_dirs=5000), usage=(2, 4000), rescan_interval_s=600,
                                   proc_dir=limits(tmp_path, 8192))[0]
    assert watches.status == WARN


def test_no_instance_left_fails_and_a_short_queue_warns(tmp_path: Path) -> None:
    findings = doctor.check_inotify(Survey(watched_dirs=1), usage=(8, 10), rescan_interval_s=600,
                                    proc_dir=limits(tmp_path, 8192, instances=8, queued=1024))
    assert statuses(findings) == [OK, FAIL, WARN]
    assert findings[1].fix == "sysctl -w fs.inotify.max_user_instances=1024"
    assert "each overflow costs a rescan of what changed" in findings[2].finding


def test_a_system_without_inotify_has_nothing_to_check(tmp_path: Path) -> None:
    (finding,) = doctor.check_inotify(Survey(), usage=None, rescan_interval_s=600, proc_dir=str(tmp_path / "none"))
    assert finding.status == OK


_INOTIFY_CHILD = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
if os.geteuid() == 0:
    os.setgroups([]); os.setresgid(%(uid)d, %(uid)d, %(uid)d); os.setresuid(%(uid)d, %(uid)d, %(uid)d)
fd = libc.inotify_init1(0)
assert fd >= 0, ctypes.get_errno()
for d in sys.argv[1:]:
    assert libc.inotify_add_watch(fd, d.encode(), 0x2) >= 0, ctypes.get_errno()
print("ready", flush=True)
sys.stdin.read()
""" % {"uid": NOBODY}


@pytest.mark.skipif(os.geteuid() != 0, reason="counts a user's watches exactly only for a user running nothing else")
def test_inotify_usage_counts_a_real_processs_instances_and_watches(open_dir: Path) -> None:
    dirs = [open_dir / name for name in ("a", "b", "c")]
    for d in dirs:
        d.mkdir()
    child = subprocess.Popen([sys.executable, "-c", _INOTIFY_CHILD, *map(str, dirs)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        assert doctor.inotify_usage(uid=NOBODY) == (1, 3)
        assert doctor.inotify_usage(uid=NOBODY, exclude_pids=[child.pid]) == (0, 0)  # a running smoosh's own
    finally:
        child.kill()
        child.wait()


# ------------------------------------------------------------------ permissions


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A temp directory the unprivileged child can reach (pytest's own is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="smoosh-doctor-"))
    os.chmod(path, 0o755)
    yield path
    for root, dirs, _files in os.walk(path):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o755)
    shutil.rmtree(path, ignore_errors=True)


_AS_USER = """
import json, os, sys
from smoosh.cli import doctor
import smoosh.daemon.watch.scan  # imported before the privileges go: nobody may not read the interpreter's files
if os.geteuid() == 0:
    os.setgroups([]); os.setresgid(%(uid)d, %(uid)d, %(uid)d); os.setresuid(%(uid)d, %(uid)d, %(uid)d)
request = json.loads(sys.argv[1])
if request["check"] == "access":
    findings = doctor.check_access(request["dirs"])
elif request["check"] == "state_dir":
    findings = [doctor.check_state_dir(request["dir"])]
else:
    findings = doctor.check_databases_writable(doctor.survey(request["dirs"], request["dirs"]))
print(json.dumps([f.to_json() for f in findings]))
""" % {"uid": NOBODY}


def as_user(**request: Any) -> list[dict[str, Any]]:
    """Run one permission check as an ordinary user (nobody, when the suite runs as root)."""
    out = subprocess.run([sys.executable, "-c", _AS_USER, json.dumps(request)], capture_output=True, text=True,
                         timeout=30, env=dict(os.environ, PYTHONPATH=ROOT_DIR))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_directories_must_be_listable_and_writable(open_dir: Path) -> None:
    good, read_only, closed = open_dir / "good", open_dir / "ro", open_dir / "closed"
    for d, mode in ((good, 0o777), (read_only, 0o555), (closed, 0o333)):
        d.mkdir()
        os.chmod(d, mode)
    found = as_user(check="access", dirs=[str(good), str(read_only), str(closed), str(open_dir / "missing")])
    assert [(f["check"], f["status"]) for f in found] == [
        (f"access {good}", OK), (f"access {read_only}", FAIL), (f"access {closed}", FAIL),
        (f"access {open_dir / 'missing'}", FAIL),
    ]
    assert "cannot write in this directory" in found[1]["finding"] and "blocked: read-only" in found[1]["finding"]
    assert "cannot list" in found[2]["finding"]
    assert found[3]["finding"] == "no such directory"
    assert all(f["fix"] for f in found[1:])


def test_the_state_dir_must_be_writable_or_creatable(open_dir: Path) -> None:
    writable, read_only = open_dir / "state", open_dir / "ro"
    writable.mkdir()
    os.chmod(writable, 0o777)
    read_only.mkdir()
    os.chmod(read_only, 0o555)
    assert as_user(check="state_dir", dir=str(writable))[0]["status"] == OK
    (created,) = as_user(check="state_dir", dir=str(writable / "new" / "state"))
    assert created["status"] == OK and "will be created" in created["finding"]
    assert not (writable / "new").exists()  # said, not done
    (refused,) = as_user(check="state_dir", dir=str(read_only / "state"))
    assert refused["status"] == FAIL and f"{read_only} is not writable" in refused["finding"]
    assert as_user(check="state_dir", dir=str(read_only))[0]["status"] == FAIL


def test_a_database_the_user_cannot_write_is_a_warning(open_dir: Path) -> None:
    dbs = open_dir / "dbs"
    dbs.mkdir()
    os.chmod(dbs, 0o777)
    make_bloated_db(str(dbs / "ok.db"), rows=100, journal_mode="delete")
    make_bloated_db(str(dbs / "locked.db"), rows=100, journal_mode="delete")
    os.chmod(dbs / "ok.db", 0o666)
    os.chmod(dbs / "locked.db", 0o444)
    (found,) = as_user(check="databases", dirs=[str(dbs)])
    assert found["status"] == WARN
    assert found["finding"].startswith("1 of 2 database(s) are not writable by nobody" if os.geteuid() == 0 else "1 of 2")
    assert found["finding"].endswith(f"blocked: read-only: {dbs / 'locked.db'}")


# ------------------------------------------------------------------ free space


def test_room_for_the_largest_databases_vacuum_is_ok(tmp_path: Path) -> None:
    make_bloated_db(str(tmp_path / "a.db"), rows=500)
    (finding,) = doctor.check_free_space(doctor.survey([str(tmp_path)], [str(tmp_path)]))
    assert finding.status == OK
    assert f"the largest database {tmp_path / 'a.db'}" in finding.finding


def test_a_database_whose_vacuum_does_not_fit_beside_min_free_space_fails(tmp_path: Path) -> None:
    # Given a database whose VACUUM writes about its live size, and a min_free_space that
    # leaves less than that free: the compactor would refuse it every time
    from smoosh.disk_room import MinFree

    db = tmp_path / "huge.db"
    make_bloated_db(str(db), rows=100, journal_mode="delete")
    free = shutil.disk_usage(tmp_path).free
    # (more than free: other processes may free some meanwhile)
    (finding,) = doctor.check_free_space(doctor.survey([str(tmp_path)], [str(tmp_path)]),
                                         min_free=MinFree(bytes=free + (1 << 30)))
    assert finding.status == FAIL
    assert f"the largest database {db}" in finding.finding and "is blocked every time" in finding.finding
    assert finding.fix is not None and f"[smoosh.ignore] {db} = true" in finding.fix


# ------------------------------------------------------------------ discard

#: A mount table as the kernel writes it: optional fields before the "-", a space escaped as
#: \040, and "discard" in one file system's super options (ext4 lists it there).
MOUNTINFO = "\n".join([
    "22 1 252:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard,errors=remount-ro",
    "40 22 0:36 / /srv rw,relatime shared:20 - xfs /dev/vdb rw,attr2,inode64",
    "41 40 0:37 / /srv/hot\\040data rw,relatime - ext4 /dev/vdc rw,discard",
    "42 40 0:38 / /srv/cold rw,nosuid master:7 - tmpfs tmpfs rw,size=65536k",
    "not a mountinfo line",
])


#: The mount each directory of these tests lies on (the kernel's answer, given).
MOUNT_OF = {"/srv/hot data/tenants": 41, "/srv/hot data/more": 41, "/srv/cold": 42, "/srv/else": 40, "/gone": None}


def test_the_mount_table_is_read_with_its_ids_escapes_and_both_sets_of_options() -> None:
    table = doctor.disk.mounts(MOUNTINFO)
    assert [(m.id, m.point) for m in table] == [(22, "/"), (40, "/srv"), (41, "/srv/hot data"), (42, "/srv/cold")]
    assert "discard" in table[0].options and "relatime" in table[0].options


def test_the_mount_of_a_real_directory_is_found_in_the_real_table(tmp_path: Path) -> None:
    with open(doctor.disk.MOUNTINFO) as f:
        table = {m.id: m for m in doctor.disk.mounts(f.read())}
    mount = doctor.disk._mount_id_of(str(tmp_path))
    assert mount in table
    assert str(tmp_path).startswith(table[mount].point.rstrip("/") + "/")
    assert doctor.disk._mount_id_of(str(tmp_path / "not" / "made" / "yet")) == mount  # its ancestor's


def test_a_root_on_a_file_system_mounted_with_discard_is_a_warning_naming_the_trim() -> None:
    findings = doctor.check_discard(["/srv/hot data/tenants", "/srv/cold", "/srv/hot data/more"], mountinfo=MOUNTINFO,
                                    mount_of=MOUNT_OF.get)
    assert findings == [Finding(
        WARN, "discard",
        "/srv/hot data (ext4 on /dev/vdc), under /srv/hot data/tenants, /srv/hot data/more, is mounted with discard: "
        "every file cut or shrunk there (a VACUUM's database, a -wal cut to 0) holds the application's writers while "
        "the device discards the freed blocks",
        "mount /srv/hot data without discard and trim on a timer instead (systemctl enable --now fstrim.timer)")]


def test_roots_on_file_systems_without_discard_are_ok() -> None:
    # ... and one the kernel names no mount for (gone) is not checked
    assert statuses(doctor.check_discard(["/srv/cold", "/srv/else", "/gone"], mountinfo=MOUNTINFO,
                                         mount_of=MOUNT_OF.get)) == [OK]


# ------------------------------------------------------------------ the lock


def test_a_lock_nobody_holds_is_free(tmp_path: Path) -> None:
    finding, holder = doctor.check_lock(str(tmp_path))
    assert (finding.status, holder) == (OK, None)
    assert "free" in finding.finding
    assert not (tmp_path / "smoosh.lock").exists()


def test_a_running_daemons_lock_names_its_pid(paused: PausedDaemon) -> None:
    finding, holder = doctor.check_lock(str(paused.base / "state"))
    pid = paused.daemon.proc.pid
    assert (finding.status, holder) == (OK, pid)
    assert finding.finding.endswith(f"held by pid {pid}: a smoosh daemon runs on this state_dir")


_STRANGER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, b"%d\\n" % os.getpid())
print("locked", flush=True)
sys.stdin.read()
"""


def test_a_lock_held_by_something_else_warns_and_a_dead_holder_frees_it(tmp_path: Path) -> None:
    lock = tmp_path / "smoosh.lock"
    child = subprocess.Popen([sys.executable, "-c", _STRANGER, str(lock)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "locked\n"
        finding, holder = doctor.check_lock(str(tmp_path))
        assert (finding.status, holder) == (WARN, child.pid)
        assert "does not look like smoosh" in finding.finding
        # When the holder dies however it dies, the kernel frees the lock
        child.send_signal(signal.SIGKILL)
        child.wait()
        finding, holder = doctor.check_lock(str(tmp_path))
        assert (finding.status, holder) == (OK, None)
        assert f"free (last held by pid {child.pid}, which has exited)" in finding.finding
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


# ------------------------------------------------------------------ the store


def test_a_missing_sqlite_store_will_be_created_and_is_not(tmp_path: Path) -> None:
    path = tmp_path / "state" / "jobs.db"
    (finding,) = check_store(f"sqlite:{path}")
    assert finding.status == OK and "will be created" in finding.finding
    assert not path.exists() and not path.parent.exists()


def test_an_existing_store_opens_read_only(tmp_path: Path) -> None:
    from smoosh.jobs import Jobs
    from smoosh.store import open_store

    path = tmp_path / "jobs.db"
    with open_store(f"sqlite:{path}") as store, Jobs(store, monitors=False) as jobs:
        jobs.set_type_timeout("smoosh:n", 30)
        jobs.add("smoosh:n", "/db/a", {})
    before = path.read_bytes()
    (finding,) = check_store(f"sqlite:{path}")
    assert finding.status == OK and finding.finding.startswith(f"sqlite:{path} opens read-only")
    assert path.read_bytes() == before


def test_a_corrupt_store_names_the_reset_flag(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    path.write_bytes(b"not a database at all" * 100)
    (finding,) = check_store(f"sqlite:{path}")
    assert finding.status == FAIL and "is corrupt" in finding.finding
    assert finding.fix is not None and finding.fix.startswith("smoosh run --reset-store")


def test_a_sqlite_file_that_is_not_a_job_store_fails(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x)")
    (finding,) = check_store(f"sqlite:{path}")
    assert finding.status == FAIL and "not a smoosh job store" in finding.finding


def test_a_memory_store_is_a_warning() -> None:
    (finding,) = check_store("memory:")
    assert finding.status == WARN and "a restart loses them" in finding.finding


def test_fdb_reports_binding_client_api_and_cluster_versions(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cluster = tmp_path / "fdb.cluster"
    cluster.write_text("test:test@127.0.0.1:4500\n")
    binding = FakeBinding(710, 730, client="7.3.43,0123abcd,fdb00b073000000")
    binding.status = {"cluster": {"processes": {"a": {"version": "7.3.43"}}}}
    install_fake_fdb(monkeypatch, binding)
    client, server = check_store(f"fdb:{cluster}")
    assert client == Finding(OK, "FoundationDB client", "binding 7.1.67 (API 710), client library 7.3.43 "
                                                        "(API up to 730), API version 710 selected")
    assert server == Finding(OK, "FoundationDB cluster", f"{cluster}: FoundationDB 7.3.43")


def test_fdb_a_cluster_of_another_version_than_the_client_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    binding = FakeBinding(None, 710, client="7.1.27,ff,fdb00b071010000")
    binding.status = {"cluster": {"processes": {"a": {"version": "7.3.43"}}}}
    install_fake_fdb(monkeypatch, binding)
    server = check_fdb_store(None)[1]
    assert server.status == FAIL
    assert "a 7.1 client library talks only to 7.1 clusters" in server.finding
    assert server.fix is not None and "external_client_library" in server.fix


def test_fdb_an_unreachable_cluster_fails_within_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    binding = FakeBinding(710, 710, client="7.1.27,ff,fdb00b071010000")
    binding.status = RuntimeError("Operation aborted because the transaction timed out")
    install_fake_fdb(monkeypatch, binding)
    server = check_fdb_store(None, timeout_s=2)[1]
    assert server.status == FAIL
    assert server.finding == ("the default cluster file: no answer within 2 s "
                              "(Operation aborted because the transaction timed out)")


def test_fdb_without_the_binding_or_the_client_library_fails_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_fdb(monkeypatch, None)
    (finding,) = check_fdb_store(None)
    assert (finding.status, finding.fix) == (FAIL, FDB_BINDING_FIX)
    assert "pip install 'smoosh-compactor[fdb]'" in FDB_BINDING_FIX
    install_fake_fdb(monkeypatch, FakeBinding(710, 710), impl_missing=True)
    (finding,) = check_fdb_store(None)
    assert (finding.status, finding.fix) == (FAIL, FDB_FIX)
    assert fdb_store.INSTALL_HINT in finding.finding


def test_fdb_a_missing_cluster_file_fails_before_asking(tmp_path: Path) -> None:
    (finding,) = check_fdb_store(str(tmp_path / "fdb.cluster"))
    assert finding.status == FAIL and finding.finding == f"{tmp_path / 'fdb.cluster'}: no such cluster file"


# ------------------------------------------------------------------ the admin API's address


def test_a_free_admin_address_is_ok() -> None:
    http = f"127.0.0.1:{free_port()}"
    assert doctor.check_admin(http, lock_pid=None) == Finding(OK, "admin API", f"{http}: free: `smoosh run` can "
                                                                              "listen on it")


def test_an_admin_address_another_process_listens_on_fails_naming_it(tmp_path: Path) -> None:
    # Given a program of another kind listening on the configured port (here: this test)
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        http = f"127.0.0.1:{taken.getsockname()[1]}"
        # When the doctor looks, Then it fails, naming the process (the lock's holder is not it)
        finding = doctor.check_admin(http, lock_pid=None)
        assert finding.status == FAIL
        assert finding.finding.startswith(f"{http}: taken by pid {os.getpid()} (")
        assert finding.finding.endswith("): `smoosh run` would exit, unable to listen on it")
        assert finding.fix == "stop that process, or give [smoosh] http another port"
        # ... and `smoosh doctor` exits 1 with that line
        done = smoosh_cli("doctor", "--config", str(write(tmp_path, http=http)))
        assert done.returncode == 1
        assert f"fail  admin API: {http}: taken by pid {os.getpid()} (" in done.stdout


def test_the_admin_address_this_nodes_running_daemon_holds_is_ok_and_said(paused: PausedDaemon) -> None:
    # Given this node's daemon running, holding its state_dir's lock and listening on its http
    _lock, holder = doctor.check_lock(str(paused.base / "state"))
    http = paused.url[len("http://"):]
    # When the doctor looks at that address, Then it says whose it is: this node's own daemon
    assert doctor.check_admin(http, lock_pid=holder) == Finding(
        OK, "admin API", f"{http}: held by this node's running daemon (pid {paused.daemon.proc.pid}, the holder of "
                         "state_dir's lock)")
    # ... while another address, free, with that daemon running, is one it does not listen on
    other = f"127.0.0.1:{free_port()}"
    assert doctor.check_admin(other, lock_pid=holder).status == WARN


def test_an_address_not_of_this_host_fails() -> None:
    finding = doctor.check_admin("192.0.2.1:5986", lock_pid=None)  # TEST-NET-1: on no interface here
    assert (finding.status, finding.finding) == (FAIL, "192.0.2.1:5986: not an address of this host")


# ------------------------------------------------------------------ the command


def write(tmp_path: Path, extra: str = "", *, store: str | None = None, http: str | None = None) -> Path:
    (tmp_path / "dbs").mkdir(exist_ok=True)
    config = tmp_path / "smoosh.ini"
    config.write_text(textwrap.dedent(f"""\
        [smoosh]
        watch = {tmp_path / 'dbs'}
        state_dir = {tmp_path / 'state'}
        store = {store or f"sqlite:{tmp_path / 'state' / 'jobs.db'}"}
        http = {http or f"127.0.0.1:{free_port()}"}
        """) + extra)
    return config


def test_doctor_on_a_healthy_host_prints_one_line_per_check_and_exits_0(tmp_path: Path) -> None:
    config = write(tmp_path)
    make_bloated_db(str(tmp_path / "dbs" / "a.db"), rows=300)
    done = smoosh_cli("doctor", "--config", str(config))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert all(LINE.fullmatch(line) for line in lines), lines
    checks = [re.match(r"ok    ([^:]+):", line).group(1) for line in lines if line.startswith("ok  ")]  # type: ignore[union-attr]
    for check in ("config", "open check", f"access {tmp_path / 'dbs'}", "state_dir", "databases", "inotify watches",
                  "inotify instances", "inotify queue", "free space", "lock", "admin API", "store"):
        assert check in checks, (check, lines)
    assert not (tmp_path / "state").exists()  # the doctor creates nothing


def test_doctor_json_and_a_failure_exit_1(tmp_path: Path) -> None:
    config = write(tmp_path, f"roots = {tmp_path / 'dbs'}, {tmp_path / 'gone'}\n")
    done = smoosh_cli("doctor", "--config", str(config), "--json")
    assert done.returncode == 1
    body = json.loads(done.stdout)
    assert body["ok"] is False
    failed = [c for c in body["checks"] if c["status"] == FAIL]
    assert {"status", "check", "finding", "fix"} == set(failed[0])
    assert any(c["check"] == f"access {tmp_path / 'gone'}" and c["fix"] for c in failed)


def test_doctor_without_a_foundationdb_client_fails_the_store_check(tmp_path: Path) -> None:
    try:
        fdb_store.client_max_api_version(__import__("fdb"))
        pytest.skip("a FoundationDB client library is installed here")
    except (ImportError, fdb_store.StoreUnavailable):
        pass
    cluster = tmp_path / "fdb.cluster"
    cluster.write_text("test:test@127.0.0.1:4500\n")
    config = write(tmp_path, store=f"fdb:{cluster}")
    done = smoosh_cli("doctor", "--config", str(config))
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    (i,) = [n for n, line in enumerate(lines) if line.startswith("fail  FoundationDB client: ")]
    assert lines[i + 1].startswith("      fix: ")
    assert "docs/guides/several-nodes.md" in lines[i + 1]

