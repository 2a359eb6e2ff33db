"""The job layer's data model: tuple-packed keys under one prefix, the job row, and its writes.

Layout (every key is ``prefix + pack(tuple)``; the couch_jobs model, DESIGN §5.5)::

    (DATA, type, id)              = (seq, lock, scheduled_time, resubmit, data)
    (PENDING, type, stime, id)    = b""            the queue, ordered by time then id
    (WATCHES_PENDING, type)       = 8-byte LE counter, atomic add on every enqueue
    (WATCHES_ACTIVITY, type)      = (versionstamp,) rewritten on accept/update/finish/remove/re-enqueue
    (ACTIVITY_TIMEOUT, type)      = (seconds,)     also the registry of types
    (ACTIVITY, type, versionstamp) = (id, data)    one entry per running job
    (TX_IDS, issued_at, id)       = remembered result of one write transaction (see txids)

``seq`` is 0 while pending, None once finished, and the versionstamp of the job's last
accept/update while running; that versionstamp is also its ACTIVITY key, so the row always
names the one activity entry to clear. Versionstamps are the 96-bit kind: each stamped write
of a transaction gets its own user version (see :func:`next_user_version`), so two jobs of
one type touched in one transaction get distinct ACTIVITY keys.
"""

from __future__ import annotations

import struct
import threading
import weakref
from dataclasses import dataclass

from fdb.tuple import Versionstamp

from smoosh.store import tuples
from smoosh.store.base import ReadView, Transaction
from smoosh.jobs.codec import (
    PENDING_SEQ_ENC,
    STAMP_FIRST_TRAILER,
    WATCH_STAMP_VALUE,
    JobRow,
    decode_int_str,
    decode_row,
    enc_bytes,
    enc_id,
    enc_int,
    encode_row,
    incomplete_stamp,
)
from smoosh.jobs.encoding import JobType

DATA = 1
PENDING = 2
WATCHES_PENDING = 3
WATCHES_ACTIVITY = 4
ACTIVITY_TIMEOUT = 5
ACTIVITY = 6
#: Transaction ids of recent write transactions (fabric2 keeps them at 255 too).
TX_IDS = 255

#: ``seq`` of a pending job.
PENDING_SEQ = 0
#: Highest user version handed out; 0xFFFF is reserved for "every stamp of this commit"
#: (the activity monitor's inclusive upper bound).
MAX_USER_VERSION = 0xFFFE

PENDING_STATE = "pending"
RUNNING_STATE = "running"
FINISHED_STATE = "finished"
NOT_FOUND_STATE = "not_found"

_ONE = struct.pack("<q", 1)
#: Tuple-layer code of a 96-bit versionstamp element.
VERSIONSTAMP_CODE = 0x33


@dataclass(frozen=True)
class Job:
    """A worker's handle on one accepted run of a job.

    It stays valid until the job is removed or re-enqueued; ``update`` and ``resubmit``
    return a new one whose ``resubmitted`` says whether the job was resubmitted while running
    (it then goes back to pending when finished).
    """

    type: JobType
    id: str
    lock: str
    resubmitted: bool = False


#: Cached (section, type) key prefixes per layer; cleared when it grows past this.
MAX_CACHED_PREFIXES = 4096


class _TypeKeys:
    """One type's key prefixes under one layer prefix (see :class:`Keys`)."""

    __slots__ = (
        "sections", "data", "pending", "watches_pending", "watches_activity", "activity_timeout", "activity",
        "activity_first", "pending_end",
    )

    def __init__(self, prefix: bytes, job_type: JobType) -> None:
        #: ``prefix + pack((section, type))`` by section number (0 unused).
        self.sections = [b""] + [tuples.pack((section, job_type), prefix) for section in range(DATA, ACTIVITY + 1)]
        self.data = self.sections[DATA]
        self.pending = self.sections[PENDING]
        self.watches_pending = self.sections[WATCHES_PENDING]
        self.watches_activity = self.sections[WATCHES_ACTIVITY]
        self.activity_timeout = self.sections[ACTIVITY_TIMEOUT]
        self.activity = self.sections[ACTIVITY]
        #: The ACTIVITY key stamped with user version 0, with its offset trailer.
        self.activity_first = self.activity + incomplete_stamp(0) + struct.pack("<L", len(self.activity) + 1)
        #: The last pending_end asked for: (max scheduled time, key).
        self.pending_end: tuple[int, bytes] = (-1, b"")


