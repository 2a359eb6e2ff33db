"""When nothing answers at the config's ``http``: is a daemon running on this config elsewhere?

``http`` needs a restart (DESIGN §11): after an edit of it the daemon goes on listening on its
old address, while every CLI command reads the new one from the config and finds nothing
there. The CLI cannot ask the daemon (that is the point), but it can see two things on this
host: whether a process holds the config's ``state_dir`` lock (``/proc/locks``), and which TCP
addresses that process listens on (its socket descriptors matched against
``/proc/PID/net/tcp``). From them it says where the daemon is, or at least that it runs.
"""

from __future__ import annotations

import argparse
import ipaddress
import os

from smoosh.errors import SmooshError

__all__ = ["moved_daemon_hint", "listening_addresses"]

#: TCP state LISTEN in ``/proc/net/tcp``.
TCP_LISTEN = "0A"


def listening_addresses(pid: int, *, proc: str = "/proc") -> list[str]:
    """The TCP addresses process ``pid`` listens on, as ``HOST:PORT`` (``[HOST]:PORT`` for IPv6).

    Parameters:
        pid: the process.
        proc: where procfs is mounted.

    Returns:
        Its listening sockets' addresses, sorted; empty when they cannot be read (another
        user's process, not Linux).
    """
    try:
        inodes = set()
        for fd in os.listdir(f"{proc}/{pid}/fd"):
            try:
                target = os.readlink(f"{proc}/{pid}/fd/{fd}")
            except OSError:
                continue  # closed meanwhile
            if target.startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
    except OSError:
        return []
    found = []
    for table, width in (("tcp", 4), ("tcp6", 16)):
        try:
            with open(f"{proc}/{pid}/net/{table}") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != TCP_LISTEN or fields[9] not in inodes:
                continue
            address, _, port = fields[1].partition(":")
            host = _host(address, width)
            if host is not None:
                found.append(f"[{host}]:{int(port, 16)}" if ":" in host else f"{host}:{int(port, 16)}")
    return sorted(set(found))


def _host(hex_address: str, width: int) -> str | None:
    """An address of ``/proc/net/tcp{,6}``: 32-bit words in the host's byte order (little-endian here)."""
    try:
        raw = bytes.fromhex(hex_address)
    except ValueError:
        return None
    if len(raw) != width:
        return None
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, width, 4))
    return str(ipaddress.ip_address(words))


def moved_daemon_hint(args: argparse.Namespace) -> str | None:
    """What to tell an operator whose command found nothing at the config's ``http``, or None.

    Only when the address came from the config (no ``--url``), and a process holds the
    config's ``state_dir`` lock: then a daemon runs on this config but not where it says.

    Parameters:
        args: the command's arguments (``url``, ``config``).

    Returns:
        One sentence: where the daemon listens and the ``--url`` that reaches it, or (when its
        sockets cannot be read) that it still listens on its old address until restarted.
    """
    if getattr(args, "url", None):
        return None
    from smoosh.cli.doctor.lock import lock_holder
    from smoosh.config import read_admin_address
    from smoosh.daemon.control.instance_lock import LOCK_FILE

    try:
        address = read_admin_address(getattr(args, "config", None))
    except SmooshError:
        return None
    if address.state_dir is None:
        return None
    lock = os.path.join(address.state_dir, LOCK_FILE)
    holder = lock_holder(lock) if os.path.exists(lock) else None
    if holder is None or not holder[0]:
        return None  # no daemon on this state_dir: "cannot reach" says it all
    pid = holder[1]
    elsewhere = [a for a in listening_addresses(pid) if a != address.http] if pid else []
    who = f"the smoosh daemon on this config's state_dir (pid {pid})" if pid else \
        "a smoosh daemon on this config's state_dir"
    if elsewhere:
        return (f"{who} listens on {', '.join(elsewhere)}, not on the config's http {address.http}: http changed "
                f"since it started and takes effect only when it restarts; until then --url http://{elsewhere[0]} "
                "reaches it")
    return (f"{who} runs but does not answer on the config's http {address.http}: if http changed since it "
            "started, it still listens on its old address until it restarts (http needs a restart); pass that "
            "address with --url")
