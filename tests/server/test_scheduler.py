"""The scheduler port over the real job layer: one job per run, run events back to the server's loop.

A real :class:`~smoosh.jobs.Jobs` over ``memory:`` and ``sqlite:``, and a real
:class:`~smoosh.loop.Loop` stepped by hand with ``run_once``. The scheduler's starter and the
job layer's notifier are real threads, so the tests wait for what they post with a bounded
wait on the number of posts (never a fixed sleep), and for the starter's store work with a
barrier submitted behind it (the starter is one FIFO thread).

Here the test is the "worker elsewhere": it accepts, updates and finishes the jobs itself.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from channels.ports import FAILED, OK, Outcome, RunEvent
from smoosh.daemon.run.scheduler import JOB_REMOVED_ERROR, JobScheduler, Run
from smoosh.jobs import Jobs, NotFound
from smoosh.loop import Loop
from smoosh.store import open_store
from smoosh.store.base import Store, Transaction
from helpers.daemon import HANG_S, wait_for

JOB_TYPE = "smoosh:test"
CHANNEL = "ratio_dbs"
T0 = 1_704_079_800.0
#: Real seconds a test waits for something asynchronous before it fails.
SETTLE_TIMEOUT_S = HANG_S  # a ceiling on a hang, never a measure of speed
#: A key outside the job layer's prefix, written beside a job's removal.
MARKER = b"test/crash-record"
SCHEDULER_LOGGER = "smoosh.daemon.run.scheduler"


# -- fixtures -------------------------------------------------------------------------------------


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    st = open_store("memory:") if request.param == "memory" else open_store(f"sqlite:{tmp_path / 'jobs.db'}")
    yield st
    st.close()


@pytest.fixture
def jobs(store: Store) -> Iterator[Jobs]:
    layer = Jobs(store, max_jitter_s=0.05)
    layer.set_type_timeout(JOB_TYPE, 30)
    yield layer
    layer.close()


class Harness:
    """A scheduler whose events go through a real loop into a recording ``deliver``."""

    def __init__(self, jobs: Jobs, jobs_layer: Any = None) -> None:
        self.jobs = jobs
        self.loop = Loop("test-server-loop", clock=lambda: T0)
        self.delivered: list[tuple[str, RunEvent]] = []
        #: ``key -> write`` that ``deliver`` returns for the key's ended event.
        self.writes: dict[str, Callable[[Transaction], None]] = {}
        #: ``recheck(channel, key)``; 5.0 for every key unless replaced.
        self.recheck: Callable[[str, str], float] = lambda channel, key: 5.0
        self.recheck_threads: list[str] = []
        self._cond = threading.Condition()
        self._posts = 0
        self._holding = False
        self._held: list[Callable[[], None]] = []
        self._me = threading.current_thread()
        self.sched = JobScheduler(
            jobs_layer or jobs, JOB_TYPE, recheck=self._recheck, post=self._post, deliver=self._deliver,
            clock=lambda: T0, rng=random.Random(7),
        )

    # -- the scheduler's callbacks ---------------------------------------------------------

    def _recheck(self, channel: str, key: str) -> float:
        self.recheck_threads.append(threading.current_thread().name)
        return self.recheck(channel, key)

    def _post(self, fn: Callable[[], None]) -> None:
        with self._cond:
            if self._holding and threading.current_thread() is not self._me:
                self._held.append(fn)
            else:
                self.loop.post(fn)
            self._posts += 1
            self._cond.notify_all()

    def _deliver(self, channel: str, event: RunEvent) -> Callable[[Transaction], None] | None:
        self.delivered.append((channel, event))
        return self.writes.pop(event.key, None) if event.kind == "ended" else None

    # -- waiting -------------------------------------------------------------------------------

    def posts(self) -> int:
        with self._cond:
            return self._posts

    def wait_posts(self, count: int, what: str = "posts") -> None:
        """Wait (bounded) until ``count`` messages were posted in all."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._posts >= count, SETTLE_TIMEOUT_S):
                raise AssertionError(f"timed out waiting for {what}: {self._posts} post(s), wanted {count}")

    def settle(self, predicate: Callable[[], bool], what: str = "condition") -> None:
        """Run the loop until ``predicate()`` holds, waiting for each next post (bounded)."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while True:
            seen = self.posts()
            self.loop.run_once(T0)
            if predicate():
                return
            remaining = deadline - time.monotonic()

            def posted(seen: int = seen) -> bool:
                return self._posts != seen

            with self._cond:
                if remaining <= 0 or not self._cond.wait_for(posted, remaining):
                    raise AssertionError(f"timed out waiting for {what}: delivered={self.delivered}")

    def starter_idle(self) -> None:
        """Wait until the starter has done everything submitted to it so far."""
        done = threading.Event()
        self.sched.background(done.set)
        assert done.wait(SETTLE_TIMEOUT_S), "the starter did not get through its work"

    def hold_posts_from_other_threads(self) -> None:
        """Keep what the starter and the notifier post aside (to order it against direct reports)."""
        with self._cond:
            self._holding = True

    def release_posts(self) -> None:
        with self._cond:
            self._holding = False
            held, self._held = self._held, []
        for fn in held:
            self.loop.post(fn)

    # -- readers -------------------------------------------------------------------------------

    def events(self, key: str | None = None) -> list[RunEvent]:
        return [event for _, event in self.delivered if key is None or event.key == key]

    def kinds(self, key: str | None = None) -> list[str]:
        return [event.kind for event in self.events(key)]

    def wait_kinds(self, key: str, kinds: list[str]) -> None:
        self.settle(lambda: self.kinds(key) == kinds, f"events {kinds} of {key!r}")

    # -- the worker elsewhere ------------------------------------------------------------------

    def accept(self) -> tuple[Any, dict[str, Any]]:
        """A worker takes the next pending job (waiting, bounded, for the starter to add it)."""
        return self.jobs.accept(JOB_TYPE, timeout=SETTLE_TIMEOUT_S)

    def run(self, key: str) -> Run:
        """The run of ``key`` the scheduler follows (it must follow one)."""
        run = self.sched.run_of(key)
        assert run is not None, f"no run of {key!r} is followed"
        return run

    def job(self, key: str) -> Any:
        try:
            return self.jobs.get_job(JOB_TYPE, key)
        except NotFound:
            return None


@pytest.fixture
def make_scheduler(jobs: Jobs) -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def make(jobs_layer: Any = None) -> Harness:
        h = Harness(jobs, jobs_layer)
        made.append(h)
        return h

    yield make
    for h in made:
        h.sched.close(SETTLE_TIMEOUT_S)


class Delegating:
    """The real job layer, with some calls replaced or recorded by a subclass."""

    def __init__(self, jobs: Jobs) -> None:
        self._jobs = jobs
        self.calls: list[str] = []
        self.remove_txs: list[Transaction | None] = []
        self.add_txs: list[Transaction | None] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._jobs, name)
        if not callable(attr):
            return attr

        def recorded(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            if name == "remove":
                self.remove_txs.append(kwargs.get("tx"))
            if name == "add":
                self.add_txs.append(kwargs.get("tx"))
            return attr(*args, **kwargs)

        return recorded


def finish(h: Harness, job: Any, data: dict[str, Any], result: str | None = "ok", **outcome: Any) -> None:
    """The worker finishes ``job`` (``result`` None: with no result at all)."""
    extra = {} if result is None else {"result": result}
    h.jobs.finish(job, {**data, **extra, **outcome})


# -- starting: the re-check and the job -----------------------------------------------------------


def test_job_data_names_channel_key_priority_progress_and_run(make_scheduler: Callable[..., Harness]) -> None:
    h = make_scheduler()
    h.recheck = lambda channel, key: 7.5
    token = h.sched.submit(CHANNEL, "/db/a", 5.0)
    h.starter_idle()
    info = h.job("/db/a")
    assert info.data == {"channel": CHANNEL, "key": "/db/a", "priority": 7.5, "progress": 0.0, "run": token}
    assert info.state == "pending"
    # The re-check is I/O: it ran on the starter, never on the server's loop.
    assert len(h.recheck_threads) == 1 and h.recheck_threads[0].startswith("smoosh-starter")
    assert h.run("/db/a").token == token


def test_key_whose_priority_is_now_zero_is_dropped(make_scheduler: Callable[..., Harness]) -> None:
    h = make_scheduler()
    h.recheck = lambda channel, key: 0
    token = h.sched.submit(CHANNEL, "/db/done", 9.0)
    h.wait_kinds("/db/done", ["dropped"])
    assert h.delivered == [
        (CHANNEL, RunEvent("/db/done", token, "dropped", reason="its priority is now 0 (compacted or gone)", priority=0))
    ]
    h.starter_idle()
    assert h.job("/db/done") is None
    assert h.sched.run_of("/db/done") is None


def test_failing_priority_recheck_counts_as_zero(make_scheduler: Callable[..., Harness], caplog: Any) -> None:
    h = make_scheduler()

    def recheck(channel: str, key: str) -> float:
        raise OSError("cannot open")

    h.recheck = recheck
    with caplog.at_level(logging.WARNING, logger=SCHEDULER_LOGGER):
        token = h.sched.submit(CHANNEL, "/db/broken", 9.0)
        h.wait_kinds("/db/broken", ["dropped"])
    assert h.events() == [
        RunEvent("/db/broken", token, "dropped", reason="its priority is now 0 (compacted or gone)", priority=0)
    ]
    assert [r.getMessage() for r in caplog.records if r.name == SCHEDULER_LOGGER] == [
        "Re-checking the priority of '/db/broken' failed; counted as 0."
    ]
    assert "OSError: cannot open" in caplog.text
    assert h.job("/db/broken") is None


def test_key_running_in_another_channel_is_dropped(make_scheduler: Callable[..., Harness]) -> None:
    h = make_scheduler()
    data = {"channel": "slack_dbs", "key": "/db/a", "priority": 3.0, "progress": 0.0, "run": 1}
    h.jobs.add(JOB_TYPE, "/db/a", data)
    h.accept()
    token = h.sched.submit(CHANNEL, "/db/a", 5.0)
    h.wait_kinds("/db/a", ["dropped"])
    assert h.events() == [
        RunEvent("/db/a", token, "dropped", reason="it is already being compacted by channel 'slack_dbs'")
    ]
    info = h.job("/db/a")
    assert (info.state, info.data, info.resubmit) == ("running", data, False)  # untouched, not flagged
    assert h.sched.run_of("/db/a") is None


def test_error_while_adding_the_job_drops_the_key(make_scheduler: Callable[..., Harness], jobs: Jobs, caplog: Any) -> None:
    class FailingAdd(Delegating):
        def add(self, job_type: Any, job_id: str, data: dict[str, Any], *args: Any, **kwargs: Any) -> None:
            raise RuntimeError("store unavailable")

    h = make_scheduler(FailingAdd(jobs))
    with caplog.at_level(logging.WARNING, logger=SCHEDULER_LOGGER):
        token = h.sched.submit(CHANNEL, "/db/bad", 9.0)
        h.wait_kinds("/db/bad", ["dropped"])
    assert h.events() == [RunEvent("/db/bad", token, "dropped", reason="its job could not be added: store unavailable")]
    assert [r.getMessage() for r in caplog.records if r.name == SCHEDULER_LOGGER] == [
        "Could not add the job of '/db/bad': store unavailable"
    ]
    assert h.job("/db/bad") is None


def test_job_already_running_for_the_channel_is_followed_not_added_again(
    make_scheduler: Callable[..., Harness], caplog: Any
) -> None:
    # A worker still runs a job this channel started before (a race, or a restart).
    h = make_scheduler()
    data = {"channel": CHANNEL, "key": "/db/a", "priority": float("inf"), "progress": 0.3}
    h.jobs.add(JOB_TYPE, "/db/a", data)
    job, data = h.accept()
    with caplog.at_level(logging.INFO, logger=SCHEDULER_LOGGER):
        token = h.sched.submit(CHANNEL, "/db/a", float("inf"))
        h.wait_kinds("/db/a", ["running"])
    assert h.events() == [RunEvent("/db/a", token, "running")]
    assert [r.getMessage() for r in caplog.records if r.name == SCHEDULER_LOGGER] == [
        "'/db/a' is already running for channel ratio_dbs; following its job."
    ]
    assert h.job("/db/a").resubmit is False  # not flagged to run a second time
    finish(h, job, data, "ok")
    h.wait_kinds("/db/a", ["running", "ended"])
    assert h.events()[-1] == RunEvent("/db/a", token, "ended", outcome=Outcome(OK, progress=0.3))
    h.starter_idle()
    assert h.job("/db/a") is None  # it finished for good and was removed


def test_followed_job_of_an_earlier_run_is_removed_when_it_ends(make_scheduler: Callable[..., Harness]) -> None:
    # The job a previous daemon's run added names that run's token.
    h = make_scheduler()
    data = {"channel": CHANNEL, "key": "/db/a", "priority": 5.0, "progress": 0.3, "run": 999}
    h.jobs.add(JOB_TYPE, "/db/a", data)
    job, data = h.accept()
    token = h.sched.submit(CHANNEL, "/db/a", 5.0)
    assert token != 999
    h.wait_kinds("/db/a", ["running"])
    finish(h, job, data, "ok")
    h.wait_kinds("/db/a", ["running", "ended"])
    h.starter_idle()
    assert h.job("/db/a") is None


# -- following a job run by a worker elsewhere ------------------------------------------------------


def test_events_of_a_job_run_elsewhere_arrive_as_running_then_ended(make_scheduler: Callable[..., Harness]) -> None:
    h = make_scheduler()
    token = h.sched.submit(CHANNEL, "/db/a", 5.0)
    job, data = h.accept()
    assert data["run"] == token
    h.wait_kinds("/db/a", ["running"])
    assert h.run("/db/a").running_since == T0
    finish(h, job, data, "ok", size_before_bytes=8192, size_after_bytes=4096, duration_s=1.5, progress=1.0)
    h.wait_kinds("/db/a", ["running", "ended"])
    assert h.delivered[-1] == (CHANNEL, RunEvent("/db/a", token, "ended", outcome=Outcome(OK, None, 8192, 4096, 1.5, 1.0)))
    # The run has ended: it is no longer followed and its job is removed.
    assert h.sched.run_of("/db/a") is None
    h.starter_idle()
    assert h.job("/db/a") is None


@pytest.mark.parametrize(
    ("finish_data", "expected"),
    [
        ({"result": "busy", "error": "database is locked"}, Outcome("busy", "database is locked")),
        ({"result": "gone", "error": "no such file"}, Outcome("gone", "no such file")),
        ({}, Outcome(FAILED, "no outcome recorded")),
        ({"result": "exploded", "error": "?"}, Outcome(FAILED, "?")),
        ({"result": "ok", "size_before_bytes": "lots"}, Outcome(OK)),
        ({"result": "interrupted", "rotated": True}, Outcome("interrupted", rotated=True)),
    ],
    ids=["busy", "gone", "no-result", "unknown-result", "bad-size", "rotated"],
)
def test_outcome_is_decoded_from_the_finish_data(
    make_scheduler: Callable[..., Harness], finish_data: dict[str, Any], expected: Outcome
) -> None:
    h = make_scheduler()
    token = h.sched.submit(CHANNEL, "/db/a", 5.0)
    job, data = h.accept()
    h.jobs.finish(job, {**data, **finish_data})
    h.settle(lambda: "ended" in h.kinds("/db/a"), "the end")
    assert h.events()[-1] == RunEvent("/db/a", token, "ended", outcome=expected)


def test_progress_updates_arrive_as_running_events(make_scheduler: Callable[..., Harness]) -> None:
    h = make_scheduler()
    h.sched.submit(CHANNEL, "/db/a", 5.0)
    job, data = h.accept()
    for progress in (0.25, 0.5, 0.75):
        job = h.jobs.update(job, {**data, "progress": progress, "run_id": "r-1", "suspendable": True})
    h.settle(lambda: h.run("/db/a").progress == 0.75, "the last progress")
    run = h.run("/db/a")
    assert (run.run_id, run.suspendable) == ("r-1", True)
    assert set(h.kinds("/db/a")) == {"running"}


def test_job_pending_again_after_its_worker_vanished(make_scheduler: Callable[..., Harness], jobs: Jobs) -> None:
    # A worker that stops heart-beating: the activity monitor puts its job back to pending.
    jobs.set_type_timeout(JOB_TYPE, 0.1)
    h = make_scheduler()
    token = h.sched.submit(CHANNEL, "/db/a", 5.0)
    h.accept()
    h.wait_kinds("/db/a", ["running", "pending"])
    assert h.run("/db/a").running_since is None
    assert h.job("/db/a").state == "pending"
    # Another worker takes it up and finishes it. (The job layer reports states, not every
    # transition: a run that ends before its running state is seen is heard as ended only.)
    job, data = h.accept()
    h.wait_kinds("/db/a", ["running", "pending", "running"])
    finish(h, job, data, "ok")
    h.wait_kinds("/db/a", ["running", "pending", "running", "ended"])
    assert {event.run for event in h.events()} == {token}


def test_a_run_elsewhere_is_known_as_compacting_until_it_ends_and_is_settled_first(
    make_scheduler: Callable[..., Harness],
) -> None:
    h = make_scheduler()
    released: list[tuple[str, frozenset[str]]] = []
    h.sched.on_released = lambda key: released.append((key, h.sched.elsewhere))
    h.sched.submit(CHANNEL, "/db/a", 5.0)
    # From the submit: a worker's first writes come before the daemon hears it runs the job.
    assert h.sched.elsewhere == {"/db/a"}
    job, data = h.accept()
    h.wait_kinds("/db/a", ["running"])
    assert h.sched.elsewhere == {"/db/a"}
    finish(h, job, data, "ok")
    h.wait_kinds("/db/a", ["running", "ended"])
    # Settled while still counted as compacting: the watcher takes its last events as smoosh's.
    assert released == [("/db/a", frozenset({"/db/a"}))]
    assert h.sched.elsewhere == frozenset()


def test_a_dropped_run_is_released(make_scheduler: Callable[..., Harness]) -> None:
    h = make_scheduler()
    released: list[str] = []
    h.sched.on_released = released.append
    h.recheck = lambda channel, key: 0.0  # compacted or gone since it was queued
    h.sched.submit(CHANNEL, "/db/a", 5.0)
    h.wait_kinds("/db/a", ["dropped"])
    assert released == ["/db/a"] and h.sched.elsewhere == frozenset()


def test_job_pending_again_after_running_counts_as_starting(make_scheduler: Callable[..., Harness], jobs: Jobs) -> None:
    h = make_scheduler()
    h.sched.submit(CHANNEL, "/db/a", 5.0)
    job, data = h.accept()
    h.wait_kinds("/db/a", ["running"])
    # Re-adding a running job flags it; finishing then puts it back to pending (as a worker
    # that stops cleanly does), so a worker must pick it up again.
    jobs.add(JOB_TYPE, "/db/a", data)
    finish(h, job, data, "ok")
    h.wait_kinds("/db/a", ["running", "pending"])
    job, data = h.accept()
    h.wait_kinds("/db/a", ["running", "pending", "running"])
    finish(h, job, data, "ok")
    h.wait_kinds("/db/a", ["running", "pending", "running", "ended"])
    h.starter_idle()
    assert h.job("/db/a") is None


def test_removed_job_counts_as_failed(make_scheduler: Callable[..., Harness], caplog: Any) -> None:
    h = make_scheduler()
    token = h.sched.submit(CHANNEL, "/db/a", 5.0)
    h.starter_idle()
    with caplog.at_level(logging.WARNING, logger=SCHEDULER_LOGGER):
        h.jobs.remove(JOB_TYPE, "/db/a")
        h.wait_kinds("/db/a", ["ended"])
        h.starter_idle()  # its removal finds nothing to remove, quietly
    assert h.events() == [RunEvent("/db/a", token, "ended", outcome=Outcome(FAILED, JOB_REMOVED_ERROR))]
    assert JOB_REMOVED_ERROR == "job removed"
    assert h.sched.run_of("/db/a") is None
    assert caplog.records == []


def test_job_finished_before_it_was_followed_is_handled(make_scheduler: Callable[..., Harness], jobs: Jobs) -> None:
    class InstantWorker(Delegating):
        """A worker so fast that the job has finished before the scheduler subscribes."""

        def subscribe(self, job_type: Any, job_id: str, **kwargs: Any) -> Any:
            job, data = jobs.accept(job_type, timeout=0)
            jobs.finish(job, {**data, "result": "ok"})
            return jobs.subscribe(job_type, job_id, **kwargs)

    h = make_scheduler(InstantWorker(jobs))
    token = h.sched.submit(CHANNEL, "/db/a", 5.0)
    # No event will ever come: the subscription was born finished.
    h.wait_kinds("/db/a", ["ended"])
    assert h.events() == [RunEvent("/db/a", token, "ended", outcome=Outcome(OK))]
    h.starter_idle()
    assert h.job("/db/a") is None


def test_job_that_cannot_be_followed_counts_as_failed(make_scheduler: Callable[..., Harness], jobs: Jobs) -> None:
    class VanishingJob(Delegating):
        def subscribe(self, job_type: Any, job_id: str, **kwargs: Any) -> Any:
            raise NotFound("gone", type=job_type, job_id=job_id)

    h = make_scheduler(VanishingJob(jobs))
    token = h.sched.submit(CHANNEL, "/db/a", 5.0)
    h.wait_kinds("/db/a", ["ended"])
    assert h.events() == [RunEvent("/db/a", token, "ended", outcome=Outcome(FAILED, JOB_REMOVED_ERROR))]
    h.starter_idle()
    assert h.job("/db/a") is None  # nobody would ever follow it


# -- this process's worker reports directly ---------------------------------------------------------


def test_direct_reports_produce_the_same_events(make_scheduler: Callable[..., Harness]) -> None:
    # The job layer is slower than the worker's own report: hold what the notifier posts.
    h = make_scheduler()
    h.hold_posts_from_other_threads()
    token = h.sched.submit(CHANNEL, "/db/a", 5.0)
    job, data = h.accept()
    h.sched.run_started("/db/a", {**data, "run_id": "r-1"})
    h.loop.run_once(T0)
    # The direct report carries the priority the start re-checked (its job's data).
    assert h.events() == [RunEvent("/db/a", token, "running", priority=data["priority"])]
    assert h.run("/db/a").run_id == "r-1"
    outcome = Outcome(OK, None, 8192, 4096, 2.0, 1.0)
    finish(h, job, data, **outcome.to_data())
    h.sched.run_ended("/db/a", {**data, **outcome.to_data()}, outcome)
    h.loop.run_once(T0)
    assert h.events() == [
        RunEvent("/db/a", token, "running", priority=data["priority"]),
        RunEvent("/db/a", token, "ended", outcome=outcome),
    ]
    # What the job layer said meanwhile arrives late, about a retired run: it changes nothing.
    h.release_posts()
    h.loop.run_once(T0)
    assert h.kinds() == ["running", "ended"]
    h.starter_idle()
    assert h.job("/db/a") is None


def test_direct_report_without_a_run_token_is_ignored(make_scheduler: Callable[..., Harness]) -> None:
    h = make_scheduler()
    before = h.posts()
    h.sched.run_started("/db/a", {"channel": CHANNEL})
    h.sched.run_ended("/db/a", {"run": "not a token"}, Outcome(OK))
    assert h.posts() == before


@pytest.mark.parametrize("first", ["direct", "subscription"])
def test_end_heard_from_both_sources_is_delivered_and_retired_once(
    make_scheduler: Callable[..., Harness], jobs: Jobs, first: str
) -> None:
    recording = Delegating(jobs)
    h = make_scheduler(recording)
    token = h.sched.submit(CHANNEL, "/db/a", 5.0)
    job, data = h.accept()
    h.wait_kinds("/db/a", ["running"])  # from the subscription
    h.starter_idle()  # so the posts counted below are the subscription's alone
    h.hold_posts_from_other_threads()
    posts = h.posts()
    direct = Outcome(OK, None, 100, 10, 1.0, 1.0)
    finish(h, job, data, "ok")  # the worker finishes, then reports (as smoosh's worker does)
    if first == "direct":
        h.sched.run_ended("/db/a", {**data, **direct.to_data()}, direct)
        h.wait_posts(posts + 2, "the subscription's end")
    else:
        h.wait_posts(posts + 1, "the subscription's end")
        h.release_posts()
        h.sched.run_ended("/db/a", {**data, **direct.to_data()}, direct)
    h.release_posts()
    h.loop.run_once(T0)
    ends = [event for event in h.events() if event.kind == "ended"]
    assert ends == [RunEvent("/db/a", token, "ended", outcome=direct if first == "direct" else Outcome(OK))]
    h.starter_idle()
    assert recording.calls.count("remove") == 1
    assert h.job("/db/a") is None


def test_retire_removes_only_that_runs_job(make_scheduler: Callable[..., Harness], jobs: Jobs) -> None:
    recording = Delegating(jobs)
    h = make_scheduler(recording)
    token = h.sched.submit(CHANNEL, "/db/a", 5.0)
    job, data = h.accept()
    h.wait_kinds("/db/a", ["running"])
    h.starter_idle()  # so the post counted below is the subscription's
    h.hold_posts_from_other_threads()
    posts = h.posts()
    finish(h, job, data, "ok")
    h.wait_posts(posts + 1, "the subscription's end")
    # Meanwhile, before the end reaches the loop, someone adds the key's job again.
    other = {"channel": "slack_dbs", "key": "/db/a", "priority": 2.0, "progress": 0.0, "run": 999}
    jobs.add(JOB_TYPE, "/db/a", other)
    h.release_posts()
    h.sched.retire("/db/a", token + 1)  # a wrong token does nothing
    assert h.sched.run_of("/db/a") is not None
    h.loop.run_once(T0)
    assert h.kinds("/db/a") == ["running", "ended"]
    h.sched.retire("/db/a", token)  # already retired: nothing more
    h.starter_idle()
    info = h.job("/db/a")
    assert (info.state, info.data) == ("pending", other)
    assert recording.calls.count("remove") == 0


def test_retire_writes_also_in_the_same_transaction_as_the_removal(make_scheduler: Callable[..., Harness], jobs: Jobs) -> None:
    recording = Delegating(jobs)
    h = make_scheduler(recording)
    seen: list[tuple[Transaction, bool]] = []

    def crash_record(tr: Transaction) -> None:
        try:
            jobs.get_job(JOB_TYPE, "/db/a", tx=tr)
            removed = False
        except NotFound:
            removed = True
        seen.append((tr, removed))
        tr.set(MARKER, b"crashed once")

    h.writes["/db/a"] = crash_record
    h.sched.submit(CHANNEL, "/db/a", 5.0)
    job, data = h.accept()
    finish(h, job, data, "failed", error="crashed")
    h.settle(lambda: "ended" in h.kinds("/db/a"), "the end")
    h.starter_idle()
    assert h.job("/db/a") is None
    assert jobs.store.transact(lambda tr: tr.get(MARKER)) == b"crashed once"
    # One transaction: the write saw the removal, through the very transaction that made it.
    assert [(tr is recording.remove_txs[-1], removed) for tr, removed in seen[-1:]] == [(True, True)]


def broken_write(tr: Transaction) -> None:
    """A write to make with a removal that fails half-way (the history store full)."""
    tr.set(MARKER, b"half")
    raise RuntimeError("history store full")


def end_a_with_a_broken_write(h: Harness) -> None:
    """Run ``/db/a`` to its end, its removal to be written with :func:`broken_write`."""
    h.writes["/db/a"] = broken_write
    h.sched.submit(CHANNEL, "/db/a", 5.0)
    job, data = h.accept()
    finish(h, job, data, "ok")


def test_failed_also_write_rolls_back_the_removal(make_scheduler: Callable[..., Harness], jobs: Jobs, caplog: Any) -> None:
    h = make_scheduler()
    end_a_with_a_broken_write(h)
    with caplog.at_level(logging.WARNING, logger=SCHEDULER_LOGGER):
        h.settle(lambda: "ended" in h.kinds("/db/a"), "the end")
        h.starter_idle()
    assert [r.getMessage() for r in caplog.records if r.name == SCHEDULER_LOGGER] == [
        "Could not remove the finished job of '/db/a'."
    ]
    assert h.job("/db/a").state == "finished"  # neither half landed
    assert jobs.store.transact(lambda tr: tr.get(MARKER)) is None


def _next_run_waits_for_the_removal(h: Harness, then: str) -> None:
    """As a channel does: the ended run's slot goes to ``then``, submitted before the removal
    of its job; ``then``'s re-check waits until that removal waits for the starter."""

    def deliver(channel: str, event: RunEvent) -> Callable[[Transaction], None] | None:
        also = Harness._deliver(h, channel, event)
        if event.kind == "ended" and event.key != then:
            h.sched.submit(CHANNEL, then, 5.0)
        return also

    def recheck(channel: str, key: str) -> float:
        if key == then:
            wait_for(lambda: bool(h.sched._removals), SETTLE_TIMEOUT_S, what="the ended run's removal", every_s=0.001)
        return 5.0

    h._deliver = deliver  # type: ignore[method-assign]
    h.sched._deliver = deliver
    h.recheck = recheck


