"""One live daemon per ``node`` name on a shared store: who served a node, and whether it still lives.

Two daemons with one ``node`` on one store serve one job type: each takes the other's jobs,
refuses them as outside its roots, and the owner records its database as ``gone`` (issue 25).
``node`` defaults to the host name, so two daemons on one machine sharing a ``sqlite:`` store
meet it unless each is given its own name. Every daemon's status record in the store
(:mod:`smoosh.daemon.record.status`, rewritten every ~5 s) therefore names the process that
wrote it, as an :class:`Identity`; a daemon starting on a node name reads the record of
whoever served that name last and starts only if that one is provably dead
(:func:`provably_dead`):

* it stopped cleanly (its last record says so);
* it ran on this machine (same host name, boot and PID namespace) with this ``state_dir``:
  this process holds the directory's instance lock, which that one would hold while alive;
* it ran on this machine and its PID is gone, or belongs now to a process that started at
  another moment (a recycled PID), or to this very process while the instance is none of
  the servers running here (an earlier :class:`~smoosh.daemon.server.Server` of this process);
* it ran on another machine (or this one cannot say whether its process lives) and its
  record is stale: not rewritten for 15 s, three status intervals.

Stopped is not dead (DESIGN §10): on this machine a process that is still there, with the
start time its record names (:func:`process_alive_here`), is alive however late its
heartbeat: a daemon stopped by SIGSTOP, a debugger, a frozen cgroup or a paused VM writes no
record, and taking its node over would make two daemons of one node the moment it runs on.
Only across machines, where no PID can be looked up, does the heartbeat decide.

Anything else is alive, and the start is refused (:class:`NodeInUse`, naming the holder's
host, PID, start time and the age of its last record). A restart right after a kill -9 is
thus never kept waiting for the dead one's record to go stale: the machine is the same, and
so is the ``state_dir`` (or at least the PID is gone).

A job's holder is named the same way (:attr:`Identity.holder`: the instance with the host,
PID, start time and machine), so the take-over of jobs at start asks the same question of a
job's holder (:func:`process_alive_here`) before it looks at the job's heartbeat.

The instance id is drawn at every start, so a daemon never mistakes its own earlier life, or
an unrelated process that inherited its PID, for itself.
"""

from __future__ import annotations

import datetime
import os
import secrets
import socket
import threading
from dataclasses import dataclass
from typing import Any, Mapping

from smoosh.errors import SmooshError

__all__ = ["Identity", "NodeInUse", "provably_dead", "process_alive_here", "running_here"]

#: Separates the parts of a holder's name (:attr:`Identity.holder`); no host name holds it.
_HOLDER_SEP = "/"


class NodeInUse(SmooshError):
    """Raised when a live daemon of another process serves this node name on this store already.

    Attributes:
        node: the node name.
        host, pid: the live daemon's host and PID.
        since: when its process started (unix seconds), or None where its record does not say.
        heartbeat_age_s: seconds since it last wrote its status record.
        late: whether that record is older than the heartbeat rule allows (its process is
            alive on this host all the same: stopped or stalled, not dead).
    """

    def __init__(self, node: str, host: str, pid: int, *, since: float | None = None,
                 heartbeat_age_s: float | None = None, late: bool = False) -> None:
        started = "since an unknown time" if since is None else f"since {_utc(since)}"
        beat = "" if heartbeat_age_s is None else f", last heartbeat {max(0.0, heartbeat_age_s):.0f} s ago"
        alive = (": late, but its process is alive on this host (stopped or stalled, not dead), so it is "
                 "not taken over" if late else "")
        super().__init__(
            f"another smoosh is running as node {node!r} on this store (host {host}, pid {pid}, {started}{beat}{alive}); "
            "give each daemon its own node name ([smoosh] node in its config)"
        )
        self.node = node
        self.host = host
        self.pid = pid
        self.since = since
        self.heartbeat_age_s = heartbeat_age_s
        self.late = late


