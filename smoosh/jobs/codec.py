"""The job row and the elements of job keys, encoded by hand: the tuple layer's exact bytes, fast.

Every job-layer transaction packs and unpacks the job row ``(seq, lock, scheduled_time,
resubmit, data)`` and a key or two. The tuple layer (``fdb.tuple``) is pure Python and generic:
unpacking one row cost about as much as the rest of a memory-store transaction. The row has a
fixed shape, so this module writes and reads it directly, producing and accepting exactly the
bytes ``fdb.tuple.pack`` would (the tests compare them), and falls back to the tuple layer for
anything outside the shapes the job layer writes (a row written by another implementation, a
negative or huge integer).

Each element is kept encoded as long as possible: a :class:`JobRow` holds its seq and its data
as the tuple-layer bytes they were read as, so a transition that carries them into a new row
or an activity entry copies bytes and never decodes and re-encodes them ("encoding done
once").
"""

from __future__ import annotations

import struct

from fdb.tuple import Versionstamp

from smoosh.store import tuples

#: Tuple-layer codes of the elements a row holds.
_NULL = 0x00
_BYTES = 0x01
_STRING = 0x02
_INT_ZERO = 0x14
_FALSE = 0x26
_TRUE = 0x27
_VERSIONSTAMP = 0x33

#: Encoded elements.
NONE_ENC = b"\x00"
FALSE_ENC = b"\x26"
TRUE_ENC = b"\x27"
#: The seq of a pending job (integer 0).
PENDING_SEQ_ENC = b"\x14"
#: The 10 bytes an incomplete versionstamp carries until the commit fills them in.
_INCOMPLETE = b"\xff" * 10
#: Offset trailer of a value whose first element is the stamp (its 10 bytes start at byte 1).
STAMP_FIRST_TRAILER = struct.pack("<L", 1)
#: ``(WATCHES_ACTIVITY, type)``'s value: ``(Versionstamp(user_version=0),)`` with its trailer.
WATCH_STAMP_VALUE = bytes([_VERSIONSTAMP]) + _INCOMPLETE + b"\x00\x00" + STAMP_FIRST_TRAILER

#: Integers below this are written here (the binding writes larger ones with another code).
_MAX_FAST_INT = 1 << 63


def enc_str(value: str) -> bytes:
    """The tuple layer's encoding of one str element (code 0x02, NUL escaped)."""
    return b"\x02" + value.encode("utf-8").replace(b"\x00", b"\x00\xff") + b"\x00"


#: Encoded job ids remembered (cleared when full): a round trip builds keys of one id in
#: each of its three transactions, five or six times in all.
_ID_CACHE_MAX = 4096
_ids: dict[str, bytes] = {}


def enc_id(job_id: str) -> bytes:
    """:func:`enc_str` of a job id, remembered for the id's next keys."""
    encoded = _ids.get(job_id)
    if encoded is None:
        if len(_ids) >= _ID_CACHE_MAX:
            _ids.clear()
        encoded = _ids[job_id] = enc_str(job_id)
    return encoded


def enc_bytes(value: bytes) -> bytes:
    """The tuple layer's encoding of one bytes element (code 0x01, NUL escaped)."""
    return b"\x01" + value.replace(b"\x00", b"\x00\xff") + b"\x00"


def enc_int(value: int) -> bytes:
    """The tuple layer's encoding of one int element (non-negative ones written here)."""
    if 0 <= value < _MAX_FAST_INT and value.__class__ is int:
        if value == 0:
            return PENDING_SEQ_ENC
        length = (value.bit_length() + 7) >> 3
        return bytes((_INT_ZERO + length,)) + value.to_bytes(length, "big")
    return tuples.pack((value,))


def incomplete_stamp(user_version: int) -> bytes:
    """An incomplete 96-bit versionstamp element with ``user_version`` (its 10 bytes at offset 1)."""
    return bytes((_VERSIONSTAMP,)) + _INCOMPLETE + user_version.to_bytes(2, "big")


def make_versionstamp(tr_version: bytes | None, user_version: int) -> Versionstamp:
    """A Versionstamp from parts already known valid (skips the binding's checks on a hot path)."""
    stamp = Versionstamp.__new__(Versionstamp)
    stamp.tr_version = tr_version
    stamp.user_version = user_version
    return stamp


def decode_seq(seq_enc: bytes) -> int | Versionstamp | None:
    """The seq an encoded seq element holds: 0, None or a Versionstamp."""
    if seq_enc == PENDING_SEQ_ENC:
        return 0
    if seq_enc == NONE_ENC:
        return None
    if len(seq_enc) == 13 and seq_enc[0] == _VERSIONSTAMP:
        tr_version = seq_enc[1:11]
        return make_versionstamp(None if tr_version == _INCOMPLETE else tr_version, int.from_bytes(seq_enc[11:13], "big"))
    return tuples.unpack(seq_enc)[0]


def unescape(body: bytes) -> bytes:
    """A bytes or str element's payload without its NUL escapes."""
    return body.replace(b"\x00\xff", b"\x00") if b"\x00" in body else body


