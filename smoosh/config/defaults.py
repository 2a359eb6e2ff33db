"""Defaults of the ``[smoosh]`` section, and the tables that tie ini keys to Config fields.

Kept apart from :mod:`smoosh.config` so the defaults read as one list; the per-channel and
``[smoosh.sqlite]`` defaults live beside their dataclasses in :mod:`smoosh.config.sections`.
"""

from __future__ import annotations

import re

from smoosh import logs

__all__ = [
    "DEFAULT_CONFIG_PATH",
    "CONFIG_ENV",
    "DEFAULTS_NAME",
    "GLOBAL_SECTION",
    "RESERVED_SECTIONS",
    "CHANNEL_NAME_RE",
    "DEFAULT_DB_CHANNELS",
    "DEFAULT_VIEW_CHANNELS",
    "DEFAULT_CLEANUP_CHANNELS",
    "DEFAULT_STALENESS_S",
    "DEFAULT_PERSIST",
    "DEFAULT_STATE_DIR",
    "DEFAULT_WAIT_S",
    "DEFAULT_CHECKPOINT_INTERVAL_S",
    "DEFAULT_ACCESS_MAX_SIZE",
    "DEFAULT_COMPACTION_LOG_LEVEL",
    "LOG_LEVELS",
    "DEFAULT_LOG_FORMAT",
    "LOG_FORMATS",
    "DEFAULT_STORE",
    "DEFAULT_WATCH",
    "DEFAULT_HTTP",
    "DEFAULT_HEALTH_THRESHOLD_S",
    "DEFAULT_BACKOFF_BASE_S",
    "DEFAULT_BUSY_RETRIES",
    "DEFAULT_MAX_HISTORY",
    "DEFAULT_JOB_TIMEOUT_S",
    "DEFAULT_MAX_JOBS",
    "DEFAULT_INTERVAL_S",
    "DEFAULT_MAX_CHURN",
    "DEFAULT_RECHECK_INTERVAL_S",
    "DEFAULT_EXACT_SIZE_INTERVAL_S",
    "DEFAULT_RESCAN_INTERVAL_S",
    "DEFAULT_WAL_MAX_SIZE_BYTES",
    "DEFAULT_MAX_IO_RATE",
    "DEFAULT_IO_PRIORITY",
    "GLOBAL_KEYS",
    "COUCHDB_ONLY_KEYS",
    "RESTART_KEYS",
]

#: The config file used when neither a path nor ``$SMOOSH_CONFIG`` names one.
DEFAULT_CONFIG_PATH = "conf/smoosh.ini"

#: Environment variable naming the config file.
CONFIG_ENV = "SMOOSH_CONFIG"

#: How messages name the config when no file was read.
DEFAULTS_NAME = "<defaults>"

#: The global section.
GLOBAL_SECTION = "smoosh"

#: Section names under ``smoosh.`` that are not channels.
RESERVED_SECTIONS = ("ignore", "sqlite")

#: What a channel name may contain (it becomes a file name in ``state_dir``).
CHANNEL_NAME_RE = re.compile(r"[A-Za-z0-9_-]+")

#: Channels that take database keys, tried in this order.
DEFAULT_DB_CHANNELS = ("upgrade_dbs", "ratio_dbs", "slack_dbs")

#: Channels that take index keys; the built-in SQLite compactor has no indexes.
DEFAULT_VIEW_CHANNELS: tuple[str, ...] = ()

#: Channels that take ``cleanup:<path>`` keys.
DEFAULT_CLEANUP_CHANNELS = ("index_cleanup",)

#: A key a channel accepted this recently is dropped on re-enqueue, in seconds (5 minutes;
#: a bare number in the file is minutes, as in CouchDB).
DEFAULT_STALENESS_S = 300.0

#: Checkpoint channel queues to ``state_dir`` (CouchDB's default is false).
DEFAULT_PERSIST = True

#: Where checkpoints and the operator's suspension live (relative to the working directory).
DEFAULT_STATE_DIR = "var/smoosh"

#: A channel stays paused this long after it starts, so early events sort first, in seconds.
DEFAULT_WAIT_S = 30.0

#: How often each channel checkpoints its queue, in seconds.
DEFAULT_CHECKPOINT_INTERVAL_S = 180.0

#: Entries in the staleness access table; past it, new keys are not throttled.
DEFAULT_ACCESS_MAX_SIZE = 250000

#: Level of the per-compaction log lines (CouchDB's ``notice`` maps to ``info``).
DEFAULT_COMPACTION_LOG_LEVEL = "info"

#: Log levels ``compaction_log_level`` accepts, mapped to Python's names.
LOG_LEVELS = {"debug": "debug", "info": "info", "notice": "info", "warning": "warning", "error": "error"}

#: How ``smoosh run`` and ``smoosh worker`` write log lines: ``text``, or ``json`` (one object
#: per line); both defined beside the formatters, in :mod:`smoosh.logs`.
DEFAULT_LOG_FORMAT = logs.DEFAULT_LOG_FORMAT

