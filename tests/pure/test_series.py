"""The page's short series (smoosh/daemon/record/series.py): a fixed ring of minutes, fed, never swept."""

from __future__ import annotations

import pytest

from smoosh.daemon.record.series import Series

T0 = 1_700_000_040.0  # the start of a minute


def test_each_write_lands_in_its_minute_and_a_read_gives_every_minute_of_the_ring_oldest_first() -> None:
    series = Series(bucket_s=60, buckets=5)
    series.count("ok", 1_000, T0 + 1)
    series.count("ok", 500, T0 + 59)
    series.count("failed", 0, T0 + 60)
    series.note_reclaimable(7_000, T0 + 10)
    series.note_reclaimable(6_000, T0 + 50)  # the last one of the minute is kept
    read = series.read(T0 + 61)
    assert read["bucket_s"] == 60 and read["now"] == T0 + 61
    assert [b["at"] for b in read["buckets"]] == [T0 - 180, T0 - 120, T0 - 60, T0, T0 + 60]
    this, following = read["buckets"][3], read["buckets"][4]
    assert (this["reclaimed_bytes"], this["compactions"]["ok"], this["reclaimable_bytes"]) == (1_500, 2, 6_000)
    assert (following["reclaimed_bytes"], following["compactions"]["failed"], following["reclaimable_bytes"]) == (0, 1, None)
    assert read["buckets"][0] == {"at": T0 - 180, "reclaimed_bytes": 0, "reclaimable_bytes": None, "compactions": {
        "ok": 0, "failed": 0, "busy": 0, "gone": 0, "interrupted": 0, "replaced": 0, "blocked": 0}}


def test_a_minute_from_an_older_turn_of_the_ring_reads_as_empty_and_is_reset_by_its_next_write() -> None:
    series = Series(bucket_s=60, buckets=5)
    series.count("ok", 1_000, T0)
    series.add_reclaimed(300, T0 + 5)
    # Five minutes on, the same slot of the ring holds another minute
    later = T0 + 5 * 60
    assert all(b["reclaimed_bytes"] == 0 for b in series.read(later)["buckets"])
    series.count("busy", 0, later)
    bucket = series.read(later)["buckets"][-1]
    assert (bucket["reclaimed_bytes"], bucket["compactions"]["ok"], bucket["compactions"]["busy"]) == (0, 0, 1)


def test_bytes_never_count_down_and_a_ring_needs_a_size() -> None:
    series = Series(bucket_s=60, buckets=2)
    series.count("ok", -10, T0)
    series.add_reclaimed(-10, T0)
    series.note_reclaimable(-1, T0)
    assert series.read(T0)["buckets"][-1]["reclaimed_bytes"] == 0
    assert series.read(T0)["buckets"][-1]["reclaimable_bytes"] == 0
    with pytest.raises(ValueError, match="a series needs bucket_s >= 1 and buckets >= 1, not 0 and 2"):
        Series(bucket_s=0, buckets=2)