def test_the_next_runs_addition_carries_the_ended_runs_removal(make_scheduler: Callable[..., Harness], jobs: Jobs) -> None:
    recording = Delegating(jobs)
    h = make_scheduler(recording)
    _next_run_waits_for_the_removal(h, "/db/b")
    h.sched.submit(CHANNEL, "/db/a", 5.0)
    job, data = h.accept()
    finish(h, job, data, "ok")
    h.settle(lambda: "ended" in h.kinds("/db/a"), "the end")
    h.starter_idle()
    # One transaction removed a's job and added b's: one commit where there were two.
    assert h.job("/db/a") is None and h.job("/db/b").state == "pending"
    assert recording.remove_txs[-1] is recording.add_txs[-1] is not None
    assert h.sched._removals == []


def test_a_removal_that_fails_leaves_the_next_runs_addition_to_go_alone(
    make_scheduler: Callable[..., Harness], jobs: Jobs, caplog: Any
) -> None:
    h = make_scheduler()
    _next_run_waits_for_the_removal(h, "/db/b")
    end_a_with_a_broken_write(h)
    with caplog.at_level(logging.WARNING, logger=SCHEDULER_LOGGER):
        h.settle(lambda: "ended" in h.kinds("/db/a"), "the end")
        h.starter_idle()
        h.starter_idle()  # the removal put back runs after the addition
    assert h.job("/db/b").state == "pending"  # added all the same
    assert h.job("/db/a").state == "finished"  # the removal and its write: neither landed
    assert jobs.store.transact(lambda tr: tr.get(MARKER)) is None
    assert [r.getMessage() for r in caplog.records if r.name == SCHEDULER_LOGGER] == [
        "Could not remove the finished job of '/db/a'."
    ]
    assert "dropped" not in h.kinds("/db/b")


