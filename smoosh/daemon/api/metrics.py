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

The finished compactions' counts and duration histograms are most of a scrape's lines (every
channel and result at 0 from the start, a histogram of 14 series each) and change only when a
compaction ends: :class:`_CompactionText` renders them again only then, so a scrape of a daemon
that compacted nothing since the last one formats only the rest.
"""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

from prometheus_client import (
    CONTENT_TYPE_LATEST, CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector, generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from channels.ports import RESULTS
from smoosh.daemon.control.store_health import STATES as STORE_STATES, UNREACHABLE
from smoosh.daemon.record.status import NODE_STATES
from smoosh.daemon.record.histogram import Histogram
from smoosh import __version__

if TYPE_CHECKING:
    from smoosh.daemon.record.outcomes import Counters
    from smoosh.daemon.server import Server

__all__ = ["render", "SmooshCollector", "ENQUEUE_OUTCOMES", "METRICS", "MetricDef", "family"]

#: Outcomes of ``smoosh_enqueue_total`` and the ``Counters`` field each one reads.
ENQUEUE_OUTCOMES = {
    "stale": "enqueue_stale",
    "examined": "enqueue_examined",
    "accepted": "enqueue_accepted",
    "rejected": "enqueue_rejected",
}

#: The duration histogram of a channel and result that has no compaction yet.
_NO_DURATIONS = Histogram()


@dataclass(frozen=True)
class MetricDef:
    """One metric smoosh exposes, declared once: the collector builds its family from this, and
    the metrics reference (docs/reference/metrics.md) is generated from it.

    Attributes:
        name: the name a scrape shows (a counter's ends in ``_total``; a histogram's series add
            ``_bucket``, ``_sum`` and ``_count``).
        kind: ``gauge``, ``counter`` or ``histogram``.
        doc: its HELP text, which is also what the reference says of it.
        labels: its label names, in order.
        label_values: per label with a fixed vocabulary, the values it takes.
    """

    name: str
    kind: str
    doc: str
    labels: tuple[str, ...] = ()
    label_values: tuple[tuple[str, tuple[str, ...]], ...] = ()


def _results() -> tuple[tuple[str, tuple[str, ...]], ...]:
    return (("result", tuple(RESULTS)),)


#: Every smoosh metric, in the order a scrape shows them. A family the collector builds must be
#: declared here (:func:`family` refuses any other), and the docs build fails on one whose doc is
#: empty. prometheus_client's own process_*, python_info and python_gc_* are not smoosh's.
METRICS: tuple[MetricDef, ...] = (
    MetricDef("smoosh_channels", "gauge", "Channels configured on this node."),
    MetricDef("smoosh_active_jobs", "gauge", "Compactions running, per channel.", ("channel",)),
    MetricDef("smoosh_starting_jobs", "gauge", "Compactions added to the job layer and not yet running.",
              ("channel",)),
    MetricDef("smoosh_waiting_jobs", "gauge", "Keys waiting in the channel's queue that could start now (not those "
              "waiting out a crash backoff or a busy database's retry: smoosh_deferred_jobs).", ("channel",)),
    MetricDef("smoosh_deferred_jobs", "gauge", "Keys of the channel waiting out a crash backoff or a busy database's "
              "retry: they hold no slot and cannot start before their time.", ("channel",)),
    MetricDef("smoosh_reclaimable_bytes", "gauge",
              "Estimated bytes the queued keys would reclaim (file - active, from their last sizes).", ("channel",)),
    MetricDef("smoosh_channel_suspended", "gauge", "1 while an operator has suspended the channel.", ("channel",)),
    MetricDef("smoosh_channel_held", "gauge", "1 while a cluster hold in the store covers the channel on this node.",
              ("channel",)),
    MetricDef("smoosh_channel_in_window", "gauge", "1 while the channel's time window is open.", ("channel",)),
    MetricDef("smoosh_evicted_total", "counter", "Keys evicted from a full queue (lowest priority first).",
              ("channel",)),
    MetricDef("smoosh_running_seconds", "gauge", "Age of the channel's oldest compaction in flight (starting or "
              "running), in seconds since its channel started it; 0 when none is.", ("channel",)),
    MetricDef("smoosh_running_since_progress_seconds", "gauge", "The longest any compaction of the channel in flight "
              "has gone without progress, in seconds (since its last progress, or since it began when it has made "
              "none); 0 when none is in flight.", ("channel",)),
    MetricDef("smoosh_checkpoint_errors_total", "counter", "Failed writes of the channel's queue checkpoint.",
              ("channel",)),
    MetricDef("smoosh_starved_jobs", "gauge",
              "Keys busy more than busy_retries times in a row (state starved), per channel.", ("channel",)),
    MetricDef("smoosh_node_reclaimable_bytes", "gauge", "Estimated bytes all queued keys of this node would reclaim."),
    MetricDef("smoosh_compactions_total", "counter",
              "Finished compactions by channel and result (" + ", ".join(RESULTS) + ").",
              ("channel", "result"), _results()),
    MetricDef("smoosh_compaction_duration_seconds", "histogram",
              "How long finished compactions ran, by channel and result; its _count equals smoosh_compactions_total.",
              ("channel", "result"), _results()),
    MetricDef("smoosh_compacted_bytes_total", "counter", "Database bytes (file and WAL) before and after successful "
              "compactions; before minus after is smoosh_reclaimed_bytes_total.", ("channel", "phase"),
              (("phase", ("before", "after")),)),
    MetricDef("smoosh_reclaimed_bytes_total", "counter", "Bytes given back to the file system by successful compactions.",
              ("channel",)),
    MetricDef("smoosh_last_success_timestamp_seconds", "gauge",
              "Unix time of the channel's last successful compaction since the daemon started (0: none yet).",
              ("channel",)),
    MetricDef("smoosh_crashing_jobs", "gauge", "Keys waiting out a crash backoff (failed or blocked, not yet due again).",
              ("channel",)),
    MetricDef("smoosh_rotations_total", "counter",
              "Suspendable compactions asked to make way for work waiting on max_jobs."),
    MetricDef("smoosh_enqueue_total", "counter", "Enqueue requests by outcome: stale (dropped by the access table), "
              "examined (priority computed), accepted (queued by a channel), rejected (invalid key).", ("outcome",),
              (("outcome", tuple(ENQUEUE_OUTCOMES)),)),
    MetricDef("smoosh_http_connections_shed_total", "counter", "Admin API connections closed to protect it: full (a "
              "new one, every open connection answering or waiting), evicted (the longest-waiting idle one, to admit "
              "a new one).", ("reason",), (("reason", ("full", "evicted")),)),
    MetricDef("smoosh_http_requests_cut_total", "counter", "POST /enqueue requests bounded in time: cut (its "
              "deadline passed; the keys left were not examined, and the answer names them), shed (it waited too long "
              "for a handler: refused whole with 503).", ("reason",), (("reason", ("cut", "shed")),)),
    MetricDef("smoosh_config_error", "gauge",
              "1 while the last config edit was rejected (the previous config is in force)."),
    MetricDef("smoosh_store_state", "gauge", "1 for the job store's state now (" + ", ".join(STORE_STATES) + "), 0 for "
              "the others; while it is not ok no new compaction starts.", ("state",), (("state", tuple(STORE_STATES)),)),
    MetricDef("smoosh_store_up", "gauge", "1 while the job store answers (its state ok or full), 0 while it is "
              "unreachable: a transaction gave up on it, or has had no answer for 10 s."),
    MetricDef("smoosh_fleet_nodes", "gauge", "The nodes of this node's store, by state, as this node last read "
              "every node's status record: live (its record rewritten in the last 15 s), stale (not: killed, "
              "stopped or cut off from the store), stopped (stopped cleanly). A forgotten node (smoosh forget) is "
              "in none. All 0 until the first read.", ("state",), (("state", ("live", "stale", "stopped")),)),
    MetricDef("smoosh_cluster_max_jobs", "gauge",
              "This node's cluster_max_jobs: compactions running on all the nodes of its store together, at most; "
              "+Inf when unset."),
    MetricDef("smoosh_cluster_slots", "gauge", "Slots of the fleet-wide cap (cluster_max_jobs) this node's runs hold."),
    MetricDef("smoosh_cluster_waiting", "gauge",
              "1 while this node's starts wait for a slot of the fleet-wide cap (the cap refused its last claim)."),
    MetricDef("smoosh_cluster_refusals_total", "counter",
              "Claims of this node the fleet-wide cap refused (the key waited in its channel for a slot)."),
    MetricDef("smoosh_build_info", "gauge", "Always 1; the version of smoosh running.", ("version",)),
    MetricDef("smoosh_io_budget_bytes_per_second", "gauge", "The I/O budget in force (max_io_rate); +Inf when unlimited."),
    MetricDef("smoosh_io_charged_bytes_total", "counter",
              "Bytes compactions of this process charged to the I/O budget (written)."),
    MetricDef("smoosh_disk_reserved_bytes", "gauge", "Disk space running compactions reserved for what they write "
              "(kept beside min_free_space on each file system)."),
    MetricDef("smoosh_disk_used_ratio", "gauge", "How full each file system under the roots is (used over used plus "
              "available, as df shows it), named by its first root.", ("root",)),
    MetricDef("smoosh_disk_pressure", "gauge",
              "1 while the file system is used past disk_pressure: its databases go worst-first.", ("root",)),
    MetricDef("smoosh_application_waits_total", "counter", "Compactions (or incremental chunks) that found an "
              "application inside a transaction on their database and waited for a moment with none open."),
    MetricDef("smoosh_application_wait_seconds_total", "counter", "Seconds compactions waited so."),
    MetricDef("smoosh_application_gave_up_total", "counter", "Such waits that found no quiet moment (the compaction "
              "ended busy, to be tried again)."),
    MetricDef("smoosh_looks_total", "counter", "Looks at a database between compactions: lock=\"none\" read the "
              "file without a lock (its header, an immutable read), lock=\"sqlite\" took a SQLite read lock.",
              ("lock",), (("lock", ("none", "sqlite")),)),
    MetricDef("smoosh_wal_pinned_databases", "gauge",
              "WAL databases whose log a reader kept from being emptied at their last compaction."),
    MetricDef("smoosh_wal_pinned_bytes", "gauge", "The largest log readers keep pinned, in bytes (0: none)."),
    MetricDef("smoosh_wal_pinned_seconds", "gauge",
              "How long the log pinned longest has been (seconds; 0: none). /jobs names the reader."),
    MetricDef("smoosh_backlog_bytes", "gauge",
              "Reclaimable bytes waiting in the channels, as the backlog controller last saw them."),
    MetricDef("smoosh_controller_busy", "gauge",
              "Busy results (the application held its lock) in the controller's last interval."),
    MetricDef("smoosh_controller_lock_waits", "gauge", "Incremental chunks that found the application holding the "
              "write lock, in the controller's last interval (harm, as busy results are)."),
    MetricDef("smoosh_controller_slots", "gauge",
              "Compactions the backlog controller lets run at once (between min_jobs and max_jobs)."),
    MetricDef("smoosh_controller_chunk_gap_ratio", "gauge", "The incremental pace the backlog controller set: after a "
              "chunk on a database the application has open, the lock stays free this many times as long as the "
              "chunk held it."),
)

_DECLARED = {m.name: m for m in METRICS}
_FAMILIES = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily, "histogram": HistogramMetricFamily}


def family(name: str) -> Any:
    """An empty metric family built from its declaration in :data:`METRICS`.

    Parameters:
        name: the declared name (a counter's with ``_total``).

    Returns:
        A ``GaugeMetricFamily``, ``CounterMetricFamily`` or ``HistogramMetricFamily`` with the
        declared HELP text and labels.

    Raises:
        KeyError: no metric of that name is declared.
    """
    m = _DECLARED[name]
    return _FAMILIES[m.kind](m.name, m.doc, labels=list(m.labels))

# One registry (and its scrape's state) per server. Weak keys: the registry must not keep a
# stopped server alive, and the collector holds the server only through a weak reference for the
# same reason.
_registries: weakref.WeakKeyDictionary[Any, _Scrape] = weakref.WeakKeyDictionary()
_registries_lock = threading.Lock()


class SmooshCollector(Collector):
    """Builds every smoosh metric family from ``server.status()`` and ``server.counters``.

    Parameters:
        server: the server scraped (held weakly).
        compactions: False leaves out ``smoosh_compactions_total`` and
            ``smoosh_compaction_duration_seconds`` (:func:`render` adds them from its cache).
    """

    def __init__(self, server: Server, *, compactions: bool = True) -> None:
        self._server = weakref.ref(server)
        self._compactions = compactions
        #: The channels the last :meth:`collect` saw, sorted (read by :func:`render` under its lock).
        self.channels: list[str] = []

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
        count = family("smoosh_channels")
        count.add_metric([], len(channels))
        yield count

        gauges = {
            "active": family("smoosh_active_jobs"),
            "starting": family("smoosh_starting_jobs"),
            "waiting": family("smoosh_waiting_jobs"),
            "deferred": family("smoosh_deferred_jobs"),
            "reclaimable": family("smoosh_reclaimable_bytes"),
            "suspended": family("smoosh_channel_suspended"),
            "held": family("smoosh_channel_held"),
            "in_window": family("smoosh_channel_in_window"),
            "oldest_run": family("smoosh_running_seconds"),
            "since_progress": family("smoosh_running_since_progress_seconds"),
        }
        evicted = family("smoosh_evicted_total")
        checkpoint_errors = family("smoosh_checkpoint_errors_total")
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

        starved = family("smoosh_starved_jobs")
        for name, entry in channels.items():
            starved.add_metric([name], _number(entry.get("starved")))
        yield starved

        total = family("smoosh_node_reclaimable_bytes")
        total.add_metric([], _number(status.get("reclaimable_bytes")))
        yield total

        self.channels = sorted(channels)
        if self._compactions:
            yield from _counted_families(_durations(counters, self.channels))
        yield from _compaction_families(server, counters, self.channels)

        rotations = family("smoosh_rotations_total")
        rotations.add_metric([], getattr(counters, "rotations", 0))
        yield rotations

        enqueues = family("smoosh_enqueue_total")
        for outcome, attribute in ENQUEUE_OUTCOMES.items():
            enqueues.add_metric([outcome], getattr(counters, attribute, 0))
        yield enqueues

        shed = family("smoosh_http_connections_shed_total")
        for reason, n in sorted(dict(counters.http_shed).items()):
            shed.add_metric([reason], n)
        yield shed

        cut = family("smoosh_http_requests_cut_total")
        for how, n in sorted(dict(counters.http_cut).items()):
            cut.add_metric([how], n)
        yield cut

        config_error = family("smoosh_config_error")
        config_error.add_metric([], 1 if status.get("config_error") else 0)
        yield config_error

        store = status.get("store") or {}
        store_state = family("smoosh_store_state")
        for state in STORE_STATES:
            store_state.add_metric([state], 1 if store.get("state") == state else 0)
        yield store_state
        store_up = family("smoosh_store_up")
        store_up.add_metric([], 0 if store.get("state") == UNREACHABLE else 1)
        yield store_up

        yield from _fleet_families(status)

        # The version's one home, as `smoosh --version` prints it.
        build = family("smoosh_build_info")
        build.add_metric([__version__], 1)
        yield build

        budget = server.io_budget
        rate = family("smoosh_io_budget_bytes_per_second")
        rate.add_metric([], float("inf") if budget.rate_bytes_per_s is None else budget.rate_bytes_per_s)
        yield rate
        charged = family("smoosh_io_charged_bytes_total")
        charged.add_metric([], budget.charged_bytes)
        yield charged
        reserved = family("smoosh_disk_reserved_bytes")
        reserved.add_metric([], server.disk_room.reserved_bytes())
        yield reserved
        used = family("smoosh_disk_used_ratio")
        pressure = family("smoosh_disk_pressure")
        for fs in server.pressure.snapshot():
            used.add_metric([fs.roots[0]], fs.used)
            pressure.add_metric([fs.roots[0]], 1 if fs.pressure else 0)
        yield used
        yield pressure
        yield from _pinned_wal_families(server)
        yield from _application_families(server)
        decision = server.controller.last
        for name, value in (
            ("smoosh_backlog_bytes", decision.backlog_bytes),
            ("smoosh_controller_busy", decision.busy),
            ("smoosh_controller_lock_waits", decision.lock_waits),
            ("smoosh_controller_slots", decision.slots),
            ("smoosh_controller_chunk_gap_ratio", decision.chunk_gap_factor),
        ):
            gauge = family(name)
            gauge.add_metric([], value)
            yield gauge


def _durations(counters: Counters, channels: list[str]) -> dict[tuple[str, str], Histogram]:
    """(channel, result) -> its compactions' durations, every configured channel and result there.

    Every configured channel has every series at 0 from start (DESIGN §11), so an alert on
    ``increase(...{result="blocked"}[1h])`` has a series before the first blocked compaction
    and ``increase()`` sees the first one as an increase. A channel removed from the config
    keeps the counts it made while the process lives.
    """
    # dict() copies in one step under the GIL: the loop thread may add a key meanwhile. Each
    # value is an immutable Histogram, replaced whole by the one writer.
    durations = dict(counters.durations)
    for channel in channels:
        for result in RESULTS:
            durations.setdefault((channel, result), _NO_DURATIONS)
    return durations


def _counted_families(durations: dict[tuple[str, str], Histogram]) -> Iterator[Metric]:
    """``smoosh_compactions_total`` and ``smoosh_compaction_duration_seconds`` of ``durations``."""
    compactions = family("smoosh_compactions_total")
    duration = family("smoosh_compaction_duration_seconds")
    for (channel, result), histogram in sorted(durations.items()):
        compactions.add_metric([channel, result], histogram.count)
        duration.add_metric(
            [channel, result], [(floatToGoString(bound), n) for bound, n in histogram.cumulative()], histogram.sum)
    yield compactions
    yield duration


def _compaction_families(server: Server, counters: Counters, channels: list[str]) -> Iterator[Metric]:
    """The other families of finished compactions: bytes, last success, crashing keys.

    Like the counts, every configured channel has its series from the start (0).
    """
    compacted = dict(counters.compacted_bytes)
    last_success = dict(counters.last_success_s)
    for channel in channels:
        compacted.setdefault(channel, (0, 0))
        last_success.setdefault(channel, 0.0)

    compacted_bytes = family("smoosh_compacted_bytes_total")
    reclaimed = family("smoosh_reclaimed_bytes_total")
    for channel, (before, after) in sorted(compacted.items()):
        compacted_bytes.add_metric([channel, "before"], before)
        compacted_bytes.add_metric([channel, "after"], after)
        reclaimed.add_metric([channel], before - after)
    yield compacted_bytes
    yield reclaimed

    success = family("smoosh_last_success_timestamp_seconds")
    for channel, at in sorted(last_success.items()):
        success.add_metric([channel], at)
    yield success

    crashing = server.crashing_jobs()
    crashing_jobs = family("smoosh_crashing_jobs")
    for channel in sorted(set(channels) | set(crashing)):
        crashing_jobs.add_metric([channel], crashing.get(channel, 0))
    yield crashing_jobs


def _fleet_families(status: dict[str, Any]) -> Iterator[Metric]:
    """The fleet as this node last read it from the store, and this node's part of the fleet-wide cap."""
    fleet = status.get("fleet") or {}
    nodes = family("smoosh_fleet_nodes")
    for state in NODE_STATES:
        nodes.add_metric([state], _number(fleet.get(state)))
    yield nodes
    cluster = status.get("cluster") or {}
    limit = cluster.get("max_jobs")
    cap = family("smoosh_cluster_max_jobs")
    cap.add_metric([], float("inf") if limit is None else _number(limit))
    yield cap
    slots = family("smoosh_cluster_slots")
    slots.add_metric([], _number(cluster.get("slots")))
    yield slots
    waiting = family("smoosh_cluster_waiting")
    waiting.add_metric([], 0 if cluster.get("waiting_since") is None else 1)
    yield waiting
    refusals = family("smoosh_cluster_refusals_total")
    refusals.add_metric([], _number(cluster.get("refusals")))
    yield refusals


def _application_families(server: Server) -> Iterator[Metric]:
    """What the compactions saw of the applications beside their databases, and how they looked."""
    seen = server.application()
    for name, field in (("smoosh_application_waits_total", "waits"),
                        ("smoosh_application_wait_seconds_total", "wait_seconds"),
                        ("smoosh_application_gave_up_total", "gave_up")):
        metric = family(name)
        metric.add_metric([], seen.get(field, 0))
        yield metric
    looks = family("smoosh_looks_total")
    looks.add_metric(["none"], seen.get("looks_lockless", 0))
    looks.add_metric(["sqlite"], seen.get("looks_locked", 0))
    yield looks


def _pinned_wal_families(server: Server) -> Iterator[Metric]:
    """The logs readers keep pinned: how many, the largest one's bytes, how long the oldest has been."""
    pinned = server.pinned_wals()  # what the compactors saw, and the history remembers across a restart
    now = time.monotonic()  # the clock the compactors and the daemon count ages on
    count = family("smoosh_wal_pinned_databases")
    count.add_metric([], len(pinned))
    largest = family("smoosh_wal_pinned_bytes")
    largest.add_metric([], max((size for _p, size, _s in pinned), default=0))
    age = family("smoosh_wal_pinned_seconds")
    age.add_metric([], max((now - since for _p, _size, since in pinned), default=0.0))
    yield count
    yield largest
    yield age


def _number(value: Any) -> float:
    """A sample value from a status field (missing or non-numeric fields count as 0)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


class _CompactionText(Collector):
    """The exposition of the compaction counts and durations, rendered again only when they changed.

    A collector of its own registry, which holds nothing else: its :meth:`collect` yields the
    families of the durations :meth:`text` last found changed. Owner: :func:`render`, under its
    scrape's lock.
    """

    def __init__(self) -> None:
        self._durations: dict[tuple[str, str], Histogram] = {}
        self._seen: tuple[tuple[tuple[str, str], Histogram], ...] | None = None
        self._text = b""
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(self)

    def collect(self) -> Iterator[Metric]:
        """The families of the durations being rendered."""
        return _counted_families(self._durations)

    def text(self, counters: Counters, channels: list[str]) -> bytes:
        """The families' text for the counters now: the last one while no compaction ended since."""
        durations = _durations(counters, channels)
        # Histograms compare by value, and there is one per channel and result: a cheap key.
        seen = tuple(sorted(durations.items()))
        if seen != self._seen:
            self._durations = durations
            self._text, self._seen = generate_latest(self._registry), seen
        return self._text


@dataclass
class _Scrape:
    """What scraping one server takes: its registry, its collector, the cached compaction text.

    Owner: :func:`render`; one scrape of a server at a time, under ``lock`` (scrapes are seconds
    apart, and the collector and the cache are each one scrape's state).
    """

    registry: CollectorRegistry
    collector: SmooshCollector
    compactions: _CompactionText
    lock: threading.Lock


def _scrape_of(server: Server) -> _Scrape:
    """The scrape state of ``server``, created with its registry on first use."""
    with _registries_lock:
        scrape = _registries.get(server)
        if scrape is None:
            registry = CollectorRegistry(auto_describe=False)
            collector = SmooshCollector(server, compactions=False)
            registry.register(collector)
            # What the process-wide default registry would carry: process_* (CPU, memory, open
            # files, start time, read from /proc at scrape time), python_info and python_gc_*.
            ProcessCollector(registry=registry)
            PlatformCollector(registry=registry)
            GCCollector(registry=registry)
            scrape = _registries[server] = _Scrape(registry, collector, _CompactionText(), threading.Lock())
        return scrape


def render(server: Server) -> tuple[bytes, str]:
    """Scrape ``server`` now.

    Parameters:
        server: a started :class:`smoosh.daemon.server.Server`.

    Returns:
        ``(body, content_type)``: the Prometheus text exposition and its content type.
    """
    scrape = _scrape_of(server)
    with scrape.lock:
        body = generate_latest(scrape.registry)
        return body + scrape.compactions.text(server.counters, scrape.collector.channels), CONTENT_TYPE_LATEST
