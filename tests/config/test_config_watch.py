"""Live reload: editor-style saves of a real file, debounced by a stepped clock."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from watchdog.events import (
    DirModifiedEvent,
    FileClosedEvent,
    FileClosedNoWriteEvent,
    FileCreatedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileOpenedEvent,
)

from smoosh.config import Config
from smoosh.config.watch import ConfigWatcher
from smoosh.errors import ConfigError
from helpers.clocks import FakeClock
from helpers.daemon import HANG_S

#: Upper bound for waiting on the operating system's file events (never a timer of ours).
EVENT_WAIT_S = HANG_S  # a ceiling on a hang, never a measure of speed


def replace_atomically(path: Path, text: str) -> None:
    """Save the way editors do: write a temporary file, then rename it over the original."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def wait_until(condition: Callable[[], bool], timeout_s: float = EVENT_WAIT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "smoosh.ini"
    path.write_text("[smoosh]\nmax_jobs = 1\nwatch = dbs\n")
    return path


@pytest.fixture
def results() -> list[Config | ConfigError]:
    return []


@pytest.fixture
def stepped(config_file: Path, results: list[Config | ConfigError]) -> Iterator[tuple[ConfigWatcher, FakeClock]]:
    """A watcher fed by real file events whose debounce is stepped by hand."""
    clock = FakeClock(1000.0)
    watcher = ConfigWatcher(str(config_file), results.append, settle_s=0.5, clock=clock)
    watcher.start(ticker=False)
    yield watcher, clock
    watcher.stop()


def test_atomic_replace_reloads_exactly_once_after_settling(
    stepped: tuple[ConfigWatcher, FakeClock], config_file: Path, results: list[Config | ConfigError]
) -> None:
    watcher, clock = stepped
    replace_atomically(config_file, "[smoosh]\nmax_jobs = 7\nwatch = dbs\n")
    assert wait_until(lambda: watcher.pending), "no file event for the replaced config"

    assert watcher.tick(clock.now + 0.49) is False  # still settling
    assert results == []
    clock.now += 0.3
    watcher.note_event(clock.now)  # another event of the same save pushes the reload back
    assert watcher.tick(clock.now + 0.49) is False
    assert watcher.tick(clock.now + 0.5) is True
    assert watcher.tick(clock.now + 10) is False

    assert len(results) == 1
    result = results[0]
    assert isinstance(result, Config)
    assert (result.max_jobs, result.path) == (7, str(config_file))


def test_reading_the_config_does_not_count_as_an_edit(
    stepped: tuple[ConfigWatcher, FakeClock], config_file: Path, results: list[Config | ConfigError]
) -> None:
    watcher, clock = stepped
    replace_atomically(config_file, "[smoosh]\nmax_jobs = 2\nwatch = dbs\n")
    assert wait_until(lambda: watcher.pending)
    clock.now += 1.0
    assert watcher.tick(clock.now)
    # Our own read opens and closes the file; those events must not start another reload.
    assert not wait_until(lambda: watcher.pending, timeout_s=0.3)
    assert len(results) == 1


def test_an_invalid_edit_delivers_the_config_error(
    stepped: tuple[ConfigWatcher, FakeClock], config_file: Path, results: list[Config | ConfigError]
) -> None:
    watcher, clock = stepped
    replace_atomically(config_file, "[smoosh.ratio_dbs]\ncapacity = 0\n")
    assert wait_until(lambda: watcher.pending)
    clock.now += 1.0
    assert watcher.tick(clock.now)
    assert isinstance(results[-1], ConfigError)
    assert str(results[-1]) == f"{config_file}: [smoosh.ratio_dbs] capacity = '0': must be an integer >= 1"

    config_file.write_text("")  # truncated in place, as a tool writing through the file would
    assert wait_until(lambda: watcher.pending)
    clock.now += 1.0
    assert watcher.tick(clock.now)
    assert isinstance(results[-1], ConfigError)
    assert str(results[-1]) == f"{config_file}: is empty"


def test_events_on_other_files_are_ignored(config_file: Path) -> None:
    watcher = ConfigWatcher(str(config_file), lambda result: None)
    other = str(config_file.with_name("other.ini"))
    me = str(config_file)
    assert watcher.is_edit(FileModifiedEvent(me))
    assert watcher.is_edit(FileCreatedEvent(me))
    assert watcher.is_edit(FileClosedEvent(me))
    assert watcher.is_edit(FileMovedEvent(me + ".tmp", me))  # an editor's save
    assert watcher.is_edit(FileMovedEvent(me, me + "~"))  # moved away: the file is gone
    assert not watcher.is_edit(FileModifiedEvent(other))
    assert not watcher.is_edit(FileMovedEvent(other, other + ".bak"))
    assert not watcher.is_edit(FileOpenedEvent(me))
    assert not watcher.is_edit(FileClosedNoWriteEvent(me))
    assert not watcher.is_edit(DirModifiedEvent(str(config_file.parent)))


def test_a_failing_handler_does_not_stop_reloading(config_file: Path) -> None:
    calls: list[Config | ConfigError] = []

    def handler(result: Config | ConfigError) -> None:
        calls.append(result)
        raise RuntimeError("handler bug")

    clock = FakeClock(1000.0)
    watcher = ConfigWatcher(str(config_file), handler, clock=clock)
    watcher.note_event(clock.now)
    assert watcher.tick(clock.now + 1)
    watcher.note_event(clock.now + 2)
    assert watcher.tick(clock.now + 3)
    assert len(calls) == 2


def test_reload_now_delivers_at_once(config_file: Path, results: list[Config | ConfigError]) -> None:
    watcher = ConfigWatcher(str(config_file), results.append)
    result = watcher.reload_now()
    assert isinstance(result, Config) and result.max_jobs == 1
    assert results == [result]


def test_unwatchable_directory_is_logged_not_fatal(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    watcher = ConfigWatcher(str(tmp_path / "missing" / "smoosh.ini"), lambda result: None)
    watcher.start()
    watcher.stop()
    assert "send SIGHUP to reload" in caplog.text


def test_real_watcher_reloads_after_an_editor_save(config_file: Path) -> None:
    delivered = threading.Event()
    results: list[Config | ConfigError] = []

    def on_change(result: Config | ConfigError) -> None:
        results.append(result)
        delivered.set()

    watcher = ConfigWatcher(str(config_file), on_change, settle_s=0.05)
    watcher.start()
    try:
        replace_atomically(config_file, "[smoosh]\nmax_jobs = 3\nwatch = dbs\n")
        assert delivered.wait(EVENT_WAIT_S), "no reload within 5 s of os.replace"
    finally:
        watcher.stop()
    assert isinstance(results[0], Config)
    assert results[0].max_jobs == 3
