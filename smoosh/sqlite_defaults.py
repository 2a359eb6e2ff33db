"""The SQLite compactor's defaults that the config states too, defined once for both.

The config parses ``[smoosh.sqlite]`` and documents each key's default; the compactor falls
back on the same values when its settings leave one out. Both read them here: the config may
not import the compactor's modules cheaply (the package loads apsw), and the compactor may
not import the config (the layering in ``pyproject.toml``).
"""

from __future__ import annotations

__all__ = ["DEFAULT_INCREMENTAL_CHUNK_PAGES", "DEFAULT_BUSY_TIMEOUT_S", "DEFAULT_MAX_LOCK_HOLD_S"]

#: Pages an incremental compaction frees per chunk (between chunks it holds no lock).
DEFAULT_INCREMENTAL_CHUNK_PAGES = 1000
#: How long a compaction waits for a database lock before reporting "busy", in seconds.
DEFAULT_BUSY_TIMEOUT_S = 1.0
#: Longest a full VACUUM may hold the write lock of a database another process has open,
#: in seconds (0: no limit): smoosh gives up before the application's writers would.
DEFAULT_MAX_LOCK_HOLD_S = 1.0