# -- adopt and close --------------------------------------------------------------------------------


def test_adopt_follows_an_existing_job_with_the_token_in_its_data(make_scheduler: Callable[..., Harness]) -> None:
    h = make_scheduler()
    h.jobs.add(JOB_TYPE, "/db/a", {"channel": CHANNEL, "key": "/db/a", "priority": 3.0, "progress": 0.5, "run": 4242})
    job, data = h.accept()
    assert h.sched.adopt(CHANNEL, "/db/a") == 4242
    assert h.run("/db/a").priority == 3.0
    h.wait_kinds("/db/a", ["running"])
    assert h.delivered == [(CHANNEL, RunEvent("/db/a", 4242, "running"))]
    finish(h, job, data, "ok")
    h.wait_kinds("/db/a", ["running", "ended"])
    h.starter_idle()
    assert h.job("/db/a") is None  # its own run's job: removed


def test_adopt_without_a_job_finds_nothing(make_scheduler: Callable[..., Harness]) -> None:
    h = make_scheduler()
    assert h.sched.adopt(CHANNEL, "/db/none") is None
    assert h.sched.run_of("/db/none") is None


def test_close_lets_queued_store_work_finish(make_scheduler: Callable[..., Harness]) -> None:
    h = make_scheduler()
    gate = threading.Event()
    def busy() -> None:
        gate.wait(SETTLE_TIMEOUT_S)

    h.sched.background(busy)  # the starter is busy
    token = h.sched.submit(CHANNEL, "/db/a", 5.0)  # queued behind it: re-check and add
    closer = threading.Thread(target=h.sched.close, name="closer")
    closer.start()
    assert closer.is_alive()  # it cannot finish while work is queued
    gate.set()
    closer.join(SETTLE_TIMEOUT_S)
    assert not closer.is_alive()
    # The queued work was done, and the job stays where it is for a successor to follow.
    info = h.job("/db/a")
    assert (info.state, info.data["run"]) == ("pending", token)
    assert h.sched.runs() == []


