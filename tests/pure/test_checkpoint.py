"""Checkpoint files (DESIGN §4.4, §5.4; upstream smoosh_persist t_write_read_delete, ...)."""

from __future__ import annotations

import math
import os
import struct
import zlib
from pathlib import Path

import msgpack
import pytest

import persist.checkpoint as checkpoint
from persist.checkpoint import (
    FORMAT_VERSION,
    MAGIC,
    quarantine,
    read_checkpoint,
    remove_stale_temp_files,
    write_checkpoint,
)
from persist.errors import CorruptCheckpoint, PersistError

INF_FLOAT64 = b"\xcb\x7f\xf0\x00\x00\x00\x00\x00\x00"


def temp_files(directory: Path) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.endswith(".tmp"))


def craft(path: Path, payload: bytes, *, version: int = FORMAT_VERSION) -> None:
    """Write a file with a valid header (CRC and length right) around ``payload``."""
    header = struct.pack(">8sHIQ", MAGIC, version, zlib.crc32(payload), len(payload))
    path.write_bytes(header + payload)


def assert_corrupt(path: Path, reason_part: str) -> CorruptCheckpoint:
    with pytest.raises(CorruptCheckpoint) as caught:
        read_checkpoint(path)
    assert caught.value.path == str(path)
    assert reason_part in caught.value.reason
    assert str(caught.value) == f"corrupt checkpoint {str(path)!r}: {caught.value.reason}"
    return caught.value


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "ratio_dbs.smooshq"


def test_package_exports_the_pinned_names() -> None:
    # Imported here: an editable install made before persist/__init__.py existed maps
    # `persist` to a namespace package (fix: `make install` / `pip install -e .`).
    import persist

    for name in ("write_checkpoint", "read_checkpoint", "CorruptCheckpoint", "check_setup"):
        assert name in persist.__all__ and hasattr(persist, name)
    assert persist.write_checkpoint is write_checkpoint
    assert persist.CorruptCheckpoint is CorruptCheckpoint


# -- upstream: t_write_read_delete, t_fail_write_read_delete --------------------------------


def test_write_then_read_gives_equal_data_and_empty_deletes(path: Path) -> None:
    data = {"shards/00000000-1fffffff/db.1529510412": 10.0, "/srv/db/a.sqlite": math.inf}
    write_checkpoint(path, data)
    assert read_checkpoint(path) == data
    write_checkpoint(path, {})
    assert not path.exists()
    assert read_checkpoint(path) == {}


def test_empty_mapping_without_a_file_is_fine(path: Path) -> None:
    write_checkpoint(path, {})
    assert not path.exists()


