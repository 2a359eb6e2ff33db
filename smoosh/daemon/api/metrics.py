"""Prometheus metrics for ``GET /metrics`` (DESIGN §4.2), read from the server at scrape time.

The server keeps plain counters (:class:`smoosh.daemon.record.outcomes.Counters`: what the outcome
recorder counts as each compaction ends, its duration in a plain
:class:`~smoosh.daemon.record.histogram.Histogram`, its bytes before and after) and the channels
publish status snapshots; nothing on the hot path touches prometheus_client. A custom
collector turns both into metric families when Prometheus scrapes, on a private
``CollectorRegistry`` per server, so two servers in one process (tests, embedding) never
collide with "Duplicated timeseries" and the process-wide default registry stays clean. The
same registry carries prometheus_client's process, platform and GC collectors, which read
``/proc`` and the interpreter at scrape time only.

No metric is labelled by database: keys are unbounded, and a label per key would make the
time-series count grow with the fleet (per-key detail lives in ``GET /jobs``).
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Iterator

from prometheus_client import (
    CONTENT_TYPE_LATEST, CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector, generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from channels.ports import RESULTS
from smoosh.daemon.control.store_health import STATES as STORE_STATES
from smoosh.daemon.record.histogram import Histogram
from smoosh import __version__

if TYPE_CHECKING:
    from smoosh.daemon.record.outcomes import Counters
    from smoosh.daemon.server import Server

__all__ = ["render", "registry_for", "SmooshCollector", "ENQUEUE_OUTCOMES"]

#: Outcomes of ``smoosh_enqueue_total`` and the ``Counters`` field each one reads.
ENQUEUE_OUTCOMES = {
    "stale": "enqueue_stale",
    "examined": "enqueue_examined",
    "accepted": "enqueue_accepted",
    "rejected": "enqueue_rejected",
}

#: The duration histogram of a channel and result that has no compaction yet.
_NO_DURATIONS = Histogram()

# One registry per server. Weak keys: the registry must not keep a stopped server alive, and
# the collector holds the server only through a weak reference for the same reason.
_registries: weakref.WeakKeyDictionary[Any, CollectorRegistry] = weakref.WeakKeyDictionary()
_registries_lock = threading.Lock()


class SmooshCollector(Collector):
    """Builds every smoosh metric family from ``server.status()`` and ``server.counters``."""

    def __init__(self, server: Server) -> None:
        self._server = weakref.ref(server)

    def collect(self) -> Iterator[Metric]:
        """Yield the metric families of one scrape (none once the server is gone)."""
        server = self._server()
        if server is None:
            return
        status = server.status()
        counters = server.counters
        channels: dict[str, dict[str, Any]] = status.get("channels", {})

        # Not smoosh_channel_count: a gauge named ..._count reads as a histogram's or a summary's
        # count series, and `promtool check metrics` fails every scrape on it.
        count = GaugeMetricFamily("smoosh_channels", "Channels configured on this node.")
        count.add_metric([], len(channels))
        yield count

        gauges = {
            "active": GaugeMetricFamily(
                "smoosh_active_jobs", "Compactions running, per channel.", labels=["channel"]),
            "starting": GaugeMetricFamily(
                "smoosh_starting_jobs", "Compactions added to the job layer and not yet running.", labels=["channel"]),
            "waiting": GaugeMetricFamily(
                "smoosh_waiting_jobs", "Keys waiting in the channel's queue that could start now (not those "
                "waiting out a crash backoff or a busy database's retry: smoosh_deferred_jobs).", labels=["channel"]),
            "deferred": GaugeMetricFamily(
                "smoosh_deferred_jobs", "Keys of the channel waiting out a crash backoff or a busy database's retry: "
                "they hold no slot and cannot start before their time.", labels=["channel"]),
            "reclaimable": GaugeMetricFamily(
                "smoosh_reclaimable_bytes",
                "Estimated bytes the queued keys would reclaim (file - active, from their last sizes).",
                labels=["channel"]),
            "suspended": GaugeMetricFamily(
                "smoosh_channel_suspended", "1 while an operator has suspended the channel.", labels=["channel"]),
            "held": GaugeMetricFamily(
                "smoosh_channel_held", "1 while a cluster hold in the store covers the channel on this node.",
                labels=["channel"]),
            "in_window": GaugeMetricFamily(
                "smoosh_channel_in_window", "1 while the channel's time window is open.", labels=["channel"]),
            "oldest_run": GaugeMetricFamily(
                "smoosh_running_seconds", "Age of the channel's oldest compaction in flight (starting or running), "
                "in seconds since its channel started it; 0 when none is.", labels=["channel"]),
            "since_progress": GaugeMetricFamily(
                "smoosh_running_since_progress_seconds", "The longest any compaction of the channel in flight has "
                "gone without progress, in seconds (since its last progress, or since it began when it has made "
                "none); 0 when none is in flight.", labels=["channel"]),
        }
        evicted = CounterMetricFamily(
            "smoosh_evicted", "Keys evicted from a full queue (lowest priority first).", labels=["channel"])
        checkpoint_errors = CounterMetricFamily(
            "smoosh_checkpoint_errors", "Failed writes of the channel's queue checkpoint.", labels=["channel"])
        for name, entry in channels.items():
            waiting = entry.get("waiting") or {}
            gauges["active"].add_metric([name], _number(entry.get("active")))
            gauges["starting"].add_metric([name], _number(entry.get("starting")))
            gauges["waiting"].add_metric([name], _number(waiting.get("size")))
            gauges["deferred"].add_metric([name], _number(entry.get("deferred")))
            gauges["reclaimable"].add_metric([name], _number(entry.get("reclaimable_bytes")))
            gauges["suspended"].add_metric([name], 1 if entry.get("suspended") else 0)
            gauges["held"].add_metric([name], 1 if entry.get("held") else 0)
            gauges["in_window"].add_metric([name], 1 if entry.get("in_window", True) else 0)
            gauges["oldest_run"].add_metric([name], _number(entry.get("oldest_run_s")))
            gauges["since_progress"].add_metric([name], _number(entry.get("since_progress_s")))
            evicted.add_metric([name], _number(entry.get("evicted")))
            checkpoint_errors.add_metric([name], _number(entry.get("checkpoint_errors")))
        yield from gauges.values()
        yield evicted
        yield checkpoint_errors

        starved = GaugeMetricFamily(
            "smoosh_starved_jobs", "Keys busy more than busy_retries times in a row (state starved), per channel.",
            labels=["channel"])
        for name, entry in channels.items():
            starved.add_metric([name], _number(entry.get("starved")))
        yield starved

        total = GaugeMetricFamily(
            "smoosh_node_reclaimable_bytes", "Estimated bytes all queued keys of this node would reclaim.")
        total.add_metric([], _number(status.get("reclaimable_bytes")))
        yield total

        yield from _compaction_families(server, counters, sorted(channels))

        rotations = CounterMetricFamily(
            "smoosh_rotations", "Suspendable compactions asked to make way for work waiting on max_jobs.")
        rotations.add_metric([], getattr(counters, "rotations", 0))
        yield rotations

        enqueues = CounterMetricFamily(
            "smoosh_enqueue", "Enqueue requests by outcome: stale (dropped by the access table), examined "
            "(priority computed), accepted (queued by a channel), rejected (invalid key).",
            labels=["outcome"])
        for outcome, attribute in ENQUEUE_OUTCOMES.items():
            enqueues.add_metric([outcome], getattr(counters, attribute, 0))
        yield enqueues

        shed = CounterMetricFamily(
            "smoosh_http_connections_shed", "Admin API connections closed to protect it: full (a new one, every "
            "open connection answering or waiting), evicted (the longest-waiting idle one, to admit a new one).",
            labels=["reason"])
        for reason, n in sorted(dict(counters.http_shed).items()):
            shed.add_metric([reason], n)
        yield shed

        config_error = GaugeMetricFamily(
            "smoosh_config_error", "1 while the last config edit was rejected (the previous config is in force).")
        config_error.add_metric([], 1 if status.get("config_error") else 0)
        yield config_error

        store = status.get("store") or {}
        store_state = GaugeMetricFamily(
            "smoosh_store_state", "1 for the job store's state now (" + ", ".join(STORE_STATES) + "), 0 for the "
            "others; while it is not ok no new compaction starts.", labels=["state"])
        for state in STORE_STATES:
            store_state.add_metric([state], 1 if store.get("state") == state else 0)
        yield store_state

        # The version's one home, as `smoosh --version` prints it.
        build = GaugeMetricFamily("smoosh_build_info", "Always 1; the version of smoosh running.", labels=["version"])
        build.add_metric([__version__], 1)
        yield build

        budget = server.io_budget
        rate = GaugeMetricFamily(
            "smoosh_io_budget_bytes_per_second", "The I/O budget in force (max_io_rate); +Inf when unlimited.")
        rate.add_metric([], float("inf") if budget.rate_bytes_per_s is None else budget.rate_bytes_per_s)
        yield rate
        charged = CounterMetricFamily(
            "smoosh_io_charged_bytes", "Bytes compactions of this process charged to the I/O budget (written).")
        charged.add_metric([], budget.charged_bytes)
        yield charged
        reserved = GaugeMetricFamily(
            "smoosh_disk_reserved_bytes", "Disk space running compactions reserved for what they write "
            "(kept beside min_free_space on each file system).")
        reserved.add_metric([], server.disk_room.reserved_bytes())
        yield reserved
        used = GaugeMetricFamily("smoosh_disk_used_ratio", "How full each file system under the roots is (used over "
                                 "used plus available, as df shows it), named by its first root.", labels=["root"])
        pressure = GaugeMetricFamily("smoosh_disk_pressure", "1 while the file system is used past disk_pressure: its "
                                     "databases go worst-first.", labels=["root"])
        for fs in server.pressure.snapshot():
            used.add_metric([fs.roots[0]], fs.used)
            pressure.add_metric([fs.roots[0]], 1 if fs.pressure else 0)
        yield used
        yield pressure
        yield from _pinned_wal_families(server)
        decision = server.controller.last
        for name, help_text, value in (
            ("smoosh_backlog_bytes", "Reclaimable bytes waiting in the channels, as the backlog controller last saw them.",
             decision.backlog_bytes),
            ("smoosh_controller_busy", "Busy results (the application held its lock) in the controller's last interval.",
             decision.busy),
            ("smoosh_controller_lock_waits", "Incremental chunks that found the application holding the write lock, in "
             "the controller's last interval (harm, as busy results are).", decision.lock_waits),
            ("smoosh_controller_slots", "Compactions the backlog controller lets run at once (between min_jobs and "
             "max_jobs).", decision.slots),
            ("smoosh_controller_chunk_gap_ratio", "The incremental pace the backlog controller set: after a chunk on a "
             "database the application has open, the lock stays free this many times as long as the chunk held it.",
             decision.chunk_gap_factor),
        ):
            gauge = GaugeMetricFamily(name, help_text)
            gauge.add_metric([], value)
            yield gauge


def _compaction_families(server: Server, counters: Counters, channels: list[str]) -> Iterator[Metric]:
    """The families of finished compactions: counts, durations, bytes, last success, crashing keys.

    Every configured channel has every series at 0 from start (DESIGN §11), so an alert on
    ``increase(...{result="blocked"}[1h])`` has a series before the first blocked compaction
    and ``increase()`` sees the first one as an increase. A channel removed from the config
    keeps the counts it made while the process lives.
    """
    # dict() copies in one step under the GIL: the loop thread may add a key meanwhile. Each
    # value is immutable (a Histogram, a tuple), replaced whole by the one writer.
    durations = dict(counters.durations)
    compacted = dict(counters.compacted_bytes)
    last_success = dict(counters.last_success_s)
    for channel in channels:
        for result in RESULTS:
            durations.setdefault((channel, result), _NO_DURATIONS)
        compacted.setdefault(channel, (0, 0))
        last_success.setdefault(channel, 0.0)

    compactions = CounterMetricFamily(
        "smoosh_compactions", "Finished compactions by channel and result (" + ", ".join(RESULTS) + ").",
        labels=["channel", "result"])
    duration = HistogramMetricFamily(
        "smoosh_compaction_duration_seconds", "How long finished compactions ran, by channel and result.",
        labels=["channel", "result"])
    for (channel, result), histogram in sorted(durations.items()):
        compactions.add_metric([channel, result], histogram.count)
        duration.add_metric(
            [channel, result], [(floatToGoString(bound), n) for bound, n in histogram.cumulative()], histogram.sum)
    yield compactions
    yield duration

    compacted_bytes = CounterMetricFamily(
        "smoosh_compacted_bytes", "Database bytes (file and WAL) before and after successful compactions; "
        "before minus after is smoosh_reclaimed_bytes_total.", labels=["channel", "phase"])
    reclaimed = CounterMetricFamily(
        "smoosh_reclaimed_bytes", "Bytes given back to the file system by successful compactions.",
        labels=["channel"])
    for channel, (before, after) in sorted(compacted.items()):
        compacted_bytes.add_metric([channel, "before"], before)
        compacted_bytes.add_metric([channel, "after"], after)
        reclaimed.add_metric([channel], before - after)
    yield compacted_bytes
    yield reclaimed

    success = GaugeMetricFamily(
        "smoosh_last_success_timestamp_seconds",
        "Unix time of the channel's last successful compaction since the daemon started (0: none yet).",
        labels=["channel"])
    for channel, at in sorted(last_success.items()):
        success.add_metric([channel], at)
    yield success

    crashing = server.crashing_jobs()
    crashing_jobs = GaugeMetricFamily(
        "smoosh_crashing_jobs", "Keys waiting out a crash backoff (failed or blocked, not yet due again).",
        labels=["channel"])
    for channel in sorted(set(channels) | set(crashing)):
        crashing_jobs.add_metric([channel], crashing.get(channel, 0))
    yield crashing_jobs


def _pinned_wal_families(server: Server) -> Iterator[Metric]:
    """The logs readers keep pinned: how many, the largest one's bytes, how long the oldest has been."""
    pinned = [w for c in server.compactors() for w in (getattr(c, "pinned_wals", lambda: [])() or [])]
    now = time.monotonic()
    count = GaugeMetricFamily("smoosh_wal_pinned_databases",
                              "WAL databases whose log a reader kept from being emptied at their last compaction.")
    count.add_metric([], len(pinned))
    largest = GaugeMetricFamily("smoosh_wal_pinned_bytes", "The largest log readers keep pinned, in bytes (0: none).")
    largest.add_metric([], max((size for _p, size, _s in pinned), default=0))
    age = GaugeMetricFamily("smoosh_wal_pinned_seconds",
                            "How long the log pinned longest has been (seconds; 0: none). /jobs names the reader.")
    age.add_metric([], max((now - since for _p, _size, since in pinned), default=0.0))
    yield count
    yield largest
    yield age


def _number(value: Any) -> float:
    """A sample value from a status field (missing or non-numeric fields count as 0)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def registry_for(server: Server) -> CollectorRegistry:
    """The private registry of ``server``, created with its collector on first use."""
    with _registries_lock:
        registry = _registries.get(server)
        if registry is None:
            registry = CollectorRegistry(auto_describe=False)
            registry.register(SmooshCollector(server))
            # What the process-wide default registry would carry: process_* (CPU, memory, open
            # files, start time, read from /proc at scrape time), python_info and python_gc_*.
            ProcessCollector(registry=registry)
            PlatformCollector(registry=registry)
            GCCollector(registry=registry)
            _registries[server] = registry
        return registry


def render(server: Server) -> tuple[bytes, str]:
    """Scrape ``server`` now.

    Parameters:
        server: a started :class:`smoosh.daemon.server.Server`.

    Returns:
        ``(body, content_type)``: the Prometheus text exposition and its content type.
    """
    return generate_latest(registry_for(server)), CONTENT_TYPE_LATEST
