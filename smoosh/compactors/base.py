"""The compactor seam: what smoosh asks of a database engine, and the errors a compaction ends with.

A compactor owns one kind of key (the built-in one: SQLite files and ``cleanup:<path>`` keys).
smoosh asks it three cheap questions when a key changes (:meth:`Compactor.sizes`,
:meth:`Compactor.needs_upgrade`, :meth:`Compactor.cleanup_priority`) and one expensive thing
from a worker (:meth:`Compactor.compact`). Third-party engines register a factory under the
entry point group ``smoosh.compactors`` (see :mod:`smoosh.compactors`).

Two shapes, one seam:

* :class:`Compactor`, the protocol a third-party engine writes to (DESIGN §7): those five
  questions, and its name;
* :class:`CompactorBase`, everything the daemon asks of a compactor, each method named, with a
  default for what an engine need not answer (one look at a file, the cleanup key a database
  calls for, its exact size, what it saw of the applications, its live settings and roots). The
  daemon holds every compactor as one of these: the built-in one is one, and :func:`adapt`
  makes one of any other (the one place a method a compactor may lack is looked up).

A batch of small databases (``smoosh.daemon.run.batch``) compacts each of them through
:meth:`CompactorBase.compact`, exactly as a compaction of its own: the seam has no batch call.
"""

from __future__ import annotations

import abc
import collections
import inspect
import logging
import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Protocol, runtime_checkable

from smoosh.errors import SmooshError

if TYPE_CHECKING:
    from smoosh.disk_room import DiskRoom
    from smoosh.io_budget import IoBudget

#: Where refusals are logged: the module that opens user databases.
_refusals = logging.getLogger("smoosh.compactors.sqlite_open")

__all__ = [
    "Sizes",
    "Look",
    "NOT_A_DATABASE",
    "file_signature",
    "CompactionResult",
    "CompactionContext",
    "Compactor",
    "CompactorBase",
    "adapt",
    "CompactionError",
    "Busy",
    "Blocked",
    "Replaced",
    "READ_ONLY",
    "Interrupted",
    "Gone",
    "Refused",
    "Shared",
    "InsufficientSpace",
    "refused",
    "shared",
]


@dataclass(frozen=True)
class Sizes:
    """What a database costs on disk and what it would cost compacted.

    Attributes:
        file_bytes: bytes on disk now.
        active_bytes: live bytes (an estimate or the exact payload, depending on the call).
        changes: writes since the last compaction, or None when the engine keeps no count.
    """

    file_bytes: int
    active_bytes: int
    changes: int | None = None

    @property
    def reclaimable_bytes(self) -> int:
        """Bytes a compaction would give back: the file less its live bytes (never negative)."""
        return max(0, self.file_bytes - self.active_bytes)


#: The problem of a :class:`Look` at a file that is not a database of the compactor's kind.
NOT_A_DATABASE = "not a SQLite file"


def file_signature(st: os.stat_result, wal: os.stat_result | None) -> tuple[int, ...]:
    """What changes when a database is written: inode, size and mtime of the file, and size
    and mtime of its ``-wal`` when it has one (``st``, ``wal``: their ``stat`` results)."""
    if wal is None:
        return (st.st_ino, st.st_size, st.st_mtime_ns)
    return (st.st_ino, st.st_size, st.st_mtime_ns, wal.st_size, wal.st_mtime_ns)


@dataclass(frozen=True, slots=True)
class Look:
    """One look at a key's database file: what a new key's admission, its examination and its
    sizes share, so the file is opened, ``fstat``-ed and its header read once per decision
    (DESIGN §12), not once per question.

    Taken by a compactor's optional ``look(path, *, strict)`` and handed back to its
    ``sizes(key, look=...)`` and ``cleanup_key(key, look=...)``.

    Attributes:
        problem: why the file is not a database to compact, in an operator's words (a
            refusal's reason, :data:`NOT_A_DATABASE` also for a file that is missing or not a
            regular one: a caller that must tell these apart looks at the path itself); None
            when it may be one.
        signature: :func:`file_signature` of what was read, or None.
        wal_bytes: the ``-wal``'s size (0: none).
        state: the compactor's own reading of the file (opaque to the daemon), or None.
    """

    problem: str | None
    signature: tuple[int, ...] | None = None
    wal_bytes: int = 0
    state: object = None


@dataclass(frozen=True)
class CompactionResult:
    """The outcome of a compaction that finished.

    Attributes:
        size_before_bytes: disk footprint before the compaction.
        size_after_bytes: disk footprint afterwards.
    """

    size_before_bytes: int
    size_after_bytes: int

    @property
    def reclaimed_bytes(self) -> int:
        """Bytes given back to the file system (never negative)."""
        return max(0, self.size_before_bytes - self.size_after_bytes)