def test_missing_directory_fails_write_and_delete_but_reads_empty(tmp_path: Path) -> None:
    path = tmp_path / "missing" / "ratio_dbs.smooshq"
    with pytest.raises(FileNotFoundError):
        write_checkpoint(path, {"a": 1.0})
    with pytest.raises(FileNotFoundError):
        write_checkpoint(path, {})
    assert read_checkpoint(path) == {}


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_directory_fails_write_and_keeps_the_old_checkpoint(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    path = state / "ratio_dbs.smooshq"
    write_checkpoint(path, {"old": 1.0})
    state.chmod(0o500)
    try:
        with pytest.raises(PermissionError):
            write_checkpoint(path, {"new": 2.0})
        assert read_checkpoint(path) == {"old": 1.0}
    finally:
        state.chmod(0o700)


def test_missing_file_reads_as_empty(path: Path) -> None:
    assert read_checkpoint(path) == {}


# -- round trips ----------------------------------------------------------------------------


def test_round_trip_keeps_values_types_and_order(path: Path) -> None:
    data = {
        "z-first": 3,
        "a-second": 2.5,
        "active": math.inf,
        "ünïcödé/数据库.sqlite": 0.0625,
        "big": 2**63 + 5,
        "negative": -7,
        "cleanup:/srv/db/a.sqlite": 1,
    }
    write_checkpoint(path, data)
    back = read_checkpoint(path)
    assert back == data
    assert list(back) == list(data)
    assert [type(v) for v in back.values()] == [type(v) for v in data.values()]


def test_infinity_is_stored_explicitly_as_float64(path: Path) -> None:
    write_checkpoint(path, {"active": math.inf})
    raw = path.read_bytes()
    assert raw.endswith(b"\xa6active" + INF_FLOAT64)
    back = read_checkpoint(path)
    assert back["active"] == math.inf and isinstance(back["active"], float)


def test_header_holds_magic_version_crc_and_length(path: Path) -> None:
    write_checkpoint(path, {f"k{i}": i / 16 for i in range(100)})
    raw = path.read_bytes()
    magic, version, crc, length = struct.unpack(">8sHIQ", raw[:22])
    assert magic == b"SMOOSHQ\x00" == MAGIC
    assert version == 1 == FORMAT_VERSION
    assert length == len(raw) - 22
    assert crc == zlib.crc32(raw[22:])


def test_large_mappings_are_written_in_chunks(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each chunk is one msgpack call followed by a GIL hand-off (time.sleep(0)).
    sleeps: list[float] = []
    monkeypatch.setattr(checkpoint.time, "sleep", sleeps.append)
    data = {f"/srv/db/{i}.sqlite": (math.inf if i % 9 == 0 else i) for i in range(25_000)}
    write_checkpoint(path, data)
    assert sleeps.count(0) >= 3
    payload = path.read_bytes()[22:]
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(payload)
    chunks = unpacker.read_array_header()
    sizes = [len(unpacker.unpack()) for _ in range(chunks)]
    assert sizes == [10_000, 10_000, 5_000]
    sleeps.clear()
    assert read_checkpoint(path) == data
    assert sleeps.count(0) >= 3


def test_chunks_larger_than_the_read_buffer_round_trip(path: Path) -> None:
    data = {"/srv/" + "x" * 200 + str(i): float(i) for i in range(10_000)}  # a ~2 MB chunk
    data["k" * 65_536] = math.inf  # the longest key allowed
    write_checkpoint(path, data)
    assert read_checkpoint(path) == data


def test_rewrite_replaces_the_previous_checkpoint(path: Path) -> None:
    write_checkpoint(path, {"a": 1.0, "b": 2.0})
    write_checkpoint(path, {"c": 3.0})
    assert read_checkpoint(path) == {"c": 3.0}
    assert temp_files(path.parent) == []


# -- bad input to write: nothing replaced, no temp file left ---------------------------------


@pytest.mark.parametrize(
    ("bad", "error", "message"),
    [
        ({b"bytes-key": 1.0}, TypeError, "keys must be str"),
        ({1: 1.0}, TypeError, "keys must be str"),
        ({"k": math.nan}, ValueError, "NaN"),
        ({"k": True}, TypeError, "must be an int or a float"),
        ({"k": None}, TypeError, "must be an int or a float"),
        ({"k": "1.0"}, TypeError, "must be an int or a float"),
        ({"k": 2**64}, ValueError, "out of range"),
        ({"k": 1, "j": math.nan}, ValueError, "NaN"),  # a mixed chunk takes the slow path
        ({"/srv/\udcff.sqlite": 1.0}, ValueError, "not valid Unicode"),  # surrogateescape
        ({"k" * 65_537: 1.0}, ValueError, "exceeds 65536"),
        ({"\u20ac" * 21_846: 1.0}, ValueError, "65538 bytes exceeds 65536"),
    ],
)
def test_unstorable_entries_are_refused_and_old_checkpoint_stays(
    path: Path, bad: dict, error: type[Exception], message: str
) -> None:
    write_checkpoint(path, {"old": 1.0})
    with pytest.raises(error, match=message):
        write_checkpoint(path, bad)
    assert read_checkpoint(path) == {"old": 1.0}
    assert temp_files(path.parent) == []


def test_failure_mid_stream_keeps_the_old_checkpoint(path: Path) -> None:
    write_checkpoint(path, {"old": 1.0})
    data: dict = {f"k{i}": float(i) for i in range(15_000)}
    data["poison"] = math.nan  # lands in the second chunk, after the first is on disk
    with pytest.raises(ValueError):
        write_checkpoint(path, data)
    assert read_checkpoint(path) == {"old": 1.0}
    assert temp_files(path.parent) == []


def test_str_subclass_keys_and_int_float_mixes_are_stored(path: Path) -> None:
    class Key(str):
        pass

    data = {Key("sub"): 1, "f": 2.5, "i": 7, "inf": math.inf}
    write_checkpoint(path, data)
    assert read_checkpoint(path) == {"sub": 1, "f": 2.5, "i": 7, "inf": math.inf}


# -- damaged files: CorruptCheckpoint (upstream t_corrupted_read and more) ----------------


def test_zero_length_file_is_corrupt(path: Path) -> None:
    # Deliberate: a zero-length file means a write went wrong; it is not an empty queue.
    path.write_bytes(b"")
    assert_corrupt(path, "empty file")


def test_garbage_bytes_are_corrupt(path: Path) -> None:
    path.write_bytes(os.urandom(4096))
    assert_corrupt(path, "bad magic")


def test_erlang_term_file_is_corrupt(path: Path) -> None:
    # What CouchDB writes: term_to_binary(Map, [compressed]).
    path.write_bytes(b"\x83P\x00\x00\x00\x1ax\x9c\xcbe``\xe0\xce\x05\x00\x02\xa8\x00\xd2")
    assert_corrupt(path, "bad magic")


def test_unknown_version_is_corrupt(path: Path) -> None:
    write_checkpoint(path, {"a": 1.0})
    raw = bytearray(path.read_bytes())
    raw[8:10] = struct.pack(">H", 2)
    path.write_bytes(bytes(raw))
    assert_corrupt(path, "unknown format version 2")


def test_flipped_payload_byte_fails_the_crc(path: Path) -> None:
    write_checkpoint(path, {"/srv/db/a.sqlite": 1.0, "/srv/db/b.sqlite": 2.0})
    raw = bytearray(path.read_bytes())
    raw[30] ^= 0x01
    path.write_bytes(bytes(raw))
    assert_corrupt(path, "CRC mismatch")


def test_every_truncation_is_corrupt(path: Path) -> None:
    write_checkpoint(path, {f"k{i}": i / 16 for i in range(50)})
    raw = path.read_bytes()
    for cut in [1, 8, 10, 21]:
        path.write_bytes(raw[:cut])
        assert_corrupt(path, f"truncated header ({cut} bytes)")
    for cut in [22, 23, len(raw) // 2, len(raw) - 1]:
        path.write_bytes(raw[:cut])
        assert_corrupt(path, f"payload is {cut - 22} bytes, the header says {len(raw) - 22}")


def test_trailing_bytes_are_corrupt(path: Path) -> None:
    write_checkpoint(path, {"a": 1.0})
    path.write_bytes(path.read_bytes() + b"\x00")
    assert_corrupt(path, "the header says")


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (msgpack.packb({"a": 1.0}), "undecodable"),  # not an array of chunks
        (msgpack.packb([[1, 2]]), "undecodable"),  # arrays are refused by the limits
        (msgpack.packb([5]), "not a non-empty map"),
        (msgpack.packb([{}]), "not a non-empty map"),
        (msgpack.packb([{1: 1.0}]), "undecodable"),  # int keys refused by msgpack
        (msgpack.packb([{b"a": 1.0}], use_bin_type=True), "undecodable"),  # bin refused
        (msgpack.packb([{"a": True}]), "not a number"),
        (msgpack.packb([{"a": None}]), "not a number"),
        (msgpack.packb([{"a": "1"}]), "not a number"),
        (msgpack.packb([{"a": math.nan}]), "not a number"),
        (msgpack.packb([{"a": 1.0}, {"a": 2.0}]), "duplicate key"),
        (msgpack.packb([{"a": 1.0}]) + b"\xc0", "trailing bytes"),
        (msgpack.packb([{"a": 1.0}, {"b": 1.0}])[:-3], "undecodable"),  # short inside
        (b"\x91\xdf\x7f\xff\xff\xff", "undecodable"),  # a map claiming 2**31 entries
        (b"\xdd\xff\xff\xff\xff", "undecodable"),  # 2**32 chunks, no data
        (msgpack.packb([{"k" * 70_000: 1.0}]), "undecodable"),  # key over the limit
        (b"\x91\x81\xa2\xff\xfe\xcb" + b"\x00" * 8, "undecodable"),  # invalid UTF-8 key
    ],
)
def test_well_framed_but_wrong_payloads_are_corrupt(path: Path, payload: bytes, reason: str) -> None:
    craft(path, payload)
    assert_corrupt(path, reason)


def test_oversized_payload_length_is_corrupt_without_reading(path: Path) -> None:
    header = struct.pack(">8sHIQ", MAGIC, FORMAT_VERSION, 0, 1 << 40)
    path.write_bytes(header + b"\x90")
    assert_corrupt(path, "exceeds the limit")


def test_a_directory_is_an_os_error_not_corruption(tmp_path: Path) -> None:
    (tmp_path / "x.smooshq").mkdir()
    with pytest.raises(IsADirectoryError):
        read_checkpoint(tmp_path / "x.smooshq")


def test_corrupt_checkpoint_carries_path_and_reason() -> None:
    error = CorruptCheckpoint("/state/ratio_dbs.smooshq", "CRC mismatch")
    assert (error.path, error.reason) == ("/state/ratio_dbs.smooshq", "CRC mismatch")
    assert str(error) == "corrupt checkpoint '/state/ratio_dbs.smooshq': CRC mismatch"
    assert isinstance(error, PersistError) and not isinstance(error, OSError)


# -- quarantine and temp files ---------------------------------------------------------------


def test_quarantine_renames_with_unix_seconds_and_never_overwrites(path: Path) -> None:
    contents = []
    moved = []
    for i in range(3):
        body = f"broken {i}".encode()
        path.write_bytes(body)
        contents.append(body)
        moved.append(quarantine(path, 1_700_000_000.9))
        assert not path.exists()
    assert moved == [
        f"{path}.corrupt-1700000000",
        f"{path}.corrupt-1700000000-1",
        f"{path}.corrupt-1700000000-2",
    ]
    assert [Path(p).read_bytes() for p in moved] == contents


def test_quarantine_of_a_missing_file_raises(path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        quarantine(path, 1_700_000_000)


def test_quarantined_file_leaves_an_empty_queue(path: Path) -> None:
    path.write_bytes(b"")
    with pytest.raises(CorruptCheckpoint):
        read_checkpoint(path)
    quarantine(path, 1_700_000_000)
    assert read_checkpoint(path) == {}


def test_stale_temp_files_of_this_checkpoint_are_removed(tmp_path: Path) -> None:
    path = tmp_path / "ratio_dbs.smooshq"
    write_checkpoint(path, {"a": 1.0})
    ours = [tmp_path / ".ratio_dbs.smooshq.abc123.tmp", tmp_path / ".ratio_dbs.smooshq.x.tmp"]
    others = [
        tmp_path / ".slack_dbs.smooshq.abc123.tmp",
        tmp_path / "ratio_dbs.smooshq.corrupt-1700000000",
        tmp_path / ".ratio_dbs.smooshq.abc.partial",
    ]
    for p in ours + others:
        p.write_bytes(b"x")
    removed = remove_stale_temp_files(path)
    assert sorted(removed) == sorted(str(p) for p in ours)
    assert all(p.exists() for p in others)
    assert read_checkpoint(path) == {"a": 1.0}
    assert remove_stale_temp_files(tmp_path / "missing" / "x.smooshq") == []


def test_temp_files_are_never_read(path: Path) -> None:
    write_checkpoint(path, {"good": 1.0})
    (path.parent / f".{path.name}.zzz.tmp").write_bytes(b"garbage")
    assert read_checkpoint(path) == {"good": 1.0}