class JobRow:
    """One ``(DATA, type, id)`` row, its seq and data kept as their encoded elements.

    Attributes:
        seq_enc: the tuple-layer bytes of ``seq`` (0 pending, None finished, a versionstamp running).
        lock: the run's lock, or None.
        scheduled_time: the job's scheduled time (Unix seconds).
        resubmit: whether the job was resubmitted while running.
        data_enc: the tuple-layer bytes of the encoded job data (a bytes element).
    """

    __slots__ = ("seq_enc", "lock", "scheduled_time", "resubmit", "data_enc")

    def __init__(self, seq_enc: bytes, lock: str | None, scheduled_time: int, resubmit: bool, data_enc: bytes) -> None:
        self.seq_enc = seq_enc
        self.lock = lock
        self.scheduled_time = scheduled_time
        self.resubmit = resubmit
        self.data_enc = data_enc

    @property
    def seq(self) -> int | Versionstamp | None:
        """0 while pending, None once finished, the last accept's or update's Versionstamp while running."""
        return decode_seq(self.seq_enc)

    @property
    def running_stamp(self) -> bool:
        """Whether ``seq`` is a versionstamp (the row names an activity entry)."""
        return self.seq_enc[0] == _VERSIONSTAMP

    @property
    def data(self) -> bytes:
        """The encoded job data (msgpack bytes)."""
        return unescape(self.data_enc[1:-1])

    @property
    def state(self) -> str:
        """"pending", "running" or "finished", derived from (seq, lock) as couch_jobs does."""
        if self.lock is not None:
            return "running"
        if self.seq_enc == NONE_ENC:
            return "finished"
        return "pending"

    def __repr__(self) -> str:
        return f"JobRow({self.seq!r}, {self.lock!r}, {self.scheduled_time!r}, {self.resubmit!r}, {self.data!r})"


def encode_row(seq_enc: bytes, lock: str | None, scheduled_time: int, resubmit: bool, data_enc: bytes) -> bytes:
    """The row's value: ``pack((seq, lock, scheduled_time, resubmit, data))`` from encoded parts."""
    return b"".join((
        seq_enc,
        NONE_ENC if lock is None else enc_str(lock),
        enc_int(scheduled_time),
        TRUE_ENC if resubmit else FALSE_ENC,
        data_enc,
    ))


def _terminator(raw: bytes, start: int) -> int:
    """Index of the NUL that ends the bytes/str element whose payload starts at ``start``."""
    end = raw.find(b"\x00", start)
    while end >= 0 and raw[end + 1 : end + 2] == b"\xff":
        end = raw.find(b"\x00", end + 2)
    if end < 0:
        raise ValueError("unterminated element")
    return end


def decode_int_str(raw: bytes, start: int) -> tuple[int, str]:
    """The ``(int, str)`` elements that end a key at ``start`` (a pending key's time and id).

    Raises:
        ValueError: the bytes there are not exactly a non-negative int and a str element.
    """
    length = raw[start] - _INT_ZERO
    if not 0 <= length <= 8:
        return _decode_int_str_slow(raw, start)
    number = int.from_bytes(raw[start + 1 : start + 1 + length], "big")
    i = start + 1 + length
    if raw[i] != _STRING or raw[-1] != _NULL:
        return _decode_int_str_slow(raw, start)
    body = raw[i + 1 : -1]
    if b"\x00" in body:
        if b"\x00" in body.replace(b"\x00\xff", b""):
            return _decode_int_str_slow(raw, start)
        body = body.replace(b"\x00\xff", b"\x00")
    return number, body.decode("utf-8")


def _decode_int_str_slow(raw: bytes, start: int) -> tuple[int, str]:
    number, text = tuples.unpack(raw, start)
    return number, text


def decode_row(raw: bytes) -> JobRow:
    """Decode a row value; rows of any shape the tuple layer can read are accepted.

    Raises:
        ValueError: the bytes are not a five-element tuple.
    """
    try:
        return _decode_fast(raw)
    except (ValueError, IndexError):
        pass
    seq, lock, scheduled_time, resubmit, data = tuples.unpack(raw)
    seq_enc = NONE_ENC if seq is None else tuples.pack((seq,))
    return JobRow(seq_enc, lock, scheduled_time, bool(resubmit), enc_bytes(data))


def _decode_fast(raw: bytes) -> JobRow:
    code = raw[0]
    if code == _INT_ZERO or code == _NULL:
        i = 1
    elif code == _VERSIONSTAMP:
        i = 13
    else:
        raise ValueError("not a fast-path seq")
    seq_enc = raw[:i]
    code = raw[i]
    if code == _NULL:
        lock = None
        i += 1
    elif code == _STRING:
        end = raw.find(b"\x00", i + 1)
        if end < 0:
            raise ValueError("unterminated lock")
        if raw[end + 1 : end + 2] == b"\xff":  # an escaped NUL in the lock: rare
            end = _terminator(raw, i + 1)
            lock = unescape(raw[i + 1 : end]).decode("utf-8")
        else:
            lock = raw[i + 1 : end].decode("utf-8")
        i = end + 1
    else:
        raise ValueError("not a fast-path lock")
    length = raw[i] - _INT_ZERO
    if not 0 <= length <= 8:
        raise ValueError("not a fast-path time")
    scheduled_time = int.from_bytes(raw[i + 1 : i + 1 + length], "big") if length else 0
    i += 1 + length
    code = raw[i]
    if code != _FALSE and code != _TRUE:
        raise ValueError("not a fast-path flag")
    # The data is the last element: it runs to the end, and every NUL inside is escaped
    # (each one followed by 0xFF: as many NULs as escapes, counted without a copy).
    data_enc = raw[i + 1 :]
    if data_enc[0] != _BYTES or data_enc[-1] != _NULL or data_enc.count(b"\x00", 1, -1) != data_enc.count(b"\x00\xff", 1, -1):
        raise ValueError("not a fast-path data element")
    return JobRow(seq_enc, lock, scheduled_time, code == _TRUE, data_enc)
