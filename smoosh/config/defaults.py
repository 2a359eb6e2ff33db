"""Defaults of the ``[smoosh]`` section, and the tables that tie ini keys to Config fields.

Kept apart from :mod:`smoosh.config` so the defaults read as one list; the per-channel and
``[smoosh.sqlite]`` defaults live beside their dataclasses in :mod:`smoosh.config.sections`.
"""

from __future__ import annotations

import re

from smoosh import logs
from smoosh.config.keys import (
    ADDRESS, BOOLEAN, DURATION, DURATION_MINUTES, GLOBS, INTEGER, NAME, NAMES, PATH, PATHS, PERCENT_OR_OFF,
    PERCENT_OR_SIZE, RATE, SECRET, SIZE, STORE_URL, Key, choice, key_table,
)
from smoosh.cpusched import CPU_SCHEDULING
from smoosh.disk_room import DEFAULT_DISK_PRESSURE, DEFAULT_MIN_FREE

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
    "DEFAULT_BATCH_MAX_SIZE_BYTES",
    "DEFAULT_MAX_IO_RATE",
    "DEFAULT_IO_PRIORITY",
    "DEFAULT_CPU_SCHEDULING",
    "GLOBAL_KEYS",
    "GLOBAL_KEY_DEFS",
    "COUCHDB_ONLY_KEYS",
    "COUCHDB_ONLY_KEY_DOCS",
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

#: Databases up to this size are compacted in batches, several to one job (4 MiB): below it a
#: job's fixed cost weighs on a compaction (bench/RESULTS.md, the drain's batch rows).
DEFAULT_BATCH_MAX_SIZE_BYTES = 4 * 1024 * 1024

#: Bytes per second all compactions of one process may write together; None = unlimited.
DEFAULT_MAX_IO_RATE: float | None = None

#: I/O class of the threads that run compactions: ``normal`` or ``idle`` (Linux only).
DEFAULT_IO_PRIORITY = "normal"

#: CPU policy of ``smoosh run`` and ``smoosh worker``: ``batch`` or ``normal`` (Linux only).
DEFAULT_CPU_SCHEDULING = "batch"

