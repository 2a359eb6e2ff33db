"""The upstream couch_jobs suite (couch_jobs_tests.erl), ported: adding, reading, accepting,
updating, finishing, resubmitting and removing jobs. Subscriptions, monitors and threads have
files of their own. Every test runs on the memory and the SQLite store."""

from __future__ import annotations

import threading
import uuid
from typing import Any, Callable

import pytest

from helpers.clocks import FakeClock
from jobs_testlib import J1, J2, T1, T2

from smoosh.jobs import EncodingError, Job, JobHalted, Jobs, NotFound, NoTypeTimeout
from smoosh.store import tuples


def run_in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            box["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


def result_of(thread: threading.Thread, box: dict[str, Any], timeout_s: float = 15.0) -> Any:
    """The thread's result; its exception re-raised; a clear failure if it is still running."""
    thread.join(timeout_s)
    if "error" in box:
        raise box["error"]
    assert "result" in box, f"still running after {timeout_s} s"
    return box["result"]


# 1. add_remove_pending
def test_added_jobs_are_pending_and_removable_in_own_or_caller_transaction(jobs: Jobs) -> None:
    jobs.add(T1, J1, {})
    assert jobs.get_job(T1, J1).state == "pending"
    assert jobs.get_job(T1, J1).data == {}
    jobs.remove(T1, J1)

    data = {"x": 42}
    jobs.transact(lambda tr: jobs.add(T2, J2, data, tx=tr))
    info = jobs.get_job(T2, J2)
    assert (info.state, info.data) == ("pending", data)
    jobs.remove(T2, J2)
    with pytest.raises(NotFound):
        jobs.get_job(T2, J2)


# 2. add_remove_errors
def test_add_and_remove_report_errors(jobs: Jobs) -> None:
    with pytest.raises(NotFound):
        jobs.remove("t999", "x")
    with pytest.raises(EncodingError):
        jobs.add(T1, J1, {1: 2})  # type: ignore[dict-item]
    with pytest.raises(NoTypeTimeout):
        jobs.add("x", J1, {})
    jobs.add(T1, J1, {})
    jobs.add(T1, J1, {})  # adding twice is fine
    jobs.remove(T1, J1)


@pytest.mark.parametrize(
    "bad",
    [
        [],
        "text",
        {1: "int key"},
        {"nested": {2: "int key inside"}},
        {"obj": object()},
        {"set": {1, 2}},
        {"huge": 2**70},
        {"big": "x" * 70_000},
    ],
)
def test_bad_data_is_refused_before_any_write(jobs: Jobs, bad: Any) -> None:
    with pytest.raises(EncodingError):
        jobs.add(T1, J1, bad)
    with pytest.raises(NotFound):
        jobs.get_job(T1, J1)
    assert jobs.pending_count(T1) == 0


def test_bad_ids_and_types_are_refused(jobs: Jobs) -> None:
    with pytest.raises(EncodingError):
        jobs.add(T1, 42, {})  # type: ignore[arg-type]
    with pytest.raises(EncodingError):
        jobs.add(T1, "", {})
    with pytest.raises(EncodingError):
        jobs.add(T1, "x" * 9000, {})
    with pytest.raises(EncodingError):
        jobs.add(["list", "type"], J1, {})
    with pytest.raises(EncodingError):
        jobs.set_type_timeout(("t", 1.5), 3)


def test_data_round_trips_floats_infinity_lists_and_bytes(jobs: Jobs) -> None:
    data = {"priority": float("inf"), "progress": 0.25, "list": [1, "a", None, True], "raw": b"\x00\xff",
            "nested": {"k": [{"deep": -1}]}}
    jobs.add(T1, J1, data)
    assert jobs.get_job_data(T1, J1) == data


# 3. add_with_the_same_scheduled_time
def test_re_adding_identical_pending_job_writes_nothing(jobs: Jobs) -> None:
    jobs.add(T1, J1, {"a": 1}, 5)

    def body(tr: Any) -> bool:
        jobs.add(T1, J1, {"a": 1}, 5, tx=tr)
        return tr.has_writes

    assert jobs.transact(body) is False


# 4. get_job_data_and_state
def test_job_data_and_state_readable_until_removed(jobs: Jobs) -> None:
    data = {"x": 42}
    jobs.add(T1, J1, data)
    assert jobs.get_job_data(T1, J1) == data
    assert jobs.get_job_state(T1, J1) == "pending"
    jobs.remove(T1, J1)
    with pytest.raises(NotFound):
        jobs.get_job_data(T1, J1)
    with pytest.raises(NotFound):
        jobs.get_job_state(T1, J1)


# 5. resubmit_as_job_creator
def test_adding_existing_job_resubmits_it_by_state(jobs: Jobs) -> None:
    data = {"x": 42}
    jobs.add(T1, J1, data, 15)
    jobs.add(T1, J1, data, 16)  # pending: only the time changes
    info = jobs.get_job(T1, J1)
    assert (info.state, info.scheduled_time) == ("pending", 16)

    job1, got = jobs.accept(T1)
    assert got == data
    jobs.add(T1, J1, data, 17)  # running: flagged to run again
    info = jobs.get_job(T1, J1)
    assert (info.state, info.scheduled_time, info.resubmit) == ("running", 17, True)

    jobs.finish(job1)  # flagged: back to pending
    info = jobs.get_job(T1, J1)
    assert (info.state, info.scheduled_time) == ("pending", 17)

    job2, _ = jobs.accept(T1)
    jobs.finish(job2)
    info = jobs.get_job(T1, J1)
    assert (info.state, info.scheduled_time) == ("finished", 17)
    jobs.add(T1, J1, data, 18)  # finished: re-enqueued
    info = jobs.get_job(T1, J1)
    assert (info.state, info.scheduled_time) == ("pending", 18)


# 17. basic_accept_and_finish
def test_accept_runs_job_and_finish_stores_data(jobs: Jobs) -> None:
    jobs.add(T1, J1, {})
    job, data = jobs.accept(T1)
    assert data == {}
    assert isinstance(job, Job) and (job.type, job.id) == (T1, J1)
    assert jobs.get_job_state(T1, J1) == "running"
    with pytest.raises(EncodingError):
        jobs.transact(lambda tr: jobs.finish(job, {1: 1}, tx=tr))  # type: ignore[dict-item]
    assert jobs.get_job_state(T1, J1) == "running"
    jobs.transact(lambda tr: jobs.finish(job, {"x": 42}, tx=tr))
    info = jobs.get_job(T1, J1)
    assert (info.state, info.data) == ("finished", {"x": 42})
    assert jobs.get_active_job_ids(T1) == []


def test_accept_stamp_is_merged_into_the_data_by_the_accepts_own_commit(jobs: Jobs) -> None:
    jobs.add(T1, J1, {"a": 1, "holder": None})
    calls: list[int] = []

    def stamp() -> dict[str, Any]:
        calls.append(1)
        return {"holder": "worker-1", "heartbeat_at": 12.5}

    job, data = jobs.accept(T1, stamp=stamp)
    assert data == {"a": 1, "holder": "worker-1", "heartbeat_at": 12.5}
    # Written with the running state: a reader sees the stamp as soon as it sees the job taken.
    info = jobs.get_job(T1, J1)
    assert (info.state, info.data) == ("running", data)
    assert calls == [1]
    jobs.finish(job)
    assert jobs.get_job(T1, J1).data == data
    # Without a stamp, the data is the job's as added.
    jobs.add(T2, J2, {"b": 2})
    assert jobs.accept(T2)[1] == {"b": 2}


# 18. accept_blocking
def test_accept_blocks_until_a_job_is_added(jobs: Jobs) -> None:
    thread, box = run_in_thread(lambda: jobs.accept(T1, timeout=30))
    jobs.add(T1, J1, {})
    assert result_of(thread, box)[0].id == J1

    thread, box = run_in_thread(lambda: jobs.accept(T1, timeout=30))
    thread.join(0.5)
    assert thread.is_alive()  # nothing pending: still waiting
    jobs.add(T1, J2, {})
    assert result_of(thread, box)[0].id == J2


def test_accept_times_out_with_not_found(jobs: Jobs) -> None:
    with pytest.raises(NotFound):
        jobs.accept(T1, timeout=0)
    with pytest.raises(NotFound):
        jobs.accept(T1, timeout=0.2)


def test_close_wakes_blocked_accept(make_jobs: Callable[..., Jobs]) -> None:
    jobs = make_jobs()
    jobs.set_type_timeout(T1, 30)
    thread, box = run_in_thread(lambda: jobs.accept(T1))
    thread.join(0.3)
    assert thread.is_alive()
    jobs.close()
    thread.join(5)
    assert not thread.is_alive()
    assert isinstance(box["error"], NotFound)


# 19. job_processor_update
def test_update_heartbeats_and_replaces_or_keeps_data(jobs: Jobs) -> None:
    jobs.add(T1, J1, {})
    job, _ = jobs.accept(T1)
    job = jobs.transact(lambda tr: jobs.update(job, {"x": 1}, tx=tr))
    assert isinstance(job, Job)
    assert jobs.get_job_data(T1, J1) == {"x": 1}
    job = jobs.transact(lambda tr: jobs.update(job, tx=tr))
    assert jobs.get_job_data(T1, J1) == {"x": 1}  # no data: keep the old
    job = jobs.transact(lambda tr: jobs.update(job, {"x": 2}, tx=tr))
    with pytest.raises(EncodingError):
        jobs.transact(lambda tr: jobs.update(job, {1: 1}, tx=tr))  # type: ignore[dict-item]
    info = jobs.get_job(T1, J1)
    assert (info.state, info.data) == ("running", {"x": 2})
    assert jobs.get_active_job_ids(T1) == [J1]  # one activity entry, however many updates
    jobs.finish(job, {"x": 3})
    info = jobs.get_job(T1, J1)
    assert (info.state, info.data) == ("finished", {"x": 3})


# 20. resubmit_enqueues_job
def test_resubmit_while_running_requeues_on_finish(jobs: Jobs) -> None:
    jobs.add(T1, J1, {})
    job1, _ = jobs.accept(T1)
    flagged = jobs.resubmit(job1, 6)
    assert flagged.resubmitted
    jobs.finish(job1)
    info = jobs.get_job(T1, J1)
    assert (info.state, info.scheduled_time) == ("pending", 6)
    job2, _ = jobs.accept(T1)
    jobs.finish(job2)
    assert jobs.get_job_state(T1, J1) == "finished"


def test_update_reports_resubmitted_flag(jobs: Jobs) -> None:
    jobs.add(T1, J1, {})
    job, _ = jobs.accept(T1)
    assert not jobs.update(job).resubmitted
    jobs.add(T1, J1, {"ignored": True})
    assert jobs.update(job).resubmitted


# 21. resubmit_finished_updates_job_data (our resubmit has no data: it keeps it — quirk fix)
def test_resubmit_of_finished_job_requeues_it_with_its_data(jobs: Jobs) -> None:
    jobs.add(T1, J1, {"a": 1})
    job, _ = jobs.accept(T1)
    jobs.finish(job, {"a": 2})
    again = jobs.resubmit(job, 3)
    assert not again.resubmitted
    info = jobs.get_job(T1, J1)
    assert (info.state, info.scheduled_time, info.data) == ("pending", 3, {"a": 2})


# 22. resubmit_running_does_not_update_job_data
def test_resubmit_of_running_job_keeps_its_data(jobs: Jobs) -> None:
    jobs.add(T1, J1, {"a": 1})
    job, _ = jobs.accept(T1)
    jobs.resubmit(job, 5)
    info = jobs.get_job(T1, J1)
    assert (info.state, info.data, info.resubmit) == ("running", {"a": 1}, True)


# Quirk fix: resubmit of a pending or finished job keeps its data (upstream crashed on it).
def test_resubmit_of_pending_job_moves_time_and_keeps_data(jobs: Jobs) -> None:
    jobs.add(T1, J1, {"keep": "me"}, 10)
    job, _ = jobs.accept(T1, max_sched_time=10)
    jobs.finish(job)
    jobs.resubmit(job, 20)  # finished -> pending at 20
    jobs.resubmit(job, 30)  # pending -> pending at 30
    info = jobs.get_job(T1, J1)
    assert (info.state, info.scheduled_time, info.data) == ("pending", 30, {"keep": "me"})
    assert jobs.pending_count(T1, max_sched_time=25) == 0
    assert jobs.pending_count(T1, max_sched_time=30) == 1


# Quirk fix: resubmit without a time keeps the old time (upstream moved it to 2^36).
def test_resubmit_without_time_keeps_old_time(jobs: Jobs) -> None:
    jobs.add(T1, J1, {}, 12)
    job, _ = jobs.accept(T1, max_sched_time=12)
    jobs.resubmit(job)
    jobs.finish(job)
    info = jobs.get_job(T1, J1)
    assert (info.state, info.scheduled_time) == ("pending", 12)


def test_resubmit_of_removed_job_is_not_found(jobs: Jobs) -> None:
    jobs.add(T1, J1, {})
    job, _ = jobs.accept(T1)
    jobs.remove(T1, J1)
    with pytest.raises(NotFound):
        jobs.resubmit(job)


# 23. resubmit_custom_schedtime
def test_resubmit_with_custom_time(jobs: Jobs) -> None:
    jobs.add(T1, J1, {}, 7)
    job, _ = jobs.accept(T1)
    jobs.resubmit(job, 9)
    jobs.finish(job)
    info = jobs.get_job(T1, J1)
    assert (info.state, info.scheduled_time) == ("pending", 9)


# 24. add_pending_updates_job_data
def test_add_on_pending_job_replaces_data(jobs: Jobs) -> None:
    jobs.add(T1, J1, {"a": 1})
    jobs.add(T1, J1, {"a": 2})
    assert jobs.get_job_data(T1, J1) == {"a": 2}
    jobs.add(T1, J1, {"a": 3}, 5)  # new time and data together
    info = jobs.get_job(T1, J1)
    assert (info.scheduled_time, info.data) == (5, {"a": 3})
    assert jobs.pending_count(T1, max_sched_time=10) == 1


# 25. add_finished_updates_job_data
def test_add_on_finished_job_replaces_data_and_requeues(jobs: Jobs) -> None:
    jobs.add(T1, J1, {"a": 1})
    job, _ = jobs.accept(T1)
    jobs.finish(job)
    jobs.add(T1, J1, {"a": 2})
    info = jobs.get_job(T1, J1)
    assert (info.state, info.data) == ("pending", {"a": 2})


# 26. add_running_does_not_update_job_data
def test_add_on_running_job_keeps_data(jobs: Jobs) -> None:
    jobs.add(T1, J1, {"a": 1})
    job, _ = jobs.accept(T1)
    jobs.add(T1, J1, {"a": 2})
    info = jobs.get_job(T1, J1)
    assert (info.state, info.data) == ("running", {"a": 1})
    jobs.finish(job)
    info = jobs.get_job(T1, J1)
    assert (info.state, info.data) == ("pending", {"a": 1})


# 27. accept_max_schedtime
def test_accept_takes_only_jobs_up_to_max_sched_time(jobs: Jobs) -> None:
    jobs.add(T1, J1, {}, 5000)
    jobs.add(T1, J2, {}, 3000)
    with pytest.raises(NotFound):
        jobs.accept(T1, max_sched_time=1000, timeout=0)
    job, _ = jobs.accept(T1, max_sched_time=3000)
    assert job.id == J2
    job, _ = jobs.accept(T1, max_sched_time=9000)
    assert job.id == J1


def test_float_times_are_floored(jobs: Jobs) -> None:
    jobs.add(T1, J1, {}, 7.9)
    assert jobs.get_job(T1, J1).scheduled_time == 7
    job, _ = jobs.accept(T1, max_sched_time=7.99, timeout=0)
    assert job.id == J1


def test_accept_default_max_sched_time_is_now_reread_each_try(make_jobs: Callable[..., Jobs]) -> None:
    clock = FakeClock(1000.0)
    jobs = make_jobs(clock=clock, monitors=False)
    jobs.set_type_timeout(T1, 30)
    jobs.add(T1, J1, {}, 1005)
    with pytest.raises(NotFound):
        jobs.accept(T1, timeout=0)
    assert jobs.pending_count(T1) == 0
    clock.now = 1005.5
    assert jobs.pending_count(T1) == 1
    job, _ = jobs.accept(T1, timeout=0)
    assert job.id == J1


def test_blocked_accept_wakes_when_earliest_job_becomes_due(make_jobs: Callable[..., Jobs]) -> None:
    clock = FakeClock(1000.95)
    jobs = make_jobs(clock=clock, monitors=False)
    jobs.set_type_timeout(T1, 30)
    jobs.add(T1, J1, {}, 1001)
    thread, box = run_in_thread(lambda: jobs.accept(T1, timeout=5))
    thread.join(0.3)
    # Not due yet: accept re-checks no sooner than every 100 ms (nothing was enqueued, so the
    # watch never fires) and keeps waiting.
    assert thread.is_alive()
    clock.now = 1001.0
    thread.join(5)
    assert box["result"][0].id == J1


# 28. accept_no_schedule
def test_accept_no_schedule_takes_every_random_id_job(jobs: Jobs) -> None:
    ids = [uuid.uuid4().hex for _ in range(25)]
    for job_id in ids:
        jobs.add(T1, job_id, {})
    with pytest.raises(ValueError):
        jobs.accept(T1, no_schedule=True, max_sched_time=1)
    accepted = [jobs.accept(T1, no_schedule=True, timeout=1)[0].id for _ in ids]
    assert sorted(accepted) == sorted(ids)
    with pytest.raises(NotFound):
        jobs.accept(T1, no_schedule=True, timeout=0)


def test_accept_no_schedule_ignores_scheduled_jobs(jobs: Jobs) -> None:
    jobs.add(T1, J1, {}, 10)
    with pytest.raises(NotFound):
        jobs.accept(T1, no_schedule=True, max_sched_time=0, timeout=0)


# 34. remove_running_job
def test_removed_running_job_halts_its_worker(jobs: Jobs) -> None:
    jobs.add(T1, J1, {})
    job, _ = jobs.accept(T1)
    jobs.remove(T1, J1)
    with pytest.raises(NotFound):
        jobs.remove(T1, J1)
    with pytest.raises(JobHalted):
        jobs.update(job)
    with pytest.raises(JobHalted):
        jobs.finish(job)
    assert jobs.get_active_job_ids(T1) == []


# 35. check_get_jobs
def test_list_jobs_lists_every_type_with_states(jobs: Jobs) -> None:
    jobs.add(T1, J1, {})
    jobs.add(T2, J2, {})
    assert sorted(jobs.list_jobs(), key=repr) == sorted([(T1, J1, "pending", {}), (T2, J2, "pending", {})], key=repr)
    jobs.accept(T1)
    assert sorted(jobs.list_jobs(), key=repr) == sorted([(T1, J1, "running", {}), (T2, J2, "pending", {})], key=repr)
    assert jobs.list_jobs(T2) == [(T2, J2, "pending", {})]


# 36. use_fabric_transaction_object: the caller's writes and the job change commit together.
def _app_key(prefix: bytes, name: str) -> bytes:
    """A caller's own document, beside the layer's keys under the test's prefix (on a cluster a
    test writes nowhere else): a string element, which no section of the layer uses."""
    return tuples.pack(("app", name), prefix)


def test_transact_composes_caller_writes_with_job_changes(jobs: Jobs, store: Any, prefix: bytes) -> None:
    jobs.add(T1, J1, {})
    job, _ = jobs.accept(T1)
    doc1, doc2 = _app_key(prefix, "doc1"), _app_key(prefix, "doc2")

    def body(tr: Any) -> None:
        assert jobs.get_job_data(T1, J1, tx=tr) == {}
        tr.set(doc1, b"{}")
        tr.set(doc2, b"{}")
        jobs.finish(job, {"d": 1}, tx=tr)

    jobs.transact(body)
    assert store.transact(lambda tr: (tr.get(doc1), tr.get(doc2))) == (b"{}", b"{}")
    assert jobs.get_job(T1, J1).data == {"d": 1}
    jobs.remove(T1, J1)
    store.transact(lambda tr: tr.clear_range_startswith(tuples.pack(("app",), prefix)))


def test_failed_caller_transaction_rolls_back_job_change(jobs: Jobs, store: Any, prefix: bytes) -> None:
    jobs.add(T1, J1, {})
    job, _ = jobs.accept(T1)
    doc = _app_key(prefix, "doc")

    def body(tr: Any) -> None:
        tr.set(doc, b"{}")
        jobs.finish(job, {"d": 1}, tx=tr)
        raise RuntimeError("the caller's own step failed")

    with pytest.raises(RuntimeError):
        jobs.transact(body)
    assert store.transact(lambda tr: tr.get(doc)) is None
    assert jobs.get_job_state(T1, J1) == "running"


def test_two_workers_never_get_the_same_job(jobs: Jobs) -> None:
    for i in range(40):
        jobs.add(T1, f"j{i}", {})
    got: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        while True:
            try:
                job, _ = jobs.accept(T1, timeout=0)
            except NotFound:
                return
            with lock:
                got.append(job.id)
            jobs.finish(job)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(got) == sorted(f"j{i}" for i in range(40))


def test_pending_count_and_types(jobs: Jobs) -> None:
    for i in range(5):
        jobs.add(T1, f"j{i}", {}, i)
    assert jobs.pending_count(T1, max_sched_time=2) == 3
    assert jobs.pending_count(T1, max_sched_time=100, limit=4) == 4
    assert sorted(jobs.get_types(), key=repr) == sorted([T1, T2], key=repr)
    jobs.clear_type_timeout(T2)
    assert jobs.get_types() == [T1]
    assert jobs.get_type_timeout(T2) is None
    assert jobs.get_type_timeout(T1) == 2


def test_fold_jobs_visits_every_job_across_batches(jobs: Jobs, monkeypatch: pytest.MonkeyPatch) -> None:
    import smoosh.jobs.layer as layer

    monkeypatch.setattr(layer, "FOLD_BATCH_ROWS", 3)
    for i in range(10):
        jobs.add(T1, f"j{i:02}", {"i": i})
    jobs.accept(T1)
    acc = jobs.fold_jobs(T1, lambda job_id, state, data, acc: acc + [(job_id, state, data["i"])], [])
    assert [a[0] for a in acc] == [f"j{i:02}" for i in range(10)]
    assert sum(1 for a in acc if a[1] == "running") == 1


@pytest.mark.parametrize("bad", [0, -1, float("inf"), "30", True])
def test_bad_type_timeouts_raise_value_error(jobs: Jobs, bad: Any) -> None:
    with pytest.raises(ValueError):
        jobs.set_type_timeout("t5", bad)
    assert jobs.get_type_timeout("t5") is None


# smoosh's own: a run claimed by its adder, ended and deleted in one step (the daemon's worker).
def test_finish_and_remove_deletes_the_job_and_ends_its_run(jobs: Jobs) -> None:
    job = jobs.add_claimed(T1, J1, {"a": 1})
    assert jobs.get_job_state(T1, J1) == "running"
    assert jobs.finish_and_remove(job) is True
    with pytest.raises(NotFound):
        jobs.get_job(T1, J1)
    assert jobs.get_active_job_ids(T1) == []  # its activity entry went with it
    with pytest.raises(JobHalted):
        jobs.finish_and_remove(job)  # a second end of the same run: it is gone


def test_finish_and_remove_leaves_a_job_resubmitted_while_it_ran_pending(jobs: Jobs) -> None:
    jobs.add(T1, J1, {"a": 1})
    job, _ = jobs.accept(T1)
    jobs.add(T1, J1, {"ignored": True}, 7)  # asked to run again while it runs
    assert jobs.finish_and_remove(job) is False
    info = jobs.get_job(T1, J1)
    assert (info.state, info.scheduled_time, info.data) == ("pending", 7, {"a": 1})
    assert jobs.get_active_job_ids(T1) == []


def test_finish_and_remove_of_a_re_enqueued_run_is_halted_and_writes_nothing(jobs: Jobs) -> None:
    jobs.add(T1, J1, {"a": 1})
    old, _ = jobs.accept(T1)
    jobs.remove(T1, J1)
    jobs.add(T1, J1, {"a": 2})
    new, _ = jobs.accept(T1)  # another run of the job, under a new lock
    with pytest.raises(JobHalted):
        jobs.finish_and_remove(old)
    assert (jobs.get_job_state(T1, J1), jobs.get_active_job_ids(T1)) == ("running", [J1])
    assert jobs.finish_and_remove(new) is True


def test_finish_and_remove_commits_with_the_callers_writes(jobs: Jobs) -> None:
    first = jobs.add_claimed(T1, J1, {})
    second = jobs.transact(lambda tr: (jobs.finish_and_remove(first, tx=tr), jobs.add_claimed(T1, J2, {}, tx=tr))[1])
    assert jobs.get_active_job_ids(T1) == [J2] and second.id == J2
    with pytest.raises(NotFound):
        jobs.get_job(T1, J1)