class CompactionContext(Protocol):
    """What a running compaction may call: the worker's side of the job."""

    def progress(self, fraction: float) -> None:
        """Report progress in [0, 1]; cheap and thread-safe (the heartbeat publishes it)."""

    def checkpoint(self) -> None:
        """Mark a chunk boundary: blocks while the job is held; raises :class:`Interrupted` to stop."""

    def on_cancel(self, fn: Callable[[], None]) -> None:
        """Register ``fn`` to run (on another thread) when the job must stop now."""

    def pause(self, seconds: float) -> None:
        """Wait up to ``seconds`` between two chunks, holding no lock; a stop or a hold ends the
        wait early (the next :meth:`checkpoint` then acts on it)."""


@runtime_checkable
class Compactor(Protocol):
    """One kind of database smoosh can compact."""

    name: str

    def claims(self, key: str) -> bool:
        """Is this key mine?  Lexical only: no I/O (it runs on the enqueue hot path)."""

    def sizes(self, key: str) -> Sizes | None:
        """Sizes of the key's database; None when it is gone or not a database of this kind."""

    def needs_upgrade(self, key: str) -> bool:
        """Does the database need a format change (a full rewrite) to meet the configured target?"""

    def cleanup_priority(self, key: str) -> float:
        """For ``cleanup:<path>`` keys: 1.0 when there is cleanup work, else 0.0."""

    def compact(self, key: str, ctx: CompactionContext) -> CompactionResult:
        """Compact the key's database.

        Raises:
            Busy: the database is locked by someone else; retry later (not a crash).
            Blocked: the compaction could not make progress (a reader pins the WAL, the file
                is read-only); retried with backoff, never a traceback.
            Replaced: the path was renamed over while the database was compacted.
            Interrupted: stopped through ``ctx`` (a hold, a clean stop); requeue (not a crash).
            Gone: the database vanished.
            Refused: the path lies outside the roots or reaches its file through a symbolic
                link (a :class:`Gone`: dropped, not retried).
            Exception: anything else means the compaction failed.
        """


#: A reader's pinned log: ``(path, WAL bytes now, pinned since: monotonic seconds)``.
PinnedWal = tuple[str, int, float]


class CompactorBase(abc.ABC):
    """Everything the daemon asks of a compactor (see the module docstring), with a default for each
    question an engine need not answer. The five of :class:`Compactor` are abstract.

    Attributes:
        name: the compactor's name (``"sqlite"``).
    """

    name: str = "compactor"

    # -- what every engine answers (the Compactor protocol) --------------------------------------

    @abc.abstractmethod
    def claims(self, key: str) -> bool:
        """Is this key mine?  Lexical only: no I/O (it runs on the enqueue hot path)."""

    @abc.abstractmethod
    def sizes(self, key: str, *, exact: bool = False, look: Look | None = None) -> Sizes | None:
        """Sizes of the key's database; None when it is gone or not a database of this kind.

        Parameters:
            key: a claimed key.
            exact: measure exactly (reads every page; an engine without a cheaper estimate
                answers the same either way).
            look: this compactor's :meth:`look` at the file just taken, to answer from.
        """

    @abc.abstractmethod
    def needs_upgrade(self, key: str) -> bool:
        """Does the database need a format change (a full rewrite) to meet the configured target?"""

    @abc.abstractmethod
    def cleanup_priority(self, key: str) -> float:
        """For ``cleanup:<path>`` keys: 1.0 when there is cleanup work, else 0.0."""

    @abc.abstractmethod
    def compact(self, key: str, ctx: CompactionContext) -> CompactionResult:
        """Compact the key's database (see :meth:`Compactor.compact` for the errors it ends with)."""

    # -- what the daemon asks when an engine can answer (defaults: it cannot) ---------------------

    def look(self, path: str, *, strict: bool = True) -> Look | None:
        """One look at a database file (strict: the identity checks a compaction's start makes, for
        HTTP, the CLI and explain), which :meth:`sizes` and :meth:`cleanup_key` then answer from
        instead of reading the file again; None: this compactor takes no looks."""
        return None

    def file_problem(self, path: str) -> str | None:
        """Why ``path`` is no database this compactor would compact, in an operator's words; None
        when it may be one (or it cannot tell). Asked only of a compactor that takes no looks."""
        return None

    def cleanup_key(self, key: str, *, look: Look | None = None) -> str | None:
        """The cleanup key a database's state calls for now (SQLite: its ``-wal`` grew past half of
        ``wal_max_size``), asked cheaply whenever a database key is examined; the server then
        examines that key too. None: none (never, for an engine without cleanup keys)."""
        return None

    def exact_size_due(self, key: str) -> bool:
        """Whether the exact size of ``key`` is due (taken on a measurer thread); never by default."""
        return False

    def pinned_wals(self) -> list[PinnedWal]:
        """The logs a reader kept pinned at their database's last compaction, oldest first."""
        return []

    def application(self) -> dict[str, float | int]:
        """What the compactions saw of the applications (``/status``, ``/metrics``): waits for a
        quiet moment, their seconds, give-ups, and looks at a database with and without a lock."""
        return {}

    def configure(
        self, settings: object, *, wal_max_size_bytes: int | None = None, exact_size_interval_s: float | None = None,
    ) -> None:
        """Apply settings live (the server, on every reload): ``[smoosh.sqlite]``'s, and the two
        global sizes an engine may use. Nothing by default."""

    def set_roots(
        self, roots: Iterable[str] | None, *, allow_hard_links: Iterable[str] | None = None,
        allow_mounts: Iterable[str] | None = None,
    ) -> None:
        """Replace the roots every open is checked against, live (None: unrestricted). An engine
        that opens no file by path has nothing to check; nothing by default."""

    def set_io_budget(self, budget: IoBudget | None) -> None:
        """Charge what compactions write to the process's I/O budget. Nothing by default."""

    def set_disk_room(self, room: DiskRoom) -> None:
        """Reserve what compactions write in the process's disk reservations. Nothing by default."""


