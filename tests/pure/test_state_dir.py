"""The start-up check of state_dir (DESIGN §5.4; upstream smoosh_persist t_check_setup)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from persist.errors import StateDirError
from persist.state_dir import check_setup

as_root = pytest.mark.skipif(
    os.geteuid() == 0, reason="root ignores directory permissions; the check cannot fail"
)


def test_usable_directory_passes_and_keeps_no_probe_file(tmp_path: Path) -> None:
    (tmp_path / "ratio_dbs.smooshq").write_bytes(b"keep me")
    assert check_setup(tmp_path) is None
    assert sorted(os.listdir(tmp_path)) == ["ratio_dbs.smooshq"]


def test_missing_directory_is_named_in_the_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(StateDirError) as caught:
        check_setup(str(missing))
    assert str(caught.value) == f"state_dir {str(missing)!r} does not exist"
    assert caught.value.path == str(missing) and caught.value.problem == "does not exist"
    assert caught.value.errno == errno.ENOENT
    assert isinstance(caught.value, OSError)


def test_a_file_is_not_a_directory(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.write_bytes(b"")
    with pytest.raises(StateDirError) as caught:
        check_setup(state)
    assert str(caught.value) == f"state_dir {str(state)!r} is not a directory"
    assert caught.value.errno == errno.ENOTDIR


def test_a_dangling_symlink_is_reported_as_such(tmp_path: Path) -> None:
    link = tmp_path / "state"
    link.symlink_to(tmp_path / "gone")
    with pytest.raises(StateDirError) as caught:
        check_setup(link)
    assert str(caught.value) == f"state_dir {str(link)!r} is a broken symbolic link"


def test_a_symlink_to_a_directory_is_fine(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "state").symlink_to(tmp_path / "real")
    assert check_setup(tmp_path / "state") is None


@as_root
def test_read_only_directory_is_not_writable(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o500)
    try:
        with pytest.raises(StateDirError) as caught:
            check_setup(state)
    finally:
        state.chmod(0o700)
    assert str(caught.value).startswith(f"state_dir {str(state)!r} is not writable")
    assert caught.value.errno == errno.EACCES
    assert os.listdir(state) == []


@as_root
def test_write_only_directory_is_not_readable(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o300)
    try:
        with pytest.raises(StateDirError) as caught:
            check_setup(state)
    finally:
        state.chmod(0o700)
    assert str(caught.value).startswith(f"state_dir {str(state)!r} is not readable")
