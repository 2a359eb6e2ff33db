"""Fixtures for the channel tests: a channel factory over a scripted scheduler and a recording host."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from channel_testlib import (
    NAME,
    T0,
    Harness,
    Journal,
    MakeChannel,
    RecordingHost,
    ScriptedScheduler,
    Settings,
)

from channels import Channel


@pytest.fixture
def make_channel() -> Iterator[MakeChannel]:
    """Factory of harnessed channels, built at ``T0`` (``wait_s=0`` unless given); closed after."""
    made: list[Channel] = []

    def make(name: str = NAME, settings: Any = None, *, host: RecordingHost | None = None, **kwargs: Any) -> Harness:
        journal = host.journal if host is not None else Journal()
        scheduler = ScriptedScheduler(journal)
        host = host or RecordingHost(journal)
        kwargs.setdefault("wait_s", 0)
        now = kwargs.pop("now", T0)
        channel = Channel(name, settings or Settings(), scheduler=scheduler, host=host, now=now, **kwargs)
        made.append(channel)
        return Harness(channel, scheduler, host, journal, now)

    yield make
    for channel in made:
        channel.close(checkpoint=False)
