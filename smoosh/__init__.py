"""smoosh: a compaction daemon that keeps a fleet of databases compact.

The names a user imports; everything else lives in its own module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from smoosh.errors import ConfigError, InvalidKey, SmooshError

if TYPE_CHECKING:
    from smoosh.config import load_config
    from smoosh.daemon.server import Server

__all__ = ["Server", "load_config", "SmooshError", "ConfigError", "InvalidKey"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Imported on first use so `import smoosh` (and the CLI's start-up) stays cheap.
    if name == "Server":
        from smoosh.daemon.server import Server

        return Server
    if name == "load_config":
        from smoosh.config import load_config

        return load_config
    raise AttributeError(f"module 'smoosh' has no attribute {name!r}")