def test_submit_after_close_is_dropped(make_scheduler: Callable[..., Harness]) -> None:
    h = make_scheduler()
    h.sched.close()
    token = h.sched.submit(CHANNEL, "/db/a", 5.0)
    h.wait_kinds("/db/a", ["dropped"])
    assert h.events() == [RunEvent("/db/a", token, "dropped", reason="the daemon is stopping")]
    assert h.job("/db/a") is None


def test_scheduler_uses_only_the_pinned_job_calls(make_scheduler: Callable[..., Harness], jobs: Jobs) -> None:
    recording = Delegating(jobs)
    h = make_scheduler(recording)
    h.sched.submit(CHANNEL, "/db/a", 5.0)
    h.starter_idle()
    job, data = h.accept()
    finish(h, job, data, "ok")
    h.settle(lambda: "ended" in h.kinds("/db/a"), "the end")
    h.starter_idle()
    assert recording.calls == ["transact", "get_job", "add", "subscribe", "transact", "get_job", "remove"]


class Instant:
    """A compactor that claims every key and compacts it at once, recording on which thread."""

    name = "instant"

    def __init__(self) -> None:
        self.threads: list[tuple[str, str]] = []

    def claims(self, key: str) -> bool:
        return True

    def compact(self, key: str, ctx: Any) -> Any:
        from smoosh.compactors.base import CompactionResult

        self.threads.append((key, threading.current_thread().name))
        return CompactionResult(size_before_bytes=2, size_after_bytes=1)


