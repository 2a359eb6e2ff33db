"""The state changes of one job, each the body of one transaction.

Every function here reads and writes through the transaction it is given and nothing else:
no validation of the caller's arguments (the API in :mod:`smoosh.jobs.layer` checks and
encodes them first), no retries, no threads. A body may run more than once (a conflict
retries the whole transaction), so each is safe to repeat. The row-level reads and writes
they are made of are :mod:`smoosh.jobs.model` and :mod:`smoosh.jobs.pending`.
"""

from __future__ import annotations

import random
import uuid
from typing import Any

from smoosh.store.base import Transaction
from smoosh.jobs import model, pending
from smoosh.jobs.errors import JobHalted, NotFound, NoTypeTimeout
from smoosh.jobs.model import FINISHED_STATE, PENDING_STATE, RUNNING_STATE, Job, JobRow, Keys


def add(tr: Transaction, keys: Keys, job_type: Any, job_id: str, stime: int, data: bytes) -> None:
    """Add a job pending at ``stime``, or re-add an existing one (see :meth:`Jobs.add`).

    Raises:
        NoTypeTimeout: the type has no timeout.
    """
    if model.read_type_timeout(tr.snapshot, keys, job_type) is None:
        raise NoTypeTimeout(job_type)
    row = model.get_row(tr, keys, job_type, job_id)
    if row is None:
        model.write_pending(tr, keys, job_type, job_id, stime, data)
    else:
        resubmit_row(tr, keys, job_type, job_id, row, stime, data)


def add_claimed(tr: Transaction, keys: Keys, job_type: Any, job_id: str, data: bytes, rng: random.Random) -> Job:
    """Add a job already running for its adder (see :meth:`Jobs.add_claimed`).

    Raises:
        NoTypeTimeout: the type has no timeout.
        JobHalted: the job is running already (someone else's run).
    """
    if model.read_type_timeout(tr.snapshot, keys, job_type) is None:
        raise NoTypeTimeout(job_type)
    row = model.get_row(tr, keys, job_type, job_id)
    if row is not None and row.state == RUNNING_STATE:
        raise JobHalted(f"job {job_type} {job_id} is running already", type=job_type, job_id=job_id)
    if row is not None and row.state == PENDING_STATE:
        pending.remove(tr, keys, job_type, row.scheduled_time, job_id)
    return start_run(tr, keys, job_type, job_id, 0, data, rng)


def start_run(
    tr: Transaction, keys: Keys, job_type: Any, job_id: str, stime: int, data: bytes, rng: random.Random
) -> Job:
    """Mark a job running under a new lock, with its activity entry; the caller took it off the queue.

    Returns:
        The handle of the new run.
    """
    lock = uuid.UUID(int=rng.getrandbits(128)).hex
    user_version = model.next_user_version(tr)
    model.set_row_running(tr, keys, job_type, job_id, JobRow(None, lock, stime, False, data), user_version)
    model.write_activity(tr, keys, job_type, job_id, None, data, user_version)
    return Job(job_type, job_id, lock, False)


def resubmit_row(
    tr: Transaction, keys: Keys, job_type: Any, job_id: str, row: JobRow, stime: int | None, data: bytes | None
) -> bool:
    """Re-enqueue an existing row; None for ``stime``/``data`` keeps the old value.

    Returns:
        Whether the job is (now) flagged as resubmitted while running.
    """
    new_stime = row.scheduled_time if stime is None else stime
    new_data = row.data if data is None else data
    state = row.state
    if state == FINISHED_STATE:
        model.write_pending(tr, keys, job_type, job_id, new_stime, new_data)
        return False
    if state == PENDING_STATE:
        if new_stime == row.scheduled_time:
            if new_data != row.data:
                model.set_row(tr, keys, job_type, job_id, JobRow(row.seq, None, new_stime, False, new_data))
            # Nothing changed: no writes at all, so the transaction stays read-only.
            return False
        pending.remove(tr, keys, job_type, row.scheduled_time, job_id)
        model.write_pending(tr, keys, job_type, job_id, new_stime, new_data)
        return False
    # Running: the worker keeps its run and its data; finish() re-enqueues it.
    model.set_row(tr, keys, job_type, job_id, JobRow(row.seq, row.lock, new_stime, True, row.data))
    return True


