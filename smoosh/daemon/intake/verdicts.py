"""What became of an enqueued key, in words an operator reads (``POST /enqueue?wait=1``).

DESIGN §4.2 and §11: one result per key, ``queued`` (with its channel and priority),
``not_queued`` (one reason string: stale until a time, below each channel's threshold with
the numbers, ignored, already running, still examining, not examined when the request's
time ran out) or ``rejected`` (outside roots, no such file, a directory, not a SQLite file). The intake fills a :class:`Waiter` when a key's
examination ends; this module holds the result, the file check HTTP and the CLI ask for,
and the sentence that says why a channel gave a database priority 0.
"""

from __future__ import annotations

import datetime
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from smoosh.compactors.base import CompactorBase, Look, Sizes
from smoosh.config import ChannelConfig
from smoosh.daemon.intake.admission import NOT_EXAMINED, RequestDeadline
from smoosh.errors import InvalidKey
from smoosh.priority import DEFAULT_MIN_PRIORITY

__all__ = [
    "QUEUED", "NOT_QUEUED", "REJECTED", "STILL_EXAMINING", "Verdict", "Offered", "Waiter",
    "file_problem", "look_at", "why_zero", "stale_reason", "enqueue_and_wait", "WAIT_S", "hold_reasons", "forced_note",
    "utc_text", "channel_phrase", "below_reason", "not_measured_reason",
]

QUEUED = "queued"
NOT_QUEUED = "not_queued"
REJECTED = "rejected"
#: The reason of a key whose examination outlasted the wait.
STILL_EXAMINING = "still examining"
#: Seconds ``POST /enqueue?wait=1`` waits for the keys' examinations (DESIGN §11).
WAIT_S = 10.0


@dataclass(frozen=True)
class Verdict:
    """What became of one key: its outcome, and the channel and priority or the reason."""

    key: str
    outcome: str
    channel: str | None = None
    priority: float | None = None
    reason: str | None = None

    def as_json(self) -> dict[str, Any]:
        """The result object of ``POST /enqueue?wait=1`` (an infinite priority stays a float here)."""
        return {"key": self.key, "outcome": self.outcome, "channel": self.channel, "priority": self.priority,
                "reason": self.reason}


class Offered(NamedTuple):
    """The answer of the server's offer to a key's channels: true when a channel queued it.

    ``reason`` says why none did, when the channels' priorities were not the cause (the key
    runs already, a full queue evicted it at once). ``note`` goes with a key that was queued
    (a forced key, and what holds it back).
    """

    channel: str | None = None
    priority: float | None = None
    reason: str | None = None
    note: str | None = None

    def __bool__(self) -> bool:
        return self.channel is not None


class Waiter:
    """One caller waiting for the verdict on one key (any thread fills it, once)."""

    def __init__(self, key: str) -> None:
        self.key = key
        self._done = threading.Event()
        self._verdict: Verdict | None = None

    def resolve(self, verdict: Verdict) -> None:
        """Record the verdict, unless one was recorded already (the first word stands)."""
        if self._verdict is None:
            self._verdict = verdict
            self._done.set()

    def wait(self, timeout_s: float) -> Verdict:
        """The verdict, or ``not_queued``, "still examining" once ``timeout_s`` has passed."""
        self._done.wait(max(0.0, timeout_s))
        return self._verdict or Verdict(self.key, NOT_QUEUED, reason=STILL_EXAMINING)


def enqueue_and_wait(
    enqueue: Callable[[str, Waiter], None],
    keys: Iterable[str],
    timeout_s: float = WAIT_S,
    *,
    monotonic: Callable[[], float] = time.monotonic,
    deadline: RequestDeadline | None = None,
) -> list[Verdict]:
    """Enqueue every key, then wait (all of them together, at most ``timeout_s`` from the call) for their verdicts.

    Parameters:
        enqueue: ``enqueue(key, waiter)``; raises ``InvalidKey`` for a key it rejects.
        keys: the keys, as the caller wrote them.
        timeout_s: how long the whole call may take, admission included; keys still being
            examined then are ``not_queued``, "still examining".
        monotonic: the clock the wait is kept on.
        deadline: the request's admission deadline (HTTP's): once it passes, the keys left are
            not enqueued at all, each ``not_queued`` with :data:`NOT_EXAMINED` (its
            ``cut_at`` says from which one).

    Returns:
        One verdict per key, in the order given.
    """
    wait_until = monotonic() + timeout_s
    waiters = []
    for key in keys:
        waiter = Waiter(key)
        if deadline is not None and not deadline.next_key():
            waiter.resolve(Verdict(key, NOT_QUEUED, reason=NOT_EXAMINED))
        else:
            try:
                enqueue(key, waiter)
            except InvalidKey as e:
                waiter.resolve(Verdict(key, REJECTED, reason=e.reason))
        waiters.append(waiter)
    return [waiter.wait(wait_until - monotonic()) for waiter in waiters]


