"""The job layer's shortcuts give the tuple layer's answers: key caches (first use, cached, after
they fill up) and the row decoder's fast path (on rows damaged at random, too)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from smoosh.jobs import codec, model
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
