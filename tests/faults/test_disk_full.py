"""Disk full while checkpointing: the old checkpoint stays intact; the failure is logged and counted; work goes on.

Two ways to fill the disk: a real 256 KiB tmpfs mounted over ``state_dir`` under a running
daemon (needs root; skipped otherwise), and RLIMIT_FSIZE in a child process around the
checkpoint writer itself (runs everywhere).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Iterator

import pytest

from compactor.dbfactory import make_bloated_db
from faults.faultlib import fill, start_daemon, tmpfs_on
from helpers.daemon import HANG_S, Daemon, free_port, wait_for, write_config
from persist import read_checkpoint


#: Size of the tiny file system holding state_dir.
TMPFS_SIZE = "256k"


@pytest.fixture
def tiny_state_dir(tmp_path: Path) -> Iterator[Path]:
    state = tmp_path / "state"
    state.mkdir()
    with tmpfs_on(state, f"size={TMPFS_SIZE}", without_root="the RLIMIT_FSIZE test covers the writer"):
        yield state


def ratio_status(d: Daemon) -> dict:
    return d.get("/status")["channels"]["ratio_dbs"]


def test_a_full_disk_keeps_the_old_checkpoint_counts_the_error_and_recovers(
    tmp_path: Path, tiny_state_dir: Path, daemons: list[Daemon]
) -> None:
    (tmp_path / "store").mkdir()
    config = write_config(tmp_path, port=free_port(),
                          extra_global=f"wait_secs = 3600\nstore = sqlite:{tmp_path / 'store' / 'jobs.db'}")
    d = start_daemon(daemons, config)
    ckpt = tiny_state_dir / "ratio_dbs.smooshq"
    first = [tmp_path / "dbs" / f"first-{i}.db" for i in range(3)]
    for db in first:
        make_bloated_db(str(db), rows=200)
    wait_for(lambda: set(read_checkpoint(ckpt)) == {str(db) for db in first}, HANG_S, what="the first checkpoint", daemon=d)

    filler = fill(tiny_state_dir)
    later = [tmp_path / "dbs" / f"later-{i}.db" for i in range(10)]
    for db in later:
        make_bloated_db(str(db), rows=200)
    wait_for(lambda: ratio_status(d)["waiting"]["size"] == len(first) + len(later), HANG_S, what="later keys queued", daemon=d)
    wait_for(lambda: ratio_status(d)["checkpoint_errors"] > 0, HANG_S, what="a counted checkpoint error", daemon=d)

    # The old checkpoint is whole, no temp file was left behind (beside the instance lock),
    # and the daemon goes on.
    assert set(read_checkpoint(ckpt)) == {str(db) for db in first}
    assert sorted(p.name for p in tiny_state_dir.iterdir()) == ["filler", "ratio_dbs.smooshq", "smoosh.lock"]
    assert "could not write checkpoint" in d.log()
    assert "No space left on device" in d.log()
    code, body = d.post("/enqueue", {"keys": [str(later[0])]})
    assert code == 202 and body["accepted"] == 1

    filler.unlink()
    expected = {str(db) for db in first + later}
    wait_for(lambda: set(read_checkpoint(ckpt)) == expected, HANG_S, what="the checkpoint after space came back", daemon=d)
    assert d.stop() == 0
    assert set(read_checkpoint(ckpt)) == expected


_CHILD = textwrap.dedent(
    """
    import json, os, resource, signal, sys, logging
    from persist import read_checkpoint, write_checkpoint
    from channels.checkpointer import Checkpointer
    path = sys.argv[1]
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG instead of killing us
    small = {"/db/%d.db" % i: float(i) for i in range(10)}
    write_checkpoint(path, small)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))
    big = {"/db/%d/%s.db" % (i, "x" * 40): float(i) for i in range(200)}
    errors = []
    try:
        write_checkpoint(path, big)
    except OSError as e:
        errors.append(e.errno)
    cp = Checkpointer(os.path.dirname(path), os.path.basename(path)[:-len(".smooshq")], logging.getLogger("t"))
    ok = cp.write(cp.next_seq(), big, 1)
    print(json.dumps({"errors": errors, "checkpointer_ok": ok, "counted": cp.errors,
                      "after": read_checkpoint(path) == small,
                      "leftovers": sorted(os.listdir(os.path.dirname(path)))}))
    """
)


def test_a_file_size_limit_hit_mid_checkpoint_leaves_the_old_file_and_no_temp_file(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    out = subprocess.run([sys.executable, "-c", _CHILD, str(state / "ratio_dbs.smooshq")],
                         capture_output=True, text=True, timeout=60, cwd=str(Path(__file__).parents[2]))
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["errors"] == [27]  # EFBIG: File too large
    assert result["checkpointer_ok"] is False and result["counted"] == 1
    assert result["after"] is True
    assert result["leftovers"] == ["ratio_dbs.smooshq"]