class Keys:
    """Key builders for one layer prefix.

    Top-level tuple elements pack independently (``pack((a, b)) == pack((a,)) + pack((b,))``),
    so the ``prefix + (section, type)`` part of a key is packed once per type and cached, and
    the rest is written by :mod:`smoosh.jobs.codec`.
    """

    def __init__(self, prefix: bytes) -> None:
        self.prefix = prefix
        # Per type, its sections' prefixes (built on first use): every job-layer transaction
        # builds several keys of one type, and one lookup by the type alone finds them all.
        self._types: dict[JobType, _TypeKeys] = {}
        #: TX_IDS prefixes by issue time (a new one every second).
        self._prefixes: dict[tuple[int, JobType | int], bytes] = {}

    def _of(self, job_type: JobType) -> _TypeKeys:
        """The type's prefixes, packed on first use."""
        t = self._types.get(job_type)
        if t is None:
            if len(self._types) >= MAX_CACHED_PREFIXES:
                self._types.clear()
            t = self._types[job_type] = _TypeKeys(self.prefix, job_type)
        return t

    def _type_prefix(self, section: int, job_type: JobType | int) -> bytes:
        """The key prefix of ``section`` for ``job_type`` (for the transaction ids, an issue time)."""
        if section <= ACTIVITY:
            assert not isinstance(job_type, int)
            return (self._types.get(job_type) or self._of(job_type)).sections[section]
        key = (section, job_type)
        cached = self._prefixes.get(key)
        if cached is None:
            if len(self._prefixes) >= MAX_CACHED_PREFIXES:
                self._prefixes.clear()
            cached = self._prefixes[key] = tuples.pack((section, job_type), self.prefix)
        return cached

    def data(self, job_type: JobType, job_id: str) -> bytes:
        return (self._types.get(job_type) or self._of(job_type)).data + enc_id(job_id)

    def data_type_range(self, job_type: JobType) -> tuple[bytes, bytes]:
        p = self._type_prefix(DATA, job_type)
        return p + b"\x00", p + b"\xff"

    def data_all_range(self) -> tuple[bytes, bytes]:
        return tuples.range((DATA,), self.prefix)

    def pending(self, job_type: JobType, scheduled_time: int, job_id: str) -> bytes:
        return (self._types.get(job_type) or self._of(job_type)).pending + enc_int(scheduled_time) + enc_id(job_id)

    def parse_pending(self, job_type: JobType, key: bytes) -> tuple[int, str]:
        """``(scheduled_time, job_id)`` of one of the type's pending keys."""
        return decode_int_str(key, len((self._types.get(job_type) or self._of(job_type)).pending))

    def pending_range(self, job_type: JobType) -> tuple[bytes, bytes]:
        p = self._type_prefix(PENDING, job_type)
        return p + b"\x00", p + b"\xff"

    def pending_prefix(self, job_type: JobType, scheduled_time: int) -> bytes:
        return self._type_prefix(PENDING, job_type) + enc_int(scheduled_time)

    def pending_end(self, job_type: JobType, max_sched_time: int) -> bytes:
        """First key past every pending key with ``scheduled_time <= max_sched_time``."""
        t = self._types.get(job_type) or self._of(job_type)
        # Every accept asks, with the same time for a second on end: the last answer is kept.
        last = t.pending_end
        if last[0] == max_sched_time:
            return last[1]
        end = t.pending + enc_int(max_sched_time + 1)
        t.pending_end = (max_sched_time, end)
        return end

    def watches_pending(self, job_type: JobType) -> bytes:
        return (self._types.get(job_type) or self._of(job_type)).watches_pending

    def watches_activity(self, job_type: JobType) -> bytes:
        return (self._types.get(job_type) or self._of(job_type)).watches_activity

    def activity_timeout(self, job_type: JobType) -> bytes:
        return (self._types.get(job_type) or self._of(job_type)).activity_timeout

    def activity_timeout_range(self) -> tuple[bytes, bytes]:
        return tuples.range((ACTIVITY_TIMEOUT,), self.prefix)

    def activity(self, job_type: JobType, stamp: Versionstamp) -> bytes:
        return self._type_prefix(ACTIVITY, job_type) + tuples.pack((stamp,))

    def activity_of(self, job_type: JobType, seq_enc: bytes) -> bytes:
        """The ACTIVITY key a running row's encoded seq names."""
        return (self._types.get(job_type) or self._of(job_type)).activity + seq_enc

    def activity_stamped(self, job_type: JobType, user_version: int) -> bytes:
        """An ACTIVITY key with an incomplete stamp, for ``set_versionstamped_key``."""
        t = self._types.get(job_type) or self._of(job_type)
        if user_version == 0:  # the only stamped key of nearly every transaction
            return t.activity_first
        prefix = t.activity
        return prefix + incomplete_stamp(user_version) + struct.pack("<L", len(prefix) + 1)

    def activity_range(self, job_type: JobType) -> tuple[bytes, bytes]:
        p = self._type_prefix(ACTIVITY, job_type)
        return p + b"\x00", p + b"\xff"

    def tx_id(self, issued_at_s: int, tx_id: bytes) -> bytes:
        """The key of one transaction id (ordered by issue time, so old ones clear as a range)."""
        # Packed by hand: the generic packer would cache every random id as an element.
        return self.tx_ids_before(issued_at_s) + enc_bytes(tx_id)

    def tx_ids_range(self) -> tuple[bytes, bytes]:
        return tuples.range((TX_IDS,), self.prefix)

    def tx_ids_before(self, issued_at_s: int) -> bytes:
        """First key past every transaction id issued before ``issued_at_s``."""
        return self._type_prefix(TX_IDS, issued_at_s)

    def unpack(self, key: bytes) -> tuple[object, ...]:
        """A key of this layer's, as its tuple (without the prefix)."""
        return tuples.unpack(key, len(self.prefix))

    # The parts of this layer's own keys, as it packed them (its keys are read, never trusted
    # from elsewhere: the types below are what it wrote).

    def type_of(self, key: bytes) -> JobType:
        """The job type of a per-type key (``(SECTION, type, ...)``)."""
        job_type: JobType = tuples.unpack(key, len(self.prefix))[1]
        return job_type

    def data_key_parts(self, key: bytes) -> tuple[JobType, str]:
        """``(type, id)`` of a job's DATA key."""
        _, job_type, job_id = tuples.unpack(key, len(self.prefix))
        return job_type, job_id

    def pending_key_parts(self, key: bytes) -> tuple[int, str]:
        """``(scheduled time, id)`` of a PENDING key."""
        _, _, scheduled_time, job_id = tuples.unpack(key, len(self.prefix))
        return scheduled_time, job_id


