"""Fixtures for the channel tests: the real job layer over a memory store, and a channel factory."""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Iterator

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from channel_testlib import JOB_TYPE, FakeClock, Harness, Recorder, Settings  # noqa: E402

from channels import Channel  # noqa: E402
from smoosh.jobs import Jobs  # noqa: E402
from smoosh.store import open_store  # noqa: E402


@pytest.fixture
def jobs() -> Iterator[Jobs]:
    """The real job layer over ``memory:``, with the test job type registered."""
    store = open_store("memory:")
    layer = Jobs(store)
    layer.set_type_timeout(JOB_TYPE, 30)
    yield layer
    layer.close()
    store.close()


@pytest.fixture
def make_channel(jobs: Jobs) -> Iterator[Callable[..., Harness]]:
    """Factory of harnessed channels (wait_s=0 unless given); every channel is closed after."""
    made: list[Channel] = []

    def make(
        name: str = "ratio_dbs",
        settings: Any = None,
        *,
        clock: FakeClock | None = None,
        rec: Recorder | None = None,
        priority_of: Callable[[str], float] | None = None,
        jobs_layer: Any = None,
        **kwargs: Any,
    ) -> Harness:
        clock = clock or FakeClock()
        rec = rec or Recorder()
        kwargs.setdefault("wait_s", 0)
        kwargs.setdefault("on_hold", rec.on_hold)
        kwargs.setdefault("acquire_slot", rec.acquire_slot)
        kwargs.setdefault("release_slot", rec.release_slot)
        channel = Channel(
            name,
            settings or Settings(),
            jobs=jobs_layer or jobs,
            job_type=JOB_TYPE,
            priority_of=priority_of or (lambda key: 5.0),
            on_job_done=rec.on_job_done,
            clock=clock,
            **kwargs,
        )
        made.append(channel)
        return Harness(channel, clock, jobs, rec)

    yield make
    for channel in made:
        channel.close(checkpoint=False)
