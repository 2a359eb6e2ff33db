"""How the CLI talks to a running daemon: its admin API over HTTP."""

from __future__ import annotations

import argparse
import json
import os
import urllib.error
import urllib.request
from typing import Any

from smoosh.errors import SmooshError

#: Seconds the CLI waits for the daemon's HTTP API before giving up.
HTTP_TIMEOUT_S = 30.0


class CliError(SmooshError):
    """Raised for an operational failure of a CLI command (exit code 1)."""


def base_url(args: argparse.Namespace) -> str:
    if getattr(args, "url", None):
        return args.url.rstrip("/")
    from smoosh.config import load_config

    config = load_config(getattr(args, "config", None))
    return f"http://{config.http}"


def absolute_key(key: str) -> str:
    if key.startswith("cleanup:"):
        return "cleanup:" + os.path.abspath(key[len("cleanup:"):])
    return os.path.abspath(key)


def http_request(method: str, url: str, payload: Any = None) -> Any:
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    token = os.environ.get("SMOOSH_TOKEN")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as e:
        try:
            detail = json.loads(e.read()).get("error", e.reason)
        except ValueError:
            detail = e.reason
        raise CliError(f"{method} {url}: {e.code} {detail}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise CliError(f"cannot reach smoosh at {url}: {reason}") from None