class _Adapted(CompactorBase):
    """A :class:`Compactor` that is no :class:`CompactorBase` (a plugin, a test's double), seen as one:
    its own answers where it has them, the base's defaults elsewhere."""

    _OPTIONAL = ("look", "file_problem", "cleanup_key", "exact_size_due", "pinned_wals", "application", "configure",
                 "set_roots", "set_io_budget", "set_disk_room")

    def __init__(self, inner: Compactor) -> None:
        self.inner = inner
        self.name = str(getattr(inner, "name", type(inner).__name__))
        # Which of sizes' keywords it takes (the protocol's sizes takes only the key; a double
        # that only compacts, a worker's, may have none).
        try:
            parameters = set(inspect.signature(getattr(inner, "sizes")).parameters)
        except (AttributeError, TypeError, ValueError):
            parameters = set()
        self._sizes_keywords = {name for name in ("exact", "look") if name in parameters}
        for name in self._OPTIONAL:
            own = getattr(inner, name, None)
            if own is not None:
                setattr(self, name, own)

    def claims(self, key: str) -> bool:
        return self.inner.claims(key)

    def sizes(self, key: str, *, exact: bool = False, look: Look | None = None) -> Sizes | None:
        keywords: dict[str, object] = {}
        if exact and "exact" in self._sizes_keywords:
            keywords["exact"] = True
        if look is not None and "look" in self._sizes_keywords:
            keywords["look"] = look
        return self.inner.sizes(key, **keywords) if keywords else self.inner.sizes(key)

    def needs_upgrade(self, key: str) -> bool:
        return self.inner.needs_upgrade(key)

    def cleanup_priority(self, key: str) -> float:
        return self.inner.cleanup_priority(key)

    def compact(self, key: str, ctx: CompactionContext) -> CompactionResult:
        return self.inner.compact(key, ctx)


def adapt(compactor: Compactor | CompactorBase) -> CompactorBase:
    """``compactor`` as the daemon holds it: itself when it is a :class:`CompactorBase`, otherwise a
    view of it that answers the base's questions it lacks with their defaults.

    Parameters:
        compactor: a compactor (a plugin's, the built-in one, a test's double).

    Returns:
        A :class:`CompactorBase`.
    """
    if isinstance(compactor, CompactorBase):
        return compactor
    return _Adapted(compactor)


class CompactionError(SmooshError):
    """Raised when a compaction cannot run or finish; the root of the compactor errors."""


class Busy(CompactionError):
    """Raised when the database is locked by another connection and the compactor gave up waiting."""


#: The reason of a :class:`Blocked` compaction whose file or directory cannot be written.
READ_ONLY = "read-only"


class Blocked(CompactionError):
    """Raised when a compaction could not make progress: a reader pins the WAL, or the database is read-only.

    Not a failure of smoosh nor of the database: something outside (a long reader, the file's
    permissions, a read-only mount) keeps the space from being given back. The message is the
    reason an operator reads (``read-only``, or the bytes a reader keeps in the WAL).

    Attributes:
        read_only: the file or its directory cannot be written; waiting alone will not help,
            so the daemon retries it at its longest backoff.
        size_before_bytes: the footprint (database and WAL) when the compaction began, when
            it got that far (None otherwise): a reader's pinned WAL may give the compacted
            pages back later, and what they reclaim then is counted against it.
    """

    def __init__(self, reason: str, *, read_only: bool = False) -> None:
        super().__init__(reason)
        self.read_only = read_only
        self.size_before_bytes: int | None = None