@dataclass(frozen=True)
class Identity:
    """The process a status record (or a job's heartbeat) comes from.

    Attributes:
        host: the host name.
        pid: the process id.
        instance: random, drawn at every start of a daemon (or worker).
        started: when the process started, in the kernel's clock ticks since boot (None where
            ``/proc`` does not say): a PID that now belongs to another process started at
            another moment.
        machine: the boot id and PID namespace (None where ``/proc`` does not say): two
            containers may share a host name, never both.
        state_dir: the daemon's ``state_dir`` (real path), whose instance lock it holds.
        since: when the process started, unix seconds (None where ``/proc`` does not say): for
            the words of a refusal, never to decide (``started`` decides).
    """

    host: str
    pid: int
    instance: str
    started: int | None
    machine: str | None
    state_dir: str | None
    since: float | None = None

    @classmethod
    def of_this_process(cls, state_dir: str | None = None) -> Identity:
        """This process, with a fresh instance id.

        Parameters:
            state_dir: the daemon's ``state_dir`` (None for a stand-alone worker).
        """
        pid = os.getpid()
        started = _start_ticks(pid)
        return cls(
            host=socket.gethostname(), pid=pid, instance=secrets.token_hex(8), started=started,
            machine=_machine(), state_dir=os.path.realpath(state_dir) if state_dir else None,
            since=_start_time(started),
        )

    def to_record(self) -> dict[str, Any]:
        """The identity as the status record stores it."""
        return {"host": self.host, "pid": self.pid, "instance": self.instance, "started": self.started,
                "machine": self.machine, "state_dir": self.state_dir, "since": self.since}

    @property
    def holder(self) -> str:
        """The name a job's data gives this process as its holder: ``INSTANCE/HOST/PID/STARTED/MACHINE``.

        Enough to ask :func:`process_alive_here` about it from another process (``STARTED`` is
        ``-`` where unknown, ``MACHINE`` empty); :meth:`from_holder` reads it back.
        """
        started = "-" if self.started is None else str(self.started)
        return _HOLDER_SEP.join((self.instance, self.host, str(self.pid), started, self.machine or ""))

    @classmethod
    def from_holder(cls, holder: object) -> Identity | None:
        """The identity a job's holder names (see :attr:`holder`); None for any other text
        (an older smoosh's bare instance id), which says nothing of its process."""
        if not isinstance(holder, str):
            return None
        parts = holder.split(_HOLDER_SEP, 4)
        if len(parts) != 5:
            return None
        instance, host, pid, started, machine = parts
        if not (instance and host and pid.isdigit() and (started == "-" or started.isdigit())):
            return None
        return cls(host=host, pid=int(pid), instance=instance, started=None if started == "-" else int(started),
                   machine=machine or None, state_dir=None)

    @classmethod
    def from_record(cls, value: object) -> Identity | None:
        """The identity a status record names; None when it names none (a record of an older smoosh)."""
        if not isinstance(value, Mapping):
            return None
        host, pid, instance = value.get("host"), value.get("pid"), value.get("instance")
        if not (isinstance(host, str) and isinstance(instance, str) and isinstance(pid, int)):
            return None
        started, machine, state_dir = value.get("started"), value.get("machine"), value.get("state_dir")
        since = value.get("since")
        return cls(
            host=host, pid=pid, instance=instance, started=started if isinstance(started, int) else None,
            machine=machine if isinstance(machine, str) else None,
            state_dir=state_dir if isinstance(state_dir, str) else None,
            since=float(since) if isinstance(since, (int, float)) and not isinstance(since, bool) else None,
        )

    def same_machine(self, other: Identity) -> bool:
        """Whether ``other`` ran on this machine, where its PID can be looked up."""
        if self.host != other.host:
            return False
        return self.machine is None or other.machine is None or self.machine == other.machine


