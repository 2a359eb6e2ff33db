"""What each finished compaction adds to /metrics, read back from the server's own scrape:
durations per channel and result, bytes before and after, the last success, crashing keys.

The server runs in process with an injected clock, so durations and backoffs are exact; the
scrape is ``smoosh.daemon.api.metrics.render``, the body ``GET /metrics`` serves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from helpers.clocks import FakeClock
from helpers.daemon import HANG_S, wait_for
from server.test_server import FailingCompactor, make_config
from smoosh.compactors.base import CompactionResult, Interrupted
from smoosh.daemon.api.metrics import render

Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]


def scrape(server: Any) -> Samples:
    """{sample name: {sorted label items: value}} of one scrape of ``server``."""
    body, _ = render(server)
    samples: Samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return samples


def value(m: Samples, name: str, **labels: str) -> float:
    return m[name][tuple(sorted(labels.items()))]


def buckets(m: Samples, channel: str, result: str) -> dict[str, float]:
    """{le: cumulative count} of one channel's and result's duration histogram."""
    return {
        dict(labels)["le"]: n for labels, n in m["smoosh_compaction_duration_seconds_bucket"].items()
        if dict(labels)["channel"] == channel and dict(labels)["result"] == result
    }


class ScriptedCompactor(FailingCompactor):
    """Runs the compactions a test scripts: each step raises or takes ``seconds`` of the clock."""

    def __init__(self, clock: FakeClock, steps: list[Any]) -> None:
        super().__init__(RuntimeError("unused"))
        self.clock = clock
        self.steps = steps

    def compact(self, key: str, ctx: Any) -> CompactionResult:
        self.calls += 1
        step = self.steps.pop(0) if self.steps else RuntimeError("no step left")
        if isinstance(step, Exception):
            raise step
        seconds, before, after = step
        self.clock.advance(seconds)  # the compaction's duration, on the server's clock
        return CompactionResult(size_before_bytes=before, size_after_bytes=after)


def test_a_success_is_counted_with_its_duration_bucket_bytes_and_time(tmp_path: Path, running: Any, dbs: Path) -> None:
    # Given a server whose one compaction takes 42 s and shrinks 10,000 bytes to 2,500
    clock = FakeClock()
    compactor = ScriptedCompactor(clock, [(42.0, 10_000, 2_500)])
    server = running(make_config(tmp_path), workers=1, clock=clock, compactors=[compactor])
    before = scrape(server)
    assert value(before, "smoosh_last_success_timestamp_seconds", channel="ratio_dbs") == 0.0
    # When it runs
    server.enqueue(str(dbs / "x.db"))
    wait_for(lambda: value(scrape(server), "smoosh_compactions_total", channel="ratio_dbs", result="ok") == 1, HANG_S,
             what="the compaction counted")
    m = scrape(server)
    # Then its duration lands in the le=60 bucket, not below
    counts = buckets(m, "ratio_dbs", "ok")
    assert counts["15.0"] == 0 and counts["60.0"] == 1 and counts["+Inf"] == 1
    assert value(m, "smoosh_compaction_duration_seconds_count", channel="ratio_dbs", result="ok") == 1
    assert value(m, "smoosh_compaction_duration_seconds_sum", channel="ratio_dbs", result="ok") == 42.0
    # and its bytes: before, after, and reclaimed = before - after
    assert value(m, "smoosh_compacted_bytes_total", channel="ratio_dbs", phase="before") == 10_000
    assert value(m, "smoosh_compacted_bytes_total", channel="ratio_dbs", phase="after") == 2_500
    assert value(m, "smoosh_reclaimed_bytes_total", channel="ratio_dbs") == 7_500
    # and the time it was recorded, on the server's clock
    assert value(m, "smoosh_last_success_timestamp_seconds", channel="ratio_dbs") == clock()
    # and nothing else moved
    others = {labels: n for labels, n in m["smoosh_compaction_duration_seconds_count"].items()
              if labels != (("channel", "ratio_dbs"), ("result", "ok"))}
    assert set(others.values()) == {0.0}
    assert value(m, "smoosh_last_success_timestamp_seconds", channel="slack_dbs") == 0.0


def test_a_database_that_grew_while_compacted_reclaims_nothing_and_the_counters_agree(
    tmp_path: Path, running: Any, dbs: Path
) -> None:
    clock = FakeClock()
    compactor = ScriptedCompactor(clock, [(1.0, 8_000, 2_000), (1.0, 5_000, 6_000)])
    server = running(make_config(tmp_path, extra="staleness = 0"), workers=1, clock=clock, compactors=[compactor])
    for n in (1, 2):
        server.enqueue(str(dbs / f"{n}.db"))
        wait_for(lambda: value(scrape(server), "smoosh_compactions_total", channel="ratio_dbs", result="ok") == n,
                 HANG_S, what=f"compaction {n}")
    m = scrape(server)
    before = value(m, "smoosh_compacted_bytes_total", channel="ratio_dbs", phase="before")
    after = value(m, "smoosh_compacted_bytes_total", channel="ratio_dbs", phase="after")
    assert (before, after) == (13_000, 7_000)  # the grown one counts 5,000 both ways
    assert value(m, "smoosh_reclaimed_bytes_total", channel="ratio_dbs") == before - after == 6_000


def test_a_failure_is_a_crashing_job_until_its_backoff_ends(tmp_path: Path, running: Any, dbs: Path) -> None:
    # Given a compaction that fails after 3 s (backoff_base is 100 s in make_config)
    clock = FakeClock()
    compactor = ScriptedCompactor(clock, [RuntimeError("disk I/O error")])
    server = running(make_config(tmp_path), workers=1, clock=clock, compactors=[compactor])
    assert value(scrape(server), "smoosh_crashing_jobs", channel="ratio_dbs") == 0
    key = str(dbs / "x.db")
    server.enqueue(key)
    wait_for(lambda: value(scrape(server), "smoosh_compactions_total", channel="ratio_dbs", result="failed") == 1,
             HANG_S, what="the failure counted")
    # Then it is one crashing job of its channel, counted as failed with its duration
    m = scrape(server)
    assert value(m, "smoosh_crashing_jobs", channel="ratio_dbs") == 1
    assert value(m, "smoosh_crashing_jobs", channel="slack_dbs") == 0
    assert value(m, "smoosh_compaction_duration_seconds_count", channel="ratio_dbs", result="failed") == 1
    assert value(m, "smoosh_compacted_bytes_total", channel="ratio_dbs", phase="before") == 0  # successes only
    assert value(m, "smoosh_last_success_timestamp_seconds", channel="ratio_dbs") == 0
    retry_at = {j["key"]: j for j in server.jobs_table()}[key]["retry_at"]
    # until its not-before time (read at the scrape, without the server stepping)
    clock.advance(retry_at - clock() - 1)
    assert value(scrape(server), "smoosh_crashing_jobs", channel="ratio_dbs") == 1
    clock.advance(1)
    assert value(scrape(server), "smoosh_crashing_jobs", channel="ratio_dbs") == 0


def test_an_interrupted_compaction_is_counted_as_interrupted(tmp_path: Path, running: Any, dbs: Path) -> None:
    # Given a compaction interrupted once (it is queued again at once), then successful
    clock = FakeClock()
    compactor = ScriptedCompactor(clock, [Interrupted("held"), (2.0, 4_000, 1_000)])
    server = running(make_config(tmp_path), workers=1, clock=clock, compactors=[compactor])
    server.enqueue(str(dbs / "x.db"))
    wait_for(lambda: value(scrape(server), "smoosh_compactions_total", channel="ratio_dbs", result="ok") == 1, HANG_S,
             what="the compaction after the interruption")
    m = scrape(server)
    assert value(m, "smoosh_compactions_total", channel="ratio_dbs", result="interrupted") == 1
    assert value(m, "smoosh_compaction_duration_seconds_count", channel="ratio_dbs", result="interrupted") == 1
    assert value(m, "smoosh_crashing_jobs", channel="ratio_dbs") == 0  # not a crash
    assert compactor.calls == 2
