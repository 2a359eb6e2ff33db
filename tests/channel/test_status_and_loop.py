"""The published status, key listings, and the background loop."""

from __future__ import annotations

import threading
import time
from typing import Any

from channel_testlib import Settings

import channels.channel as channel_module


def test_status_reflects_an_enqueue_without_a_tick(make_channel: Any) -> None:
    h = make_channel(settings=Settings(concurrency=3))
    assert h.status() == {
        "active": 0, "starting": 0, "waiting": {"size": 0, "min": 0, "max": 0},
        "paused": True, "suspended": False, "in_window": True, "held": False,
        "evicted": 0, "concurrency": 3, "checkpoint_errors": 0,
    }
    h.channel.enqueue("/db/a", 2.0)
    h.channel.enqueue("/db/b", 7.0)
    assert h.status()["waiting"] == {"size": 2, "min": 2.0, "max": 7.0}


def test_status_changes_at_once_on_operator_actions_and_job_start(make_channel: Any) -> None:
    h = make_channel()
    h.channel.enqueue("/db/a", 2.0)
    h.channel.suspend()
    assert h.status()["suspended"] is True and h.status()["held"] is True
    h.channel.resume()
    assert h.status()["suspended"] is False and h.status()["paused"] is False
    h.tick()
    assert h.status()["starting"] == 1 and h.status()["waiting"]["size"] == 0
    h.channel.enqueue("/db/b", 1.0)
    h.channel.flush()
    assert h.status()["waiting"]["size"] == 0 and h.status()["starting"] == 1


def test_status_does_not_wait_for_the_channel_lock(make_channel: Any) -> None:
    h = make_channel()
    h.channel.enqueue("/db/a", 2.0)
    seen: list[dict[str, Any]] = []
    with h.channel._lock:  # another thread is deep inside the channel
        reader = threading.Thread(target=lambda: seen.append(h.channel.status()))
        reader.start()
        reader.join(2)
        assert not reader.is_alive(), "status() blocked on the channel lock"
    assert seen[0]["waiting"]["size"] == 1


def test_status_snapshot_cannot_be_changed_by_its_reader(make_channel: Any) -> None:
    h = make_channel()
    snapshot = h.status()
    snapshot["active"] = 99
    snapshot["waiting"]["size"] = 99
    assert h.status()["active"] == 0 and h.status()["waiting"]["size"] == 0


def test_keys_lists_waiting_starting_and_active(make_channel: Any) -> None:
    h = make_channel(settings=Settings(concurrency=2))
    for key, priority in [("/db/a", 3.0), ("/db/b", 2.0), ("/db/c", 1.0)]:
        h.channel.enqueue(key, priority)
    h.tick()
    h.accept()
    h.wait_active(1)
    assert h.channel.keys() == {"/db/a", "/db/b", "/db/c"}
    assert h.channel.waiting() == [("/db/c", 1.0)]


def test_background_loop_starts_work_and_close_stops_it(make_channel: Any) -> None:
    h = make_channel()
    h.channel.start()
    assert h.channel.is_alive()
    h.channel.enqueue("/db/a", 5.0)
    deadline = time.monotonic() + 5
    while h.job_ids() != {"/db/a"} and time.monotonic() < deadline:
        time.sleep(0.01)
    assert h.job_ids() == {"/db/a"}
    thread = h.channel._thread
    h.channel.close()
    assert not h.channel.is_alive() and not thread.is_alive()


def test_enqueue_wakes_the_loop_early(make_channel: Any, monkeypatch: Any) -> None:
    # With a loop interval of a minute, only the wake-up can start the job within seconds.
    monkeypatch.setattr(channel_module, "LOOP_INTERVAL_S", 60.0)
    h = make_channel()
    h.channel.start()
    time.sleep(0.05)  # let the loop run its first tick and go to sleep
    h.channel.enqueue("/db/a", 5.0)
    deadline = time.monotonic() + 5
    while h.job_ids() != {"/db/a"} and time.monotonic() < deadline:
        time.sleep(0.01)
    assert h.job_ids() == {"/db/a"}


def test_background_loop_follows_jobs_to_the_end(make_channel: Any) -> None:
    h = make_channel(settings=Settings(concurrency=1))
    h.channel.start()
    h.channel.enqueue("/db/a", 5.0)
    h.channel.enqueue("/db/b", 4.0)
    for expected in ["/db/a", "/db/b"]:
        deadline = time.monotonic() + 5
        while True:
            try:
                job, data = h.accept()
                break
            except Exception:
                assert time.monotonic() < deadline, "no job was started"
                time.sleep(0.01)
        assert job.id == expected
        h.finish(job, data, "ok")
    deadline = time.monotonic() + 5
    while len(h.rec.done) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert h.rec.results() == {"/db/a": "ok", "/db/b": "ok"}


def test_a_failing_phase_is_logged_and_the_iteration_goes_on(make_channel: Any, caplog: Any) -> None:
    h = make_channel()

    def broken_poll(now: float) -> None:
        raise RuntimeError("subscription exploded")

    h.channel._poll_jobs = broken_poll
    h.channel.enqueue("/db/a", 5.0)
    h.tick()
    assert "Channel ratio_dbs: following jobs failed; going on." in caplog.text
    assert "RuntimeError: subscription exploded" in caplog.text
    assert h.job_ids() == {"/db/a"}


def test_status_is_republished_every_few_seconds(make_channel: Any) -> None:
    h = make_channel()
    before = h.channel._status
    h.tick(channel_module.STATUS_INTERVAL_S / 2)  # unpause republishes
    after_unpause = h.channel._status
    assert after_unpause is not before
    h.tick(0.1)
    assert h.channel._status is after_unpause  # nothing changed, nothing due
    h.tick(channel_module.STATUS_INTERVAL_S)
    assert h.channel._status is not after_unpause


def test_closed_channel_refuses_enqueues_and_ignores_ticks(make_channel: Any) -> None:
    h = make_channel()
    h.channel.close()
    assert h.channel.enqueue("/db/a", 5.0) is False
    h.tick(60)
    assert h.job_ids() == set()
    h.channel.close()  # idempotent
