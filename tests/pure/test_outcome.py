"""Outcome as job data: every field goes out, and comes back."""

from __future__ import annotations

from dataclasses import fields

from channels.ports import Outcome


def test_every_field_of_an_outcome_round_trips_through_job_data() -> None:
    outcome = Outcome("interrupted", "stopped", size_before_bytes=10, size_after_bytes=4, duration_s=1.5,
                      progress=0.25, rotated=True, stopping=True)
    data = outcome.to_data()
    assert set(data) == {f.name for f in fields(Outcome)} | {"reclaimed_bytes"}
    assert data["reclaimed_bytes"] == 6
    assert Outcome.from_data(data) == outcome


def test_the_flags_appear_only_when_set() -> None:
    data = Outcome("ok", size_before_bytes=10, size_after_bytes=4).to_data()
    assert "rotated" not in data and "stopping" not in data
    assert Outcome.from_data(data) == Outcome("ok", size_before_bytes=10, size_after_bytes=4)