def file_problem(path: str, compactor: CompactorBase) -> str | None:
    """Why ``path`` cannot be a database to compact, or None when it may be one (see :func:`look_at`)."""
    return look_at(path, compactor)[0]


def look_at(path: str, compactor: CompactorBase) -> tuple[str | None, Look | None]:
    """Why ``path`` cannot be a database to compact (or None), and the compactor's look at it.

    One ``lstat``: only a regular file is opened (a FIFO's writer or a device's driver would
    notice an open). Then, for a compactor that looks at files (the SQLite one: ``look``), one
    open, ``fstat`` and header read answer the rest with the strict identity checks, which
    never disturb a compaction of this process (a raw descriptor would: closing it drops the
    process's SQLite locks on the file); the look goes with the key to its examination, which
    then reads nothing again (DESIGN §12). A compactor that judges files without looking
    (``file_problem``) is asked instead.

    Parameters:
        path: a canonical path inside the roots.
        compactor: the compactor that claims it.

    Returns:
        ``(problem, look)``: the problem is "no such file", "a directory", "not a regular
        file", "not a SQLite file", why the file is shared (other hard links, another mount,
        a side file that is a link), or None; the look is the compactor's
        (:class:`~smoosh.compactors.base.Look`), or None.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "no such file", None
    except OSError as e:
        return f"cannot read it: {e.strerror or e}", None
    if stat.S_ISDIR(st.st_mode):
        return "a directory", None
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file", None
    look = compactor.look(path)
    if look is not None:
        return look.problem, look
    return compactor.file_problem(path), None


def stale_reason(left_s: float, now: float) -> str:
    """``stale until 2026-11-24T19:20:00Z``: a channel took the key less than ``staleness`` ago."""
    return f"stale until {utc_text(now + left_s)} (a channel took it less than staleness ago)"


def why_zero(ch: ChannelConfig, sizes: Any, needs_upgrade: bool) -> str:
    """Why ``ch`` gives a database of ``sizes`` priority 0, with the numbers (the rules of 5.2).

    Parameters:
        ch: the channel's settings.
        sizes: the database's ``Sizes`` (file and live bytes).
        needs_upgrade: whether the database needs a format upgrade.

    Returns:
        A phrase such as ``ratio 1.25 <= min_priority 2.0``.
    """
    file, active = sizes.file_bytes, sizes.active_bytes
    if ch.min_changes > 0 and sizes.changes is not None and sizes.changes < ch.min_changes:
        return f"changes {sizes.changes} < min_changes {ch.min_changes}"
    if ch.priority == "upgrade":
        return "no upgrade needed" if not needs_upgrade else "upgrade not due"
    if file <= ch.min_size_bytes:
        return f"file {file} bytes <= min_size {ch.min_size_bytes}"
    if file > ch.max_size_bytes:
        return f"file {file} bytes > max_size {_number(ch.max_size_bytes)}"
    min_priority = ch.min_priority if ch.min_priority is not None else DEFAULT_MIN_PRIORITY[ch.priority]
    if ch.priority == "slack":
        value, name = float(file - active), "slack"
    else:
        value, name = (file / active if active else float("inf")), "ratio"
    if value <= min_priority:
        return f"{name} {_number(value)} <= min_priority {_number(min_priority)}"
    return f"{name} {_number(value)} > max_priority {_number(ch.max_priority)}"


def utc_text(at: float) -> str:
    """A unix time as ``2026-11-24T19:20:00Z``, the form every reason uses."""
    return datetime.datetime.fromtimestamp(at, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def hold_reasons(
    name: str,
    status: dict[str, Any],
    *,
    window: Any,
    next_open: float | None,
    paused_until: float | None,
    slots_busy: int,
    max_jobs: int,
    dry_run: bool,
) -> list[str]:
    """What keeps channel ``name`` from starting a waiting key now, in words; empty when nothing does.

    Parameters:
        name: the channel.
        status: its published status (``suspended``, ``held``, ``in_window``, ``active``,
            ``starting``, ``concurrency``).
        window: its window (printed), or None.
        next_open: when its window opens next (unix seconds), when it is closed.
        paused_until: when its start-up pause ends, or None (a forced key ignores it: pass None).
        slots_busy, max_jobs: the node's global slots taken, and their number.
        dry_run: the daemon starts nothing at all.

    Returns:
        Phrases such as ``channel big_dbs is outside its window 23:30-05:00 UTC (it opens at
        2026-11-24T23:30:00Z)``, most lasting first.
    """
    holds = []
    if dry_run:
        holds.append("dry run: nothing starts")
    if status.get("suspended"):
        holds.append(f"channel {name} is suspended (it starts when resumed)")
    held = status.get("held")
    if held:
        by = f" set by {held.get('by')}" if isinstance(held, dict) and held.get("by") else ""
        holds.append(f"channel {name} is held by a cluster hold{by} (it starts when `smoosh resume --store` clears it)")
    if not status.get("in_window", True):
        opens = f" (it opens at {utc_text(next_open)})" if next_open is not None else ""
        holds.append(f"channel {name} is outside its window {window}{opens}")
    if paused_until is not None:
        holds.append(f"channel {name} is in its start-up pause until {utc_text(paused_until)}")
    concurrency = int(status.get("concurrency", 1))
    running = int(status.get("active", 0)) + int(status.get("starting", 0))
    if concurrency == 0:
        holds.append(f"channel {name} has concurrency 0 (it starts nothing)")
    elif running >= concurrency:
        holds.append(f"channel {name} is at its concurrency ({running} running)")
    if slots_busy >= max_jobs:
        holds.append(f"all {max_jobs} max_jobs slots are busy")
    return holds


def forced_note(holds: list[str]) -> str:
    """The reason of a forced key's ``queued`` result: ``forced``, and what holds it back if anything does."""
    return "forced" if not holds else "forced; held back: " + "; ".join(holds)


