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
* its record is stale: not rewritten for 15 s, three status intervals;
* it ran on this machine (same host name, boot and PID namespace) with this ``state_dir``:
  this process holds the directory's instance lock, which that one would hold while alive;
* it ran on this machine and its PID is gone, or belongs now to a process that started at
  another moment (a recycled PID), or to this very process while the instance is none of
  the servers running here (an earlier :class:`~smoosh.daemon.server.Server` of this process).

Anything else is alive, and the start is refused (:class:`NodeInUse`). A restart right after
a kill -9 is thus never kept waiting for the dead one's record to go stale: the machine is
the same, and so is the ``state_dir`` (or at least the PID is gone).

The instance id is drawn at every start, so a daemon never mistakes its own earlier life, or
an unrelated process that inherited its PID, for itself.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
from dataclasses import dataclass
from typing import Any, Mapping

from smoosh.errors import SmooshError

__all__ = ["Identity", "NodeInUse", "provably_dead", "running_here"]


class NodeInUse(SmooshError):
    """Raised when a live daemon of another process serves this node name on this store already."""

    def __init__(self, node: str, host: str, pid: int) -> None:
        super().__init__(
            f"another smoosh is running as node {node!r} on this store (host {host}, pid {pid}); "
            "give each daemon its own node name ([smoosh] node in its config)"
        )
        self.node = node
        self.host = host
        self.pid = pid


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
    """

    host: str
    pid: int
    instance: str
    started: int | None
    machine: str | None
    state_dir: str | None

    @classmethod
    def of_this_process(cls, state_dir: str | None = None) -> Identity:
        """This process, with a fresh instance id.

        Parameters:
            state_dir: the daemon's ``state_dir`` (None for a stand-alone worker).
        """
        pid = os.getpid()
        return cls(
            host=socket.gethostname(), pid=pid, instance=secrets.token_hex(8), started=_start_ticks(pid),
            machine=_machine(), state_dir=os.path.realpath(state_dir) if state_dir else None,
        )

    def to_record(self) -> dict[str, Any]:
        """The identity as the status record stores it."""
        return {"host": self.host, "pid": self.pid, "instance": self.instance, "started": self.started,
                "machine": self.machine, "state_dir": self.state_dir}

    @classmethod
    def from_record(cls, value: object) -> Identity | None:
        """The identity a status record names; None when it names none (a record of an older smoosh)."""
        if not isinstance(value, Mapping):
            return None
        host, pid, instance = value.get("host"), value.get("pid"), value.get("instance")
        if not (isinstance(host, str) and isinstance(instance, str) and isinstance(pid, int)):
            return None
        started, machine, state_dir = value.get("started"), value.get("machine"), value.get("state_dir")
        return cls(
            host=host, pid=pid, instance=instance, started=started if isinstance(started, int) else None,
            machine=machine if isinstance(machine, str) else None,
            state_dir=state_dir if isinstance(state_dir, str) else None,
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
    if age_s > stale_after_s:
        return f"its status record is {age_s:.0f} s old"
    if not ours.same_machine(theirs):
        return None
    if ours.state_dir is not None and theirs.state_dir == ours.state_dir:
        return "it ran on this state_dir, whose lock this daemon holds"
    if theirs.pid == ours.pid:
        return None if running_here.has(theirs.instance) else "it was an earlier start of this process"
    try:
        os.kill(theirs.pid, 0)
    except ProcessLookupError:
        return f"its process {theirs.pid} is gone"
    except PermissionError:
        pass  # a process of another user holds the PID: alive, unless it is another process
    started = _start_ticks(theirs.pid)
    if theirs.started is not None and started is not None and started != theirs.started:
        return f"its PID {theirs.pid} belongs to another process now"
    return None


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


def _machine() -> str | None:
    """This kernel's boot id and this process's PID namespace; None where ``/proc`` does not say."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None
