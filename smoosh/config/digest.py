"""A config's digest: what an operator compares across the nodes of a fleet.

Every node writes the digest of its effective config into its status record, and ``smoosh
status --store`` shows it beside the node's version, so a fleet running mixed configs shows
it at a glance (issue 50). The digest covers what decides how a node compacts (the channels,
their thresholds and windows, the slots, the backoff, the store's cap ...) and leaves out
what differs between the nodes of one fleet by design: the node's name, its admin address
and token, its directories (``watch``, ``roots``, ``state_dir`` and the roots' opt-ins), the
store's URL (the one store they share, maybe mounted at another path) and the file's own path. Two nodes given the same file and their own ``node`` share a digest.

The digest is of the parsed config, not of the file's text: comments, the order of keys and
a default written out or left implicit change nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from smoosh.config import Config

__all__ = ["config_digest", "PER_NODE_FIELDS", "DIGEST_CHARS"]

#: The Config fields left out of the digest: they differ between the nodes of one fleet by design.
PER_NODE_FIELDS = frozenset({
    "path", "node", "http", "token", "watch", "roots", "state_dir", "allow_hard_links", "allow_mounts",
    "store", "warnings",
})
#: Hex characters of the digest shown (48 bits: a fleet's handful of configs never collide).
DIGEST_CHARS = 12


def config_digest(config: Config) -> str:
    """The digest of ``config`` (see the module docstring): ``DIGEST_CHARS`` hex characters.

    Parameters:
        config: a node's effective config.

    Returns:
        The same text for two configs that compact alike, in any process and on any host.
    """
    fields = {f.name: _canonical(getattr(config, f.name)) for f in dataclasses.fields(config)
              if f.name not in PER_NODE_FIELDS}
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS]


def _canonical(value: Any) -> Any:
    """``value`` as plain JSON data that reads the same in every process (no object addresses)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _canonical(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, (frozenset, set)):
        return sorted(str(_canonical(v)) for v in value)
    if isinstance(value, float):
        return repr(value)  # infinity included, which JSON has no word for
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)  # a time zone, a parsed size: their text is what the operator wrote
