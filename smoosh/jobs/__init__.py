"""The job layer: durable jobs over a transactional store (CouchDB's couch_jobs in Python).

    from smoosh.store import open_store
    from smoosh.jobs import Jobs
    jobs = Jobs(open_store("sqlite:var/jobs.db"))
    jobs.set_type_timeout("smoosh:node1", 30)
    jobs.add("smoosh:node1", "/data/a.db", {"channel": "ratio_dbs"})
    job, data = jobs.accept("smoosh:node1", timeout=5)
    jobs.finish(job, {**data, "result": "ok"})
"""

from __future__ import annotations

from smoosh.jobs.accept import AcceptInterrupt
from smoosh.jobs.batching import BatchPolicy
from smoosh.jobs.errors import EncodingError, JobHalted, JobsError, NotFound, NoTypeTimeout
from smoosh.jobs.layer import JobInfo, Jobs
from smoosh.jobs.model import Job
from smoosh.jobs.subscription import Subscription

__all__ = [
    "Jobs",
    "Job",
    "JobInfo",
    "AcceptInterrupt",
    "Subscription",
    "BatchPolicy",
    "JobsError",
    "NotFound",
    "JobHalted",
    "NoTypeTimeout",
    "EncodingError",
]
