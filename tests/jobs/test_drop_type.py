"""``Jobs.drop_type``: a type nobody will use again, gone from the store whole (``smoosh forget``, issue 50)."""

from __future__ import annotations

import pytest
from jobs_testlib import T1, T2

from smoosh.jobs import JobHalted, Jobs
from smoosh.store import tuples


def test_dropping_a_type_clears_every_key_of_it_and_nothing_of_another(jobs: Jobs, prefix: bytes) -> None:
    for job_id in ("a", "b", "c"):
        jobs.add(T1, job_id, {"n": job_id})
    jobs.add(T2, "x", {"n": "x"})
    job, _data = jobs.accept(T1, timeout=5)

    def keys_of(job_type: object) -> list[bytes]:
        out = []
        for section in range(1, 7):
            begin, end = tuples.range((section, job_type), prefix)
            out += [k for k, _ in jobs.store.transact(lambda tr: tr.get_range(begin, end))]
            whole = tuples.pack((section, job_type), prefix)
            if jobs.store.transact(lambda tr: tr.get(whole)) is not None:
                out.append(whole)
        return out

    assert keys_of(T1) and keys_of(T2)
    jobs.drop_type(T1)
    assert keys_of(T1) == []
    assert T1 not in jobs.get_types() and jobs.list_jobs(T1) == []
    with pytest.raises(JobHalted):
        jobs.update(job)
    assert [(t, i, s) for t, i, s, _ in jobs.list_jobs()] == [(T2, "x", "pending")]
