"""Checkpoint files: a channel's queue as ``{key: priority}``, atomic, versioned, checksummed.

File format (version 1), all integers big-endian::

    offset  size  field
    0       8     magic  b"SMOOSHQ\\x00"
    8       2     format version (uint16) = 1
    10      4     CRC-32 (zlib) of the payload (uint32)
    14      8     payload length in bytes (uint64); the file is exactly 22 + this long
    22      ...   payload: a msgpack array of chunks; each chunk a msgpack map
                  {key (str): priority}, at most 65536 entries, never empty

A priority is a msgpack int or a float64; infinity is stored explicitly as the IEEE-754
float64 +inf (``cb 7f f0 00 00 00 00 00 00``), never as a sentinel, and NaN is refused both
ways. Entries are stored in the mapping's order, so a queue rebuilt by pushing them in file
order keeps its first-in first-out order among equal priorities.

Why chunks: msgpack packs (and unpacks) one object while holding the GIL, so one call over
a million entries would stall every other thread for its whole duration. Packing about
10,000 entries per call and yielding (``time.sleep(0)``) between calls bounds each stall to
a few milliseconds; the CRC runs incrementally over the same chunks.

Why atomic: the data goes to a uniquely named temp file in the same directory, is flushed
and fsynced, renamed over the checkpoint, and the directory is fsynced. A crash at any
instant leaves the old file or the new one, never a torn one; at worst a stray temp file,
which readers never open (see :func:`remove_stale_temp_files`).
"""

from __future__ import annotations

import io
import logging
import math
import os
import struct
import tempfile
import time
import zlib
from itertools import islice
from operator import itemgetter
from typing import Mapping

import msgpack

from persist.errors import CorruptCheckpoint

__all__ = [
    "write_checkpoint",
    "read_checkpoint",
    "quarantine",
    "remove_stale_temp_files",
    "MAGIC",
    "FORMAT_VERSION",
]

log = logging.getLogger(__name__)

#: First bytes of every checkpoint file: says what the file is before anything is decoded.
MAGIC = b"SMOOSHQ\x00"

#: The format this module writes and the only one it reads.
FORMAT_VERSION = 1

#: magic, version, CRC-32 of the payload, payload length (bytes).
_HEADER = struct.Struct(">8sHIQ")

#: Size of the fixed header in bytes.
HEADER_SIZE = _HEADER.size

#: Entries packed per msgpack call (and per GIL hand-off) when writing.
CHUNK_ENTRIES = 10_000

#: Most entries a reader accepts in one chunk (room for writers with bigger chunks).
MAX_CHUNK_ENTRIES = 65_536

#: Longest key a reader accepts, in UTF-8 bytes (PATH_MAX is 4096; keys may carry a prefix).
MAX_KEY_BYTES = 65_536

#: Largest payload a reader accepts, in bytes (about 30 million typical entries).
MAX_PAYLOAD_BYTES = 1 << 30

#: Bytes of payload decoded per read from the in-memory buffer.
_READ_SIZE_BYTES = 1 << 20

#: Priority types a reader accepts (exactly these: msgpack decodes true/false as bool).
_PLAIN_NUMBER_TYPES = frozenset((int, float))

#: Ints msgpack can encode.
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 64) - 1


def _check_entry(key: object, priority: object) -> None:
    if not isinstance(key, str):
        raise TypeError(f"checkpoint keys must be str, not {type(key).__name__}: {key!r}")
    try:
        encoded_bytes = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        # e.g. a file name decoded with surrogateescape: readers could never decode it.
        raise ValueError(f"checkpoint key {key!r} is not valid Unicode") from None
    if encoded_bytes > MAX_KEY_BYTES:
        raise ValueError(f"checkpoint key of {encoded_bytes} bytes exceeds {MAX_KEY_BYTES}")
    cls = priority.__class__
    if cls is float:
        if priority != priority:
            raise ValueError(f"priority of {key!r} is NaN")
        return
    if isinstance(priority, bool) or not isinstance(priority, (int, float)):
        raise TypeError(f"priority of {key!r} must be an int or a float, not {cls.__name__}")
    if isinstance(priority, float):
        if priority != priority:
            raise ValueError(f"priority of {key!r} is NaN")
    elif not _INT_MIN <= priority <= _INT_MAX:
        raise ValueError(f"priority of {key!r} is out of range: {priority}")


def _check_chunk(chunk: list[tuple[str, float]]) -> None:
    # The usual chunks (str keys; all-float or all-int priorities) are checked by C loops
    # (set(map(type, ...)), any(map(isnan, ...)), min/max) instead of a Python loop per
    # entry; anything else, mixed chunks included, gets the entry-by-entry check.
    priorities = list(map(itemgetter(1), chunk))
    priority_types = set(map(type, priorities))
    keys = list(map(itemgetter(0), chunk))
    # A str of n characters is at most 4n bytes of UTF-8; longer ones get measured exactly.
    if set(map(type, keys)) == {str} and max(map(len, keys)) <= MAX_KEY_BYTES // 4:
        if priority_types == {float}:
            if not any(map(math.isnan, priorities)):
                return
        elif priority_types == {int}:
            if _INT_MIN <= min(priorities) and max(priorities) <= _INT_MAX:
                return
    for key, priority in chunk:
        _check_entry(key, priority)