# -- per-transaction user versions --------------------------------------------------------

_counters: weakref.WeakKeyDictionary[object, int] = weakref.WeakKeyDictionary()
_counters_lock = threading.Lock()
_fallback_counter = [0]


def next_user_version(tr: Transaction) -> int:
    """The next user version for a stamped write in ``tr`` (0, 1, 2, ... per transaction).

    Counted per transaction object, on the object itself (a retry reuses the object, so
    numbers keep growing across retries, which is harmless: they only need to be distinct
    within one commit). Wraps below 0xFFFF, so a single commit with more than 65,535 stamped
    writes could repeat one; no job-layer call comes near that.
    """
    try:
        n: int = tr.__dict__.get("_job_user_version", 0)
        tr.__dict__["_job_user_version"] = n + 1
    except AttributeError:  # a transaction class without a __dict__
        with _counters_lock:
            try:
                n = _counters.get(tr, 0)
                _counters[tr] = n + 1
            except TypeError:  # nor weakref support
                n = _fallback_counter[0]
                _fallback_counter[0] = n + 1
    return n % (MAX_USER_VERSION + 1)


# -- row reads and writes ---------------------------------------------------------------------


def get_row(tr: ReadView, keys: Keys, job_type: JobType, job_id: str) -> JobRow | None:
    """Read a job row (a conflicting read unless ``tr`` is a snapshot view)."""
    raw = tr.get(keys.data(job_type, job_id))
    return None if raw is None else decode_row(raw)