#: Every ``[smoosh]`` key, declared once: its Config field, its form, its default and its doc
#: string (:mod:`smoosh.config.keys`; docs/reference/config.md is generated from this table).
GLOBAL_KEY_DEFS: tuple[Key, ...] = (
    Key("db_channels", "db_channels", NAMES,
        "Channels offered database keys, in this order: the first that gives a key a priority above 0 "
        "takes it. A list you set replaces the default (CouchDB merges its built-ins back in and sorts "
        "the list; `smoosh config check` warns where that makes a difference). Empty: no database channels.",
        DEFAULT_DB_CHANNELS),
    Key("view_channels", "view_channels", NAMES,
        "Channels offered index keys. Accepted so that a CouchDB config pastes as it is, and warned "
        "about: the built-in SQLite compactor has no indexes, so these channels never get work.",
        DEFAULT_VIEW_CHANNELS),
    Key("cleanup_channels", "cleanup_channels", NAMES,
        "Channels offered `cleanup:<db path>` keys: restarting a grown WAL log, cutting an oversized "
        "`-wal` file, removing the side files a deleted database left behind. Empty turns cleanup off.",
        DEFAULT_CLEANUP_CHANNELS),
    Key("watch", "watch", GLOBS,
        "Directories watched recursively, and glob patterns, whose SQLite files get compacted. A file "
        "counts as a database by its header, not its name; existing files are scanned at start. Empty: "
        "nothing is watched, and keys arrive only through `smoosh enqueue`, `POST /enqueue` or the Python API.",
        DEFAULT_WATCH),
    Key("roots", "roots", PATHS,
        "Directories every key must lie in, after resolving symbolic links; a key outside them is refused.",
        default_text="the watched directories (for a glob, its directory part)"),
    Key("allow_hard_links", "allow_hard_links", PATHS,
        "Roots (each one of `roots`) whose databases may have more than one hard link, or side files "
        "(`-journal`, `-wal`, `-shm`) that are hard links. Elsewhere such a file is refused: a compaction "
        "through one name rewrites the file for every name.",
        ()),
    Key("allow_mounts", "allow_mounts", PATHS,
        "Roots (each one of `roots`) whose databases may lie on another mount than the root itself "
        "(a bind mount, a volume mounted below the root). Elsewhere such a file is refused.",
        ()),
    Key("store", "store", STORE_URL,
        "The job store: `memory:` (this process only), `sqlite:PATH` (the embedded default), `fdb:` or "
        "`fdb:CLUSTER_FILE` (FoundationDB). Running compactions, crash records and the last results "
        "of every database live there.",
        DEFAULT_STORE),
    Key("state_dir", "state_dir", PATH,
        "Where the channels' checkpoints, the operator's suspension and the instance lock live. One "
        "daemon per `state_dir`.",
        DEFAULT_STATE_DIR),
    Key("persist", "persist", BOOLEAN,
        "Checkpoint the channels' queues to `state_dir`, so they survive a restart (CouchDB's default "
        "is false).",
        DEFAULT_PERSIST),
    Key("checkpoint_interval", "checkpoint_interval_s", DURATION,
        "How often each channel checkpoints its queue (also at a clean stop).",
        DEFAULT_CHECKPOINT_INTERVAL_S),
    Key("http", "http", ADDRESS,
        "The admin API's address. Off loopback a `token` is required.",
        DEFAULT_HTTP),
    Key("token", "token", SECRET,
        f"The bearer token every POST to the admin API must carry once it is set, on loopback too. At "
        f"least {MIN_TOKEN_BYTES} bytes; required when `http` is not a loopback address. A line written "
        f"blank is an error (remove it for no token).",
        default_text="none: every POST on loopback is allowed"),
    Key("node", "node", NAME,
        "This node's name: its compactions run as jobs of the type `smoosh:<node>`. One live daemon per "
        "node on a store, so several daemons sharing a store each need their own.",
        default_text="the host name"),
    Key("staleness", "staleness_s", DURATION_MINUTES,
        "A key a channel accepted less than this long ago is dropped when it is enqueued again (a "
        "dictionary lookup, before anything else).",
        DEFAULT_STALENESS_S),
    Key("access_max_size", "access_max_size", INTEGER,
        "Entries in the table `staleness` reads; past it, new keys are not throttled.",
        DEFAULT_ACCESS_MAX_SIZE),
    Key("wait_secs", "wait_s", DURATION,
        "Each channel starts paused this long, so the keys of the first events and the start-up scan "
        "sort by priority before any starts.",
        DEFAULT_WAIT_S),
    Key("recheck_interval", "recheck_interval_s", DURATION,
        "A key no channel took is not examined again on file events for this long.",
        DEFAULT_RECHECK_INTERVAL_S),
    Key("max_jobs", "max_jobs", INTEGER,
        "Compactions running at once across all channels, at most (and the default number of "
        "in-process workers). When channels compete for the last slots, the one that has waited "
        "longest goes first.",
        DEFAULT_MAX_JOBS),
    Key("cluster_max_jobs", "cluster_max_jobs", INTEGER,
        "Compactions running at once on all the nodes sharing this node's store together, at most: one "
        "limit for nodes that share a storage backend (a SAN, one cloud volume's throughput). Checked "
        "in the transaction that starts each compaction, so it holds across nodes with no overshoot, "
        "and shared fairly: while another node waits for a slot, a node already running its share "
        "starts nothing more. Set the same value on every node of the store (`smoosh status --store` "
        "shows each node's). Unset: no limit across nodes (each node's `max_jobs` still holds).",
        default_text="unset: no limit across nodes"),
    Key("min_jobs", "min_jobs", INTEGER,
        "The fewest compactions the backlog controller lets run at once while work waits. Every "
        "status interval it lets `min_jobs` run plus a share of the rest of `max_jobs` that follows "
        "the reclaimable bytes waiting; compactions that find the application holding its database "
        "halve that share at once.",
        DEFAULT_MIN_JOBS),
    Key("backlog_full", "backlog_full_bytes", SIZE,
        "The reclaimable bytes waiting at which the backlog controller lets every one of `max_jobs` "
        "run, and paces incremental compaction beside an application at its quickest.",
        DEFAULT_BACKLOG_FULL_BYTES),
    Key("job_timeout", "job_timeout_s", DURATION,
        "A running job whose worker sent no heartbeat for this long goes back to pending, for another "
        "worker.",
        DEFAULT_JOB_TIMEOUT_S),
    Key("backoff_base", "backoff_base_s", DURATION,
        "The first wait after a failed compaction; it doubles with each consecutive failure (at most "
        "1024 times this). Counted on the monotonic clock: a step of the system clock does not move it.",
        DEFAULT_BACKOFF_BASE_S),
    Key("health_threshold", "health_threshold_s", DURATION,
        "Failures closer than this to the event before them count as consecutive.",
        DEFAULT_HEALTH_THRESHOLD_S),
    Key("max_history", "max_history", INTEGER,
        "Results kept per database in the job store, shown by `/jobs` and `smoosh jobs list`.",
        DEFAULT_MAX_HISTORY),
    Key("busy_retries", "busy_retries", INTEGER,
        "A database busy more than this many times in a row (its application never left it idle "
        "long enough) is shown as `starved`, with one WARNING line. 0: never.",
        DEFAULT_BUSY_RETRIES),
    Key("interval", "interval_s", DURATION,
        "Rotation: every `interval`, when all `max_jobs` slots are busy and a channel waits for one, "
        "up to `max_churn` incremental compactions that have run at least this long stop at a chunk "
        "boundary and are queued again, so the waiting work gets their slots. A full VACUUM is never "
        "stopped.",
        DEFAULT_INTERVAL_S),
    Key("max_churn", "max_churn", INTEGER,
        "The most compactions rotation stops per `interval`; 0 turns rotation off.",
        DEFAULT_MAX_CHURN),
    Key("exact_size_interval", "exact_size_interval_s", DURATION,
        "How often a database's exact live size is measured (a scan of its pages); also how long a "
        "just-compacted file that has not grown is left alone by every channel but the upgrade ones.",
        DEFAULT_EXACT_SIZE_INTERVAL_S),
    Key("rescan_interval", "rescan_interval_s", DURATION,
        "How often the watched directories are rescanned, since file events can be lost. A rescan "
        "reports the databases changed since the scan before it; the start-up scan and the one after "
        "a config reload report every database.",
        DEFAULT_RESCAN_INTERVAL_S),
    Key("wal_max_size", "wal_max_size_bytes", SIZE,
        "The size smoosh keeps each `-wal` file under. Once the log in it passes half of this, the "
        "database's `cleanup:` key is queued, whose job restarts the log at a moment no reader pins "
        "it; a file past this size is cut. A reader that pins a log past it is named (`blocked`).",
        DEFAULT_WAL_MAX_SIZE_BYTES),
    Key("batch_max_size", "batch_max_size_bytes", SIZE,
        "Databases up to this size are compacted in batches: when a compaction of a channel ends and "
        "the channel's next database is this small, the same worker slot and thread take it at once "
        "(no new slot, no hand-off to another thread), under the same job in the store (one commit "
        "claims a batch, one finishes it). Each database keeps its own re-check, checks, result, "
        "history and line in the log; a batch ends between two databases when the "
        "channel would not start the next (held, out of its window, another channel's turn for the "
        "slot). Below this size a job's cost around the compaction is a large share of it; above it, "
        "the compaction dwarfs it. `0`: no batches.",
        DEFAULT_BATCH_MAX_SIZE_BYTES),
    Key("min_free_space", "min_free_space", PERCENT_OR_SIZE,
        "Room kept free on each file system for the application: a size (`1GiB`) or a percentage of "
        "the file system. A compaction reserves what it will write before it starts, and starts only "
        "while the free space covers every reservation there plus this.",
        DEFAULT_MIN_FREE),
    Key("disk_pressure", "disk_pressure", PERCENT_OR_OFF,
        "A file system used past this (as `df` shows it) is under disk pressure: its databases are "
        "taken largest reclaim first, each channel may run as many compactions as the backlog "
        "controller allows (up to one per core) whatever its `concurrency` (except 0), and channels "
        "with `under_pressure = ignore_window` run outside their windows. `off`: never.",
        DEFAULT_DISK_PRESSURE),
    Key("max_io_rate", "max_io_rate_bytes_per_s", RATE,
        "Bytes per second all compactions of one process may write together (`20MiB`, `50MB/s`). "
        "Paces incremental chunks, and delays the next start after a full VACUUM until its debt is paid.",
        DEFAULT_MAX_IO_RATE, default_text="infinity (unlimited)"),
    Key("io_priority", "io_priority", choice(("normal", "idle")),
        "`idle` runs each compaction's thread in Linux's idle I/O class (disk time only when nothing "
        "else wants it); elsewhere one warning, then `normal`.",
        DEFAULT_IO_PRIORITY),
    Key("cpu_scheduling", "cpu_scheduling", choice(CPU_SCHEDULING),
        "`batch` runs every thread of `smoosh run` and `smoosh worker` in Linux's `SCHED_BATCH` "
        "policy: the same share of the CPU, but a smoosh thread that wakes (a file event, a timer) "
        "does not preempt a running application thread, which may hold a SQLite lock its other "
        "threads wait on. `normal`: the process's policy as started. Elsewhere one warning, then "
        "`normal`. Takes effect at the next start.",
        DEFAULT_CPU_SCHEDULING),
    Key("compaction_log_level", "compaction_log_level", choice(("debug", "info", "notice", "warning", "error")),
        "The level of the one line a successful compaction logs (`notice` is `info`). Failed, "
        "blocked and replaced compactions log at WARNING or above whatever this says.",
        DEFAULT_COMPACTION_LOG_LEVEL),
    Key("log_format", "log_format", choice(LOG_FORMATS),
        "How `smoosh run` and `smoosh worker` write their log on stderr: `text` lines, or `json`, one "
        "object per line.",
        DEFAULT_LOG_FORMAT),
)

#: ini key -> Config field for ``[smoosh]`` (also checked against conf/smoosh.ini's docs).
GLOBAL_KEYS: dict[str, str] = key_table(GLOBAL_KEY_DEFS)

#: CouchDB ``[smoosh]`` keys smoosh accepts without using (a pasted config stays quiet), each
#: with what the reference says of it. ``cleanup_index_files = false`` gets a warning, since it
#: meant "no cleanup" there.
COUCHDB_ONLY_KEY_DOCS: dict[str, str] = {
    "cleanup_index_files": "Index cleanup is the `cleanup_channels` list here; to turn it off, write "
                           "`cleanup_channels =`. Written `false`, it is warned about.",
}
COUCHDB_ONLY_KEYS = tuple(COUCHDB_ONLY_KEY_DOCS)

#: Keys that take effect only after a restart (everything else applies live).
RESTART_KEYS = ("store", "http", "node", "state_dir", "cpu_scheduling")
