"""A tiny sd_notify client: tells systemd (``Type=notify``) that smoosh is ready, alive, stopping.

The protocol is one datagram per message on the AF_UNIX socket named by ``$NOTIFY_SOCKET``
(a leading ``@`` means the abstract namespace). Without that variable every call is a no-op,
so the daemon behaves the same outside systemd. Sending never raises: a notification that
cannot be delivered is logged at DEBUG and the daemon goes on (systemd's own ``sd_notify``
behaves the same way).

The watchdog ping is sent from the daemon's main loop, not from a side thread, so a hung
loop stops the pings and systemd restarts the service (``WatchdogSec=`` in the unit).
"""

from __future__ import annotations

import logging
import os
import socket
import time

log = logging.getLogger(__name__)

#: Environment variable holding the notification socket's address.
NOTIFY_SOCKET_ENV = "NOTIFY_SOCKET"
#: Environment variable holding the watchdog interval, in microseconds.
WATCHDOG_USEC_ENV = "WATCHDOG_USEC"
#: Environment variable naming the process the watchdog applies to (absent: this one).
WATCHDOG_PID_ENV = "WATCHDOG_PID"
#: Longest STATUS= text sent, in characters (systemctl shows one line anyway).
MAX_STATUS_CHARS = 200


def _address() -> str | None:
    address = os.environ.get(NOTIFY_SOCKET_ENV)
    if not address:
        return None
    if address.startswith("@"):
        # Abstract namespace: the leading '@' stands for a NUL byte (sd_notify(3)).
        return "\0" + address[1:]
    return address


def enabled() -> bool:
    """Whether systemd asked for notifications (``$NOTIFY_SOCKET`` names a usable address)."""
    return _address() is not None


def notify(message: str) -> bool:
    """Send one notification (``"READY=1"``, several lines joined by newlines, ...).

    Parameters:
        message: the ``KEY=VALUE`` lines to send.

    Returns:
        True when the datagram was sent; False without ``$NOTIFY_SOCKET`` or on a send error.
    """
    address = _address()
    if address is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(message.encode("utf-8", "replace"))
        return True
    except OSError as e:
        log.debug("could not notify systemd at %r: %s", address, e)
        return False


def ready() -> bool:
    """Tell systemd start-up is complete (every channel restored, the admin API serving)."""
    return notify("READY=1")


def watchdog_ping() -> bool:
    """Tell systemd the main loop is alive (send at half of :func:`watchdog_interval_s`)."""
    return notify("WATCHDOG=1")


def stopping() -> bool:
    """Tell systemd a clean stop has begun."""
    return notify("STOPPING=1")


def reloading() -> bool:
    """Tell systemd the config is being re-read; send :func:`ready` when done (sd_notify(3)).

    The message carries ``MONOTONIC_USEC`` (CLOCK_MONOTONIC now), which ``Type=notify-reload``
    units require and plain ``Type=notify`` units accept.
    """
    usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    return notify(f"RELOADING=1\nMONOTONIC_USEC={usec}")


def status(text: str) -> bool:
    """Set the one-line status ``systemctl status smoosh`` shows.

    Parameters:
        text: a short summary; newlines are replaced and it is cut at 200 characters.
    """
    line = " ".join(text.split())[:MAX_STATUS_CHARS]
    return notify(f"STATUS={line}")


def watchdog_interval_s() -> float | None:
    """The watchdog interval systemd expects pings within, in seconds; None when disabled.

    Returns:
        ``$WATCHDOG_USEC`` in seconds, or None when it is unset, invalid or zero, or when
        ``$WATCHDOG_PID`` names another process (the variable was inherited, not meant for us).
    """
    text = os.environ.get(WATCHDOG_USEC_ENV)
    if not text:
        return None
    pid_text = os.environ.get(WATCHDOG_PID_ENV)
    if pid_text and pid_text.strip() != str(os.getpid()):
        return None
    try:
        usec = int(text)
    except ValueError:
        log.warning("ignoring %s=%r: not an integer", WATCHDOG_USEC_ENV, text)
        return None
    return usec / 1_000_000 if usec > 0 else None
