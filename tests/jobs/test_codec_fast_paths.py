"""The job layer's shortcuts give the general code's answers: key caches (first use, cached, after
they fill up) and the row decoder's fast path against the tuple layer (on rows damaged at
random, too), the flat job data check against the general one (encoding and decoding)."""

from __future__ import annotations

import msgpack
from hypothesis import example, given, settings
from hypothesis import strategies as st

from smoosh.jobs import codec, encoding, model
from smoosh.jobs.errors import EncodingError
from smoosh.jobs.model import Keys
from smoosh.store import tuples
from smoosh.store.tuples import Versionstamp

job_types = st.one_of(st.text(min_size=1, max_size=8), st.tuples(st.text(min_size=1, max_size=4), st.integers(0, 2**40)))
job_ids = st.text(min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(job_types, job_ids, st.integers(0, 2**40)), min_size=1, max_size=30))
def test_keys_built_from_the_caches_are_the_tuple_layers(calls):
    old_prefixes, old_ids = model.MAX_CACHED_PREFIXES, codec._ID_CACHE_MAX
    # Tiny caches: the calls below fill and clear them many times over.
    model.MAX_CACHED_PREFIXES, codec._ID_CACHE_MAX = 3, 3
    try:
        keys = Keys(tuples.pack(("jobs",)))
        p = keys.prefix
        for _ in range(2):  # the second pass meets whatever the first left cached
            for job_type, job_id, t in calls:
                assert keys.data(job_type, job_id) == tuples.pack((model.DATA, job_type, job_id), p)
                assert keys.pending(job_type, t, job_id) == tuples.pack((model.PENDING, job_type, t, job_id), p)
                assert keys.watches_pending(job_type) == tuples.pack((model.WATCHES_PENDING, job_type), p)
                assert keys.activity_timeout(job_type) == tuples.pack((model.ACTIVITY_TIMEOUT, job_type), p)
                assert keys.tx_ids_before(t) == tuples.pack((model.TX_IDS, t), p)
                assert codec.enc_id(job_id) == tuples.pack((job_id,))
    finally:
        model.MAX_CACHED_PREFIXES, codec._ID_CACHE_MAX = old_prefixes, old_ids


_seqs = st.one_of(st.just(codec.PENDING_SEQ_ENC), st.just(codec.NONE_ENC), st.binary(min_size=12, max_size=12).map(lambda b: b"\x33" + b))
_locks = st.one_of(st.none(), st.text(max_size=40), st.just("0123456789abcdef0123456789abcdef"))


@settings(max_examples=300, deadline=None)
@given(_seqs, _locks, st.integers(0, 2**64 - 1), st.booleans(), st.binary(max_size=40),
       st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255), st.sampled_from(["flip", "insert", "delete"])), max_size=3))
def test_the_fast_row_decoder_reads_what_the_tuple_layer_reads(seq_enc, lock, stime, resubmit, data, damage):
    raw = bytearray(codec.encode_row(seq_enc, lock, stime, resubmit, codec.enc_bytes(data)))
    for at, byte, how in damage:
        at %= len(raw) + (how == "insert")
        if how == "flip" and at < len(raw):
            raw[at] = byte
        elif how == "insert":
            raw.insert(at, byte)
        elif at < len(raw) and len(raw) > 1:
            del raw[at]
    raw_b = bytes(raw)
    try:
        fast = codec._decode_fast(raw_b)
    except (ValueError, IndexError):
        return  # the general decoder takes it
    seq, lock_, stime_, resubmit_, data_ = tuples.unpack(raw_b)
    assert (fast.seq, fast.lock, fast.scheduled_time, fast.resubmit, fast.data) == (seq, lock_, stime_, resubmit_, data_)
    assert isinstance(seq, (int, type(None), Versionstamp)) and fast.seq_enc == (codec.NONE_ENC if seq is None else tuples.pack((seq,)))


_scalars = st.one_of(
    st.none(), st.booleans(), st.floats(allow_nan=False), st.text(max_size=8), st.binary(max_size=8),
    st.integers(-(2**64), 2**65),  # beyond msgpack's range on both sides too
)
_keys = st.one_of(st.text(max_size=4), st.integers(0, 2), st.binary(max_size=2))
_values = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_keys, inner, max_size=3)), max_leaves=6)
_job_data = st.dictionaries(_keys, _values, max_size=6)


def _general_encode(data):
    encoding._check_map(data)
    return msgpack.packb(data, use_bin_type=True)


@settings(max_examples=300, deadline=None)
@given(_job_data)
# Each way out of the flat check: an int past either end of msgpack's range, a nested
# dict (whose keys need the general check), a str subclass.
@example({"a": 2**64})
@example({"a": -(2**63) - 1, "b": "x"})
@example({"a": [{1: 2}]})
@example({"a": {"b": 2**70}})
@example({"a": type("S", (str,), {})("x")})
def test_encoding_job_data_answers_as_the_general_check_does(data):
    try:
        expected = ("ok", _general_encode(data))
    except EncodingError as e:
        expected = ("error", str(e))
    try:
        got = ("ok", encoding.encode_data(data))
    except EncodingError as e:
        got = ("error", str(e))
    assert got == expected


def _general_decode(raw):
    # decode_data with the general check on every map, as it was written before the flat check.
    try:
        value = msgpack.unpackb(raw, raw=False, strict_map_key=True, max_ext_len=0)
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise EncodingError(f"stored job data is damaged: {e}") from e
    if not isinstance(value, dict):
        raise EncodingError(f"stored job data is a {type(value).__name__}, not a map")
    try:
        encoding._check_map(value)
    except EncodingError as e:
        raise EncodingError(f"stored job data is damaged: {e}") from None
    return value


@settings(max_examples=300, deadline=None)
@given(st.one_of(_job_data, _values))
def test_decoding_job_data_answers_as_the_general_check_does(data):
    raw = msgpack.packb(data, use_bin_type=True) if _packable(data) else msgpack.packb({}, use_bin_type=True)
    try:
        expected = ("ok", _general_decode(raw))
    except EncodingError as e:
        expected = ("error", str(e))
    try:
        got = ("ok", encoding.decode_data(raw))
    except EncodingError as e:
        got = ("error", str(e))
    assert got == expected


def _packable(data):
    try:
        msgpack.packb(data, use_bin_type=True)
        return True
    except (OverflowError, TypeError, ValueError):
        return False
