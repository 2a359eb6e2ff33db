"""smoosh's configuration: a CouchDB-compatible ini file read into frozen dataclasses.

An operator can paste CouchDB's ``[smoosh]``, ``[smoosh.<channel>]`` and ``[smoosh.ignore]``
sections. Parsed with configparser, ``interpolation=None`` (a ``%`` in a token or path is
literal) and case-sensitive keys (``[smoosh.ignore]`` keys are paths). ``[smoosh.ignore]``
and ``[smoosh.sqlite]`` are reserved, not channels. Every value is validated at load time:
a bad one raises ``ConfigError`` whose message names file, section, key and value, so an
invalid number is never discovered at enqueue time. Unknown keys and sections are not
errors (a pasted CouchDB config has some) but are warned about by name, in
``Config.warnings`` and the log.

Differences from CouchDB, on purpose: a channel list that is set replaces the default list
and is tried in the order written (CouchDB merges its built-ins back in and sorts,
apache/couchdb#4378); a built-in channel's ``priority`` key wins over its name; malformed
values are errors, not silent defaults. Where these make a file behave otherwise than in
CouchDB (a channel an earlier one shadows, built-ins left out, a built-in's method
overridden), or an ignore entry is a CouchDB name rather than a path, it is warned about
(:mod:`smoosh.config.fidelity`).
"""

from __future__ import annotations

import configparser
import logging
import os
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from smoosh.config.defaults import (
    DEFAULT_CONFIG_PATH, CONFIG_ENV, DEFAULTS_NAME, GLOBAL_SECTION,
    DEFAULT_DB_CHANNELS, DEFAULT_VIEW_CHANNELS, DEFAULT_CLEANUP_CHANNELS,
    DEFAULT_STALENESS_S, DEFAULT_PERSIST, DEFAULT_STATE_DIR, DEFAULT_WAIT_S,
    DEFAULT_CHECKPOINT_INTERVAL_S, DEFAULT_ACCESS_MAX_SIZE, DEFAULT_COMPACTION_LOG_LEVEL,
    DEFAULT_LOG_FORMAT, DEFAULT_STORE, DEFAULT_WATCH, DEFAULT_HTTP,
    DEFAULT_HEALTH_THRESHOLD_S, DEFAULT_BACKOFF_BASE_S, DEFAULT_BUSY_RETRIES, DEFAULT_MAX_HISTORY,
    DEFAULT_JOB_TIMEOUT_S, DEFAULT_MAX_JOBS, DEFAULT_INTERVAL_S, DEFAULT_MAX_CHURN, DEFAULT_RECHECK_INTERVAL_S,
    DEFAULT_EXACT_SIZE_INTERVAL_S, DEFAULT_RESCAN_INTERVAL_S, DEFAULT_WAL_MAX_SIZE_BYTES,
    DEFAULT_MAX_IO_RATE, DEFAULT_IO_PRIORITY, DEFAULT_CPU_SCHEDULING, GLOBAL_KEYS, MIN_TOKEN_BYTES, RESTART_KEYS,
    DEFAULT_MIN_JOBS, DEFAULT_BACKLOG_FULL_BYTES, DEFAULT_BATCH_MAX_SIZE_BYTES,
)
from smoosh.config.fidelity import dropped_builtin_warnings, ignore_warnings, shadow_warnings
from smoosh.config.ini import ini_parser, read_sections
from smoosh.config.layout import channel_kinds, channel_list, global_warnings
from smoosh.config.sections import CHANNEL_KEYS, SQLITE_KEYS, ChannelConfig, SqliteConfig, parse_ignore
from smoosh.config.values import (
    SectionReader,
    is_loopback_host,
    parse_bool,
    parse_duration_at_least,
    parse_http,
    parse_int,
    parse_io_priority,
    parse_cpu_scheduling,
    parse_io_rate,
    parse_list,
    parse_log_format,
    parse_log_level,
    parse_node,
    parse_store,
    parse_threshold_size,
    resolve_glob,
    resolve_path,
    split_host_port,
    static_prefix,
)
from smoosh.disk_room import DEFAULT_DISK_PRESSURE, DEFAULT_MIN_FREE, MinFree, parse_disk_pressure, parse_min_free
from smoosh.errors import ConfigError
from smoosh.units import format_duration, format_size

