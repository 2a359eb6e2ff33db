"""``smoosh worker``: a worker in a process of its own, beside (or instead of) the daemon's.

It runs the jobs of one node's job type from a shared store; holds and rotation requests
reach it through the store (:mod:`smoosh.daemon.control.control`), and a clean stop puts its
interrupted jobs back to pending for another worker.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

from smoosh.config import Config
from smoosh.daemon.run.worker import STOP_TIMEOUT_S, Worker

__all__ = ["run_worker_process"]

log = logging.getLogger(__name__)


def run_worker_process(config: Config, store_url: str | None = None, concurrency: int | None = None) -> int:
    """``smoosh worker``: run jobs of the config's node until SIGTERM/SIGINT, then stop cleanly.

    Parameters:
        config: smoosh's ``Config`` (``node``, ``job_timeout_s``, ``sqlite``, ``store``,
            ``roots``, ``wal_max_size_bytes``, ``exact_size_interval_s``, ``max_io_rate_bytes_per_s``,
            ``io_priority``; read once: this process does not reload its config).
        store_url: the store (default: the config's ``store``).
        concurrency: jobs at once (default 1).

    Returns:
        The exit code: 0 after a clean stop.
    """
    from smoosh.compactors import load_compactors
    from smoosh.daemon.control.node_claim import Identity
    from smoosh.disk_room import DiskRoom
    from smoosh.io_budget import IoBudget
    from smoosh.jobs import Jobs
    from smoosh.store import open_store

    node = config.node
    job_timeout_s = config.job_timeout_s
    store = open_store(store_url or config.store)
    jobs = Jobs(store)
    stop = threading.Event()
    previous: dict[signal.Signals, object] = {}
    try:
        job_type = "smoosh:" + node
        jobs.set_type_timeout(job_type, job_timeout_s)
        # This process's own budget: max_io_rate is per process (DESIGN §11).
        io_budget = IoBudget(config.max_io_rate_bytes_per_s)
        io_priority = config.io_priority
        # Its own disk reservations too: what it reserves, a daemon beside it cannot see.
        disk_room = DiskRoom(config.min_free_space)
        compactors = load_compactors(config.sqlite, roots=config.roots, io_budget=io_budget, disk_room=disk_room,
                                     wal_max_size_bytes=config.wal_max_size_bytes,
                                     exact_size_interval_s=config.exact_size_interval_s)
        roots = tuple(config.roots) or None
        worker = Worker(jobs, store, job_type, compactors, node=node, job_timeout_s=job_timeout_s,
                        concurrency=concurrency or 1, signals="store", roots=lambda: roots,
                        io_budget=io_budget, io_priority=lambda: io_priority,
                        # Named in every heartbeat: a restarting daemon follows its jobs while it lives
                        # (on this host: while its process does, however late its heartbeat).
                        holder=Identity.of_this_process().holder)

        def on_signal(signum: int, frame: FrameType | None) -> None:
            stop.set()

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, on_signal)
        worker.start()
        log.info("Worker for %r running %d job(s) at once.", job_type, worker.concurrency)
        stop.wait()
        log.info("Stopping the worker for %r.", job_type)
        worker.stop(STOP_TIMEOUT_S - 1.0)
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        jobs.close()
        store.close()