def test_from_one_compaction_to_the_next_the_loops_thread_sleeps_and_one_thread_does_it_all(jobs: Jobs) -> None:
    from smoosh.daemon.run.worker import Worker

    # Given the server's loop asleep, this process's worker (a slot for its dispatcher, one for
    # claims), and a channel that starts the next key as it hears the last one's end
    keys = [f"/d/{i}.db" for i in range(6)]
    loop = Loop("t-server")
    iterations: list[str] = []
    run_once = loop.run_once

    def recorded(now: float | None = None) -> float | None:
        iterations.append(threading.current_thread().name)
        return run_once(now)

    loop.run_once = recorded  # type: ignore[method-assign]
    submitted_on: list[tuple[str, str]] = []
    first_claim = threading.Event()

    def recheck(channel: str, key: str) -> float:
        if key == keys[0]:
            assert first_claim.wait(SETTLE_TIMEOUT_S)  # until the test's own iteration has ended
        return 1.0

    def deliver(channel: str, event: RunEvent) -> None:
        if event.kind == "ended":
            following = keys.index(event.key) + 1
            if following < len(keys):
                submit(keys[following])

    def submit(key: str) -> None:
        submitted_on.append((key, threading.current_thread().name))
        sched.submit(CHANNEL, key, 1.0)

    sched = JobScheduler(jobs, JOB_TYPE, recheck=recheck, post=loop.post, deliver=deliver, clock=time.monotonic,
                         post_helped=lambda fn: loop.post(fn, helped=True), help=loop.help)
    compactor = Instant()
    worker = Worker(jobs, None, JOB_TYPE, [compactor], node="test", concurrency=2, signals="direct", listener=sched)
    sched.local = worker
    worker.start()
    loop.start()
    try:
        wait_for(lambda: loop._waiting, SETTLE_TIMEOUT_S, what="the loop asleep")
        asleep_since = len(iterations)
        # When the test starts the first key, helping with its own news
        loop.post(lambda: submit(keys[0]), helped=True)
        loop.help()
        first_claim.set()
        # Then every key is compacted, one after the other, on one compaction thread
        wait_for(lambda: len(compactor.threads) == len(keys), SETTLE_TIMEOUT_S, what="every key compacted")
        compacting = {name for _key, name in compactor.threads}
        assert [key for key, _name in compactor.threads] == keys and len(compacting) == 1
        # ... each next key started by the thread that had just compacted the last one
        me = threading.current_thread().name
        assert submitted_on == [(keys[0], me)] + [(key, *compacting) for key in keys[1:]]
        # ... and the loop's iterations ran there (the news of each start and end), never on its thread
        wait_for(lambda: not worker.is_running(keys[-1]) and not loop._inbox, SETTLE_TIMEOUT_S,
                 what="the last run's end heard")
        assert set(iterations[asleep_since:]) == {me, *compacting}
        assert loop.call(lambda: sched.runs()) == []
    finally:
        worker.stop(SETTLE_TIMEOUT_S)
        loop.stop()
        sched.close(SETTLE_TIMEOUT_S)


