"""Room on disk for compactions: what each one will write, reserved per file system before it starts.

A ``VACUUM`` writes about its database's live size twice (measured: a 50 MB file with 11 MB
live peaked at 21 MB more on its file system): a temporary copy in SQLite's temp directory,
then the journal (or the WAL) of the copy back beside the database. Checked one compaction at a
time against the free space, two VACUUMs on one file system each see the same free bytes, and
nothing is left for the application's own writes. So each compaction *reserves* what it will
write, per file system (the temp directory's included), before it starts, and releases it as it
ends; a reservation is granted only while

    free bytes  >=  reservations on that file system  +  the new one  +  min_free_space

where ``min_free_space`` (a size, or a percentage of the file system) is room kept for the
application. A compaction that does not fit is refused before anything is opened
(:class:`NoRoom`, a ``blocked`` result: retried later; the channel goes on with keys that fit).

Counting is conservative: a running compaction's reservation stays whole while the free space
already shows what it has written. Reservations are per process (``smoosh worker`` processes
keep their own).

Ownership: one :class:`DiskRoom` per process, made by its owner (the server or ``smoosh
worker``), which alone changes ``min_free_space`` (:meth:`DiskRoom.set_min_free`); compaction
threads reserve and release through it. Every way in takes its lock.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping

from smoosh.errors import SmooshError
from smoosh.units import parse_size

__all__ = ["DiskRoom", "MinFree", "NoRoom", "Reservation", "DEFAULT_MIN_FREE", "parse_min_free",
           "DEFAULT_DISK_PRESSURE", "parse_disk_pressure"]


@dataclass(frozen=True)
class MinFree:
    """Room kept free for the application: ``bytes`` exactly, or ``fraction`` of the file system."""

    bytes: int = 0
    fraction: float = 0.0

    def of(self, total_bytes: int) -> int:
        """The bytes kept free on a file system of ``total_bytes``."""
        return max(self.bytes, int(self.fraction * total_bytes))

    def __str__(self) -> str:
        return f"{self.fraction * 100:g}%" if self.fraction else f"{self.bytes} bytes"


#: ``min_free_space`` when the config says nothing: 2% of each file system.
DEFAULT_MIN_FREE = MinFree(fraction=0.02)


def parse_min_free(text: str) -> MinFree:
    """``min_free_space``: a size (``1GiB``, ``500MB``, ``0``) or a percentage of the file system (``5%``).

    Raises:
        ValueError: neither, or a percentage outside 0-90.
    """
    value = text.strip()
    if value.endswith("%"):
        try:
            percent = float(value[:-1])
        except ValueError:
            percent = -1.0
        if not 0 <= percent <= 90:
            raise ValueError("must be a size (e.g. 1GiB) or a percentage of the file system from 0% to 90%")
        return MinFree(fraction=percent / 100)
    try:
        size = parse_size(value, allow_infinity=False)
    except ValueError:
        raise ValueError("must be a size (e.g. 1GiB) or a percentage of the file system from 0% to 90%") from None
    return MinFree(bytes=int(size))


#: ``disk_pressure`` when the config says nothing: a file system 90% used is under pressure.
DEFAULT_DISK_PRESSURE: float | None = 0.90


def parse_disk_pressure(text: str) -> float | None:
    """``disk_pressure``: a percentage of a file system's use (``90%``), or ``off``.

    Raises:
        ValueError: anything else, or a percentage outside 1-100.
    """
    value = text.strip().lower()
    if value in ("off", "none", "never"):
        return None
    if value.endswith("%"):
        try:
            percent = float(value[:-1])
        except ValueError:
            percent = 0.0
        if 1 <= percent <= 100:
            return percent / 100
    raise ValueError("must be a percentage of a file system's use from 1% to 100% (e.g. 90%), or off")


class NoRoom(SmooshError):
    """Raised when a compaction's writes do not fit beside the reservations and ``min_free_space``.

    Attributes:
        directory: where the room is missing (the database's directory or the temp directory).
        needed_bytes: what the compaction would write there.
        free_bytes: free now on that file system.
        reserved_bytes: what running compactions have reserved there.
        min_free_bytes: what ``min_free_space`` keeps there.
    """

    def __init__(self, directory: str, needed_bytes: int, free_bytes: int, reserved_bytes: int, min_free_bytes: int) -> None:
        super().__init__(
            f"not enough free disk space in {directory}: a compaction writes {needed_bytes} bytes there; "
            f"{free_bytes} free, {reserved_bytes} reserved by running compactions, {min_free_bytes} kept by "
            "min_free_space"
        )
        self.directory = directory
        self.needed_bytes = needed_bytes
        self.free_bytes = free_bytes
        self.reserved_bytes = reserved_bytes
        self.min_free_bytes = min_free_bytes


@dataclass(frozen=True)
class _Fs:
    """What ``statvfs`` says of one file system: available to us, and its size."""

    free_bytes: int
    total_bytes: int


def _statvfs(directory: str) -> _Fs:
    st = os.statvfs(directory)
    return _Fs(free_bytes=st.f_bavail * st.f_frsize, total_bytes=st.f_blocks * st.f_frsize)


class Reservation:
    """Bytes reserved on file systems for one compaction; :meth:`release` (or ``with``) gives them back."""

    def __init__(self, room: DiskRoom, held: Mapping[int, int]) -> None:
        self._room = room
        self.held = dict(held)

    def release(self) -> None:
        """Give the bytes back (idempotent)."""
        held, self.held = self.held, {}
        if held:
            self._room._release(held)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class DiskRoom:
    """Reservations per file system (by device), checked against the free space and ``min_free_space``.

    Parameters:
        min_free: room kept for the application on each file system.
        statvfs: ``directory -> (free bytes, total bytes)``; tests give their own.
        device: ``directory -> device number`` (which file system it is on); tests give their own.
    """

    def __init__(
        self,
        min_free: MinFree = DEFAULT_MIN_FREE,
        *,
        statvfs: Callable[[str], _Fs] = _statvfs,
        device: Callable[[str], int] = lambda directory: os.stat(directory).st_dev,
    ) -> None:
        self._lock = threading.Lock()
        self._min_free = min_free
        self._statvfs = statvfs
        self._device = device
        self._reserved: dict[int, int] = {}
        # directory -> device: asked at every compaction's start, for directories that stay put.
        self._devices: dict[str, int] = {}

    @property
    def min_free(self) -> MinFree:
        """The ``min_free_space`` in force."""
        return self._min_free

    def set_min_free(self, min_free: MinFree) -> None:
        """Change ``min_free_space`` (live reload); reservations granted stand."""
        with self._lock:
            self._min_free = min_free

    def reserved_bytes(self) -> int:
        """Bytes reserved now, over every file system."""
        with self._lock:
            return sum(self._reserved.values())

    def reserve(self, needs: Mapping[str, int]) -> Reservation:
        """Reserve ``needs`` (directory -> bytes written there) at once, or nothing.

        Directories on one file system add up (a database and SQLite's temp directory on the
        same disk need both amounts there).

        Raises:
            NoRoom: some file system lacks the room; nothing was reserved.
            OSError: a directory cannot be looked at (missing, no permission).
        """
        per_fs: dict[int, tuple[str, int]] = {}
        for directory, nbytes in needs.items():
            if nbytes <= 0:
                continue
            dev = self._devices.get(directory)
            if dev is None:
                dev = self._devices[directory] = self._device(directory)
                if len(self._devices) > 4096:  # a fleet spread over many directories
                    self._devices = {directory: dev}
            seen_dir, seen = per_fs.get(dev, (directory, 0))
            per_fs[dev] = (seen_dir, seen + int(nbytes))
        with self._lock:
            for dev, (directory, nbytes) in per_fs.items():
                fs = self._statvfs(directory)
                reserved = self._reserved.get(dev, 0)
                keep = self._min_free.of(fs.total_bytes)
                if fs.free_bytes < reserved + nbytes + keep:
                    raise NoRoom(directory, nbytes, fs.free_bytes, reserved, keep)
            for dev, (_directory, nbytes) in per_fs.items():
                self._reserved[dev] = self._reserved.get(dev, 0) + nbytes
        return Reservation(self, {dev: n for dev, (_d, n) in per_fs.items()})

    def _release(self, held: Mapping[int, int]) -> None:
        with self._lock:
            for dev, nbytes in held.items():
                left = self._reserved.get(dev, 0) - nbytes
                if left > 0:
                    self._reserved[dev] = left
                else:
                    self._reserved.pop(dev, None)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        """(device, reserved bytes) pairs now."""
        with self._lock:
            return iter(list(self._reserved.items()))
