"""FoundationDB's tuple layer, usable without the FoundationDB native client.

``fdb.tuple`` is pure Python except for one thing: packing *any* ``Versionstamp`` (complete or
not) touches ``fdb.impl``, which loads ``libfdb_c`` at import time and so fails on a machine
without the client. This module encodes the ``0x33`` (96-bit) versionstamp element itself and
hands every other element to ``fdb.tuple.pack``, so its bytes are exactly the binding's (the
tests compare them). Unpacking versionstamps works in the binding, so :func:`unpack` is
``fdb.tuple.unpack``.
"""

from __future__ import annotations

import struct
from typing import Any

import fdb.tuple as _fdbtuple  # untyped: see [tool.mypy] overrides
from fdb.tuple import Versionstamp

__all__ = ["Versionstamp", "pack", "unpack", "range", "pack_with_versionstamp", "has_incomplete_versionstamp"]

#: Type code of a 96-bit versionstamp element (10-byte commit stamp + 2-byte user version).
VERSIONSTAMP_CODE = 0x33
#: Type code that opens a nested tuple (closed by 0x00).
NESTED_CODE = 0x05
#: Type code of None; inside a nested tuple it is escaped as 0x00 0xFF.
NULL_CODE = 0x00
#: The 10 bytes an incomplete versionstamp carries until commit fills them in.
INCOMPLETE_STAMP = b"\xff" * 10


#: Encoded elements remembered (cleared when full): job keys repeat the same type names,
#: ids and prefixes across the three transactions of a job, and the binding's pack of one
#: element runs many times the Python of a dict hit.
_ELEMENT_CACHE_MAX = 65536
_element_cache: dict[tuple[type, Any], bytes] = {}
#: Types whose value alone decides the encoding (bool and float are not here: True == 1 and
#: -0.0 == 0.0 but encode differently; the type is part of the cache key as well).
_CACHEABLE = (str, bytes, int)


def _encode_stamp(v: Versionstamp) -> bytes:
    tr_version = v.tr_version
    if tr_version is not None and not isinstance(tr_version, bytes):
        # A binding-side ``fdb.impl.Value`` (only with the native client): use its bytes.
        tr_version = bytes(tr_version)
    return bytes([VERSIONSTAMP_CODE]) + struct.pack(">10sH", tr_version or INCOMPLETE_STAMP, v.user_version)


def _encode(value: Any, nested: bool) -> tuple[bytes, int]:
    """Encode one element; returns (bytes, offset of an incomplete stamp's 10 bytes or -1)."""
    if isinstance(value, Versionstamp):
        return _encode_stamp(value), (-1 if value.is_complete() else 1)
    if isinstance(value, (tuple, list)):
        parts = [bytes([NESTED_CODE])]
        pos = -1
        length = 1
        for child in value:
            data, child_pos = _encode(child, True)
            if child_pos >= 0:
                if pos >= 0:
                    raise ValueError("Multiple incomplete versionstamps included in tuple")
                pos = length + child_pos
            parts.append(data)
            length += len(data)
        parts.append(b"\x00")
        return b"".join(parts), pos
    if value is None:
        return (b"\x00\xff" if nested else b"\x00"), -1
    # Every other type is encoded identically at top level and nested, so the binding's own
    # top-level pack of a one-element tuple gives exactly the element's bytes.
    kind = type(value)
    if kind not in _CACHEABLE:
        return _fdbtuple.pack((value,)), -1
    cache_key = (kind, value)
    cached = _element_cache.get(cache_key)
    if cached is not None:
        data = cached
    else:
        data = _fdbtuple.pack((value,))
        if len(_element_cache) >= _ELEMENT_CACHE_MAX:
            _element_cache.clear()
        _element_cache[cache_key] = data
    return data, -1


def _pack(t: tuple, prefix: bytes) -> tuple[bytes, int]:
    if not isinstance(t, tuple):
        raise TypeError(f"tuple pack expects a tuple, got {type(t).__name__}")
    parts = [prefix]
    pos = -1
    length = len(prefix)
    for item in t:
        data, item_pos = _encode(item, False)
        if item_pos >= 0:
            if pos >= 0:
                raise ValueError("Multiple incomplete versionstamps included in tuple")
            pos = length + item_pos
        parts.append(data)
        length += len(data)
    return b"".join(parts), pos


def pack(t: tuple, prefix: bytes = b"") -> bytes:
    """Pack ``t`` as ``fdb.tuple.pack`` does, complete Versionstamps included.

    Parameters:
        t: the tuple (elements: None, bytes, str, int, float, bool, UUID, tuple, Versionstamp).
        prefix: bytes put before the packed tuple.

    Returns:
        The key bytes.

    Raises:
        ValueError: ``t`` holds an incomplete Versionstamp (use :func:`pack_with_versionstamp`)
            or an unsupported type.
    """
    data, pos = _pack(t, prefix)
    if pos >= 0:
        raise ValueError("Incomplete versionstamp included in vanilla tuple pack")
    return data


def pack_with_versionstamp(t: tuple, prefix: bytes = b"") -> bytes:
    """Pack ``t``, which holds exactly one incomplete Versionstamp, for a versionstamped write.

    Returns:
        The packed bytes plus a 4-byte little-endian trailer with the offset of the stamp's
        10 bytes: the operand ``set_versionstamped_key`` / ``set_versionstamped_value`` expect.

    Raises:
        ValueError: no incomplete Versionstamp, or more than one.
    """
    data, pos = _pack(t, prefix)
    if pos < 0:
        raise ValueError("No incomplete versionstamp included in tuple pack with versionstamp")
    return data + struct.pack("<L", pos)


def unpack(b: bytes, prefix_len: int = 0) -> tuple:
    """Unpack a key packed by :func:`pack` (or by FoundationDB's tuple layer), skipping ``prefix_len`` bytes."""
    return _fdbtuple.unpack(b, prefix_len)


def range(t: tuple, prefix: bytes = b"") -> tuple[bytes, bytes]:  # noqa: A001 - the tuple layer's name
    """The key range ``[begin, end)`` holding every tuple that extends ``t`` (not ``t`` itself).

    Returns:
        ``(pack(t, prefix) + b"\\x00", pack(t, prefix) + b"\\xff")``.
    """
    p = pack(t, prefix)
    return p + b"\x00", p + b"\xff"


def has_incomplete_versionstamp(t: tuple) -> bool:
    """Whether ``t`` (or a tuple nested in it) holds an incomplete Versionstamp."""
    return _fdbtuple.has_incomplete_versionstamp(t)