# -- every start ends in an event for its channel (issue 45: a run's slots freed by construction) ------


def test_a_second_start_of_a_key_is_refused_and_the_first_runs_end_is_still_heard(
    make_scheduler: Callable[..., Harness],
) -> None:
    # Given a run of the key, its job taken by a worker
    h = make_scheduler()
    first = h.sched.submit(CHANNEL, "/db/a", 5.0)
    job, data = h.accept()
    h.settle(lambda: h.kinds("/db/a") == ["running"], "the first run running")
    # When another channel starts the same key (it waited there too)
    second = h.sched.submit("upgrade_dbs", "/db/a", 1.0)
    h.settle(lambda: len(h.events("/db/a")) == 2, "the second start's answer")
    # Then the second is refused at once, to its own channel, and the first run is still the key's
    assert h.delivered[-1] == ("upgrade_dbs", RunEvent("/db/a", second, "dropped",
                                                       reason="it is already being compacted by channel 'ratio_dbs'"))
    assert h.run("/db/a").token == first
    # ... whose end reaches its channel (before, the second start replaced the first's record,
    # and this end was ignored: the channel kept the run, and its slots, for good)
    finish(h, job, data)
    h.settle(lambda: "ended" in h.kinds("/db/a"), "the first run's end")
    assert h.delivered[-1] == (CHANNEL, RunEvent("/db/a", first, "ended", outcome=Outcome(OK)))
    assert h.sched.runs() == []