def remove(tr: Transaction, keys: Keys, job_type: Any, job_id: str) -> None:
    """Delete a job: its subscribers hear "not_found", a running worker gets JobHalted at its next write.

    Raises:
        NotFound: no such job.
    """
    row = model.get_row(tr, keys, job_type, job_id)
    if row is None:
        raise NotFound(f"job {job_type} {job_id} not found", type=job_type, job_id=job_id)
    if row.state == PENDING_STATE:
        pending.remove(tr, keys, job_type, row.scheduled_time, job_id)
    model.clear_activity(tr, keys, job_type, row.seq)
    tr.clear(keys.data(job_type, job_id))
    model.bump_activity_watch(tr, keys, job_type)


def update(tr: Transaction, keys: Keys, job: Job, data: bytes | None) -> Job:
    """Heartbeat a running job, replacing its data unless ``data`` is None.

    Raises:
        JobHalted: the job was removed or re-enqueued since it was accepted.
    """
    row = row_or_halt(tr, keys, job)
    new_data = row.data if data is None else data
    user_version = model.next_user_version(tr)
    running = JobRow(None, row.lock, row.scheduled_time, row.resubmit, new_data)
    model.set_row_running(tr, keys, job.type, job.id, running, user_version)
    model.write_activity(tr, keys, job.type, job.id, row.seq, new_data, user_version)
    return Job(job.type, job.id, job.lock, row.resubmit)


def finish(tr: Transaction, keys: Keys, job: Job, data: bytes | None) -> None:
    """End a run: the job is finished, or pending again if it was resubmitted while running.

    Raises:
        JobHalted: the job was removed or re-enqueued since it was accepted.
    """
    row = row_or_halt(tr, keys, job)
    new_data = row.data if data is None else data
    if row.resubmit:
        model.write_pending(tr, keys, job.type, job.id, row.scheduled_time, new_data)
    else:
        model.write_finished(tr, keys, job.type, job.id, row.scheduled_time, new_data)
    model.clear_activity(tr, keys, job.type, row.seq)
    model.bump_activity_watch(tr, keys, job.type)


def finish_and_remove(tr: Transaction, keys: Keys, job: Job) -> bool:
    """End a run and delete its job (see :meth:`Jobs.finish_and_remove`); whether it was deleted.

    Raises:
        JobHalted: the job was removed or re-enqueued since it was accepted.
    """
    row = row_or_halt(tr, keys, job)
    if row.resubmit:
        # Asked to run again while it ran: pending again with its data, as finish() leaves it.
        model.write_pending(tr, keys, job.type, job.id, row.scheduled_time, row.data)
    else:
        tr.clear(keys.data(job.type, job.id))
    model.clear_activity(tr, keys, job.type, row.seq)
    model.bump_activity_watch(tr, keys, job.type)
    return not row.resubmit


def resubmit(tr: Transaction, keys: Keys, job: Job, stime: int | None) -> Job:
    """Run a job again, keeping its data; ``stime`` None keeps its time.

    Raises:
        NotFound: the job no longer exists.
    """
    row = model.get_row(tr, keys, job.type, job.id)
    if row is None:
        raise NotFound(f"job {job.type} {job.id} not found", type=job.type, job_id=job.id)
    flagged = resubmit_row(tr, keys, job.type, job.id, row, stime, None)
    return Job(job.type, job.id, job.lock, flagged)


def row_or_halt(tr: Transaction, keys: Keys, job: Job) -> JobRow:
    """The row of ``job``'s run, read with a conflict range.

    Raises:
        JobHalted: the job was removed, or re-enqueued (its lock changed) since it was accepted.
    """
    # Reading the row (not as a snapshot) is what makes a worker's writes conflict-safe:
    # a re-enqueue or remove that commits first makes this transaction fail and retry,
    # and the retry sees the changed lock.
    row = model.get_row(tr, keys, job.type, job.id)
    if row is None:
        raise JobHalted(f"job {job.type} {job.id} was removed", type=job.type, job_id=job.id)
    if row.lock != job.lock:
        raise JobHalted(f"job {job.type} {job.id} was re-enqueued", type=job.type, job_id=job.id)
    return row
