"""``smoosh run`` and ``smoosh worker``: the daemon and stand-alone workers in the foreground."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import select
import signal
import sys
import threading
import time
from typing import Any

from smoosh.compactors import sqlite_guard
from smoosh.cli.format import status_summary
from smoosh.cpusched import apply_cpu_scheduling
from smoosh.threadnames import name_threads_for_kernel
from smoosh.errors import ConfigError, SmooshError

log = logging.getLogger("smoosh")

#: Longest the main thread sleeps without looking for a signal's handler to run: a net only, since
#: every signal wakes it through its wakeup pipe (:func:`_sleep_until_signalled`).
SIGNAL_CHECK_INTERVAL_S = 60.0
#: Environment variable holding the log level of ``run`` and ``worker``.
LOG_LEVEL_ENV = "SMOOSH_LOG_LEVEL"
#: Seconds between two STATUS= summaries sent to systemd (only sent when the text changed).
STATUS_NOTIFY_INTERVAL_S = 5.0


def cmd_run(args: argparse.Namespace) -> int:
    """``smoosh run``: the daemon in the foreground until SIGTERM/SIGINT; SIGHUP re-reads the config.

    Under systemd (``Type=notify``) it reports READY=1 once serving, a STATUS= summary, WATCHDOG=1
    pings from this main loop at half ``WatchdogSec``, and STOPPING=1 when it begins to stop.
    """
    from smoosh.cli import systemd
    from smoosh.config.checks import check_directories, check_store
    from smoosh.daemon.server import Server

    config = _load_config_and_log(args.config)
    # Before any thread starts, so that every thread of the daemon inherits the policy and
    # gives the kernel its name.
    apply_cpu_scheduling(config.cpu_scheduling)
    name_threads_for_kernel()
    if args.watch:
        _check_watch_option(args.watch)
    else:
        check_directories(config)
    config = _override(config, store=args.store, http=args.http, watch=args.watch)
    check_store(config, option="--store" if args.store else None)
    _check_http_token(config, overridden=args.http is not None)
    server = Server(config, workers=args.workers, dry_run=args.dry_run, reset_store=args.reset_store)
    # The lock, then the admin socket, before anything starts: a second daemon or a taken port
    # stops the start-up at once, as one line. The API serves only once every channel has
    # restored its checkpoint.
    server.claim_state_dir()
    admin = _bind_admin(server, config.http) if config.http else None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, lambda *_: threading.Thread(target=_reload, args=(server,), daemon=True).start())
    try:
        server.start()
    except BaseException:
        if admin is not None:
            admin.stop()
        raise
    try:
        if admin is not None:
            admin.start()
            log.info("admin API on http://%s", admin.address)
            # The address a new user opens (the page is served whenever the API is).
            log.info("the operators' page: open http://%s/ in a browser", admin.address)
        log.info("effective config: %s", config.describe() if hasattr(config, "describe") else config.path)
        if not sqlite_guard.installed():
            log.warning("%s.", sqlite_guard.NOT_BUILT)
        systemd.ready()
        _wait_for_stop(server, stop)
    finally:
        systemd.stopping()
        if admin is not None:
            admin.stop()
        server.stop()
    return 0


def _bind_admin(server: Any, address: str) -> Any:
    """The admin API bound to ``address`` (not serving yet).

    Raises:
        SmooshError: the address cannot be listened on (taken, not this host's), naming it.
    """
    from smoosh.daemon.api.http import AdminServer

    try:
        return AdminServer(server, address)
    except OSError as e:
        raise SmooshError(f"cannot listen on {address} for the admin API: {e.strerror or e}") from None


def _wait_for_stop(server: Any, stop: threading.Event) -> None:
    """Sleep until SIGTERM/SIGINT; under systemd, send watchdog pings and STATUS= summaries meanwhile.

    Pings come from this loop, not a side thread: a hung loop must stop them (systemd then
    restarts us). Outside systemd nothing here wakes until the signal.
    """
    from smoosh.cli import systemd

    if not systemd.enabled():
        _sleep_until_signalled(stop)
        return
    watchdog_s = systemd.watchdog_interval_s()
    ping_every_s = watchdog_s / 2 if watchdog_s else None
    wait_s = min(STATUS_NOTIFY_INTERVAL_S, ping_every_s) if ping_every_s else STATUS_NOTIFY_INTERVAL_S
    next_ping = next_status = 0.0
    last_status = ""
    while True:
        now = time.monotonic()
        if ping_every_s is not None and now >= next_ping:
            systemd.watchdog_ping()
            next_ping = now + ping_every_s
        if now >= next_status:
            next_status = now + STATUS_NOTIFY_INTERVAL_S
            try:
                text = status_summary(server.status())
            except Exception:  # a summary is cosmetic: never let it end the daemon
                log.exception("could not summarise the status for systemd")
                text = last_status
            if text != last_status:
                systemd.status(text)
                last_status = text
        if stop.wait(wait_s):
            return


def _sleep_until_signalled(stop: threading.Event) -> None:
    """Sleep on the main thread until ``stop`` is set by a signal's handler, waking for nothing else.

    The kernel may hand SIGTERM/SIGINT to any thread, and Python runs the handler (which sets
    ``stop``) only when the main thread next runs bytecode: a main thread asleep on a lock would
    sleep through it. So it sleeps on a pipe that the interpreter's C-level handler writes the
    signal's number to, from whichever thread received it (``signal.set_wakeup_fd``); the next
    Python call after the wake (``stop.is_set``) runs the handler. An idle daemon's main thread
    then costs no wake-up a second. Main thread only (``set_wakeup_fd``'s rule).
    """
    read_fd, write_fd = os.pipe()
    for fd in (read_fd, write_fd):
        os.set_blocking(fd, False)
    previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    try:
        while not stop.is_set():
            select.select([read_fd], [], [], SIGNAL_CHECK_INTERVAL_S)
            try:
                while os.read(read_fd, 512):
                    pass
            except BlockingIOError:
                pass
    finally:
        signal.set_wakeup_fd(previous)
        os.close(read_fd)
        os.close(write_fd)


def _reload(server: Any) -> None:
    """SIGHUP: re-read the config, telling systemd a reload is in progress until it is done."""
    from smoosh.cli import systemd

    systemd.reloading()
    try:
        server.reload_config()
    finally:
        systemd.ready()


def _check_watch_option(directories: list[str]) -> None:
    """Every ``--watch`` directory must exist, as the config's ``watch`` must.

    Raises:
        ConfigError: ``--watch '/srv/dbz': no such directory``.
    """
    for directory in directories:
        if not os.path.isdir(directory):
            raise ConfigError(f"--watch {directory!r}: no such directory", key="watch", value=directory)


def _check_http_token(config: Any, *, overridden: bool) -> None:
    """An off-loopback admin API needs a token (``--http`` bypasses the config file's own check).

    Raises:
        ConfigError: naming ``http`` and ``token``.
    """
    from smoosh.daemon.api.http import is_loopback, parse_address

    if not config.http or config.token:
        return
    try:
        host, _port = parse_address(config.http)
    except ValueError as e:
        raise ConfigError(f"--http {config.http!r}: {e}", key="http", value=config.http) from None
    if not is_loopback(host):
        where = "--http" if overridden else f"{config.path or 'defaults'}: [smoosh] http"
        raise ConfigError(
            f"{where} = {config.http!r}: binding off loopback needs [smoosh] token",
            path=config.path, section="smoosh", key="http", value=config.http,
        )


def cmd_worker(args: argparse.Namespace) -> int:
    """``smoosh worker``: workers for this node's job type, in their own process."""
    from smoosh.cli.argtypes import private_store
    from smoosh.daemon.run.worker_process import run_worker_process

    config = _load_config_and_log(args.config)
    apply_cpu_scheduling(config.cpu_scheduling)
    name_threads_for_kernel()
    if not args.store and private_store(config.store):
        # A memory store lives inside one process: this worker's would never hold the daemon's jobs.
        raise ConfigError(
            f"{config.path or 'defaults'}: [smoosh] store = {config.store!r}: smoosh worker cannot share a memory: "
            "store with the daemon (each process has its own); use sqlite:PATH or fdb:, or pass --store",
            path=config.path, section="smoosh", key="store", value=config.store)
    return run_worker_process(config, args.store or config.store, args.concurrency)


def _load_config_and_log(path: str | None) -> Any:
    """Set up the log on stderr, load the config, switch the log to its ``log_format``, log its warnings.

    The warnings are logged after the switch, so with ``log_format = json`` every line is JSON.
    Only a missing default config file logs before it (and then the format is the default).

    Raises:
        ConfigError: an invalid config.
        SmooshError: a ``$SMOOSH_LOG_LEVEL`` that names no level.
    """
    from smoosh import logs
    from smoosh.config import load_config

    level = os.environ.get(LOG_LEVEL_ENV, "INFO")
    try:
        logs.setup(level, stream=sys.stderr)
    except ValueError:
        raise SmooshError(f"{LOG_LEVEL_ENV}={level!r}: must be DEBUG, INFO, WARNING or ERROR") from None
    config = load_config(path, log_warnings=False)
    logs.set_format(config.log_format)
    for warning in config.warnings:
        logging.getLogger("smoosh.config").warning("%s", warning)
    return config


def _override(config: Any, *, store: str | None, http: str | None, watch: list[str] | None) -> Any:
    changes: dict[str, Any] = {}
    if store:
        changes["store"] = store
    if http is not None:
        changes["http"] = http
    if watch:
        dirs = tuple(os.path.realpath(w) for w in watch)
        changes["watch"] = dirs
        # Keys must lie in roots; a directory watched from the command line is a root too.
        changes["roots"] = tuple(dict.fromkeys(tuple(config.roots) + dirs))
    return dataclasses.replace(config, **changes) if changes else config