def test_a_job_that_cannot_be_followed_for_any_reason_ends_its_run_failed(
    make_scheduler: Callable[..., Harness], jobs: Jobs,
) -> None:
    class BrokenSubscription(Delegating):
        def subscribe(self, job_type: Any, job_id: str, **kwargs: Any) -> Any:
            raise RuntimeError("notifier gone")

    h = make_scheduler(BrokenSubscription(jobs))
    token = h.sched.submit(CHANNEL, "/db/a", 5.0)
    h.wait_kinds("/db/a", ["ended"])
    assert h.events() == [RunEvent("/db/a", token, "ended", outcome=Outcome(
        FAILED, "its job could not be followed: RuntimeError: notifier gone"))]
    h.starter_idle()
    assert h.job("/db/a") is None  # nobody would ever follow it


class _Local:
    """This process's worker as the scheduler sees it: a slot free for every claim."""

    holder = "this-process"

    def __init__(self, runs: bool = True) -> None:
        self.runs = runs

    def reserve(self) -> bool:
        return True

    def run_claimed(self, claim: Callable[[], Any]) -> bool:
        if self.runs:
            threading.Thread(target=claim, daemon=True).start()
        return self.runs

    def unreserve(self) -> None:
        pass

    def claim_transact(self, key: str, body: Callable[[Any], Any]) -> Any:
        raise NotImplementedError  # (its claims never reach a commit here)

    def release_carrier(self, key: str) -> bool:
        return True

    def carriers(self) -> list[tuple[int, Any]]:
        return []


