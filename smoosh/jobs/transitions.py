"""The state changes of one job, each the body of one transaction.

Every function here reads and writes through the transaction it is given and nothing else:
no validation of the caller's arguments (the API in :mod:`smoosh.jobs.layer` checks and
encodes them first), no retries, no threads. A body may run more than once (a conflict
retries the whole transaction), so each is safe to repeat. The row-level reads and writes
they are made of are :mod:`smoosh.jobs.model` and :mod:`smoosh.jobs.pending`.
"""

from __future__ import annotations

import random
from typing import Any

from smoosh.store.base import Transaction
from smoosh.jobs import model, pending
from smoosh.jobs.codec import NONE_ENC, enc_bytes
from smoosh.jobs.errors import JobHalted, NotFound, NoTypeTimeout
from smoosh.jobs.model import FINISHED_STATE, PENDING_STATE, RUNNING_STATE, Job, JobRow, Keys
from smoosh.jobs.encoding import JobType


def add(tr: Transaction, keys: Keys, job_type: JobType, job_id: str, stime: int, data: bytes) -> None:
    """Add a job pending at ``stime``, or re-add an existing one (see :meth:`Jobs.add`).

    Raises:
        NoTypeTimeout: the type has no timeout.
    """
    if tr.snapshot.get(keys.activity_timeout(job_type)) is None:
        raise NoTypeTimeout(job_type)
    key = keys.data(job_type, job_id)
    raw = tr.get(key)
    if raw is None:
        model.write_pending(tr, keys, job_type, job_id, stime, enc_bytes(data), key)
    else:
        resubmit_row(tr, keys, job_type, job_id, model.decode_row(raw), stime, data, key)


def add_claimed(tr: Transaction, keys: Keys, job_type: JobType, job_id: str, data: bytes, rng: random.Random) -> Job:
    """Add a job already running for its adder (see :meth:`Jobs.add_claimed`).

    Raises:
        NoTypeTimeout: the type has no timeout.
        JobHalted: the job is running already (someone else's run).
    """
    if tr.snapshot.get(keys.activity_timeout(job_type)) is None:
        raise NoTypeTimeout(job_type)
    key = keys.data(job_type, job_id)
    raw = tr.get(key)
    if raw is not None:
        row = model.decode_row(raw)
        if row.state == RUNNING_STATE:
            raise JobHalted(f"job {job_type} {job_id} is running already", type=job_type, job_id=job_id)
        if row.state == PENDING_STATE:
            pending.remove(tr, keys, job_type, row.scheduled_time, job_id)
    return start_run(tr, keys, job_type, job_id, 0, enc_bytes(data), rng, key)


def start_run(
    tr: Transaction, keys: Keys, job_type: JobType, job_id: str, stime: int, data_enc: bytes, rng: random.Random,
    key: bytes | None = None,
) -> Job:
    """Mark a job running under a new lock, with its activity entry; the caller took it off the queue.

    Parameters:
        data_enc: the job's data as an encoded bytes element (as a row holds it).
        key: the job's DATA key, when the caller has built it already.

    Returns:
        The handle of the new run.
    """
    lock = "%032x" % rng.getrandbits(128)  # uuid4-like hex, as couch_jobs' 32 hex chars
    user_version = model.next_user_version(tr)
    model.set_row_running(tr, key or keys.data(job_type, job_id), lock, stime, False, data_enc, user_version)
    model.write_activity(tr, keys, job_type, job_id, None, data_enc, user_version)
    return Job(job_type, job_id, lock, False)


def resubmit_row(
    tr: Transaction, keys: Keys, job_type: JobType, job_id: str, row: JobRow, stime: int | None, data: bytes | None,
    key: bytes | None = None,
) -> bool:
    """Re-enqueue an existing row; None for ``stime``/``data`` keeps the old value.

    Returns:
        Whether the job is (now) flagged as resubmitted while running.
    """
    key = key or keys.data(job_type, job_id)
    new_stime = row.scheduled_time if stime is None else stime
    new_data_enc = row.data_enc if data is None else enc_bytes(data)
    state = row.state
    if state == FINISHED_STATE:
        model.write_pending(tr, keys, job_type, job_id, new_stime, new_data_enc, key)
        return False
    if state == PENDING_STATE:
        if new_stime == row.scheduled_time:
            if new_data_enc != row.data_enc:
                model.set_row(tr, key, row.seq_enc, None, new_stime, False, new_data_enc)
            # Nothing changed: no writes at all, so the transaction stays read-only.
            return False
        pending.remove(tr, keys, job_type, row.scheduled_time, job_id)
        model.write_pending(tr, keys, job_type, job_id, new_stime, new_data_enc, key)
        return False
    # Running: the worker keeps its run and its data; finish() re-enqueues it.
    model.set_row(tr, key, row.seq_enc, row.lock, new_stime, True, row.data_enc)
    return True


