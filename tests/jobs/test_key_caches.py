"""The job layer's key caches give the tuple layer's bytes, first use or cached, and after they fill up."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from smoosh.jobs import codec, model
from smoosh.jobs.model import Keys
from smoosh.store import tuples

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