def provably_dead(theirs: Identity, ours: Identity, *, age_s: float, stale_after_s: float, stopped: bool) -> str | None:
    """Why the daemon ``theirs`` cannot be alive any more, or None if it may be (see the module docstring).

    Parameters:
        theirs: who wrote the node's status record.
        ours: this daemon, which holds its ``state_dir``'s instance lock.
        age_s: seconds since that record was written.
        stale_after_s: a record older than this is stale (its writer stopped writing it).
        stopped: whether the record says its daemon stopped cleanly.

    Returns:
        The proof in words (for the log), or None.
    """
    if theirs.instance == ours.instance:
        return "it is this daemon"
    if stopped:
        return "it stopped cleanly"
    if ours.same_machine(theirs):
        if ours.state_dir is not None and theirs.state_dir == ours.state_dir:
            # A stopped process keeps its flock: had it lived, this daemon would not hold the lock.
            return "it ran on this state_dir, whose lock this daemon holds"
        alive, proof = _process_here(theirs)
        if alive is True:
            return None  # stopped is not dead: however late its record, it runs on when continued
        if alive is False:
            return proof
    if age_s > stale_after_s:
        return f"its status record is {age_s:.0f} s old"
    return None


def process_alive_here(theirs: Identity) -> bool | None:
    """Whether the process ``theirs`` names lives on this machine: the one question its heartbeat cannot answer.

    Asked by the node's claim (through :func:`provably_dead`) and by the take-over of jobs at
    start (of a job's holder, :attr:`Identity.holder`): one answer for both.

    Parameters:
        theirs: a daemon's or worker's identity (from a status record or a job's holder).

    Returns:
        True: it ran on this machine and its process is there, with the start time it names
        (a process of this very process: while a server of it runs as that instance), however
        late its heartbeat; False: it ran here and its process is gone, or its PID belongs to
        another process now; None: it ran on another machine, or this one cannot tell (no
        ``/proc``, no start time recorded): the heartbeat decides.
    """
    ours = Identity(host=socket.gethostname(), pid=os.getpid(), instance="", started=None, machine=_machine(),
                    state_dir=None)
    if not ours.same_machine(theirs):
        return None
    return _process_here(theirs)[0]


def _process_here(theirs: Identity) -> tuple[bool | None, str | None]:
    """:func:`process_alive_here` for an identity on this machine, with the proof of a death in words."""
    if theirs.pid == os.getpid():
        if running_here.has(theirs.instance):
            return True, None
        return False, "it was an earlier start of this process"
    try:
        os.kill(theirs.pid, 0)
    except ProcessLookupError:
        return False, f"its process {theirs.pid} is gone"
    except PermissionError:
        pass  # a process of another user holds the PID: alive, unless it is another process
    except OSError:
        return None, None
    started = _start_ticks(theirs.pid)
    if theirs.started is None or started is None:
        return None, None  # the PID is taken, but by whom cannot be told: the heartbeat decides
    if started != theirs.started:
        return False, f"its PID {theirs.pid} belongs to another process now"
    return True, None


class _RunningHere:
    """The instance ids of the servers running in this process.

    Owner: this class; one lock. The server adds its instance as it claims its node and
    discards it as it stops; :func:`provably_dead` asks.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._instances: set[str] = set()

    def add(self, instance: str) -> None:
        """A server of this process serves a node as ``instance`` from now on."""
        with self._lock:
            self._instances.add(instance)

    def discard(self, instance: str) -> None:
        """The server of ``instance`` stopped."""
        with self._lock:
            self._instances.discard(instance)

    def has(self, instance: str) -> bool:
        """Whether a server of this process runs as ``instance`` now."""
        with self._lock:
            return instance in self._instances


#: The servers running in this process (see :class:`_RunningHere`).
running_here = _RunningHere()


def _start_ticks(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/PID/stat`` field 22); None if unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        # The command name (field 2) may hold spaces and parentheses: count after its last ')'.
        return int(stat[stat.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _start_time(ticks: int | None) -> float | None:
    """The unix time a process started ``ticks`` clock ticks after boot (``btime`` in ``/proc/stat``); None if unknown."""
    if ticks is None:
        return None
    try:
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    return int(line.split()[1]) + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    return None


def _utc(at: float) -> str:
    """A unix time as ``2026-11-24T19:20:00Z``."""
    return datetime.datetime.fromtimestamp(at, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _machine() -> str | None:
    """This kernel's boot id and this process's PID namespace; None where ``/proc`` does not say."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None