__all__ = [
    "Config",
    "ChannelConfig",
    "SqliteConfig",
    "load_config",
    "parse_config",
    "GLOBAL_KEYS",
    "CHANNEL_KEYS",
    "SQLITE_KEYS",
    "RESTART_KEYS",
    "DEFAULT_CONFIG_PATH",
    "AdminAddress",
    "read_admin_address",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Config:
    """The effective configuration. Durations are seconds, sizes bytes, paths absolute.

    ``channels`` maps every channel of the three lists, in list order, to its settings
    (treat it as read-only). ``path`` is the file read, or None for the defaults.
    """

    path: str | None
    db_channels: tuple[str, ...]
    view_channels: tuple[str, ...]
    cleanup_channels: tuple[str, ...]
    staleness_s: float
    persist: bool
    state_dir: str
    wait_s: float
    checkpoint_interval_s: float
    access_max_size: int
    compaction_log_level: str
    log_format: str
    store: str
    watch: tuple[str, ...]
    roots: tuple[str, ...]
    node: str
    http: str
    token: str | None
    health_threshold_s: float
    backoff_base_s: float
    max_history: int
    job_timeout_s: float
    max_jobs: int
    interval_s: float
    max_churn: int
    recheck_interval_s: float
    exact_size_interval_s: float
    rescan_interval_s: float
    wal_max_size_bytes: int
    max_io_rate_bytes_per_s: float | None
    io_priority: str
    channels: dict[str, ChannelConfig] = field(compare=True)
    busy_retries: int = DEFAULT_BUSY_RETRIES
    #: CPU policy of ``smoosh run`` and ``smoosh worker`` (smoosh.cpusched); set at their start only.
    cpu_scheduling: str = DEFAULT_CPU_SCHEDULING
    ignore: tuple[str, ...] = ()
    sqlite: SqliteConfig = field(default_factory=SqliteConfig)
    #: Roots whose databases may have other hard links, or lie on another mount (smoosh.identity).
    allow_hard_links: tuple[str, ...] = ()
    allow_mounts: tuple[str, ...] = ()
    #: Room kept free on each file system beside what compactions reserve (smoosh.disk_room).
    min_free_space: MinFree = DEFAULT_MIN_FREE
    #: A file system used past this (0-1) is under disk pressure; None: never (smoosh.daemon.control.pressure).
    disk_pressure: float | None = DEFAULT_DISK_PRESSURE
    #: The backlog controller's bounds (smoosh.daemon.control.backlog): the fewest slots, and the
    #: reclaimable bytes waiting at which all of max_jobs run.
    min_jobs: int = DEFAULT_MIN_JOBS
    backlog_full_bytes: int = DEFAULT_BACKLOG_FULL_BYTES
    #: Databases up to this size are compacted in batches (smoosh.daemon.run.batch); 0: none.
    batch_max_size_bytes: int = DEFAULT_BATCH_MAX_SIZE_BYTES
    #: Compactions running at once on all the nodes of the store together (None: no such cap;
    #: smoosh.daemon.control.cluster_cap).
    cluster_max_jobs: int | None = None
    warnings: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def default(cls, *, cwd: str | None = None) -> Config:
        """The configuration with every key at its default (``path`` None).

        Parameters
        ----------
        cwd:
            The directory relative defaults resolve against; None = the working directory.

        Returns
        -------
        The default config.
        """
        return cls.from_sections({}, path=None, cwd=cwd)

    @classmethod
    def from_sections(
        cls,
        sections: Mapping[str, Mapping[str, str]],
        *,
        path: str | None,
        cwd: str | None = None,
    ) -> Config:
        """Build and validate a config from raw ini sections.

        Parameters
        ----------
        sections:
            Section name -> raw ``key -> value`` (as configparser reads them).
        path:
            The file they came from (None for none), kept in ``Config.path`` and named in
            messages.
        cwd:
            The directory relative paths resolve against; None = the working directory.

        Returns
        -------
        The config; doubtful but valid settings are listed in ``warnings``.

        Raises
        ------
        ConfigError
            Any invalid value, channel list, or an off-loopback ``http`` without ``token``.
        """
        where = path if path is not None else DEFAULTS_NAME
        cwd = os.getcwd() if cwd is None else cwd
        warnings: list[str] = []
        r = SectionReader(where, GLOBAL_SECTION, sections.get(GLOBAL_SECTION, {}))

        lists = {}
        for key, default in (("db_channels", DEFAULT_DB_CHANNELS), ("view_channels", DEFAULT_VIEW_CHANNELS),
                             ("cleanup_channels", DEFAULT_CLEANUP_CHANNELS)):
            lists[key] = channel_list(r, key, default)
        kinds = channel_kinds(r, lists)

        channels: dict[str, ChannelConfig] = {}
        for name, kind in kinds.items():
            section = sections.get(f"{GLOBAL_SECTION}.{name}", {})
            channels[name] = ChannelConfig.from_section(name, kind, section, path=where, cwd=cwd, warnings=warnings)

        # Like the channel lists, a present but empty watch means "none" (enqueue by API only).
        r.used.add("watch")
        if "watch" in r.values:
            watch = tuple(resolve_glob(p, cwd) for p in parse_list(r.values["watch"]))
        else:
            watch = tuple(resolve_glob(p, cwd) for p in DEFAULT_WATCH)
        default_roots = _unique(static_prefix(entry) for entry in watch)
        roots = r.get("roots", lambda text: _unique(resolve_path(p, cwd) for p in parse_list(text)), default_roots)
        opt_ins = {key: r.get(key, lambda text: _unique(resolve_path(p, cwd) for p in parse_list(text)), ())
                   for key in ("allow_hard_links", "allow_mounts")}
        for key, dirs in opt_ins.items():
            for d in dirs:
                if d not in roots:
                    raise r.error(key, ", ".join(dirs), f"{d} is not one of roots ({', '.join(roots) or 'none'})")
        http = r.get("http", parse_http, DEFAULT_HTTP)
        token = r.raw("token")
        if token is None and "token" in r.values:
            # Written but blank (empty, or spaces that the ini format strips): the operator meant
            # a token, and silently running without one would leave every POST open.
            raise r.error("token", r.values["token"], "empty: a token must be a long random string (at least "
                                                      f"{MIN_TOKEN_BYTES} bytes); remove the line for no token")
        if token is None and not is_loopback_host(split_host_port(http)[0]):
            raise r.error("http", http, f"binding off loopback needs [{GLOBAL_SECTION}] token")
        if token is not None and len(token.encode("utf-8")) < MIN_TOKEN_BYTES:
            # Printed as its length only: the value is a secret, even a bad one.
            raise r.error("token", f"<{len(token.encode('utf-8'))} bytes, not shown>",
                          f"a token must be at least {MIN_TOKEN_BYTES} bytes: a long random string")

        values: dict[str, Any] = dict(
            path=path,
            db_channels=lists["db_channels"],
            view_channels=lists["view_channels"],
            cleanup_channels=lists["cleanup_channels"],
            staleness_s=r.get("staleness", parse_duration_at_least(60.0, 0.0), DEFAULT_STALENESS_S),
            persist=r.get("persist", parse_bool, DEFAULT_PERSIST),
            state_dir=r.get("state_dir", lambda text: resolve_path(text, cwd), resolve_path(DEFAULT_STATE_DIR, cwd)),
            wait_s=r.get("wait_secs", parse_duration_at_least(1.0, 0.0), DEFAULT_WAIT_S),
            checkpoint_interval_s=r.get("checkpoint_interval", parse_duration_at_least(1.0, 0.0, strict=True),
                                        DEFAULT_CHECKPOINT_INTERVAL_S),
            access_max_size=r.get("access_max_size", parse_int(0), DEFAULT_ACCESS_MAX_SIZE),
            compaction_log_level=r.get("compaction_log_level", parse_log_level, DEFAULT_COMPACTION_LOG_LEVEL),
            log_format=r.get("log_format", parse_log_format, DEFAULT_LOG_FORMAT),
            store=r.get("store", lambda text: parse_store(text, cwd), parse_store(DEFAULT_STORE, cwd)),
            watch=watch,
            roots=roots,
            allow_hard_links=opt_ins["allow_hard_links"],
            allow_mounts=opt_ins["allow_mounts"],
            node=r.get("node", parse_node, parse_node(socket.gethostname())),
            http=http,
            token=token,
            health_threshold_s=r.get("health_threshold", parse_duration_at_least(1.0, 0.0, strict=True),
                                     DEFAULT_HEALTH_THRESHOLD_S),
            backoff_base_s=r.get("backoff_base", parse_duration_at_least(1.0, 0.0), DEFAULT_BACKOFF_BASE_S),
            max_history=r.get("max_history", parse_int(0), DEFAULT_MAX_HISTORY),
            busy_retries=r.get("busy_retries", parse_int(0), DEFAULT_BUSY_RETRIES),
            job_timeout_s=r.get("job_timeout", parse_duration_at_least(1.0, 0.0, strict=True), DEFAULT_JOB_TIMEOUT_S),
            max_jobs=r.get("max_jobs", parse_int(1), DEFAULT_MAX_JOBS),
            min_jobs=r.get("min_jobs", parse_int(1), DEFAULT_MIN_JOBS),
            cluster_max_jobs=r.get("cluster_max_jobs", parse_int(1), None),
            backlog_full_bytes=int(r.get("backlog_full", parse_threshold_size(allow_infinity=False),
                                         DEFAULT_BACKLOG_FULL_BYTES)),
            interval_s=r.get("interval", parse_duration_at_least(1.0, 0.0, strict=True), DEFAULT_INTERVAL_S),
            max_churn=r.get("max_churn", parse_int(0), DEFAULT_MAX_CHURN),
            recheck_interval_s=r.get("recheck_interval", parse_duration_at_least(1.0, 0.0), DEFAULT_RECHECK_INTERVAL_S),
            exact_size_interval_s=r.get("exact_size_interval", parse_duration_at_least(1.0, 0.0, strict=True),
                                        DEFAULT_EXACT_SIZE_INTERVAL_S),
            rescan_interval_s=r.get("rescan_interval", parse_duration_at_least(1.0, 0.0, strict=True),
                                    DEFAULT_RESCAN_INTERVAL_S),
            wal_max_size_bytes=int(r.get("wal_max_size", parse_threshold_size(allow_infinity=False),
                                         DEFAULT_WAL_MAX_SIZE_BYTES)),
            batch_max_size_bytes=int(r.get("batch_max_size", parse_threshold_size(allow_infinity=False),
                                           DEFAULT_BATCH_MAX_SIZE_BYTES)),
            max_io_rate_bytes_per_s=r.get("max_io_rate", parse_io_rate, DEFAULT_MAX_IO_RATE),
            min_free_space=r.get("min_free_space", parse_min_free, DEFAULT_MIN_FREE),
            disk_pressure=r.get("disk_pressure", parse_disk_pressure, DEFAULT_DISK_PRESSURE),
            io_priority=r.get("io_priority", parse_io_priority, DEFAULT_IO_PRIORITY),
            cpu_scheduling=r.get("cpu_scheduling", parse_cpu_scheduling, DEFAULT_CPU_SCHEDULING),
            channels=channels,
            ignore=parse_ignore(sections.get(f"{GLOBAL_SECTION}.ignore", {}), path=where, cwd=cwd),
            sqlite=SqliteConfig.from_section(sections.get(f"{GLOBAL_SECTION}.sqlite", {}), path=where,
                                             warnings=warnings),
        )
        if values["min_jobs"] > values["max_jobs"]:
            raise r.error("min_jobs", r.raw("min_jobs") or "", f"must be at most max_jobs ({values['max_jobs']})")
        warnings[:0] = global_warnings(r, sections, kinds)
        warnings.extend(_fidelity_warnings(where, sections, r.values.get("db_channels"), lists, channels,
                                           values["sqlite"], cwd=cwd, roots=roots))
        return cls(**values, warnings=tuple(warnings))

    def http_host_port(self) -> tuple[str, int]:
        """The admin API address as ``(host, port)``; an IPv6 host without brackets."""
        return split_host_port(self.http)

    def restart_keys_changed(self, other: Config) -> list[str]:
        """The restart-only keys whose value differs between ``self`` and ``other``.

        Parameters
        ----------
        other:
            The other config (typically the freshly reloaded one).

        Returns
        -------
        Names among ``store``, ``http``, ``node``, ``state_dir`` and ``cpu_scheduling``, in that
        order: every other key applies live.
        """
        return [key for key in RESTART_KEYS if getattr(self, key) != getattr(other, key)]

    def describe(self) -> str:
        """A one-line summary of the effective config, for the INFO log at start-up."""
        lists = []
        for kind, names in (("db", self.db_channels), ("view", self.view_channels),
                            ("cleanup", self.cleanup_channels)):
            if names:
                parts = [f"{n}({self.channels[n].priority})" for n in names]
                lists.append(f"{kind}=" + ",".join(parts))
        return (
            f"config {self.path or DEFAULTS_NAME}: node={self.node} store={self.store} http={self.http}"
            f"{' (token set)' if self.token else ''} watch={','.join(self.watch) or '-'}"
            f" channels {' '.join(lists) or '-'} max_jobs={self.max_jobs}"
            f" staleness={format_duration(self.staleness_s)} persist={'on' if self.persist else 'off'}"
            f" state_dir={self.state_dir} ignore={len(self.ignore)}"
            f" wal_max_size={format_size(self.wal_max_size_bytes)}"
            f" max_io_rate={'infinity' if self.max_io_rate_bytes_per_s is None else format_size(self.max_io_rate_bytes_per_s) + '/s'}"
            f" io_priority={self.io_priority} cpu_scheduling={self.cpu_scheduling}"
        )


def _fidelity_warnings(where: str, sections: Mapping[str, Mapping[str, str]], written_db_channels: str | None,
                       lists: Mapping[str, tuple[str, ...]], channels: Mapping[str, ChannelConfig],
                       sqlite: SqliteConfig, *, cwd: str, roots: tuple[str, ...]) -> list[str]:
    """Where this file does otherwise than CouchDB would, or than it seems to say (``smoosh.config.fidelity``)."""
    builtins = {name: channels.get(name) or _unlisted_builtin(name, sections, where=where, cwd=cwd)
                for name in DEFAULT_DB_CHANNELS}
    return [
        *shadow_warnings(where, lists, channels),
        *dropped_builtin_warnings(where, None if written_db_channels is None else written_db_channels.strip(),
                                  lists["db_channels"], channels, builtins, sqlite),
        *ignore_warnings(where, sections.get(f"{GLOBAL_SECTION}.ignore", {}), cwd=cwd, roots=roots),
    ]


def _unlisted_builtin(name: str, sections: Mapping[str, Mapping[str, str]], *, where: str, cwd: str) -> ChannelConfig:
    """A built-in db channel the lists leave out, as CouchDB would read it: its own section, else the defaults.

    The section is not in force here (it is warned about as ignored), so a bad value in it is
    no error: the defaults stand in for it.
    """
    try:
        return ChannelConfig.from_section(name, "db", sections.get(f"{GLOBAL_SECTION}.{name}", {}), path=where,
                                          cwd=cwd, warnings=[])
    except ConfigError:
        return ChannelConfig.from_section(name, "db", {}, path=where, cwd=cwd, warnings=[])


def _unique(items: Iterable[str]) -> tuple[str, ...]:
    out: list[str] = []
    for item in items:
        if item not in out:
            out.append(item)
    return tuple(out)


def parse_config(text: str, path: str | None, *, cwd: str | None = None, log_warnings: bool = True) -> Config:
    """Parse config text (the contents of ``path``).

    Parameters
    ----------
    text:
        The ini text.
    path:
        Where it came from: kept in ``Config.path`` and named in every message.
    cwd:
        The directory relative paths resolve against; None = the working directory.
    log_warnings:
        Also log the warnings (False for a caller that shows them itself, such as
        ``smoosh config check``, so each is shown once).

    Returns
    -------
    The config. Its warnings are also logged unless ``log_warnings`` is False.

    Raises
    ------
    ConfigError
        Unparseable text, or any invalid section, key or value.
    """
    where = path if path is not None else DEFAULTS_NAME
    config = Config.from_sections(read_sections(text, where), path=path, cwd=cwd)
    if log_warnings:
        for warning in config.warnings:
            log.warning("%s", warning)
    return config


@dataclass(frozen=True)
class AdminAddress:
    """Where the daemon's admin API is, read from a config file: all the CLI needs to reach it.

    Attributes:
        http: ``host:port`` of the admin API.
        token: the bearer token for POSTs, or None.
        problem: the config file's error, when it has one (the address was then read on its
            own, leniently); None for a valid file.
        state_dir: the daemon's ``state_dir`` (absolute), where its instance lock says whether
            it runs; read leniently too.
    """

    http: str
    token: str | None
    problem: str | None = None
    state_dir: str | None = None


def read_admin_address(path: str | None = None) -> AdminAddress:
    """The ``http``, ``token`` and ``state_dir`` of a config file, even when the file has errors elsewhere.

    An operator must never be locked out of a running daemon by a bad edit of its config
    (the daemon keeps the previous config and shows the error). So a file that does not
    load whole is read again for ``[smoosh] http`` and ``token`` alone; a value that does not
    parse there gives the default address.

    Parameters:
        path: the file (None: ``$SMOOSH_CONFIG``, else ``conf/smoosh.ini``, as for ``load_config``).

    Returns:
        The address, with the file's error in ``problem`` when it has one.

    Raises:
        ConfigError: a file that was named cannot be read at all.
    """
    try:
        # Warnings are the daemon's and `config check`'s to show, not every CLI command's.
        config = load_config(path, log_warnings=False)
        return AdminAddress(config.http, config.token, state_dir=config.state_dir)
    except ConfigError as error:
        problem = str(error)
    name = path or os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG_PATH
    try:
        with open(name, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(f"{name}: cannot read: {e.strerror or e}", path=name) from None
    parser = ini_parser(strict=False)
    try:
        parser.read_string(text, source=name)
        section = dict(parser.items(GLOBAL_SECTION, raw=True)) if parser.has_section(GLOBAL_SECTION) else {}
    except configparser.Error:
        section = {}
    http = section.get("http", "").strip() or DEFAULT_HTTP
    try:
        split_host_port(http)
    except ValueError:
        http = DEFAULT_HTTP
    token = section.get("token", "").strip() or None
    state_dir = resolve_path(section.get("state_dir", "").strip() or DEFAULT_STATE_DIR, os.getcwd())
    return AdminAddress(http, token, problem, state_dir)


def load_config(path: str | None = None, *, cwd: str | None = None, log_warnings: bool = True) -> Config:
    """Load the config file.

    Parameters
    ----------
    path:
        The file. None: ``$SMOOSH_CONFIG`` if set, else ``conf/smoosh.ini``; when that
        default file does not exist, the defaults (``path`` None).
    cwd:
        The directory relative paths resolve against; None = the working directory.
    log_warnings:
        Also log the config's warnings (see :func:`parse_config`).

    Returns
    -------
    The config.

    Raises
    ------
    ConfigError
        A file that was named (argument or ``$SMOOSH_CONFIG``) is missing, unreadable or
        empty, or the file is invalid.
    """
    named = path is not None or bool(os.environ.get(CONFIG_ENV))
    if path is None:
        path = os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG_PATH
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        if not named:
            log.info("no config file at %s: using the defaults", path)
            return Config.default(cwd=cwd)
        raise ConfigError(f"{path}: no such file", path=path) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})", path=path) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}", path=path) from None
    if not text.strip():
        # An editor mid-save or a truncating tool leaves an empty file: taking it as "all
        # defaults" would silently drop the operator's channels on a live reload.
        raise ConfigError(f"{path}: is empty", path=path)
    return parse_config(text, path, cwd=cwd, log_warnings=log_warnings)


def config_fields() -> dict[str, set[str]]:
    """Per section kind, the dataclass fields that come from ini keys (used by the doc test)."""
    skip_global = {"path", "channels", "ignore", "sqlite", "warnings"}
    return {
        "global": {f.name for f in fields(Config)} - skip_global,
        "channel": {f.name for f in fields(ChannelConfig)} - {"name", "kind"},
        "sqlite": {f.name for f in fields(SqliteConfig)},
    }