class Replaced(CompactionError):
    """Raised when the database's path names another file than the one being compacted (renamed over it).

    Attributes:
        path: the database path.
        integrity: ``PRAGMA integrity_check`` of the file the path names now (None: not taken
            yet: the compactor raises it bare where it notices, and again with the verdict);
            ``"ok"``, its problems, or ``"not checked: <why>"``. The message says it in words an
            operator reads at a glance: the new file is intact, corrupt, or was not checked.
        rolled_back: the compaction was interrupted and rolled back (False: it had committed to
            the old file before the rename was seen).
    """

    def __init__(self, path: str, *, integrity: str | None = None, rolled_back: bool = True) -> None:
        what = "the compaction was interrupted and rolled back" if rolled_back else "the compaction had finished on the old file"
        message = f"{path} was replaced (renamed over) while it was being compacted: {what}"
        if integrity is not None:
            message += "; " + _verdict(integrity)
        super().__init__(message)
        self.path = path
        self.integrity = integrity
        self.rolled_back = rolled_back


def _verdict(integrity: str) -> str:
    if integrity == "ok":
        return "the new file is intact (integrity_check: ok)"
    if integrity.startswith("not checked: "):
        return f"the new file could not be checked ({integrity[len('not checked: '):]})"
    return f"the new file is CORRUPT (integrity_check: {integrity})"


class Interrupted(CompactionError):
    """Raised when a compaction was stopped on request (hold, strict window, clean stop); work rolled back or kept."""


class Gone(CompactionError):
    """Raised when the database to compact no longer exists or is no longer a database of this kind."""


class Refused(Gone):
    """Raised when a database path lies outside the roots or reaches its file through a symbolic link; the file is never opened.

    A :class:`Gone`, so the worker drops the key (result ``gone``) instead of retrying it with
    backoff: the path cannot become acceptable by waiting. Such a path was canonical and
    inside the roots when it was enqueued, so a refusal means it changed since (a file or a
    directory swapped for a symlink): a security event, logged once at WARNING where it is
    refused.

    Attributes:
        path: the database path as it was about to be opened.
        reason: why it was refused, e.g. ``"reaches its file through a symbolic link"``.
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"refused to open {path}: {reason}")
        self.path = path
        self.reason = reason


class Shared(Refused):
    """Raised when a database file is shared with names outside smoosh's view: more than one hard
    link, another mount than its root, or a side file that is a link (see :mod:`smoosh.identity`).

    Refused where a key is measured (priority 0, like any refused path); a compaction that meets
    it ends ``blocked`` instead (the compactor raises :class:`Blocked`), since an operator can
    end the sharing and the key is then worth compacting again.
    """


class InsufficientSpace(Blocked):
    """Raised when a compaction's writes would not fit on disk beside the reservations of those running
    and ``min_free_space`` (:mod:`smoosh.disk_room`): refused before anything is opened, ``blocked``.

    Attributes:
        directory: where the room is missing.
        needed_bytes: what the compaction would write there.
        free_bytes: free on that file system when it was refused.
    """

    def __init__(self, message: str, *, directory: str, needed_bytes: int, free_bytes: int) -> None:
        super().__init__(message)
        self.directory = directory
        self.needed_bytes = needed_bytes
        self.free_bytes = free_bytes


def refused(path: str, reason: str) -> Refused:
    """The :class:`Refused` error for ``path``, logged once at WARNING (without a traceback).

    A path that was canonical and inside the roots when it was enqueued and is refused now was
    changed under smoosh: an operator should see it (``journalctl -p warning``).

    Parameters:
        path: the refused path.
        reason: why.

    Returns:
        The error, for the caller to raise.
    """
    _refusals.warning("Refused to open the database %r: %s.", path, reason)
    return Refused(path, reason)


#: (path, reason) pairs :func:`shared` has logged, oldest first; at most this many are kept.
_SHARED_WARNED_MAX = 4096
_shared_warned: collections.OrderedDict[tuple[str, str], None] = collections.OrderedDict()
_shared_lock = threading.Lock()


def shared(path: str, reason: str) -> Shared:
    """The :class:`Shared` error for ``path``, logged at WARNING once per path and reason.

    A shared file stays shared until an operator acts, and the watcher brings it back on
    every write: one line says it, not one per examination. (Per process, for the last
    4,096 files refused so; ``explain`` says it whenever asked.)

    Parameters:
        path: the refused path.
        reason: why (one of :mod:`smoosh.identity`'s reasons).

    Returns:
        The error, for the caller to raise.
    """
    with _shared_lock:
        new = (path, reason) not in _shared_warned
        if new:
            _shared_warned[(path, reason)] = None
            if len(_shared_warned) > _SHARED_WARNED_MAX:
                _shared_warned.popitem(last=False)
    if new:
        _refusals.warning("Refused to compact the database %r: %s.", path, reason)
    return Shared(path, reason)