#: The values ``log_format`` accepts.
LOG_FORMATS = logs.LOG_FORMATS

#: The job store URL (``memory:``, ``sqlite:PATH``, ``fdb:`` or ``fdb:CLUSTER_FILE``).
DEFAULT_STORE = "sqlite:var/smoosh/jobs.db"

#: Directories (watched recursively) and glob patterns whose SQLite files get compacted.
DEFAULT_WATCH = ("var/databases",)

#: Address of the admin API; loopback, so no token is needed.
DEFAULT_HTTP = "127.0.0.1:5986"

#: Shortest ``token`` accepted, in bytes: a guessable one protects nothing.
MIN_TOKEN_BYTES = 16

#: Crashes closer than this to the event before them count as consecutive (backoff), seconds.
DEFAULT_HEALTH_THRESHOLD_S = 120.0

#: First retry delay after a failed compaction, doubled per consecutive failure, seconds.
DEFAULT_BACKOFF_BASE_S = 30.0

#: Busy results in a row past which a key is shown ``starved`` (0: never).
DEFAULT_BUSY_RETRIES = 10

#: Compaction results kept per key for ``/jobs``.
DEFAULT_MAX_HISTORY = 20

#: A running job with no heartbeat for this long is re-queued (couch_jobs type timeout), s.
DEFAULT_JOB_TIMEOUT_S = 30.0

#: Compactions running at once across all channels.
DEFAULT_MAX_JOBS = 4

#: The fewest compactions the backlog controller lets run at once (while anything waits).
DEFAULT_MIN_JOBS = 1

#: Reclaimable bytes waiting at which the backlog controller runs every one of max_jobs (256 MiB).
DEFAULT_BACKLOG_FULL_BYTES = 256 * 1024 * 1024

#: How often rotation looks for work waiting on max_jobs, in seconds (DESIGN §5.6).
DEFAULT_INTERVAL_S = 60.0

#: Suspendable jobs rotation may stop per interval (0 turns rotation off).
DEFAULT_MAX_CHURN = 20

#: A key no channel took is not re-examined on file events for this long, in seconds.
DEFAULT_RECHECK_INTERVAL_S = 10.0

#: How often a database's exact live size is measured (a full page scan), in seconds (1h).
DEFAULT_EXACT_SIZE_INTERVAL_S = 3600.0

#: How often the watched directories are rescanned (events can be dropped), seconds (10m).
DEFAULT_RESCAN_INTERVAL_S = 600.0

#: A ``-wal`` file past this size makes its database eligible, in bytes (64 MiB).
DEFAULT_WAL_MAX_SIZE_BYTES = 64 * 1024 * 1024

#: Bytes per second all compactions of one process may write together; None = unlimited.
DEFAULT_MAX_IO_RATE: float | None = None

#: I/O class of the threads that run compactions: ``normal`` or ``idle`` (Linux only).
DEFAULT_IO_PRIORITY = "normal"

#: ini key -> Config field for ``[smoosh]`` (also checked against conf/smoosh.ini's docs).
GLOBAL_KEYS: dict[str, str] = {
    "db_channels": "db_channels",
    "view_channels": "view_channels",
    "cleanup_channels": "cleanup_channels",
    "staleness": "staleness_s",
    "persist": "persist",
    "state_dir": "state_dir",
    "wait_secs": "wait_s",
    "checkpoint_interval": "checkpoint_interval_s",
    "access_max_size": "access_max_size",
    "compaction_log_level": "compaction_log_level",
    "log_format": "log_format",
    "store": "store",
    "watch": "watch",
    "roots": "roots",
    "allow_hard_links": "allow_hard_links",
    "allow_mounts": "allow_mounts",
    "node": "node",
    "http": "http",
    "token": "token",
    "health_threshold": "health_threshold_s",
    "backoff_base": "backoff_base_s",
    "busy_retries": "busy_retries",
    "max_history": "max_history",
    "job_timeout": "job_timeout_s",
    "max_jobs": "max_jobs",
    "min_jobs": "min_jobs",
    "backlog_full": "backlog_full_bytes",
    "interval": "interval_s",
    "max_churn": "max_churn",
    "recheck_interval": "recheck_interval_s",
    "exact_size_interval": "exact_size_interval_s",
    "rescan_interval": "rescan_interval_s",
    "wal_max_size": "wal_max_size_bytes",
    "max_io_rate": "max_io_rate_bytes_per_s",
    "min_free_space": "min_free_space",
    "disk_pressure": "disk_pressure",
    "io_priority": "io_priority",
}

#: CouchDB ``[smoosh]`` keys smoosh accepts without using: a pasted config stays quiet.
#: ``cleanup_index_files = false`` gets a warning, since it meant "no cleanup" there.
COUCHDB_ONLY_KEYS = ("cleanup_index_files",)

#: Keys that take effect only after a restart (everything else applies live).
RESTART_KEYS = ("store", "http", "node", "state_dir")
