"""Operator suspension: sticky until resumed, saved in ``state_dir`` so it survives restarts.

A suspend of all channels also covers channels created later; resuming one channel of a
suspend-all keeps the others suspended.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Iterable

log = logging.getLogger(__name__)

#: File in ``state_dir`` recording operator suspension across restarts.
SUSPEND_FILE = "suspended.json"


class Suspension:
    """Which channels the operator suspended. Not thread-safe: the server serialises calls."""

    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, SUSPEND_FILE)
        self.all = False
        self.channels: set[str] = set()

    def is_suspended(self, name: str) -> bool:
        """Whether channel ``name`` (existing or future) is suspended."""
        return self.all or name in self.channels

    def suspend(self, name: str | None) -> None:
        """Suspend one channel, or all (None), and save."""
        if name is None:
            self.all = True
        else:
            self.channels.add(name)
        self.save()

    def resume(self, name: str | None, existing: Iterable[str]) -> None:
        """Resume one channel, or all (None), and save; ``existing`` names every current channel."""
        if name is None:
            self.all = False
            self.channels.clear()
        else:
            if self.all:
                self.all = False
                self.channels = set(existing)
            self.channels.discard(name)
        self.save()

    def load(self) -> None:
        """Read the saved state; a missing file means nothing is suspended."""
        try:
            with open(self.path, encoding="utf-8") as f:
                saved = json.load(f)
            self.all = bool(saved.get("all", False))
            self.channels = {str(n) for n in saved.get("channels", [])}
        except FileNotFoundError:
            return
        except (OSError, ValueError, AttributeError, TypeError) as e:
            log.warning("ignoring unreadable suspension state %s: %s", self.path, e)

    def save(self) -> None:
        """Write the state atomically (a crash leaves the old or the new file); errors are logged."""
        try:
            if not self.all and not self.channels:
                if os.path.exists(self.path):
                    os.unlink(self.path)
                return
            tmp = f"{self.path}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({"all": self.all, "channels": sorted(self.channels)}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as e:
            log.error("could not save suspension state to %s: %s", self.path, e)