def _fsync_directory(directory: str) -> None:
    # Makes the rename (or unlink) itself durable: without it a power cut can bring the old
    # directory entry back even though the new file's data reached the disk.
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        # Some file systems cannot fsync a directory; the rename is then as durable as
        # that file system makes it, which is all we can do.
        if exc.errno not in (22, 95):  # EINVAL, EOPNOTSUPP
            raise
    finally:
        os.close(fd)


def _temp_prefix(path: str) -> str:
    return f".{os.path.basename(path)}."


def _write_payload(f: io.BufferedWriter, mapping: Mapping[str, float]) -> tuple[int, int]:
    """Stream the payload to ``f`` in chunks; return (crc32, length in bytes)."""
    count = len(mapping)
    packer = msgpack.Packer(use_bin_type=True, use_single_float=False, autoreset=True)
    head = packer.pack_array_header((count + CHUNK_ENTRIES - 1) // CHUNK_ENTRIES)
    f.write(head)
    crc, length = zlib.crc32(head), len(head)
    items = iter(mapping.items())
    written = 0
    while written < count:
        chunk = list(islice(items, min(CHUNK_ENTRIES, count - written)))
        if not chunk:
            raise RuntimeError("mapping changed size during write_checkpoint")
        _check_chunk(chunk)
        try:
            data = packer.pack_map_pairs(chunk)
        except UnicodeEncodeError:
            for key, priority in chunk:  # find the culprit (a lone surrogate) and name it
                _check_entry(key, priority)
            raise
        f.write(data)
        crc = zlib.crc32(data, crc)
        length += len(data)
        written += len(chunk)
        # Hand the GIL to other threads between chunks (see the module docstring).
        time.sleep(0)
    if next(items, None) is not None:
        raise RuntimeError("mapping changed size during write_checkpoint")
    return crc, length


def write_checkpoint(path: str | os.PathLike[str], mapping: Mapping[str, float]) -> None:
    """Atomically replace the checkpoint at ``path`` with ``mapping``; ``{}`` deletes it.

    Parameters
    ----------
    path:
        The checkpoint file; its directory must exist.
    mapping:
        ``{key: priority}``: str keys, int or float priorities (``math.inf`` allowed, NaN
        not). Must not change while it is written (pass a copy from another thread).

    Raises
    ------
    OSError
        The directory is missing or not writable, the disk is full, ... The old checkpoint
        (if any) is then untouched and the temp file removed.
    TypeError, ValueError
        A key or priority cannot be stored (a key that is not str, not valid Unicode or
        over :data:`MAX_KEY_BYTES`; a priority that is not an int or float, NaN, or an int
        outside the 64-bit range); nothing is replaced.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    if not mapping:
        try:
            os.unlink(path)
        except FileNotFoundError:
            if not os.path.isdir(directory):
                raise
            return
        _fsync_directory(directory)
        return
    fd, tmp_path = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_HEADER.pack(MAGIC, FORMAT_VERSION, 0, 0))  # placeholder, rewritten below
            crc, length = _write_payload(f, mapping)
            f.seek(0)
            f.write(_HEADER.pack(MAGIC, FORMAT_VERSION, crc, length))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
    except BaseException:
        try:
            os.unlink(tmp_path)
        except OSError:
            pass
        raise
    _fsync_directory(directory)


def _read_exactly(fd: int, size: int) -> bytes:
    parts = []
    while size > 0:
        part = os.read(fd, min(size, 1 << 24))
        if not part:
            break
        parts.append(part)
        size -= len(part)
    return b"".join(parts)


def _validate_chunk(path: str, chunk: dict[object, object]) -> None:
    # As in _check_chunk: C loops over the whole chunk, entry by entry only to name an error.
    priorities = chunk.values()
    priority_types = set(map(type, priorities))
    if set(map(type, chunk)) == {str} and priority_types <= _PLAIN_NUMBER_TYPES:
        if float not in priority_types or not any(math.isnan(p) for p in priorities if isinstance(p, float)):
            return
    for key, priority in chunk.items():
        if key.__class__ is not str:
            raise CorruptCheckpoint(path, f"key {key!r} is not a string")
        cls = priority.__class__
        if not (cls is int or (cls is float and priority == priority)):
            raise CorruptCheckpoint(path, f"priority of {key!r} is not a number: {priority!r}")


def _decode_payload(path: str, payload: bytes) -> dict[str, float]:
    unpacker = msgpack.Unpacker(
        io.BytesIO(payload),
        read_size=_READ_SIZE_BYTES,
        raw=False,
        strict_map_key=True,
        use_list=True,
        max_buffer_size=max(_READ_SIZE_BYTES, MAX_KEY_BYTES * 2),
        max_str_len=MAX_KEY_BYTES,
        max_bin_len=0,
        max_ext_len=0,
        max_array_len=0,
        max_map_len=MAX_CHUNK_ENTRIES,
    )
    result: dict[str, float] = {}
    try:
        chunks = unpacker.read_array_header()
        for _ in range(chunks):
            chunk = unpacker.unpack()
            if chunk.__class__ is not dict or not chunk:
                raise CorruptCheckpoint(path, "a chunk is not a non-empty map")
            _validate_chunk(path, chunk)
            before = len(result)
            result.update(chunk)
            if len(result) != before + len(chunk):
                raise CorruptCheckpoint(path, "duplicate key")
            time.sleep(0)  # hand the GIL over between chunks, as when writing
    except CorruptCheckpoint:
        raise
    except (msgpack.UnpackException, ValueError, TypeError) as exc:
        # OutOfData = truncated inside; ValueError covers limits and bad UTF-8.
        raise CorruptCheckpoint(path, f"undecodable payload ({type(exc).__name__}: {exc})")
    if unpacker.tell() != len(payload):
        raise CorruptCheckpoint(path, "trailing bytes after the last chunk")
    return result


def read_checkpoint(path: str | os.PathLike[str]) -> dict[str, float]:
    """Read the checkpoint at ``path``.

    Parameters
    ----------
    path:
        The checkpoint file.

    Returns
    -------
    ``{key: priority}`` in the order written; ``{}`` if the file (or its directory) does
    not exist.

    Raises
    ------
    CorruptCheckpoint
        The file exists but is damaged: empty, truncated, a foreign file, an unknown format
        version, a CRC mismatch, or undecodable or ill-typed content. Nothing of it is
        trusted (the CRC is checked before anything is decoded).
    OSError
        The file cannot be read (permissions, a directory, I/O error).
    """
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return {}
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            raise CorruptCheckpoint(path, "empty file")
        header = _read_exactly(fd, HEADER_SIZE)
        if header[: len(MAGIC)] != MAGIC[: len(header)]:
            raise CorruptCheckpoint(path, "not a smoosh checkpoint (bad magic)")
        if len(header) < HEADER_SIZE:
            raise CorruptCheckpoint(path, f"truncated header ({len(header)} bytes)")
        _, version, crc, length = _HEADER.unpack(header)
        if version != FORMAT_VERSION:
            raise CorruptCheckpoint(path, f"unknown format version {version}")
        if length > MAX_PAYLOAD_BYTES:
            raise CorruptCheckpoint(path, f"payload of {length} bytes exceeds the limit")
        if size - HEADER_SIZE != length:
            raise CorruptCheckpoint(
                path, f"payload is {size - HEADER_SIZE} bytes, the header says {length}"
            )
        payload = _read_exactly(fd, length)
    finally:
        os.close(fd)
    if len(payload) != length:
        raise CorruptCheckpoint(path, f"truncated payload ({len(payload)} of {length} bytes)")
    if zlib.crc32(payload) != crc:
        raise CorruptCheckpoint(path, "CRC mismatch")
    return _decode_payload(path, payload)


def quarantine(path: str | os.PathLike[str], now_s: float) -> str:
    """Move a corrupt checkpoint aside to ``<path>.corrupt-<unix seconds>``.

    Never overwrites an earlier quarantined file: if the name is taken, ``-1``, ``-2``, ...
    is appended.

    Parameters
    ----------
    path:
        The corrupt checkpoint.
    now_s:
        The current time, in seconds since the epoch (the caller's clock).

    Returns
    -------
    The new path.

    Raises
    ------
    OSError
        The file cannot be moved (``FileNotFoundError`` if it is gone).
    """
    path = os.fspath(path)
    base = f"{path}.corrupt-{int(now_s)}"
    suffix = 0
    while True:
        target = base if suffix == 0 else f"{base}-{suffix}"
        try:
            # link + unlink: a rename that fails instead of replacing an existing target.
            os.link(path, target, follow_symlinks=False)
        except FileExistsError:
            suffix += 1
            continue
        except OSError as exc:
            if isinstance(exc, FileNotFoundError) or exc.errno not in (1, 18, 38, 95):
                raise
            # No hard links here (EPERM, EXDEV, ENOSYS, EOPNOTSUPP): check, then rename.
            if os.path.lexists(target):
                suffix += 1
                continue
            os.rename(path, target)
            break
        os.unlink(path)
        break
    _fsync_directory(os.path.dirname(os.path.abspath(path)))
    log.debug("Moved checkpoint %r aside to %r.", path, target)
    return target


def remove_stale_temp_files(path: str | os.PathLike[str]) -> list[str]:
    """Delete temp files a crashed :func:`write_checkpoint` of ``path`` left behind.

    Call it only when no write of ``path`` is in progress (for example when the owning
    channel starts): a running write's temp file looks exactly like a stale one.

    Parameters
    ----------
    path:
        The checkpoint file whose temp files to remove.

    Returns
    -------
    The removed paths (a missing directory gives an empty list).
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    prefix = _temp_prefix(path)
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return removed
    for name in names:
        if name.startswith(prefix) and name.endswith(".tmp"):
            stale = os.path.join(directory, name)
            try:
                os.unlink(stale)
            except FileNotFoundError:
                continue
            removed.append(stale)
    return removed
