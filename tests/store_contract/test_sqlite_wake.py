"""The SQLite store's doorbell: another process's commit wakes the watch poller without a poll.

Each commit rings ``PATH-wake``; a poller that has seen another process commit listens for it
(inotify) and stops after a quiet spell. The store tests use a real second process; the
poll interval is made an hour long, so only the bell can deliver a commit within the wait.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from smoosh.store import sqlite as sqlite_store
from smoosh.store._sqlite_wake import BELL_SUFFIX, LISTEN_QUIET_S, Doorbell, PollWake
from smoosh.store.sqlite import SqliteStore
from helpers.daemon import HANG_S, wait_for

pytest.importorskip("inotify_simple")

WORKER = str(Path(__file__).with_name("store_worker.py"))
#: Bound on waits for another thread or process (never reached when things work).
WAIT_S = HANG_S
#: A poll interval no test waits out: a change seen within WAIT_S came by the bell.
NEVER_S = 3600.0


def _set_elsewhere(path: str, key: bytes, value: bytes) -> None:
    subprocess.run([sys.executable, WORKER, "set", path, key.hex(), value.hex()], check=True, timeout=WAIT_S)


def _watch(store: SqliteStore, key: bytes):
    tr = store.create_transaction()
    tr.get(key)
    w = tr.watch(key)
    tr.commit()
    return w


def _poll_now(store: SqliteStore) -> None:
    """Have the poller poll once more, and wait until it has."""
    polls = store.polls
    store._poll_wake.set()
    wait_for(lambda: store.polls > polls, WAIT_S, what="the poller's next poll", every_s=0.002)


@pytest.fixture
def wake(path):
    w = PollWake(path)
    yield w
    w.close()


@pytest.fixture
def hour_polls(monkeypatch):
    monkeypatch.setattr(sqlite_store, "MAX_POLL_INTERVAL_S", NEVER_S)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# -- the poller in a store ------------------------------------------------------------------


def test_after_another_process_commits_its_next_commit_wakes_the_poller_by_the_bell(path, hour_polls):
    with SqliteStore(path, poll_interval_s=NEVER_S) as store:
        store.transact(lambda tr: (tr.set(b"a", b"0"), tr.set(b"b", b"0")))
        first = _watch(store, b"a")
        _poll_now(store)  # the baseline poll: nothing to tell yet
        assert not store.listening
        _set_elsewhere(path, b"a", b"1")
        _poll_now(store)  # the poll finds another process's commit: listen from now on
        assert first.wait(WAIT_S)
        assert store.listening
        second = _watch(store, b"b")
        _poll_now(store)  # the arm's own wake, done before the other process commits
        _set_elsewhere(path, b"b", b"1")
        # No poll for an hour: only the other process's doorbell can wake the poller.
        assert second.wait(WAIT_S)
        assert store.create_transaction().get(b"b") == b"1"


def test_this_processs_own_commits_never_make_the_poller_listen(path):
    with SqliteStore(path, poll_interval_s=0.01) as store:
        store.transact(lambda tr: tr.set(b"a", b"0"))
        w = _watch(store, b"a")
        _poll_now(store)
        for i in range(5):
            store.transact(lambda tr: tr.set(b"a", b"%d" % i))
            _poll_now(store)
        assert w.wait(WAIT_S)  # fired by the commit itself, in this process
        assert not store.listening
        assert os.path.exists(path + BELL_SUFFIX)  # rung all the same, for other processes


def test_the_poller_stops_listening_after_a_quiet_spell(path, hour_polls):
    clock = FakeClock()
    with SqliteStore(path, poll_interval_s=NEVER_S, clock=clock) as store:
        store.transact(lambda tr: tr.set(b"a", b"0"))
        w = _watch(store, b"a")
        _poll_now(store)
        _set_elsewhere(path, b"a", b"1")
        _poll_now(store)
        assert w.wait(WAIT_S) and store.listening
        _watch(store, b"a")
        clock.now += LISTEN_QUIET_S - 1
        _poll_now(store)
        assert store.listening
        clock.now += 1
        _poll_now(store)
        assert not store.listening


# -- the event and the bell -----------------------------------------------------------------


def test_a_set_before_the_wait_is_kept_once(wake):
    wake.set()
    wake.set()
    assert wake.wait(WAIT_S) is True
    assert wake.wait(0) is False


def test_a_set_from_another_thread_ends_a_wait_without_timeout(wake):
    threading.Timer(0.01, wake.set).start()
    assert wake.wait(None) is True


def test_the_bell_wakes_only_a_listening_wait(wake, path):
    bell = Doorbell(path)
    try:
        bell.ring()
        assert wake.wait(0) is False  # not listening: the ring is nobody's business
        wake.listen(True)
        assert wake.listening
        threading.Timer(0.01, bell.ring).start()
        assert wake.wait(WAIT_S) is True
        assert wake.wait(0) is False  # one ring, one wake
        wake.listen(False)
        bell.ring()
        assert wake.wait(0) is False
    finally:
        bell.close()


def test_listening_makes_the_bell_if_no_process_has_rung_it(wake, path):
    wake.listen(True)
    assert wake.listening and os.path.exists(path + BELL_SUFFIX)


def test_a_removed_bell_wakes_the_wait_and_ends_listening(wake, path):
    wake.listen(True)
    os.unlink(path + BELL_SUFFIX)
    assert wake.wait(WAIT_S) is True  # woken: the poller polls at once
    assert not wake.listening


def test_a_bell_that_cannot_be_written_is_said_once_and_never_raises(tmp_path, caplog):
    bell = Doorbell(str(tmp_path / "missing" / "jobs.db"))
    with caplog.at_level(logging.INFO, logger="smoosh.store.sqlite"):
        bell.ring()
        bell.ring()
    said = [r.getMessage() for r in caplog.records if "doorbell" in r.getMessage()]
    assert len(said) == 1 and "cannot write its doorbell" in said[0]
    bell.close()


def test_a_set_after_close_does_nothing(wake):
    wake.close()
    wake.set()  # no write to a closed (or reused) descriptor, no error
    assert not wake._is_set
