"""Job data, types and ids as bytes: msgpack with explicit size limits, checked before any write.

Job data is a dict with string keys whose values are msgpack-encodable (None, bool, int,
float incl. ``inf``, str, bytes, lists/tuples and dicts with string keys). Anything else is
refused with :class:`EncodingError` before a transaction writes a byte, so a bad payload
never leaves a half-written job behind. Decoding caps every length, so a damaged or hostile
row cannot make the reader allocate without bound.
"""

from __future__ import annotations

import math
import threading
from typing import Mapping, Union

import msgpack

from smoosh.jobs.errors import EncodingError

#: A job type: a string, or a non-empty tuple of strings and ints (hashable: types key dicts).
JobType = Union[str, tuple[Union[str, int], ...]]
#: A job's data as the layer hands it back: a dict with string keys, whose values the layer does
#: not look into (msgpack-encodable, checked before any write): a reader checks what it reads.
JobData = dict[str, object]
#: Job data as a caller hands it in (a dict, checked as :func:`encode_data` says).
JobDataIn = Mapping[str, object]

#: Largest encoded job data (bytes). The data row and the activity entry each carry the data
#: plus a key or id, and a store value may hold at most 100,000 bytes.
MAX_DATA_BYTES = 65_536
#: Largest job id (UTF-8 bytes); keys (prefix + type + id) must stay under 10,000 bytes.
MAX_ID_BYTES = 8_192
#: Largest job type, counting the UTF-8 bytes of its strings.
MAX_TYPE_BYTES = 1_024
#: Deepest nesting of lists and dicts in job data.
MAX_DEPTH = 32
#: Largest number of items in any one list or dict while decoding.
MAX_CONTAINER_ITEMS = 65_536

_SCALARS = (str, bytes, bool, float, type(None))
#: msgpack's integer range (int64 min .. uint64 max).
_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1


def _check_value(value: object, depth: int) -> None:
    if isinstance(value, _SCALARS):
        return
    if isinstance(value, int):
        if not _INT_MIN <= value <= _INT_MAX:
            raise EncodingError(f"job data integer {value} is outside msgpack's 64-bit range")
        return
    if depth >= MAX_DEPTH:
        raise EncodingError(f"job data nests deeper than {MAX_DEPTH} levels")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise EncodingError(f"job data key {key!r} is not a string")
            _check_value(item, depth + 1)
        return
    if isinstance(value, (list, tuple)):
        for item in value:
            _check_value(item, depth + 1)
        return
    raise EncodingError(f"job data value {value!r} of type {type(value).__name__} cannot be encoded")


#: Exact types :func:`_check_map` passes without a call (subclasses take the general path).
_PLAIN_SCALARS = frozenset({str, float, bool, bytes, type(None)})


def _check_map(data: Mapping[object, object]) -> None:
    """``_check_value(data, 0)`` for a job's top-level dict, with its usual flat items inline.

    Job data is nearly always one flat dict of strings and numbers (smoosh's own is): those
    items are checked here without a call each, the rest by :func:`_check_value`.
    """
    for key, item in data.items():
        if key.__class__ is not str and not isinstance(key, str):
            raise EncodingError(f"job data key {key!r} is not a string")
        kind = item.__class__
        if kind in _PLAIN_SCALARS:
            continue
        if kind is int and _INT_MIN <= item <= _INT_MAX:  # type: ignore[operator]  # an int: its class says so
            continue
        _check_value(item, 1)


#: Each thread's msgpack Packer (a Packer is not thread-safe; making one per call cost as
#: much as the packing).
_packers = threading.local()


def _pack(data: JobDataIn) -> bytes:
    try:
        packer = _packers.packer
    except AttributeError:
        packer = _packers.packer = msgpack.Packer(use_bin_type=True)
    packed: bytes = packer.pack(data)
    return packed


def encode_data(data: object) -> bytes:
    """Encode job data for storage.

    Parameters:
        data: a dict with string keys and msgpack-encodable values.

    Returns:
        The msgpack bytes.

    Raises:
        EncodingError: ``data`` is not a dict, has a non-string key (at any depth), holds a
            value msgpack cannot encode, or encodes to more than :data:`MAX_DATA_BYTES`.
    """
    if not isinstance(data, dict):
        raise EncodingError(f"job data must be a dict, not {type(data).__name__}")
    _check_map(data)
    try:
        packed = _pack(data)
    except (TypeError, ValueError, OverflowError) as e:  # pragma: no cover - _check_value catches these first
        _packers.packer = msgpack.Packer(use_bin_type=True)  # its buffer may hold a partial value
        raise EncodingError(f"job data cannot be encoded: {e}") from e
    if len(packed) > MAX_DATA_BYTES:
        raise EncodingError(f"job data encodes to {len(packed)} bytes, more than the limit of {MAX_DATA_BYTES}")
    return packed


