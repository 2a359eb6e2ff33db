"""The hand-written row and key codec writes and reads exactly the tuple layer's bytes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from smoosh.jobs import codec
from smoosh.jobs.model import Keys
from smoosh.store import tuples
from smoosh.store.tuples import Versionstamp

stamps = st.builds(lambda tr, uv: Versionstamp(tr, uv), st.binary(min_size=10, max_size=10), st.integers(0, 0xFFFF))
seqs = st.one_of(st.just(0), st.none(), stamps)
locks = st.one_of(st.none(), st.text(), st.just("0123456789abcdef0123456789abcdef"))
times = st.one_of(st.integers(0, 2**64 - 1), st.integers(-(2**70), 2**70))
payloads = st.binary(max_size=300)


@given(seqs, locks, times, st.booleans(), payloads)
def test_a_row_encodes_and_decodes_as_the_tuple_layer_does(seq, lock, stime, resubmit, data) -> None:
    seq_enc = codec.NONE_ENC if seq is None else tuples.pack((seq,))
    raw = codec.encode_row(seq_enc, lock, stime, resubmit, codec.enc_bytes(data))
    assert raw == tuples.pack((seq, lock, stime, resubmit, data))
    row = codec.decode_row(raw)
    assert (row.seq, row.lock, row.scheduled_time, row.resubmit, row.data) == (seq, lock, stime, resubmit, data)
    assert row.seq_enc == seq_enc and row.data_enc == codec.enc_bytes(data)


@given(st.integers(0, 0xFFFE), locks, st.integers(0, 2**40), st.booleans(), payloads)
def test_a_running_row_has_the_operand_pack_with_versionstamp_makes(uv, lock, stime, resubmit, data) -> None:
    value = codec.encode_row(codec.incomplete_stamp(uv), lock, stime, resubmit, codec.enc_bytes(data))
    expected = tuples.pack_with_versionstamp((Versionstamp(user_version=uv), lock, stime, resubmit, data))
    assert value + codec.STAMP_FIRST_TRAILER == expected


def test_a_row_of_another_shape_is_read_through_the_tuple_layer() -> None:
    # Bytes a future or foreign writer might produce: a float time, a bytes lock.
    row = codec.decode_row(tuples.pack((0, b"lock", 1.5, True, b"d")))
    assert (row.seq, row.lock, row.scheduled_time, row.resubmit, row.data, row.state) == (0, b"lock", 1.5, True, b"d", "running")


@given(st.text(min_size=1), st.integers(0, 2**40), st.binary(min_size=1, max_size=16), st.integers(0, 0xFFFE))
def test_job_keys_are_the_tuple_layers(job_id, stime, tx_id, uv) -> None:
    keys = Keys(tuples.pack(("jobs",)))
    p = keys.prefix
    assert keys.data("t", job_id) == tuples.pack((1, "t", job_id), p)
    assert keys.pending("t", stime, job_id) == tuples.pack((2, "t", stime, job_id), p)
    assert keys.pending_end("t", stime) == tuples.pack((2, "t", stime + 1), p)
    assert keys.tx_id(stime, tx_id) == tuples.pack((255, stime, tx_id), p)
    assert keys.activity_stamped("t", uv) == tuples.pack_with_versionstamp((6, "t", Versionstamp(user_version=uv)), p)
    assert codec.WATCH_STAMP_VALUE == tuples.pack_with_versionstamp((Versionstamp(user_version=0),))
