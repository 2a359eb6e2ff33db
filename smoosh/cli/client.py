"""How the CLI talks to a running daemon: its admin API over HTTP."""

from __future__ import annotations

import argparse
import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from smoosh.cli.messages import print_warning
from smoosh.errors import SmooshError

#: Seconds the CLI waits for the daemon's HTTP API before giving up.
HTTP_TIMEOUT_S = 30.0


class CliError(SmooshError):
    """Raised for an operational failure of a CLI command (exit code 1).

    Attributes:
        status: the HTTP status the daemon answered with, or None when it did not answer.
        detail: the daemon's own words for the failure (its ``error``), or the reason it was not reached.
    """

    def __init__(self, message: str, *, status: int | None = None, detail: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail or message


class Unreachable(CliError):
    """Raised when nothing answers at the daemon's address (refused, timed out, no such host)."""


@dataclass(frozen=True)
class DaemonTarget:
    """Where a command reaches the daemon: its admin API's URL and the token for POSTs."""

    url: str
    token: str | None


def daemon_target(args: argparse.Namespace) -> DaemonTarget:
    """The daemon's admin API: ``--url``, else ``http://`` + the config's ``http``.

    Only ``http`` and ``token`` are read from the config: a file with errors elsewhere (a bad
    live edit the daemon rejected) still lets every command reach the daemon, and one warning
    line says the file has errors. ``$SMOOSH_TOKEN`` wins over the config's ``token``.

    Raises:
        ConfigError: no ``--url`` and a config file that was named cannot be read at all.
    """
    from smoosh.config import read_admin_address

    env_token = os.environ.get("SMOOSH_TOKEN") or None
    if getattr(args, "url", None):
        token = env_token
        if token is None:
            try:
                token = read_admin_address(getattr(args, "config", None)).token
            except SmooshError:
                token = None  # --url alone reaches the daemon; the config only offers a token
        return DaemonTarget(str(args.url).rstrip("/"), token)
    address = read_admin_address(getattr(args, "config", None))
    if address.problem is not None:
        first = address.problem.splitlines()[0]
        print_warning(f"the config has errors (the daemon shows them in its status): {first}")
    return DaemonTarget(f"http://{address.http}", env_token or address.token)


def absolute_key(key: str) -> str:
    """A key as the daemon takes it: a path made absolute against this command's working directory."""
    if key.startswith("cleanup:"):
        return "cleanup:" + os.path.abspath(key[len("cleanup:"):])
    return os.path.abspath(key)


def http_request(method: str, url: str, payload: Any = None, *, token: str | None = None,
                 timeout_s: float = HTTP_TIMEOUT_S) -> Any:
    """One request to the daemon's admin API; its JSON answer (``timeout_s``: how long to wait for it).

    Raises:
        CliError: the daemon answered with an error status (``status`` and ``detail`` say which), or
            ``url`` is not a URL urllib can use.
        Unreachable: nothing answered at ``url``.
    """
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as e:
        try:
            detail = json.loads(e.read()).get("error", e.reason)
        except ValueError:
            detail = e.reason
        raise CliError(f"{method} {url}: {e.code} {detail}", status=e.code, detail=str(detail)) from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise Unreachable(f"cannot reach smoosh at {url}: {reason}", detail=str(reason)) from None
    except ValueError as e:  # http.client.InvalidURL: a config's or --url's address urllib cannot use
        raise CliError(f"{url} is not a URL smoosh can reach: {e}") from None