def decode_data(raw: bytes) -> JobData:
    """Decode stored job data, with every length capped.

    Parameters:
        raw: bytes written by :func:`encode_data`.

    Returns:
        The job data dict (lists come back as lists).

    Raises:
        EncodingError: the bytes are damaged, too large, or not a msgpack map.
    """
    if len(raw) > MAX_DATA_BYTES:
        raise EncodingError(f"stored job data is {len(raw)} bytes, more than the limit of {MAX_DATA_BYTES}")
    try:
        value = msgpack.unpackb(
            raw,
            raw=False,
            strict_map_key=True,
            max_str_len=MAX_DATA_BYTES,
            max_bin_len=MAX_DATA_BYTES,
            max_array_len=MAX_CONTAINER_ITEMS,
            max_map_len=MAX_CONTAINER_ITEMS,
            max_ext_len=0,
        )
    except (ValueError, TypeError, msgpack.UnpackException) as e:  # damaged bytes raise any of these
        raise EncodingError(f"stored job data is damaged: {e}") from e
    if not isinstance(value, dict):
        raise EncodingError(f"stored job data is a {type(value).__name__}, not a map")
    # msgpack's strict_map_key still lets bytes keys through and its own depth limit is far
    # above MAX_DEPTH: data encode_data would refuse is damaged or foreign, and handing it to
    # a worker would only fail later, at finish, with the job stuck until its timeout.
    try:
        _check_map(value)
    except EncodingError as e:
        raise EncodingError(f"stored job data is damaged: {e}") from None
    return value


def check_type(job_type: object) -> JobType:
    """Validate a job type: a non-empty str, or a non-empty tuple of strs and ints.

    Returns:
        The type, unchanged (lists are not accepted: types must be hashable).

    Raises:
        EncodingError: any other shape, or more than :data:`MAX_TYPE_BYTES`.
    """
    if isinstance(job_type, str):
        size = len(job_type.encode("utf-8", "surrogatepass"))
    elif isinstance(job_type, tuple) and job_type:
        size = 0
        for part in job_type:
            if isinstance(part, str):
                size += len(part.encode("utf-8", "surrogatepass"))
            elif isinstance(part, int) and not isinstance(part, bool):
                size += 9
            else:
                raise EncodingError(f"job type {job_type!r} may hold only strings and ints")
    else:
        raise EncodingError(f"job type {job_type!r} must be a string or a tuple of strings and ints")
    if size == 0 or size > MAX_TYPE_BYTES:
        raise EncodingError(f"job type {job_type!r} must be 1..{MAX_TYPE_BYTES} bytes")
    return job_type


def check_id(job_id: object) -> str:
    """Validate a job id: a non-empty str of at most :data:`MAX_ID_BYTES` UTF-8 bytes.

    Raises:
        EncodingError: not a str, empty, or too long.
    """
    if not isinstance(job_id, str):
        raise EncodingError(f"job id {job_id!r} must be a string")
    size = len(job_id.encode("utf-8", "surrogatepass"))
    if size == 0 or size > MAX_ID_BYTES:
        raise EncodingError(f"job id {job_id[:80]!r} must be 1..{MAX_ID_BYTES} bytes, not {size}")
    return job_id


def check_sched_time(scheduled_time: object) -> int:
    """Scheduled times are integer Unix seconds; floats are floored.

    Floats are floored because the tuple encoding sorts every float after every int, so a
    float time would never fall under an integer ``max_sched_time``.

    Raises:
        ValueError: not a finite non-negative number.
    """
    if isinstance(scheduled_time, bool) or not isinstance(scheduled_time, (int, float)):
        raise ValueError(f"scheduled time {scheduled_time!r} must be a number of Unix seconds")
    if isinstance(scheduled_time, float):
        if not math.isfinite(scheduled_time):
            raise ValueError(f"scheduled time {scheduled_time!r} must be finite")
        scheduled_time = math.floor(scheduled_time)
    if scheduled_time < 0:
        raise ValueError(f"scheduled time {scheduled_time!r} must not be negative")
    return int(scheduled_time)
