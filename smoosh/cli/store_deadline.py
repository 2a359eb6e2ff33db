"""Commands that read the store answer within a deadline, whatever the store does (issue 50).

``smoosh status --store``, ``jobs``, ``suspend --store`` and ``resume --store`` go to the store
and to no daemon. A FoundationDB cluster that is down does not refuse a client: it leaves its
reads and commits waiting, and ``status --store`` sat there with no output until it was
killed. Every such command now runs its store work through :func:`answer_within`:

* each transaction carries the deadline as its own timeout (FoundationDB's ``timeout``
  option: the client gives up with 1031 by itself);
* and the whole of the work (opening the store included: a store file on a filesystem that
  hangs blocks in ``open``) runs on a thread of its own, which the command stops waiting for
  at the deadline.

Either way the command says ``the store URL is unreachable since WHEN`` and exits 1, within
the deadline (``--store-timeout``, :data:`STORE_DEADLINE_S` by default). *Since when*: what
this host's daemon reports, when it uses the same store and says it is unreachable (it has
been watching it); else when this command started to ask.
"""

from __future__ import annotations

import argparse
import datetime
import threading
import time
from typing import Any, Callable, TypeVar

from smoosh.errors import SmooshError
from smoosh.store import Store, open_store
from smoosh.store.errors import TRANSACTION_TIMED_OUT, StoreError

__all__ = ["STORE_DEADLINE_S", "StoreUnreachable", "answer_within", "deadline_of", "add_deadline_option"]

T = TypeVar("T")

#: Seconds a command waits for the store's answer by default: far above a healthy store's
#: round trips (milliseconds), short enough that an operator is not left waiting.
STORE_DEADLINE_S = 5.0
#: Seconds the command gives this host's daemon to say since when the store is unreachable.
DAEMON_ASK_S = 1.0


class StoreUnreachable(SmooshError):
    """Raised when the store gave no answer within the command's deadline.

    Attributes:
        url: the store.
        since: since when it does not answer (Unix seconds).
        deadline_s: the deadline the command waited.
    """

    def __init__(self, url: str, since: float, deadline_s: float, *, said_by: str | None = None) -> None:
        when = datetime.datetime.fromtimestamp(since).strftime("%Y-%m-%d %H:%M:%S")
        source = f"as the daemon at {said_by} reports; " if said_by else ""
        super().__init__(f"the store {url} is unreachable since {when} ({source}no answer within {deadline_s:g} s)")
        self.url = url
        self.since = since
        self.deadline_s = deadline_s


def add_deadline_option(parser: argparse.ArgumentParser, *, inherited: bool = False) -> None:
    """``--store-timeout SECONDS`` on a command that reads the store (``inherited``: on a subcommand
    of one, where it is left unset unless given, and the command's own value stands)."""
    if inherited:
        parser.add_argument("--store-timeout", metavar="SECONDS", type=_seconds, default=argparse.SUPPRESS,
                            help="as before the subcommand")
        return
    parser.add_argument("--store-timeout", metavar="SECONDS", type=_seconds, default=STORE_DEADLINE_S,
                        help=f"with a store: give up when it has not answered within this many seconds "
                             f"(default {STORE_DEADLINE_S:g}): the command says since when it is unreachable, exit 1")


def deadline_of(args: argparse.Namespace) -> float:
    """The command's deadline (``--store-timeout``), in seconds."""
    return float(getattr(args, "store_timeout", None) or STORE_DEADLINE_S)


def answer_within(
    url: str, work: Callable[[Store], T], deadline_s: float, *, create: bool = False,
    args: argparse.Namespace | None = None, opener: Callable[..., Store] | None = None,
) -> T:
    """Open the store at ``url`` and run ``work(store)``, giving up at ``deadline_s``.

    ``work`` should pass ``timeout_s=deadline_s`` to its transactions (the store's own way of
    giving up); the thread is the net under whatever still blocks.

    Parameters:
        url: the store.
        work: what the command does with it; its return value is returned.
        deadline_s: seconds to wait at most.
        create: create a ``sqlite:`` store that does not exist (commands never do).
        args: the command's arguments (the config that names this host's daemon, asked
            for since when the store is unreachable).
        opener: opens the store (default :func:`smoosh.store.open_store`; tests hand a stand-in's).

    Returns:
        What ``work`` returned.

    Raises:
        StoreUnreachable: no answer within ``deadline_s``, or the store's own timeout (1031).
        SmooshError: anything else the store or ``work`` raised.
    """
    started = time.time()
    box: dict[str, Any] = {}
    open_ = opener or open_store

    def run() -> None:
        try:
            with open_(url, create=create) as store:
                box["value"] = work(store)
        except BaseException as e:  # handed to the command's thread
            box["error"] = e

    # A daemon thread: a store that never answers must not keep the command from exiting.
    thread = threading.Thread(target=run, name="smoosh-cli-store", daemon=True)
    thread.start()
    thread.join(deadline_s)
    error = box.get("error")
    timed_out = isinstance(error, StoreError) and error.code == TRANSACTION_TIMED_OUT
    if thread.is_alive() or timed_out:
        since, said_by = _since_daemon_says(url, args)
        raise StoreUnreachable(url, since if since is not None else started, deadline_s, said_by=said_by) from error
    if error is not None:
        raise error
    return box["value"]


def _since_daemon_says(url: str, args: argparse.Namespace | None) -> tuple[float | None, str | None]:
    """Since when this host's daemon finds the store unreachable, if it uses ``url`` and says so."""
    if args is None:
        return None, None
    try:
        from smoosh.cli.client import daemon_target, http_request

        target = daemon_target(argparse.Namespace(config=getattr(args, "config", None), url=None))
        status = http_request("GET", f"{target.url}/status", timeout_s=DAEMON_ASK_S)
    except Exception:
        return None, None  # no daemon here, or it does not answer: the command's own start says it
    store = status.get("store") if isinstance(status, dict) else None
    config_store = _config_store(args)
    if not isinstance(store, dict) or store.get("state") != "unreachable" or config_store != url:
        return None, None
    since = store.get("since")
    return (float(since), target.url) if isinstance(since, (int, float)) else (None, None)


def _config_store(args: argparse.Namespace) -> str | None:
    try:
        from smoosh.config import load_config

        return load_config(getattr(args, "config", None)).store
    except Exception:
        return None


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be more than 0")
    return value