def set_row(tr: Transaction, key: bytes, seq_enc: bytes, lock: str | None, scheduled_time: int, resubmit: bool, data_enc: bytes) -> None:
    """Write the row at ``key`` (the job's DATA key) from encoded parts."""
    tr.set(key, encode_row(seq_enc, lock, scheduled_time, resubmit, data_enc))


def set_row_running(
    tr: Transaction, key: bytes, lock: str, scheduled_time: int, resubmit: bool, data_enc: bytes, user_version: int
) -> None:
    """Write a running row whose seq becomes this commit's versionstamp (with ``user_version``)."""
    value = encode_row(incomplete_stamp(user_version), lock, scheduled_time, resubmit, data_enc) + STAMP_FIRST_TRAILER
    tr.set_versionstamped_value(key, value)


def enqueue(tr: Transaction, keys: Keys, job_type: JobType, job_id: str, scheduled_time: int) -> None:
    """Add the pending key and bump the pending counter, which wakes blocked ``accept`` calls."""
    tr.set(keys.pending(job_type, scheduled_time, job_id), b"")
    tr.add(keys.watches_pending(job_type), _ONE)


def write_pending(
    tr: Transaction, keys: Keys, job_type: JobType, job_id: str, scheduled_time: int, data_enc: bytes, key: bytes | None = None
) -> None:
    """Make the job pending: row (0, None, time, False, data), pending key, counter bump.

    Parameters:
        data_enc: the data as an encoded bytes element (:func:`~smoosh.jobs.codec.enc_bytes`).
        key: the job's DATA key, when the caller has built it already.
    """
    set_row(tr, key or keys.data(job_type, job_id), PENDING_SEQ_ENC, None, scheduled_time, False, data_enc)
    enqueue(tr, keys, job_type, job_id, scheduled_time)


def bump_activity_watch(tr: Transaction, keys: Keys, job_type: JobType) -> None:
    """Rewrite ``(WATCHES_ACTIVITY, type)`` with this commit's stamp: wakes the type monitors."""
    tr.set_versionstamped_value(keys.watches_activity(job_type), WATCH_STAMP_VALUE)


def write_activity(
    tr: Transaction, keys: Keys, job_type: JobType, job_id: str, old_seq_enc: bytes | None, data_enc: bytes, user_version: int
) -> None:
    """Replace the job's ACTIVITY entry with one stamped by this commit, and bump the watch."""
    if old_seq_enc is not None:
        clear_activity(tr, keys, job_type, old_seq_enc)
    tr.set_versionstamped_key(keys.activity_stamped(job_type, user_version), enc_id(job_id) + data_enc)
    bump_activity_watch(tr, keys, job_type)


def clear_activity(tr: Transaction, keys: Keys, job_type: JobType, seq_enc: bytes) -> None:
    """Clear the ACTIVITY entry a row's seq names (none unless it is a versionstamp)."""
    if seq_enc[0] == VERSIONSTAMP_CODE:
        tr.clear(keys.activity_of(job_type, seq_enc))


def read_activity_stamp(tr: ReadView, keys: Keys, job_type: JobType) -> Versionstamp | None:
    """The versionstamp in ``(WATCHES_ACTIVITY, type)``, or None if nothing ever bumped it."""
    raw = tr.get(keys.watches_activity(job_type))
    if raw is None:
        return None
    (stamp,) = tuples.unpack(raw)
    return stamp


def read_type_timeout(tr: ReadView, keys: Keys, job_type: JobType) -> float | None:
    raw = tr.get(keys.activity_timeout(job_type))
    if raw is None:
        return None
    timeout_s: float = tuples.unpack(raw)[0]
    return timeout_s
