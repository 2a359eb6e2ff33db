"""The disk room: reservations per file system, granted only beside min_free_space (smoosh.disk_room)."""

from __future__ import annotations

import pytest

from smoosh.disk_room import DiskRoom, MinFree, NoRoom, _Fs, parse_min_free

MiB = 2**20


class Disks:
    """Two file systems: /a (100 MiB, 30 free) and /b (1000 MiB, 500 free); /a/tmp is on /a."""

    def __init__(self) -> None:
        self.free = {1: 30 * MiB, 2: 500 * MiB}
        self.total = {1: 100 * MiB, 2: 1000 * MiB}

    def device(self, directory: str) -> int:
        return 1 if directory.startswith("/a") else 2

    def statvfs(self, directory: str) -> _Fs:
        dev = self.device(directory)
        return _Fs(free_bytes=self.free[dev], total_bytes=self.total[dev])


def room(min_free: MinFree) -> tuple[DiskRoom, Disks]:
    disks = Disks()
    return DiskRoom(min_free, statvfs=disks.statvfs, device=disks.device), disks


def test_reservations_on_one_file_system_add_up_and_are_refused_past_min_free() -> None:
    r, _ = room(MinFree(bytes=10 * MiB))
    first = r.reserve({"/a/db": 8 * MiB, "/a/tmp": 4 * MiB})  # one file system: 12 MiB there
    with pytest.raises(NoRoom) as info:
        r.reserve({"/a/other": 9 * MiB})  # 12 + 9 + 10 kept > 30 free
    assert str(info.value) == (f"not enough free disk space in /a/other: a compaction writes {9 * MiB} bytes there; "
                               f"{30 * MiB} free, {12 * MiB} reserved by running compactions, {10 * MiB} kept by "
                               "min_free_space")
    assert r.reserve({"/a/other": 8 * MiB}).held == {1: 8 * MiB}  # 12 + 8 + 10 = 30 fits exactly
    first.release()
    first.release()  # idempotent
    assert r.reserved_bytes() == 8 * MiB


def test_a_refusal_on_one_file_system_reserves_nothing_on_the_other() -> None:
    r, _ = room(MinFree(bytes=0))
    with pytest.raises(NoRoom):
        r.reserve({"/b/db": 10 * MiB, "/a/tmp": 31 * MiB})
    assert r.reserved_bytes() == 0


def test_min_free_space_as_a_percentage_of_each_file_system() -> None:
    r, _ = room(parse_min_free("20%"))  # 20 MiB on /a, 200 MiB on /b
    assert r.reserve({"/a/db": 10 * MiB}).held == {1: 10 * MiB}
    with pytest.raises(NoRoom):
        r.reserve({"/a/db": 1})
    assert r.reserve({"/b/db": 300 * MiB}).held == {2: 300 * MiB}
    r.set_min_free(MinFree(bytes=0))  # a live reload
    assert r.reserve({"/a/db": 20 * MiB}).held == {1: 20 * MiB}


@pytest.mark.parametrize(("text", "expected"), [("2%", MinFree(fraction=0.02)), ("0", MinFree()), ("1GiB", MinFree(bytes=2**30)),
                                                ("512MB", MinFree(bytes=512 * 10**6)), (" 0.5% ", MinFree(fraction=0.005))])
def test_min_free_space_parses_sizes_and_percentages(text: str, expected: MinFree) -> None:
    assert parse_min_free(text) == expected


@pytest.mark.parametrize("text", ["91%", "-1%", "x%", "lots", "infinity", "-5"])
def test_a_bad_min_free_space_says_what_it_takes(text: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_min_free(text)
    assert str(info.value) == "must be a size (e.g. 1GiB) or a percentage of the file system from 0% to 90%"