def remove(tr: Transaction, keys: Keys, job_type: JobType, job_id: str) -> None:
    """Delete a job: its subscribers hear "not_found", a running worker gets JobHalted at its next write.

    Raises:
        NotFound: no such job.
    """
    key = keys.data(job_type, job_id)
    raw = tr.get(key)
    if raw is None:
        raise NotFound(f"job {job_type} {job_id} not found", type=job_type, job_id=job_id)
    row = model.decode_row(raw)
    if row.state == PENDING_STATE:
        pending.remove(tr, keys, job_type, row.scheduled_time, job_id)
    model.clear_activity(tr, keys, job_type, row.seq_enc)
    tr.clear(key)
    model.bump_activity_watch(tr, keys, job_type)


def update(tr: Transaction, keys: Keys, job: Job, data: bytes | None) -> Job:
    """Heartbeat a running job, replacing its data unless ``data`` is None.

    Raises:
        JobHalted: the job was removed or re-enqueued since it was accepted.
    """
    key, row = row_or_halt(tr, keys, job)
    new_data_enc = row.data_enc if data is None else enc_bytes(data)
    user_version = model.next_user_version(tr)
    model.set_row_running(tr, key, job.lock, row.scheduled_time, row.resubmit, new_data_enc, user_version)
    model.write_activity(tr, keys, job.type, job.id, row.seq_enc, new_data_enc, user_version)
    return Job(job.type, job.id, job.lock, row.resubmit)


def finish(tr: Transaction, keys: Keys, job: Job, data: bytes | None) -> None:
    """End a run: the job is finished, or pending again if it was resubmitted while running.

    Raises:
        JobHalted: the job was removed or re-enqueued since it was accepted.
    """
    key, row = row_or_halt(tr, keys, job)
    new_data_enc = row.data_enc if data is None else enc_bytes(data)
    if row.resubmit:
        model.write_pending(tr, keys, job.type, job.id, row.scheduled_time, new_data_enc, key)
    else:
        model.set_row(tr, key, NONE_ENC, None, row.scheduled_time, False, new_data_enc)
    model.clear_activity(tr, keys, job.type, row.seq_enc)
    model.bump_activity_watch(tr, keys, job.type)


def finish_and_remove(tr: Transaction, keys: Keys, job: Job) -> bool:
    """End a run and delete its job (see :meth:`Jobs.finish_and_remove`); whether it was deleted.

    Raises:
        JobHalted: the job was removed or re-enqueued since it was accepted.
    """
    key, row = row_or_halt(tr, keys, job)
    if row.resubmit:
        # Asked to run again while it ran: pending again with its data, as finish() leaves it.
        model.write_pending(tr, keys, job.type, job.id, row.scheduled_time, row.data_enc, key)
    else:
        tr.clear(key)
    model.clear_activity(tr, keys, job.type, row.seq_enc)
    model.bump_activity_watch(tr, keys, job.type)
    return not row.resubmit


def resubmit(tr: Transaction, keys: Keys, job: Job, stime: int | None) -> Job:
    """Run a job again, keeping its data; ``stime`` None keeps its time.

    Raises:
        NotFound: the job no longer exists.
    """
    key = keys.data(job.type, job.id)
    raw = tr.get(key)
    if raw is None:
        raise NotFound(f"job {job.type} {job.id} not found", type=job.type, job_id=job.id)
    flagged = resubmit_row(tr, keys, job.type, job.id, model.decode_row(raw), stime, None, key)
    return Job(job.type, job.id, job.lock, flagged)


def row_or_halt(tr: Transaction, keys: Keys, job: Job) -> tuple[bytes, JobRow]:
    """The DATA key and row of ``job``'s run, the row read with a conflict range.

    Raises:
        JobHalted: the job was removed, or re-enqueued (its lock changed) since it was accepted.
    """
    # Reading the row (not as a snapshot) is what makes a worker's writes conflict-safe:
    # a re-enqueue or remove that commits first makes this transaction fail and retry,
    # and the retry sees the changed lock.
    key = keys.data(job.type, job.id)
    raw = tr.get(key)
    if raw is None:
        raise JobHalted(f"job {job.type} {job.id} was removed", type=job.type, job_id=job.id)
    row = model.decode_row(raw)
    if row.lock != job.lock:
        raise JobHalted(f"job {job.type} {job.id} was re-enqueued", type=job.type, job_id=job.id)
    return key, row