def channel_phrase(
    ch: ChannelConfig, key: str, sizes: Sizes | None, priority: float, compactor: CompactorBase | None,
) -> str | None:
    """Why channel ``ch`` does not take ``key``, or None when it does (its ``priority`` is above 0).

    Parameters:
        ch: the channel's settings.
        key: a canonical key.
        sizes: the database's ``Sizes``, or None (a cleanup key, or nothing measured).
        priority: what the channel gives the key.
        compactor: the compactor that claims it (asked whether it needs an upgrade).

    Returns:
        ``outside its match patterns``, ``nothing to clean up``, or :func:`why_zero`'s phrase.
    """
    if not ch.matches(key):
        return "outside its match patterns"
    if priority:
        return None
    if sizes is None:
        return "nothing to clean up"
    needs = ch.priority == "upgrade" and compactor is not None and compactor.needs_upgrade(key)
    return why_zero(ch, sizes, needs)


def below_reason(key: str, names: Iterable[str], cfg: Any, sizes: Any, priority_of: Callable[[Any], float],
                 compactor: CompactorBase | None) -> str:
    """Why no channel took ``key``: each channel's threshold, with the numbers (``?wait=1``, ``explain``).

    Returns:
        ``below every channel's threshold (file N bytes, live M bytes): ratio_dbs: ratio 1.25
        <= min_priority 2.0; ...``, or ``no channel takes it`` when no channel of its kind exists.
    """
    parts = []
    for name in names:
        ch = cfg.channels.get(name)
        if ch is None:
            continue
        phrase = channel_phrase(ch, key, sizes, priority_of(ch) if ch.matches(key) else 0.0, compactor)
        if phrase is not None:
            parts.append(f"{name}: {phrase}")
    if not parts:
        return "no channel takes it"
    what = "" if sizes is None else f" (file {sizes.file_bytes} bytes, live {sizes.active_bytes} bytes)"
    return f"below every channel's threshold{what}: " + "; ".join(parts)


def not_measured_reason(key: str) -> str:
    """Why a key got no measurement at all: its file is gone, or was just compacted."""
    path = key[len("cleanup:"):] if key.startswith("cleanup:") else key
    if not os.path.lexists(path):
        return "no such file"
    return "compacted less than exact_size_interval ago and not grown since"


def _number(value: float) -> str:
    if value == float("inf"):
        return "infinity"
    return str(int(value)) if float(value).is_integer() else f"{value:.3g}"
