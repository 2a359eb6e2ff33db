"""The smoosh server: canonical keys, staleness, validation, routing, channels, backoff, status.

The path of one event (DESIGN §2): ``enqueue(key)`` looks the raw key up in the access table
(the hot path: a dict lookup, no I/O); only on a miss is the key canonicalised and validated,
and its priority computed off the caller's thread. The router offers the key to the channels
of its kind in the operator's order; the first that gives a priority > 0 queues it. Channels
start compactions by adding jobs; workers run them; outcomes come back through
:meth:`Server._on_job_done`, where crashes earn an exponential backoff.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from channels import Channel
from smoosh.daemon import control
from smoosh.compactors import load_compactors
from smoosh.config import ChannelConfig, Config
from smoosh.errors import ConfigError, InvalidKey, SmooshError
from smoosh.daemon.history import ADDED, BUSY, CRASHED, FINISHED, STARTED, HistoryTable
from smoosh.jobs import Jobs, NotFound
from smoosh.daemon.keypool import KeyPool
from smoosh.paths import canonical_path
from smoosh.priority import quantize
from smoosh.daemon.router import CLEANUP_PREFIX, EXACT_DUE, Router, db_path
from smoosh.daemon.slots import SlotGate
from smoosh.daemon.staleness import AccessTable
from smoosh.daemon.suspension import Suspension
from smoosh.daemon.status import STATUS_INTERVAL_S, write_node_status
from smoosh.store import Store, open_store

log = logging.getLogger(__name__)

#: Longest key accepted, in bytes of UTF-8 (PATH_MAX on Linux).
MAX_KEY_BYTES = 4096
#: Seconds between iterations of the server's own loop (retries, debounced events, health).
LOOP_INTERVAL_S = 0.1
#: Seconds between reads of running jobs' progress from the job layer (for /jobs).
JOB_SYNC_INTERVAL_S = 1.0
#: Threads computing priorities from cheap sizes (a header read each). One: the work is
#: Python under the GIL, and more threads only convoy on it (measured: 1 thread 8,400 new
#: keys/s, 2 or 4 threads ~6,200/s).
EXAMINE_THREADS = 1
#: Threads taking exact ``dbstat`` measurements handed over by the examine thread. Several:
#: SQLite reads every page without the GIL, and at start-up those pages are rarely cached.
MEASURE_THREADS = 3
#: Seconds a clean stop may take before the daemon gives up waiting (DESIGN §5.1).
STOP_TIMEOUT_S = 10.0


class UnknownChannel(SmooshError):
    """Raised when an operator names a channel the config does not define."""

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown channel {name!r}")
        self.name = name


@dataclass(slots=True)
class _InFlight:
    """A key waiting for or in its priority computation (one per key: a fleet has many).

    ``dirty`` asks for one more run after the one in progress; ``debounced`` reports the
    outcome to the debouncer (the key came from the watcher).
    """

    started: bool = False
    dirty: bool = False
    debounced: bool = False


@dataclass
class Counters:
    """Plain-int counters: cheap enough for the hot path, exported by the metrics collector."""

    enqueue_stale: int = 0
    enqueue_examined: int = 0
    enqueue_accepted: int = 0
    enqueue_rejected: int = 0
    compactions: dict[tuple[str, str], int] = field(default_factory=dict)
    reclaimed_bytes: dict[str, int] = field(default_factory=dict)
    rotations: int = 0


class Server:
    """The compaction daemon, embeddable: ``Server(load_config(path)).start()``.

    Parameters:
        config: the loaded configuration.
        store: a store to use instead of opening ``config.store`` (the caller closes it).
        workers: in-process worker threads; None means ``config.max_jobs``, 0 none.
        dry_run: route, prioritise and queue as usual, but start no compaction.
        http: ``"host:port"`` for the admin API; None means ``config.http``; "" or False: none.
        clock: the wall clock (unix seconds); tests inject one.
        watch_config: reload the config file live when it changes.
        compactors: compactors to use instead of the built-in SQLite one and the plugins.
    """

    def __init__(
        self,
        config: Config,
        *,
        store: Store | None = None,
        workers: int | None = None,
        dry_run: bool = False,
        http: str | bool | None = None,
        clock: Callable[[], float] = time.time,
        watch_config: bool = True,
        compactors: list[Any] | None = None,
    ) -> None:
        self._config = config
        self._clock = clock
        self.dry_run = dry_run
        self._owns_store = store is None
        self._store = store
        self._workers_n = config.max_jobs if workers is None else workers
        self._http_address = config.http if http is None else (http or None)
        self._watch_config = watch_config and config.path is not None
        self.node = config.node
        self.job_type = f"smoosh:{config.node}"

        self._lock = threading.RLock()
        self._inflight: dict[str, _InFlight] = {}
        self._slots = SlotGate(config.max_jobs)
        # key -> (run id, first seen running at): how long each run has held its slot.
        self._runs_seen: dict[str, tuple[str, float]] = {}
        self._next_rotation: float | None = None
        self._sizes: dict[str, tuple[int, int]] = {}
        self._history = HistoryTable(
            max_history=config.max_history,
            health_threshold_s=config.health_threshold_s,
            backoff_base_s=config.backoff_base_s,
        )
        self.counters = Counters()
        self._access = AccessTable(config.staleness_s, max_size=config.access_max_size, clock=time.monotonic)
        self._compactors = compactors if compactors is not None else load_compactors(
            config.sqlite,
            wal_max_size_bytes=config.wal_max_size_bytes,
            exact_size_interval_s=config.exact_size_interval_s,
        )
        self._router = Router(self._compactors, clock=clock)
        self._channels: dict[str, Channel] = {}
        self._suspension = Suspension(config.state_dir)
        self._config_error: str | None = None
        self._restart_required: list[str] = []
        # channel -> (reclaimable bytes, would-run list) last computed: shown while it is busy.
        self._last_estimates: dict[str, tuple[int, list[list[Any]]]] = {}
        self._own_paths: tuple[str, ...] = ()
        self._state_dir_ok = False

        self._jobs: Jobs | None = None
        self._worker: Any = None
        self._watcher: Any = None
        self._debouncer: Any = None
        self._config_watcher: Any = None
        self._http: Any = None
        self._examiners: KeyPool | None = None
        self._measurers: KeyPool | None = None
        self._thread: threading.Thread | None = None
        self._stop_event = threading.Event()
        self._started = False
        self._next_job_sync = 0.0
        self._next_status_write = 0.0

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Open the store, restore every channel, then start workers, watcher and HTTP.

        Raises:
            SmooshError: the store cannot be opened or the HTTP address cannot be bound.
        """
        if self._started:
            return
        cfg = self._config
        log.info(
            "starting smoosh on node %r: store %s, %d channel(s), %d worker(s)%s",
            self.node, cfg.store, len(cfg.channels), self._workers_n, ", dry run" if self.dry_run else "",
        )
        self._check_state_dir()
        if self._store is None:
            self._store = open_store(cfg.store)
        self._own_paths = self._compute_own_paths(cfg)
        self._jobs = Jobs(self._store)
        self._jobs.set_type_timeout(self.job_type, cfg.job_timeout_s)
        self._examiners = KeyPool(self._examine_loop, EXAMINE_THREADS, "smoosh-examine")
        self._examiners.start()
        self._measurers = KeyPool(self._measure_loop, MEASURE_THREADS, "smoosh-measure")
        self._measurers.start()
        self._suspension.load()
        for name, ch_cfg in cfg.channels.items():
            self._open_channel(name, ch_cfg)
        self._access.start()
        if self._workers_n > 0:
            from smoosh.daemon.worker import Worker

            self._worker = Worker(
                self._jobs, self._store, self.job_type, self._compactors,
                node=self.node, job_timeout_s=cfg.job_timeout_s, concurrency=self._workers_n,
            )
            self._worker.start()
        self._start_watcher(cfg)
        if self._watch_config:
            from smoosh.config.watch import ConfigWatcher

            self._config_watcher = ConfigWatcher(cfg.path, self._on_config_change)
            self._config_watcher.start()
        self._stop_event.clear()
        self._thread = threading.Thread(target=self._run, name="smoosh-server", daemon=True)
        self._thread.start()
        # The admin API comes last: it serves only once every channel has restored its queue.
        if self._http_address:
            from smoosh.daemon.http import AdminServer

            self._http = AdminServer(self, self._http_address, token=cfg.token)
            self._http.start()
        self._started = True
        log.info("smoosh is running%s", f"; admin API on http://{self.http_address}" if self._http else "")

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop cleanly: interrupt running compactions, put their jobs back, checkpoint, close."""
        if not self._started:
            return
        deadline = time.monotonic() + timeout_s
        self._started = False
        self._stop_event.set()
        for part in (self._config_watcher, self._watcher):
            if part is not None:
                _quietly(part.stop)
        if self._thread is not None:
            self._thread.join(max(0.1, deadline - time.monotonic()))
        if self._worker is not None:
            _quietly(lambda: self._worker.stop(timeout_s=max(0.5, deadline - time.monotonic() - 1.0)))
        for name, channel in list(self._channels.items()):
            _quietly(lambda: channel.close(checkpoint=True))
        self._channels.clear()
        self._access.stop()
        for pool in (self._examiners, self._measurers):
            if pool is not None:
                dropped = pool.stop()
                with self._lock:
                    for key in dropped:
                        self._inflight.pop(key, None)
        if self._http is not None:
            _quietly(self._http.stop)
            self._http = None
        if self._jobs is not None:
            _quietly(self._jobs.close)
        if self._owns_store and self._store is not None:
            _quietly(self._store.close)
            self._store = None
        log.info("smoosh stopped")

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def config(self) -> Config:
        """The configuration in force (an invalid edit leaves the previous one)."""
        return self._config

    @property
    def http_address(self) -> str | None:
        """``host:port`` the admin API listens on (the real port when 0 was asked for)."""
        return self._http.address if self._http is not None else None

    @property
    def jobs(self) -> Jobs:
        """The job layer this server schedules through."""
        assert self._jobs is not None, "server not started"
        return self._jobs

    # ------------------------------------------------------------------ enqueue path

    def enqueue(self, key: str) -> None:
        """Ask smoosh to consider ``key`` for compaction; returns at once.

        Raises:
            InvalidKey: the key is not a usable key for this daemon (the reason says why).
        """
        if self._access.is_fresh(key):
            self.counters.enqueue_stale += 1
            return
        canonical = self.canonical_key(key)
        if canonical != key and self._access.is_fresh(canonical):
            self.counters.enqueue_stale += 1
            return
        self.validate(canonical)
        self._submit(canonical)

    def canonical_key(self, key: object) -> str:
        """The key's identity: the realpath of an absolute path (``cleanup:`` kept as a prefix).

        Raises:
            InvalidKey: not a string, empty, too long, a NUL byte, or not an absolute path.
        """
        if not isinstance(key, str):
            raise InvalidKey(repr(key), "a key must be a string")
        if not key:
            raise InvalidKey(key, "empty key")
        if "\x00" in key:
            raise InvalidKey(key, "contains a NUL byte")
        try:
            size_bytes = len(key.encode("utf-8"))
        except UnicodeEncodeError:
            raise InvalidKey(key, "not valid UTF-8") from None
        if size_bytes > MAX_KEY_BYTES:
            raise InvalidKey(key[:80] + "...", f"longer than {MAX_KEY_BYTES} bytes")
        prefix, path = (CLEANUP_PREFIX, key[len(CLEANUP_PREFIX):]) if key.startswith(CLEANUP_PREFIX) else ("", key)
        if not os.path.isabs(path):
            raise InvalidKey(key, "not an absolute path")
        return prefix + canonical_path(path)

    def validate(self, key: str) -> None:
        """Check a canonical key: claimed by a compactor, inside ``roots``, not smoosh's own file.

        Raises:
            InvalidKey: naming the key and the reason.
        """
        if self._router.compactor_for(key) is None:
            raise InvalidKey(key, "no compactor claims it")
        path = db_path(key)
        roots = self._config.roots
        if not roots:
            raise InvalidKey(key, "no roots configured: set [smoosh] roots or watch")
        if not any(_inside(path, root) for root in roots):
            raise InvalidKey(key, f"outside roots ({', '.join(roots)})")
        if any(path == own or _inside(path, own) for own in self._own_paths):
            raise InvalidKey(key, "smoosh's own file")

    def _submit(self, key: str, debounced: bool = False) -> None:
        """Compute the key's priority off this thread; a second request while it runs marks it dirty.

        ``debounced``: the key came from the watcher; its outcome goes back to the debouncer.
        """
        with self._lock:
            state = self._inflight.get(key)
            if state is not None:
                # The computation running now may have read the file before this event's
                # change: run it once more afterwards so the file's final state is examined.
                # One still waiting for a thread will read the file anyway.
                state.dirty = state.started
                state.debounced = state.debounced or debounced
                return
            self._inflight[key] = _InFlight(debounced=debounced)
        assert self._examiners is not None
        if not self._examiners.submit(key):  # stopped: the server is stopping
            with self._lock:
                self._inflight.pop(key, None)

    def _examine_loop(self, key: str) -> None:
        """The examine thread: cheap sizes; a key whose exact size is due goes to a measurer."""
        self._examine(key, defer_exact=True)

    def _measure_loop(self, key: str) -> None:
        """A measurer thread: the same examination, exact sizes included."""
        self._examine(key, defer_exact=False)

    def _examine(self, key: str, defer_exact: bool) -> None:
        with self._lock:
            state = self._inflight.get(key)
            if state is None:
                return
            state.started = True
        accepted = False
        while True:
            try:
                if defer_exact:
                    self.counters.enqueue_examined += 1
                outcome = self._route(key, defer_exact)
            except Exception:
                log.exception("examining %r failed", key)
                outcome = False
            if outcome is EXACT_DUE:
                measurers = self._measurers
                if measurers is not None and measurers.submit(key):
                    return  # still in flight: the measurer finishes its bookkeeping
                outcome = False
            accepted = bool(outcome)
            with self._lock:
                if state.dirty and self._started:
                    state.dirty = False
                    continue
                self._inflight.pop(key, None)
            break
        debouncer = self._debouncer
        if state.debounced and debouncer is not None:
            _quietly(lambda: debouncer.result(key, accepted, self._clock()))

    def _route(self, key: str, defer_exact: bool = False) -> Any:
        """Offer ``key`` to its channels in configured order; True when one queued it.

        With ``defer_exact``: :data:`EXACT_DUE` when no channel took the cheap sizes and an
        exact measurement is due (the caller hands the key to a measurer thread).
        """
        cfg = self._config
        with self._lock:
            if self._history.waiting_retry(key):
                return False
        if self._router.is_ignored(key, cfg):
            log.debug("%r is ignored", key)
            return False
        # The live-job check is a store read: asked only once some channel wants the key,
        # so the many keys no channel takes (most of a fleet at start-up) never pay it.
        live: list[bool] = []
        for offer in self._router.offers(key, cfg, defer_exact=defer_exact):
            if offer is EXACT_DUE:
                return EXACT_DUE
            names, sizes, priority_of = offer
            queued = self._offer(key, names, cfg, priority_of, sizes, live)
            if queued or live == [True]:
                return queued
        return False

    def _offer(
        self,
        key: str,
        names: Sequence[str],
        cfg: Config,
        priority_of: Callable[[ChannelConfig], float],
        sizes: Any,
        live: list[bool],
    ) -> bool:
        for name in names:
            ch_cfg = cfg.channels.get(name)
            channel = self._channels.get(name)
            if ch_cfg is None or channel is None or not ch_cfg.matches(key):
                continue
            priority = priority_of(ch_cfg)
            if not priority:
                continue
            if not live:
                live.append(self._has_live_job(key))  # one key, one job
            if live[0]:
                return False
            queued = channel.enqueue(key, quantize(priority))
            now = self._clock()
            with self._lock:
                if sizes is not None:
                    self._sizes[key] = (sizes.file_bytes, sizes.active_bytes)
                if queued:
                    self._history.record(key, ADDED, now, channel=name)
            self._access.record(key)
            self.counters.enqueue_accepted += 1
            log.debug("%r queued in %s at priority %r", key, name, priority)
            return True
        return False

    def _has_live_job(self, key: str) -> bool:
        """One key, one job: a pending or running job of this node's type blocks routing."""
        assert self._jobs is not None
        try:
            return self._jobs.get_job_state(self.job_type, key) in ("pending", "running")
        except NotFound:
            return False

    # ------------------------------------------------------------------ channel callbacks

    def _acquire_slot(self, channel: str, key: str) -> bool:
        return self._slots.acquire(channel)

    def _release_slot(self, channel: str, key: str) -> None:
        self._slots.release(channel)

    def _on_hold(self, channel: str, hold: bool) -> None:
        if self._store is not None:
            control.set_hold(self._store, self.node, channel, hold)

    def _on_job_done(self, channel: str, key: str, data: dict[str, Any]) -> None:
        result = str(data.get("result") or "failed")
        now = self._clock()
        with self._lock:
            self._sizes.pop(key, None)
            counter_key = (channel, result)
            self.counters.compactions[counter_key] = self.counters.compactions.get(counter_key, 0) + 1
            if result == "ok":
                reclaimed = int(data.get("reclaimed_bytes") or 0)
                self.counters.reclaimed_bytes[channel] = self.counters.reclaimed_bytes.get(channel, 0) + reclaimed
                self._history.record(key, FINISHED, now, channel=channel, reason=f"reclaimed {reclaimed} bytes")
                self._router.record_compacted(key, int(data.get("size_after_bytes") or 0), now)
                log.info("compacted %r in %s: reclaimed %d bytes", key, channel, reclaimed)
            elif result == "gone":
                self._history.record(key, FINISHED, now, channel=channel, reason="database gone")
                log.info("%r is gone; dropped", key)
            elif result == "busy":
                self._history.record(key, BUSY, now, channel=channel, reason=data.get("error") or "database busy")
                log.info("%r was busy; retrying in 60 s", key)
            else:
                rec = self._history.record(key, CRASHED, now, channel=channel, reason=data.get("error") or result)
                log.warning(
                    "compaction of %r in %s failed (%s); retrying in %.0f s",
                    key, channel, rec.last_error, (rec.retry_at or now) - now,
                )

    # ------------------------------------------------------------------ operator controls

    def suspend(self, channel: str | None = None) -> None:
        """Suspend one channel or all (sticky until resume; survives restarts).

        Raises:
            UnknownChannel: ``channel`` is not configured.
        """
        targets = self._targets(channel)
        with self._lock:
            self._suspension.suspend(channel)
        for ch in targets:
            ch.suspend()

    def resume(self, channel: str | None = None) -> None:
        """Resume one channel or all; queued work starts at once.

        Raises:
            UnknownChannel: ``channel`` is not configured.
        """
        targets = self._targets(channel)
        with self._lock:
            self._suspension.resume(channel, list(self._channels))
        for ch in targets:
            ch.resume()

    def flush(self, channel: str | None = None) -> None:
        """Empty the waiting queue of one channel or all (running jobs go on).

        Raises:
            UnknownChannel: ``channel`` is not configured.
        """
        for ch in self._targets(channel):
            ch.flush()

    def _targets(self, channel: str | None) -> list[Channel]:
        if channel is None:
            return list(self._channels.values())
        ch = self._channels.get(channel)
        if ch is None:
            raise UnknownChannel(channel)
        return [ch]

    # ------------------------------------------------------------------ status

    def status(self) -> dict[str, Any]:
        """The status table: CouchDB's ``_smoosh/status`` shape plus smoosh's fields. Never blocks on a channel."""
        channels: dict[str, Any] = {}
        total = 0
        with self._lock:
            sizes = dict(self._sizes)
        for name, channel in list(self._channels.items()):
            entry = dict(channel.status())
            snapshot = channel.try_snapshot()
            if snapshot is None:
                # A busy or stuck channel: show the last estimate rather than wait for it.
                reclaimable, would_run = self._last_estimates.get(name, (0, []))
            else:
                keys, waiting = snapshot
                reclaimable = 0
                for key in keys:
                    file_active = sizes.get(key)
                    if file_active is not None:
                        reclaimable += max(0, file_active[0] - file_active[1])
                would_run = [[k, p] for k, p in waiting[:100]]
                self._last_estimates[name] = (reclaimable, would_run)
            entry["reclaimable_bytes"] = reclaimable
            ch_cfg = self._config.channels.get(name)
            window = getattr(ch_cfg, "window", None)
            entry["window"] = str(window) if window is not None else "always"
            if self.dry_run:
                entry["would_run"] = would_run
            total += reclaimable
            channels[name] = entry
        return {
            "node": self.node,
            "channels": channels,
            "reclaimable_bytes": total,
            "dry_run": self.dry_run,
            "config_error": self._config_error,
            "restart_required": list(self._restart_required),
            "scan": self._scan_status(),
        }

    def _scan_status(self) -> dict[str, Any]:
        """Progress of finding and examining the fleet (start-up of a large fleet takes a while)."""
        watcher, debouncer = self._watcher, self._debouncer
        completed, (found, took_s), (last_found, last_s) = 0, (0, 0.0), (0, 0.0)
        if watcher is not None:
            completed = int(getattr(watcher, "scans_completed", 0))
            found, took_s = getattr(watcher, "startup_scan", (0, 0.0))
            last_found, last_s = getattr(watcher, "last_scan", (0, 0.0))
        return {
            "scans_completed": completed,
            "databases_found": found,
            "duration_s": round(took_s, 3),
            "last_scan_databases": last_found,
            "last_scan_s": round(last_s, 3),
            "debouncing": debouncer.counts()["pending"] if debouncer is not None else 0,
            "examining": len(self._inflight),
        }

    def jobs_table(self) -> list[dict[str, Any]]:
        """Per-key state, progress, error count, last error and history (``GET /jobs``)."""
        with self._lock:
            return [r.to_json() for r in self._history.records()]

    # ------------------------------------------------------------------ loop

    def _run(self) -> None:
        while not self._stop_event.wait(LOOP_INTERVAL_S):
            try:
                self.tick(self._clock())
            except Exception:
                log.exception("server loop iteration failed")

    def tick(self, now: float) -> None:
        """One iteration of the server loop: retries, debounced events, channel health, job progress."""
        with self._lock:
            due = self._history.due(now)
        for key in due:
            log.info("retrying %r after its backoff", key)
            self._access.forget(key)
            self._submit(key)
        if self._debouncer is not None:
            for key in self._debouncer.due(now):
                self._examine_debounced(key, now)
        if self._watcher is not None and hasattr(self._watcher, "tick"):
            self._watcher.tick(time.monotonic())
        self._restart_dead_channels()
        if now >= self._next_job_sync:
            self._next_job_sync = now + JOB_SYNC_INTERVAL_S
            rows = self._sync_jobs(now)
            if rows is not None:
                self._maybe_rotate(now, rows)
        if now >= self._next_status_write and self._store is not None:
            self._next_status_write = now + STATUS_INTERVAL_S
            try:
                write_node_status(self._store, self.node, self.status(), now)
            except SmooshError as e:
                log.warning("could not write this node's status record: %s", e)

    def _examine_debounced(self, key: str, now: float) -> None:
        debouncer = self._debouncer
        if self._access.is_fresh(key):
            debouncer.result(key, True, now)
            return
        try:
            self.validate(key)
        except InvalidKey as e:
            log.debug("watcher event ignored: %s", e)
            debouncer.result(key, False, now)
            return
        self._submit(key, debounced=True)

    def _on_path(self, path: str) -> None:
        """Watcher callback: the hot path first, then the debouncer."""
        if self._access.is_fresh(path):
            self.counters.enqueue_stale += 1
            return
        if self._debouncer is not None:
            self._debouncer.event(path, self._clock())

    def _restart_dead_channels(self) -> None:
        for name, channel in list(self._channels.items()):
            if not channel.is_alive() and self._started:
                log.error("channel %s died; restarting it from its checkpoint", name)
                ch_cfg = self._config.channels.get(name)
                self._channels.pop(name, None)
                if ch_cfg is not None:
                    self._open_channel(name, ch_cfg)

    def _sync_jobs(self, now: float) -> list[tuple[Any, str, str, dict[str, Any]]] | None:
        """Mirror running jobs' progress into the history table (what /jobs shows).

        Returns the job rows read (None when the store could not be read).
        """
        if self._jobs is None:
            return None
        try:
            rows = self._jobs.list_jobs(self.job_type)
        except SmooshError as e:
            log.debug("could not read jobs: %s", e)
            return None
        with self._lock:
            runs_seen: dict[str, tuple[str, float]] = {}
            for _type, key, state, data in rows:
                if state != "running":
                    continue
                run_id = (data or {}).get("run_id")
                if isinstance(run_id, str):
                    seen = self._runs_seen.get(key)
                    runs_seen[key] = seen if seen is not None and seen[0] == run_id else (run_id, now)
                rec = self._history.get(key)
                if rec is None or rec.state != "running":
                    self._history.record(key, STARTED, now, channel=(data or {}).get("channel"))
                progress = (data or {}).get("progress")
                if isinstance(progress, (int, float)):
                    self._history.set_progress(key, float(progress), now)
            self._runs_seen = runs_seen
        return rows

    def _maybe_rotate(self, now: float, rows: list[tuple[Any, str, str, dict[str, Any]]]) -> None:
        """Rotation (DESIGN §5.6): every ``interval``, make way for work waiting on ``max_jobs``.

        When every slot is busy and some channel is in line for one, up to ``max_churn`` of
        the longest-running suspendable runs (chunked compactions, whose progress lives in
        the file; never a full VACUUM) that have held their slot for at least ``interval``
        are asked to stop at their next chunk boundary. Their channels queue them again, and
        the freed slots go to the channels that waited longest (:class:`SlotGate`).
        """
        cfg = self._config
        if self._next_rotation is None:
            self._next_rotation = now + cfg.interval_s
        if now < self._next_rotation or self._store is None:
            return
        self._next_rotation = now + cfg.interval_s
        running = {key: (data or {}) for _t, key, state, data in rows if state == "running"}
        self._clear_stale_rotations(running)
        waiting = self._slots.waiting()
        if cfg.max_churn <= 0 or not waiting or self._slots.busy < cfg.max_jobs:
            return
        waiting_keys = 0
        for name in waiting:
            channel = self._channels.get(name)
            if channel is not None:
                waiting_keys += int(channel.status()["waiting"]["size"])
        with self._lock:
            seen = dict(self._runs_seen)
        candidates = sorted(
            (since, key, run_id)
            for key, (run_id, since) in seen.items()
            if running.get(key, {}).get("run_id") == run_id
            and running[key].get("suspendable") is True
            and now - since >= cfg.interval_s
        )
        for since, key, run_id in candidates[: min(cfg.max_churn, waiting_keys)]:
            try:
                control.request_rotation(self._store, self.node, key, run_id)
            except SmooshError as e:
                log.warning("could not ask %r to make way for waiting work: %s", key, e)
                continue
            self.counters.rotations += 1
            log.info(
                "rotating %r out after %.0f s: channel(s) %s wait for a slot",
                key, now - since, ", ".join(waiting),
            )

    def _clear_stale_rotations(self, running: dict[str, dict[str, Any]]) -> None:
        """Drop rotation requests whose run has ended (a stopped or dead run never reads them)."""
        try:
            requests = control.rotation_requests(self._store, self.node)
            for key, run_id in requests.items():
                if running.get(key, {}).get("run_id") != run_id:
                    control.clear_rotation(self._store, self.node, key)
        except SmooshError as e:
            log.debug("could not clean rotation requests: %s", e)

    # ------------------------------------------------------------------ channels and config

    def _open_channel(self, name: str, ch_cfg: ChannelConfig) -> None:
        cfg = self._config
        channel = Channel(
            name,
            ch_cfg,
            jobs=self._jobs,
            job_type=self.job_type,
            priority_of=lambda key, _name=name: self._router.recheck(self._config, _name, key),
            on_job_done=self._on_job_done,
            on_hold=self._on_hold,
            acquire_slot=self._acquire_slot,
            release_slot=self._release_slot,
            state_dir=cfg.state_dir if (cfg.persist and self._state_dir_ok) else None,
            checkpoint_interval_s=cfg.checkpoint_interval_s,
            wait_s=cfg.wait_s,
            dry_run=self.dry_run,
            clock=self._clock,
        )
        if self._suspension.is_suspended(name):
            channel.suspend()
        channel.start()
        self._channels[name] = channel

    def apply_config(self, new: Config) -> None:
        """Apply a valid new config live: channels created, closed (with checkpoint) or retuned."""
        old = self._config
        self._restart_required = old.restart_keys_changed(new)
        if self._restart_required:
            log.warning("config keys changed that need a restart: %s", ", ".join(self._restart_required))
        self._config = new
        self._config_error = None
        self._slots.limit = new.max_jobs
        with self._lock:
            self._history.configure(
                max_history=new.max_history,
                health_threshold_s=new.health_threshold_s,
                backoff_base_s=new.backoff_base_s,
            )
        self._access.set_staleness(new.staleness_s)
        if self._debouncer is not None:
            self._debouncer.set_recheck_interval(new.recheck_interval_s)
        for name in list(self._channels):
            if name not in new.channels:
                log.info("channel %s removed from the config; closing it", name)
                channel = self._channels.pop(name)
                _quietly(lambda: channel.close(checkpoint=True))
                # Its running jobs finish; a hold left on them would pause them forever.
                _quietly(lambda: self._on_hold(name, False))
        for name, ch_cfg in new.channels.items():
            channel = self._channels.get(name)
            if channel is None:
                log.info("channel %s added by the config", name)
                self._open_channel(name, ch_cfg)
            else:
                channel.update_settings(ch_cfg)
        if self._watcher is not None and hasattr(self._watcher, "request_full_scan"):
            # Periodic rescans report only changed files; the new config may price an
            # unchanged one differently (a new channel, an upgrade target), so look at all.
            self._watcher.request_full_scan()
        log.info("config reloaded: %d channel(s)", len(self._channels))

    def reload_config(self) -> None:
        """Re-read the config file now (SIGHUP); an invalid file is rejected whole."""
        from smoosh.config import load_config

        if self._config.path is None:
            return
        try:
            self._on_config_change(load_config(self._config.path))
        except ConfigError as e:
            self._on_config_change(e)

    def _on_config_change(self, result: Config | ConfigError) -> None:
        if isinstance(result, ConfigError):
            self._config_error = str(result)
            log.error("config edit rejected, the previous config stays in force: %s", result)
            return
        try:
            self.apply_config(result)
        except Exception as e:
            self._config_error = f"could not apply config: {e}"
            log.exception("could not apply the new config")

    # ------------------------------------------------------------------ helpers

    def _start_watcher(self, cfg: Config) -> None:
        if not cfg.watch:
            return
        from smoosh.daemon.debounce import Debouncer
        from smoosh.daemon.watcher import Watcher

        self._debouncer = Debouncer(quiet_s=1.0, recheck_interval_s=cfg.recheck_interval_s)
        self._watcher = Watcher(
            list(cfg.watch),
            self._on_path,
            rescan_interval_s=cfg.rescan_interval_s,
            exclude=self._is_own_path,
        )
        self._watcher.start()

    def _is_own_path(self, path: str) -> bool:
        return any(path == own or _inside(path, own) for own in self._own_paths)

    def _compute_own_paths(self, cfg: Config) -> tuple[str, ...]:
        own = [os.path.realpath(cfg.state_dir)]
        scheme, _, rest = cfg.store.partition(":")
        if scheme == "sqlite" and rest:
            db = os.path.realpath(rest)
            own += [db, db + "-wal", db + "-shm", db + "-journal"]
        return tuple(own)

    def _check_state_dir(self) -> None:
        from persist import check_setup

        state_dir = self._config.state_dir
        try:
            os.makedirs(state_dir, exist_ok=True)
            check_setup(state_dir)
            self._state_dir_ok = True
        except Exception as e:
            self._state_dir_ok = False
            log.error("queues will not be checkpointed: %s", e)


def _inside(path: str, root: str) -> bool:
    """Whether ``path`` is ``root`` or below it (both absolute, canonical).

    A string test: both are canonical, so no ``..`` or doubled slash can fool it, and it
    costs a tenth of ``os.path.commonpath`` on the enqueue path. ``/data2`` is not inside
    ``/data``: the prefix includes the separator.
    """
    return path == root or path.startswith(root.rstrip("/") + "/")


def _quietly(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception:
        log.exception("error while stopping")