def test_a_claim_the_worker_refuses_drops_its_run(make_scheduler: Callable[..., Harness]) -> None:
    h = make_scheduler()
    h.sched.local = _Local(runs=False)  # its pool stops: the claim never runs
    token = h.sched.submit(CHANNEL, "/db/a", 5.0)
    assert not h.sched.running_at_once("/db/a", token)
    h.wait_kinds("/db/a", ["dropped"])
    assert h.events() == [RunEvent("/db/a", token, "dropped", reason="the daemon is stopping")]
    assert h.sched.runs() == []


def test_a_claim_that_fails_unforeseen_drops_its_run(make_scheduler: Callable[..., Harness], caplog: Any) -> None:
    class Broken(_Local):
        @property
        def holder(self) -> str:  # type: ignore[override]
            raise RuntimeError("no instance")

    h = make_scheduler()
    h.sched.local = Broken()
    with caplog.at_level(logging.ERROR, logger=SCHEDULER_LOGGER):
        token = h.sched.submit(CHANNEL, "/db/a", 5.0)
        h.wait_kinds("/db/a", ["dropped"])
    assert h.events() == [RunEvent("/db/a", token, "dropped", reason="it could not start: RuntimeError: no instance")]
    assert [r.getMessage() for r in caplog.records if r.name == SCHEDULER_LOGGER] == [
        "Starting the run of '/db/a' failed; dropped."]
    assert h.sched.runs() == []
