"""The admin API's address, for ``smoosh doctor``: free to listen on, or held by this node's own daemon.

``smoosh run`` binds ``http`` before anything else and exits when it cannot ("cannot listen
on ... for the admin API"); a doctor that said ok while another program held the port was
wrong about the one thing that stops a start. So the address is bound for a moment, as the
daemon binds it (``SO_REUSEADDR``, so a restart's ``TIME_WAIT`` sockets do not count), and
closed at once; when it is taken, the process listening on the port is looked up
(``/proc/net/tcp`` and ``tcp6``, then the processes' descriptors) and compared with the holder
of ``state_dir``'s lock: this node's own running daemon is fine, anything else fails, named.
"""

from __future__ import annotations

import errno
import os
import socket

from smoosh.cli.doctor.findings import FAIL, OK, WARN, Finding

__all__ = ["check_admin", "listener_pid"]

#: What the findings are about.
CHECK = "admin API"
#: ``/proc/net/tcp`` state of a listening socket.
_LISTEN = "0A"


def check_admin(http: str, *, lock_pid: int | None) -> Finding:
    """Whether ``smoosh run`` could listen on ``http``, or this node's daemon does already.

    Parameters:
        http: the config's ``http`` (``host:port``).
        lock_pid: the pid holding ``state_dir``'s instance lock (this node's running daemon),
            or None when none does.

    Returns:
        ok (free; or taken by the lock's holder), warn (free while this node's daemon runs: it
        listens elsewhere, its ``http`` changed since it started), or fail (taken by another
        process, named when this user can see it; not an address of this host; not allowed).
    """
    from smoosh.config.address import split_host_port

    try:
        host, port = split_host_port(http)
    except ValueError as e:
        return Finding(FAIL, CHECK, f"http = {http!r}: {e}", "correct [smoosh] http (HOST:PORT)")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the daemon binds
            sock.bind((host, port))
    except OSError as e:
        return _taken(http, port, e, lock_pid)
    if lock_pid is not None:
        return Finding(WARN, CHECK, f"{http}: free, but this node's daemon (pid {lock_pid}) runs and does not listen on "
                                    "it: its http changed since it started",
                       "restart the daemon to move its admin API to this address (http needs a restart)")
    return Finding(OK, CHECK, f"{http}: free: `smoosh run` can listen on it")


def _taken(http: str, port: int, error: OSError, lock_pid: int | None) -> Finding:
    """The finding for an address that could not be bound (``error``)."""
    if error.errno == errno.EADDRINUSE:
        pid = listener_pid(port)
        if pid is not None and pid == lock_pid:
            return Finding(OK, CHECK, f"{http}: held by this node's running daemon (pid {pid}, the holder of "
                                      "state_dir's lock)")
        who = f"pid {pid} ({_command(pid)})" if pid is not None else "another process (not visible to this user)"
        return Finding(FAIL, CHECK, f"{http}: taken by {who}: `smoosh run` would exit, unable to listen on it",
                       "stop that process, or give [smoosh] http another port")
    if error.errno == errno.EADDRNOTAVAIL:
        return Finding(FAIL, CHECK, f"{http}: not an address of this host", "give [smoosh] http an address of this host")
    if error.errno == errno.EACCES:
        return Finding(FAIL, CHECK, f"{http}: this user may not listen on port {port}",
                       "use a port above 1023, or run smoosh with the privilege to bind it")
    return Finding(FAIL, CHECK, f"{http}: cannot listen on it: {error.strerror or error}",
                   "correct [smoosh] http")


def listener_pid(port: int, *, proc: str = "/proc") -> int | None:
    """The pid of a process listening on TCP ``port`` (any address, IPv4 or IPv6), or None.

    Parameters:
        port: the port.
        proc: where ``/proc`` is.

    Returns:
        The first process found holding a listening socket on the port; None when none this
        user can see does (another user's descriptors are not readable), or ``/proc`` cannot say.
    """
    inodes: set[str] = set()
    for table in ("net/tcp", "net/tcp6"):
        try:
            with open(os.path.join(proc, table)) as f:
                next(f, None)  # the header
                for line in f:
                    parts = line.split()
                    # "sl local_address rem_address st ... inode": local_address is ADDR:PORT in hex
                    if len(parts) > 9 and parts[3] == _LISTEN and int(parts[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(parts[9])
        except (OSError, ValueError, IndexError):
            continue
    if not inodes:
        return None
    wanted = {f"socket:[{inode}]" for inode in inodes if inode != "0"}
    try:
        pids = sorted(int(name) for name in os.listdir(proc) if name.isdigit())
    except OSError:
        return None
    for pid in pids:
        fd_dir = os.path.join(proc, str(pid), "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(os.path.join(fd_dir, fd)) in wanted:
                    return pid
            except OSError:
                continue
    return None


def _command(pid: int) -> str:
    """A process's command line, shortened, for a finding; ``unknown`` when unreadable."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return "command unknown"
    text = " ".join(a.decode("utf-8", "replace") for a in raw.split(b"\0") if a)
    return text[:120] + ("..." if len(text) > 120 else "") or "command unknown"
