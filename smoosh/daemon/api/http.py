"""The admin HTTP API (DESIGN §4.2): status, jobs, explain, enqueue, suspend/resume/flush, metrics,
and the operators' page, which reads the same endpoints (DESIGN §12).

The API is for the operator, not for whatever runs in a browser on the same host
(the threat model of docs/guides/security.md). So:

* once a ``token`` is configured, every POST needs ``Authorization: Bearer <token>``
  (compared in constant time), on loopback too; bound off loopback, a POST without a
  configured token is refused (the config check refuses that setup anyway);
* a request whose ``Host`` names neither an IP address, ``localhost``, this machine, nor the
  configured host is refused, whatever its method: a page whose domain was re-pointed at
  127.0.0.1 (DNS rebinding) cannot read ``/status``;
* a POST that carries ``Origin`` (a browser's mark; the CLI never sends it) is refused,
  unless it names the very address the request goes to (the page this daemon served, and no
  other: :func:`~smoosh.daemon.api.requests.own_page`), and a POST body must be
  ``application/json``: the content types a page may send without a CORS preflight
  (``text/plain``, forms) never reach a handler.

Handlers only read published snapshots, so a slow or stuck channel never delays
``/status``. Connections are gathered by one loop thread and answered by a bounded few
(:mod:`smoosh.daemon.api.http_conns`), so a slow or idle client never holds a thread.

Work per request is bounded in time as well as size (DESIGN §10). ``POST /enqueue`` is the
one heavy request: it runs in a lane of its own that never takes the last
:data:`~smoosh.daemon.api.http_conns.RESERVED_LIGHT_THREADS` handler threads, so ``GET
/status`` and the other light requests always find one. Its keys are admitted under a
deadline (:data:`~smoosh.daemon.intake.admission.REQUEST_WORK_S`): past it, the rest are not
examined, and the answer says so and which (``not_examined``: their count and the index of
the first; with ``?wait=1`` each is ``not_queued`` with that reason), with ``Retry-After``;
the keys before it were enqueued as usual. A request that waited longer than
:data:`SHED_AFTER_S` for a handler thread is refused whole, unexamined: ``503`` with
``Retry-After``. Each cut request is logged once at WARNING with its size; shed ones too, at
most once a minute with the count since (both counted in ``smoosh_http_requests_cut_total{reason}``).
"""

from __future__ import annotations

import hmac
import json
import logging
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any, Callable, cast

import smoosh.jsonutil as jsonutil
from smoosh.config.address import is_loopback_host, split_host_port
from smoosh.daemon.api import page
from smoosh.daemon.api.http_conns import (
    MAX_HANDLER_THREADS, MAX_OPEN_CONNECTIONS, RESERVED_LIGHT_THREADS, ConnectionLoop, RequestReader,
)
from smoosh.daemon.api.requests import (
    MAX_PAGE, host_allowed, own_page, parse_history_query, parse_jobs_query, parse_queue_query,
)
from smoosh.daemon.intake.admission import NOT_EXAMINED, REQUEST_WORK_S, RequestDeadline
from smoosh.errors import InvalidKey, SmooshError, UnknownChannel

if TYPE_CHECKING:
    from smoosh.daemon.server import Server

log = logging.getLogger(__name__)

#: Most keys one ``POST /enqueue`` may carry.
MAX_ENQUEUE_KEYS = 10_000
#: Longest key accepted by ``POST /enqueue``, in bytes of UTF-8.
MAX_ENQUEUE_KEY_BYTES = 4096
#: Largest request body read, in bytes (10,000 keys of 4 KiB, JSON-escaped, fit).
MAX_BODY_BYTES = 64 * 1024 * 1024
#: Longest a connection may take to send its next whole request (idle time included), in
#: seconds: a client trickling bytes (slowloris) is closed then, however steadily it sends.
REQUEST_TIMEOUT_S = 30.0
#: A ``POST /enqueue`` that waited longer than this for a handler thread (seconds) is refused
#: unexamined (503): its client has likely given up, and the queue behind it must not grow.
SHED_AFTER_S = 2 * REQUEST_WORK_S
#: ``Retry-After`` (seconds) of a cut or shed request: about one request's work.
RETRY_AFTER_S = int(REQUEST_WORK_S)
#: Seconds between two log lines about shed requests (the count in between goes in the next).
SHED_REQUEST_LOG_INTERVAL_S = 60.0
#: The request line of the one heavy request (see the module docstring).
_HEAVY_PREFIX = b"POST /enqueue"


def _heavy(data: bytes) -> bool:
    """Whether the request in ``data`` goes in the heavy lane: ``POST /enqueue`` (with or without a query)."""
    return data.startswith(_HEAVY_PREFIX) and data[len(_HEAVY_PREFIX):len(_HEAVY_PREFIX) + 1] in (b" ", b"?")


def parse_address(address: str) -> tuple[str, int]:
    """Split ``host:port`` (``[::1]:5986`` for IPv6) into host and port, as the config check does.

    Raises:
        ValueError: not ``HOST:PORT`` (the message says what is expected).
    """
    try:
        return split_host_port(address)
    except ValueError as e:
        raise ValueError(f"invalid address {address!r}: {e}") from None


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only the loopback interface."""
    return is_loopback_host(host)


@dataclass(frozen=True)
class Route:
    """One endpoint of the admin API, declared once: the dispatch reads it, and the HTTP reference
    (docs/reference/http.md) is generated from it.

    Attributes:
        method: ``GET`` (reads, no token) or ``POST`` (changes, JSON body, token once one is set).
        path: the path, without its query.
        handler: the name of the handler's method that answers it (a POST handler takes the body).
        summary: one line: what it is for.
        doc: what it takes and what it answers (Markdown), for the reference.
    """

    method: str
    path: str
    handler: str
    summary: str
    doc: str


#: Every endpoint, in the order the reference lists them. A route answered by the dispatch must be
#: declared here; the docs build fails on one without a summary and a doc.
ROUTES: tuple[Route, ...] = (
    Route("GET", "/status", "_status", "The status table: every channel of this node, and the node's own state.",
          "`{\"node\", \"channels\": {NAME: {\"active\", \"starting\", \"waiting\": {\"size\", \"min\", \"max\"}, "
          "\"deferred\", \"paused\", \"suspended\", \"held\", \"in_window\", \"holding\", \"window\", \"concurrency\", "
          "\"evicted\", \"checkpoint_errors\", \"reclaimable_bytes\", \"starved\", \"runs\": [{\"key\", \"state\", "
          "\"started_at\", \"age_s\", \"progress\", \"progress_at\", \"since_progress_s\"}], \"oldest_run_s\", "
          "\"since_progress_s\"}}, \"reclaimable_bytes\", \"dry_run\", \"config_error\", "
          "\"restart_required\", \"io_budget\", \"scan\", \"store\", \"disk\", \"controller\", \"application\", "
          "\"version\", \"config_digest\", \"cluster\", \"fleet\"}`: CouchDB's "
          "`_smoosh/status` shape plus smoosh's fields. `suspended` is this daemon's own suspension, `held` a "
          "cluster hold (`null`, or `{\"node\", \"channel\", \"by\", \"at\"}`: its scope, `null` meaning every node "
          "or channel, who set it and when), `holding` whether running work holds (suspended, held, or "
          "outside a strict window). `config_error` is the last rejected edit's error (`null` when the file "
          "in force is the file on disk); `restart_required` names the keys edited that apply only at a "
          "restart. `io_budget` is the I/O budget (`max_io_rate`, `charged_bytes`, `debt_s`, `paused`, "
          "`waiting_channels`); `scan` the start-up scan's and the latest rescan's progress; `store` the job "
          "store's health (`state`: `ok`, `full` or `unreachable`, `since`, `error`); `disk` each file "
          "system under the roots (how full, under pressure since when); `controller` what the backlog "
          "controller saw and set. `runs` are the channel's compactions in flight (`state` `starting`, "
          "`claimed` or `running`; times in Unix seconds), `oldest_run_s` the oldest one's age and "
          "`since_progress_s` the longest any has gone without progress. `application` is what the "
          "compactions saw of the applications beside their databases: `waits` for a moment with no "
          "application transaction open and their `wait_seconds`, `gave_up` (such waits that found none: "
          "the compaction ended `busy`), and `looks_locked` / `looks_lockless`, the looks at a database "
          "that took a SQLite lock or read the file without one. `version` is the smoosh this daemon runs and "
          "`config_digest` the digest of its config (what decides how it compacts, not its name, directories or "
          "address: nodes given one file share it), both written in its status record for the fleet view. "
          "`cluster` is the fleet-wide cap as this node sees it (`max_jobs`: its `cluster_max_jobs`, `null` "
          "when unset; `slots` its runs hold; `waiting_since`: since when its starts wait for a slot, `null` "
          "when they do not; `refusals`; `waiting_channels`); `fleet` how many nodes of its store are `live`, "
          "`stale` and `stopped`, as it last read their records (`read_at`), `null` before the first read."),
    Route("GET", "/jobs", "_jobs", "Current and recent compactions, per database, paged.",
          "`{\"jobs\": [{\"key\", \"channel\", \"state\", \"progress\", \"error_count\", \"last_error\", "
          "\"last_updated\", \"retry_at\", \"busy_count\", \"starved_since\", \"result\", \"history\": [{\"event\", "
          "\"at\", \"reason\"}]}], \"total\", \"offset\", \"next_offset\"}`: every pending and running key, plus the "
          "last 1000 finished or crashing, most recently updated first. `state` is `pending`, `running`, "
          "`crashing`, `starved`, `finished` or `dropped` (a key smoosh compacted stays `finished` when a later "
          "run finds nothing left to reclaim; its history has that look as `dropped`); `result` is how the key's "
          "last run ended (one of the "
          "results: `ok`, `failed`, `busy`, `gone`, `interrupted`, `replaced`, `blocked`), or `null` before one. `?state=pending,crashing` (any of those states; also "
          "repeatable), `&limit=N` (at least 1) and `&offset=N` page it: `total` counts the matching keys, "
          "`next_offset` is the next page's offset or `null`. An unknown parameter or state, or a limit or "
          "offset that is not a whole number in range, is `400 {\"error\": ...}` naming it."),
    Route("GET", "/explain", "_explain", "Why one database is or is not queued, per channel; changes nothing.",
          "`?key=KEY` (an absolute path, or `cleanup:` and one). Answers `{\"key\", \"state\", \"channel\", "
          "\"reason\", \"result\", \"sizes\", \"ignored\", \"forced\", \"stale_until\", \"crashes\", \"busy\", \"max_jobs\", "
          "\"disk_pressure\", "
          "\"channels\": {NAME: {\"state\", \"place\", \"priority\", \"queued_priority\", \"position\", \"forced\", "
          "\"reason\", \"thresholds\", \"window\", \"in_window\", \"next_open\", \"suspended\", \"held\", "
          "\"paused_until\", \"not_before\", \"holds\"}}}`; `state` is `queued`, `running`, `crashing`, `starved`, "
          "`not_queued` or `rejected`; `result` is how its last run ended, or `null`; times are Unix seconds. "
          "Without exactly one `key=`: `400`."),
    Route("GET", "/queue", "_queue", "A page of one channel's waiting keys, in the order they would start.",
          f"`?channel=NAME` (required), `&offset=N` and `&limit=N` (1 to {MAX_PAGE}, default 50). Answers "
          "`{\"channel\", \"keys\": [{\"key\", \"priority\", \"place\", \"position\"}], \"total\", \"offset\", "
          "\"next_offset\"}`: the keys an operator forced first (`\"forced\": true`), then the queue, highest "
          "priority first (oldest first among equals), then the keys rotation set aside (`place` `benched`), then "
          "the keys waiting out a crash's backoff or a busy database's retry (`place` `deferred`, with "
          "`not_before`, Unix seconds), earliest first. `position` is 1 for the next key to start; `total` "
          "counts every waiting key; `next_offset` is the next page's offset or `null`. Costs the page, not "
          "the queue's length. An unknown channel is `404`; a missing channel, an unknown parameter, or an "
          "offset or limit out of range is `400 {\"error\": ...}` naming it; a channel busy past half a "
          "second is `503`."),
    Route("GET", "/history", "_history", "The finished compactions this node remembers, newest first, paged.",
          "`{\"history\": [{\"key\", \"at\", \"channel\", \"result\", \"duration_s\", \"size_before_bytes\", "
          "\"size_after_bytes\", \"reclaimed_bytes\", \"error\", \"retry_at\"}], \"total\", \"offset\", "
          "\"next_offset\"}`: each compaction's end (`at`, Unix seconds) and result, from the durable history "
          "(`max_history` results per database, for the last 1000 databases that finished; an interrupted "
          "run is not a finished one). `retry_at` is set on a database's newest result while it waits for "
          "its retry (a crash's backoff, a busy database), else `null`. `?result=failed,busy` (any of the "
          "results; also repeatable), `&channel=NAME`, `&offset=N` and `&limit=N` (1 to "
          f"{MAX_PAGE}, default 50) filter and page it. An unknown parameter or result, or an offset or "
          "limit out of range, is `400 {\"error\": ...}` naming it."),
    Route("GET", "/series", "_series", "The last hour, per minute: bytes reclaimed, compactions by result, reclaimable bytes.",
          "`{\"bucket_s\": 60, \"now\", \"buckets\": [{\"at\", \"reclaimed_bytes\", \"compactions\": {RESULT: n}, "
          "\"reclaimable_bytes\"}]}`: sixty buckets, oldest first, the current minute last (`at`: its start, "
          "Unix seconds; `now`: the daemon's clock). `reclaimed_bytes` and `compactions` (every result, 0 "
          "included) count the compactions that ended in that minute; `reclaimable_bytes` is the fleet's, "
          "as the status table last summed it in that minute (`null` if it did not). Kept in memory by "
          "the daemon (it starts empty), fed by what it counts anyway: no timer of its own."),
    Route("GET", "/", "_page", "The operators' page: the status table, running compactions, queues, history, charts.",
          "An HTML page for a browser ([the operators' page](../guides/operator-page.md)), served with the API on the same "
          "address; it reads the endpoints above and acts through the POST ones below, under their rules. "
          "It is served with a Content-Security-Policy that lets it load only its own files and talk only "
          "to this daemon, and that forbids framing it."),
    Route("GET", page.PREFIX, "_page_file", "The page's own files: `/ui/page.js`, `/ui/page.css`.",
          "Shipped in the package; any other name under `/ui/` is `404`. Sent with an `ETag` and "
          "`Cache-Control: no-cache` (a request with the same `If-None-Match` gets `304`)."),
    Route("GET", "/metrics", "_send_metrics", "Prometheus metrics, in the text exposition format.",
          "Every metric of the metrics reference, each labelled series at 0 from the daemon's start, and "
          "the process's and the interpreter's as Prometheus's Python client reports them."),
    Route("POST", "/enqueue", "_enqueue", "Ask the daemon to consider databases for compaction.",
          "Body `{\"keys\": [KEY, ...]}` (at most 10,000 strings of at most 4 KiB), optionally `\"force\": true` "
          "(what `smoosh enqueue --force` sends). Answers `202 {\"accepted\": n, \"rejected\": [{\"key\", "
          "\"reason\"}]}` at once: the cheap path for hooks. With `?wait=1` it answers `200 {\"results\": "
          "[{\"key\", \"outcome\", \"channel\", \"priority\", \"reason\"}]}` once every key is routed (within "
          "10 s), one result per key in order: `queued` (with its channel and priority), `not_queued` (with "
          "the reason: stale, below every channel's threshold, ignored, already running, still examining) "
          "or `rejected` (outside the roots, no such file, a directory, not a SQLite file, a shared file). A "
          "malformed body is `400 {\"error\": ...}` and enqueues nothing."),
    Route("POST", "/suspend", "_suspend", "Suspend one channel or all, on this daemon (sticky until resumed).",
          "Optional body `{\"channel\": NAME}` (default: every channel). Answers `200 {\"ok\": true, \"action\", "
          "\"channel\"}` once the channels' status is republished; `404 {\"error\": ...}` for an unknown channel. "
          "Running work holds: an incremental compaction pauses between chunks, a VACUUM is interrupted."),
    Route("POST", "/resume", "_resume", "Resume one channel or all; queued work starts at once.",
          "Optional body `{\"channel\": NAME}` (default: every channel); answers as `/suspend`. Clears this "
          "daemon's suspension only, never a cluster hold."),
    Route("POST", "/flush", "_flush", "Drop the waiting keys of one channel or all; running work goes on.",
          "Optional body `{\"channel\": NAME}` (default: every channel); answers as `/suspend`, with "
          "`\"dropped\"`: the waiting keys dropped, whose staleness is forgotten (their crash backoff stays)."),
)

_GET = {r.path: r for r in ROUTES if r.method == "GET"}
_POST = {r.path: r for r in ROUTES if r.method == "POST"}


def _get_route(path: str) -> Route | None:
    """The GET route of ``path``: its own, or the page's files' for a path under their prefix."""
    route = _GET.get(path)
    if route is None and path.startswith(page.PREFIX):
        route = _GET.get(page.PREFIX)
    return route


#: ``AdminServer(token=...)`` default: the token of the server's config in force (a reload applies).
FROM_CONFIG = object()


class AdminServer:
    """Serves the admin API of one :class:`Server` from a thread of its own.

    The command line wraps a started server in it (``smoosh run``); an embedding program
    may do the same. It starts serving only when :meth:`start` is called, so a caller starts
    the server first: every channel has restored its checkpoint by then.

    Parameters:
        server: the started server.
        address: ``host:port`` (port 0: any free port; see :attr:`address`).
        token: the bearer token every POST must carry off loopback; by default the token of
            the server's config in force.
        request_timeout_s: how long a connection may take to send its next whole request;
            None: :data:`REQUEST_TIMEOUT_S` (the handler class's ``timeout``).
        max_threads: requests answered at once.
        max_connections: connections open at once (past it the longest-waiting is closed).
        clock: monotonic seconds, for the request deadlines (the connections' and the
            admission's of ``POST /enqueue``).
        request_work_s: how long one ``POST /enqueue`` may spend admitting its keys.
        shed_after_s: a ``POST /enqueue`` that waited longer for a handler is refused (503).
    """

    def __init__(
        self,
        server: Server,
        address: str,
        *,
        token: Any = FROM_CONFIG,
        request_timeout_s: float | None = None,
        max_threads: int = MAX_HANDLER_THREADS,
        max_connections: int = MAX_OPEN_CONNECTIONS,
        clock: Callable[[], float] = time.monotonic,
        request_work_s: float = REQUEST_WORK_S,
        shed_after_s: float = SHED_AFTER_S,
    ) -> None:
        host, port = parse_address(address)
        self.request_work_s = request_work_s
        self.shed_after_s = shed_after_s
        # Shed requests logged at most once per SHED_REQUEST_LOG_INTERVAL_S (under the lock: any
        # handler thread): (requests, bytes) since the last line, and when that line was.
        self._shed_lock = threading.Lock()
        self._shed_unlogged = (0, 0)
        self._shed_logged_at: float | None = None
        self.smoosh = server
        self._token = token
        self.loopback = is_loopback(host)
        #: Host names a request's ``Host`` may give (besides IP addresses): see :func:`host_allowed`.
        self.host_names = frozenset(
            name.lower().rstrip(".") for name in ("localhost", host, socket.gethostname()) if name
        )
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        handler = type("Handler", (_Handler,), {"admin": self})
        self._handler: type[_Handler] = handler
        self._request_timeout_s = request_timeout_s
        self._clock = clock
        self._httpd = ConnectionLoop(
            (host, port), family, self._answer, timeout_s=self._timeout_s,
            max_threads=max_threads, max_connections=max_connections, clock=clock, on_shed=self._shed,
            heavy=_heavy, reserved_threads=min(RESERVED_LIGHT_THREADS, max_threads - 1),
        )
        self._thread: threading.Thread | None = None

    def _shed(self, reason: str) -> None:
        shed = self.smoosh.counters.http_shed
        shed[reason] = shed.get(reason, 0) + 1

    def _timeout_s(self) -> float:
        return float(self._request_timeout_s if self._request_timeout_s is not None else self._handler.timeout)

    def _answer(
        self, sock: socket.socket, address: tuple, data: bytes, deadline: float, waited_s: float,
    ) -> tuple[bool, bytes]:
        """Answer the one request in ``data`` (and the socket); whether to keep the connection, and what follows."""
        handler = self._handler(sock, address, data, deadline, self._clock, waited_s)
        return not handler.close_connection, handler.reader.leftover()

    def deadline(self) -> RequestDeadline:
        """A new ``POST /enqueue``'s admission deadline, from now."""
        return RequestDeadline(self.request_work_s, clock=self._clock)

    def count_cut(self, how: str) -> None:
        """Count one request cut at its deadline (``"cut"``) or refused unexamined (``"shed"``)."""
        cut = self.smoosh.counters.http_cut
        cut[how] = cut.get(how, 0) + 1

    def log_shed(self, address: str, size_bytes: int, waited_s: float) -> None:
        """Say that a request was shed: the first at once with its size, then at most one line per interval."""
        with self._shed_lock:
            count, total = self._shed_unlogged
            count, total = count + 1, total + size_bytes
            now = self._clock()
            if self._shed_logged_at is not None and now - self._shed_logged_at < SHED_REQUEST_LOG_INTERVAL_S:
                self._shed_unlogged = (count, total)
                return
            first = self._shed_logged_at is None
            self._shed_logged_at = now
            self._shed_unlogged = (0, 0)
        if first or count == 1:
            log.warning("POST /enqueue from %s (%d bytes) shed unexamined: it waited %.1f s for a handler (the admin "
                        "API is busy); answered 503 with Retry-After: %d.", address, size_bytes, waited_s, RETRY_AFTER_S)
        else:
            log.warning("The admin API shed %d POST /enqueue request(s) unexamined (%d bytes in all) in the last "
                        "%.0f s: each waited over %g s for a handler; answered 503 with Retry-After: %d.",
                        count, total, SHED_REQUEST_LOG_INTERVAL_S, self.shed_after_s, RETRY_AFTER_S)

    @property
    def open_connections(self) -> int:
        """Connections open now (idle, sending, or being answered)."""
        return self._httpd.open_connections

    @property
    def token(self) -> str | None:
        """The token POSTs need now."""
        token = self.smoosh.config.token if self._token is FROM_CONFIG else self._token
        return token if isinstance(token, str) else None

    @property
    def require_token(self) -> bool:
        """Whether POSTs need the token now: once one is configured, or off loopback (fail closed)."""
        return not self.loopback or self.token is not None

    @property
    def address(self) -> str:
        """``host:port`` actually bound (the real port when 0 was asked for)."""
        host, port = self._httpd.server_address[:2]
        host = host.decode() if isinstance(host, bytes) else str(host)
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def start(self) -> None:
        """Serve in a daemon thread."""
        self._thread = threading.Thread(target=self._httpd.serve, name="smoosh-http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._httpd.stop()
        if self._thread is not None:
            self._thread.join(5)
        self._httpd.close()


class _Handler(BaseHTTPRequestHandler):
    admin: AdminServer
    server_version = "smoosh"
    protocol_version = "HTTP/1.1"
    #: The request deadline (see :class:`AdminServer`), also the timeout of each write.
    timeout = REQUEST_TIMEOUT_S

    def __init__(
        self, sock: socket.socket, address: tuple, data: bytes, deadline: float, clock: Callable[[], float],
        waited_s: float = 0.0,
    ) -> None:
        # One request per handler: the connection loop gathered it (``data``) and takes the
        # connection back afterwards, so an idle keep-alive connection holds no thread.
        self.reader = RequestReader(data, sock, deadline, clock)
        self.waited_s = waited_s  # how long the request waited for this handler thread
        super().__init__(sock, address, cast(Any, None))  # runs setup, handle and finish; no server object

    def setup(self) -> None:
        super().setup()
        self.rfile.close()
        self.rfile = cast(Any, self.reader)

    def handle(self) -> None:
        self.close_connection = True
        self.handle_one_request()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        log.debug("%s %s", self.address_string(), format % args)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Answer http.server's own failures (bad request line, header too long, unknown
        method) in JSON like every other answer, and close the connection: after a parse
        failure the rest of the stream cannot be trusted."""
        try:
            status = HTTPStatus(code)
        except ValueError:
            status = HTTPStatus.BAD_REQUEST
        headers = {"Connection": "close"}
        if status is HTTPStatus.NOT_IMPLEMENTED and self.command:
            # http.server says 501 (a server fault) for a method without a do_ handler; the
            # method is the client's mistake.
            status = HTTPStatus.METHOD_NOT_ALLOWED
            message = f"method {self.command} is not allowed; the API takes GET and POST"
            headers["Allow"] = "GET, POST"
        self.log_error("code %d, message %s", status.value, message)
        self.close_connection = True
        self._send(status, {"error": message or status.phrase}, headers=headers)

    # --------------------------------------------------------------- dispatch

    def do_HEAD(self) -> None:  # noqa: N802
        # Defined so HEAD gets the same 405 as PUT and DELETE rather than a 501; no body.
        self.send_error(HTTPStatus.NOT_IMPLEMENTED)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if not self._host_checked():
            return
        path = self.path.split("?", 1)[0]
        route = _get_route(path)
        if route is not None:
            getattr(self, route.handler)()
        elif path in _POST:
            self._send(HTTPStatus.METHOD_NOT_ALLOWED, {"error": f"{path} takes POST"})
        else:
            self._send(HTTPStatus.NOT_FOUND, {"error": f"no such endpoint: {path}"})

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0]
        route = _POST.get(path)
        if route is None:
            self._drain()
            if _get_route(path) is not None:
                self._send(HTTPStatus.METHOD_NOT_ALLOWED, {"error": f"{path} takes GET"})
            else:
                self._send(HTTPStatus.NOT_FOUND, {"error": f"no such endpoint: {path}"})
            return
        if not self._host_checked():
            return
        origin = self.headers.get("Origin")
        if origin is not None and not own_page(origin, self.headers.get("Host"), self.headers.get("Sec-Fetch-Site")):
            self._drain()
            self._send(HTTPStatus.FORBIDDEN, {"error": f"a request from a web page (Origin: {origin[:200]}) may not "
                                                       "change anything; use the smoosh command, a client without Origin, "
                                                       "or this daemon's own page"})
            return
        if not self._authorised():
            self._drain()
            self._send(HTTPStatus.UNAUTHORIZED, {"error": "missing or wrong bearer token"},
                       headers={"WWW-Authenticate": "Bearer"})
            return
        content_type = self.headers.get("Content-Type", "")
        if content_type.partition(";")[0].strip().lower() != "application/json":
            self._drain()
            self._send(HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
                       {"error": f"a POST body must be sent as Content-Type: application/json, "
                                 f"not {content_type[:100] or 'none'}"})
            return
        if path == "/enqueue" and self.waited_s > self.admin.shed_after_s:
            self._shed()
            return
        body, error = self._read_json()
        if error is not None:
            self._send(error[0], {"error": error[1]})
            return
        getattr(self, route.handler)(body)

    # --------------------------------------------------------------- endpoints

    def _status(self) -> None:
        self._send(HTTPStatus.OK, self.admin.smoosh.status())

    def _suspend(self, body: Any) -> None:
        self._control("suspend", body)

    def _resume(self, body: Any) -> None:
        self._control("resume", body)

    def _flush(self, body: Any) -> None:
        self._control("flush", body)

    def _enqueue(self, body: Any) -> None:
        if not isinstance(body, dict):
            self._send(HTTPStatus.BAD_REQUEST, {"error": "body must be a JSON object"})
            return
        if "keys" not in body:
            self._send(HTTPStatus.BAD_REQUEST, {"error": "body lacks 'keys'"})
            return
        keys = body["keys"]
        if not isinstance(keys, list):
            self._send(HTTPStatus.BAD_REQUEST, {"error": "'keys' must be a list of strings"})
            return
        if len(keys) > MAX_ENQUEUE_KEYS:
            self._send(HTTPStatus.BAD_REQUEST, {"error": f"'keys' holds {len(keys)} keys; at most {MAX_ENQUEUE_KEYS}"})
            return
        for i, key in enumerate(keys):
            if not isinstance(key, str):
                self._send(HTTPStatus.BAD_REQUEST, {"error": f"'keys'[{i}] is not a string"})
                return
            if len(key.encode("utf-8", "surrogatepass")) > MAX_ENQUEUE_KEY_BYTES:
                self._send(HTTPStatus.BAD_REQUEST, {"error": f"'keys'[{i}] is longer than {MAX_ENQUEUE_KEY_BYTES} bytes"})
                return
        force = body.get("force", False)
        if not isinstance(force, bool):
            self._send(HTTPStatus.BAD_REQUEST, {"error": f"'force' must be true or false, not {json.dumps(force)}"})
            return
        smoosh = self.admin.smoosh
        deadline = self.admin.deadline()
        if urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query).get("wait") == ["1"]:
            # Answers after routing, one result per key (DESIGN §4.2, §11); keys the deadline
            # left are not_queued, not examined.
            verdicts = smoosh.enqueue_and_wait(keys, force=force, deadline=deadline)
            smoosh.counters.enqueue_rejected += sum(v.outcome == "rejected" for v in verdicts)
            self._send(HTTPStatus.OK, {"results": [v.as_json() for v in verdicts]}, headers=self._cut(deadline, keys))
            return
        accepted = 0
        rejected = []
        with smoosh.intake.admitting():
            for key in keys:
                if not deadline.next_key():
                    break
                try:
                    smoosh.enqueue(key, require_file=True, force=force)
                    accepted += 1
                except InvalidKey as e:
                    rejected.append({"key": key, "reason": e.reason})
        smoosh.counters.enqueue_rejected += len(rejected)
        answer: dict[str, Any] = {"accepted": accepted, "rejected": rejected}
        headers = self._cut(deadline, keys)
        if deadline.cut_at is not None:
            answer["not_examined"] = {"count": len(keys) - deadline.cut_at, "from_index": deadline.cut_at,
                                      "reason": NOT_EXAMINED}
        self._send(HTTPStatus.ACCEPTED, answer, headers=headers)

    def _cut(self, deadline: RequestDeadline, keys: list[str]) -> dict[str, str] | None:
        """For a request its deadline cut: log it once with its size, count it, and the ``Retry-After`` header."""
        if deadline.cut_at is None:
            return None
        self.admin.count_cut("cut")
        log.warning("POST /enqueue from %s: %d keys (%s bytes) cut at its %g s deadline after %d; %d not examined "
                    "(from index %d; answered with Retry-After: %d).", self.address_string(), len(keys),
                    self.headers.get("Content-Length", "?"), deadline.budget_s, deadline.cut_at,
                    len(keys) - deadline.cut_at, deadline.cut_at, RETRY_AFTER_S)
        return {"Retry-After": str(RETRY_AFTER_S)}

    def _shed(self) -> None:
        """Refuse a ``POST /enqueue`` that waited too long for a handler, unexamined: 503.

        Its body is read past (not parsed): a socket closed with bytes unread is reset, and the
        client would see the reset instead of the answer.
        """
        size = self._content_length() or 0
        self._drain()
        self.admin.count_cut("shed")
        self.admin.log_shed(self.address_string(), size, self.waited_s)
        self._send(HTTPStatus.SERVICE_UNAVAILABLE,
                   {"error": f"the admin API is busy: this request waited {self.waited_s:.1f} s for a handler and "
                             f"was not examined; nothing was enqueued; send it again after {RETRY_AFTER_S} s"},
                   headers={"Retry-After": str(RETRY_AFTER_S)})

    def _jobs(self) -> None:
        """``GET /jobs[?state=S[,S...]&limit=N&offset=N]``: a page of the per-key table, most recent first."""
        try:
            states, limit, offset = parse_jobs_query(self._query())
        except ValueError as e:
            self._send(HTTPStatus.BAD_REQUEST, {"error": str(e)})
            return
        rows, total = self.admin.smoosh.jobs_page(states=states, limit=limit, offset=offset)
        end = offset + len(rows)
        self._send(HTTPStatus.OK, {"jobs": rows, "total": total, "offset": offset,
                                   "next_offset": end if end < total else None})

    def _queue(self) -> None:
        """``GET /queue?channel=NAME[&offset=N&limit=N]``: a page of the channel's waiting keys, in start order."""
        try:
            channel, offset, limit = parse_queue_query(self._query())
        except ValueError as e:
            self._send(HTTPStatus.BAD_REQUEST, {"error": str(e)})
            return
        try:
            found = self.admin.smoosh.queue_page(channel, offset=offset, limit=limit)
        except UnknownChannel as e:
            self._send(HTTPStatus.NOT_FOUND, {"error": str(e)})
            return
        if found is None:
            self._send(HTTPStatus.SERVICE_UNAVAILABLE, {"error": f"channel {channel!r} is busy; ask again"},
                       headers={"Retry-After": "1"})
            return
        rows, total = found
        end = offset + len(rows)
        self._send(HTTPStatus.OK, {"channel": channel, "keys": rows, "total": total, "offset": offset,
                                   "next_offset": end if end < total else None})

    def _history(self) -> None:
        """``GET /history[?result=R[,R...]&channel=NAME&offset=N&limit=N]``: finished compactions, newest first."""
        try:
            results, channel, offset, limit = parse_history_query(self._query())
        except ValueError as e:
            self._send(HTTPStatus.BAD_REQUEST, {"error": str(e)})
            return
        rows, total = self.admin.smoosh.history_page(results=results, channel=channel, offset=offset, limit=limit)
        end = offset + len(rows)
        self._send(HTTPStatus.OK, {"history": rows, "total": total, "offset": offset,
                                   "next_offset": end if end < total else None})

    def _series(self) -> None:
        """``GET /series``: the last hour per minute, for the page's charts."""
        self._send(HTTPStatus.OK, self.admin.smoosh.series())

    def _page(self) -> None:
        """``GET /``: the operators' page."""
        self._send_page_file(page.PAGE)

    def _page_file(self) -> None:
        """``GET /ui/NAME``: one of the page's files."""
        name = self.path.split("?", 1)[0][len(page.PREFIX):]
        if name == page.PAGE:
            name = ""  # the page itself is at /
        self._send_page_file(name)

    def _send_page_file(self, name: str) -> None:
        found = page.page_file(name) if name else None
        if found is None:
            self._send(HTTPStatus.NOT_FOUND, {"error": f"no such file of the page: {self.path[:200]}"})
            return
        fresh = self.headers.get("If-None-Match") == found.etag
        self.send_response(HTTPStatus.NOT_MODIFIED if fresh else HTTPStatus.OK)
        for name_, value in page.HEADERS.items():
            self.send_header(name_, value)
        self.send_header("ETag", found.etag)
        if fresh:
            self.end_headers()
            return
        self.send_header("Content-Type", found.content_type)
        self.send_header("Content-Length", str(len(found.body)))
        self.end_headers()
        self.wfile.write(found.body)

    def _explain(self) -> None:
        """``GET /explain?key=KEY``: why the key is or is not queued, per channel (changes nothing)."""
        keys = self._query().get("key", [])
        if len(keys) != 1 or not keys[0]:
            self._send(HTTPStatus.BAD_REQUEST, {"error": "name one key: /explain?key=/path/to/db"})
            return
        self._send(HTTPStatus.OK, self.admin.smoosh.explain(keys[0]))

    def _query(self) -> dict[str, list[str]]:
        """The request's query parameters (blank values kept, so ``state=`` can be refused by name)."""
        return urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query, keep_blank_values=True)

    def _control(self, action: str, body: Any) -> None:
        if body is None:
            body = {}
        if not isinstance(body, dict):
            self._send(HTTPStatus.BAD_REQUEST, {"error": "body must be a JSON object"})
            return
        channel = body.get("channel")
        if channel is not None and not isinstance(channel, str):
            self._send(HTTPStatus.BAD_REQUEST, {"error": "'channel' must be a string"})
            return
        try:
            result = getattr(self.admin.smoosh, action)(channel)
        except SmooshError as e:
            status = HTTPStatus.NOT_FOUND if isinstance(e, UnknownChannel) else HTTPStatus.INTERNAL_SERVER_ERROR
            self._send(status, {"error": str(e)})
            return
        answer: dict[str, Any] = {"ok": True, "action": action, "channel": channel}
        if action == "flush":
            answer["dropped"] = result  # waiting keys dropped, their staleness forgotten
        self._send(HTTPStatus.OK, answer)

    def _send_metrics(self) -> None:
        try:
            from smoosh.daemon.api.metrics import render
        except ImportError:
            self._send(HTTPStatus.NOT_FOUND, {"error": "metrics are not available in this build"})
            return
        try:
            body, content_type = render(self.admin.smoosh)
        except Exception as e:  # a failed scrape is an answer, not a dropped connection
            log.exception("rendering /metrics failed")
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"metrics failed: {e}"})
            return
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    # --------------------------------------------------------------- plumbing

    def _host_checked(self) -> bool:
        """Answer 403 and return False when ``Host`` names another site (see :func:`host_allowed`)."""
        host = self.headers.get("Host")
        if host_allowed(host, self.admin.host_names):
            return True
        self._drain()
        self._send(HTTPStatus.FORBIDDEN, {"error": f"Host {(host or '')[:200]!r} is not this daemon's address: use its IP "
                                                   "address, localhost or this machine's name"})
        return False

    def _authorised(self) -> bool:
        if not self.admin.require_token:
            return True
        token = self.admin.token or ""
        header = self.headers.get("Authorization", "")
        scheme, _, presented = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return False
        return hmac.compare_digest(presented.strip().encode(), token.encode())

    def _content_length(self) -> int | None:
        text = self.headers.get("Content-Length")
        if text is None:
            return 0
        # RFC 9110: 1*DIGIT, nothing else. int() would also take "+5", "1_0" and non-ASCII
        # digits, which a proxy in front may frame differently (request smuggling).
        text = text.strip(" \t")
        if not text or not text.isascii() or not text.isdigit():
            return None
        return int(text)

    def _drain(self) -> None:
        if self.headers.get("Transfer-Encoding") is not None:
            self.close_connection = True
            return
        length = self._content_length()
        if length and length <= MAX_BODY_BYTES:
            try:
                self.rfile.read(length)
            except TimeoutError:
                self.close_connection = True
        elif length is None or length:
            self.close_connection = True

    def _read_json(self) -> tuple[Any, tuple[HTTPStatus, str] | None]:
        if self.headers.get("Transfer-Encoding") is not None:
            # Chunked bodies are not read; the chunks left in the stream would be parsed as
            # the next request, so the connection ends here.
            self.close_connection = True
            return None, (HTTPStatus.LENGTH_REQUIRED, "send the body with a Content-Length, not Transfer-Encoding")
        length = self._content_length()
        if length is None:
            self.close_connection = True
            return None, (HTTPStatus.BAD_REQUEST, "invalid Content-Length")
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            return None, (HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body larger than {MAX_BODY_BYTES} bytes")
        try:
            raw = self.rfile.read(length) if length else b""
        except TimeoutError:
            self.close_connection = True
            return None, (HTTPStatus.REQUEST_TIMEOUT, f"body not received within {self.timeout:g} s")
        if len(raw) < length:
            self.close_connection = True
            return None, (HTTPStatus.BAD_REQUEST, f"body ended after {len(raw)} of {length} bytes")
        if not raw.strip():
            return None, None
        try:
            return json.loads(raw.decode("utf-8")), None
        except (UnicodeDecodeError, ValueError) as e:
            return None, (HTTPStatus.BAD_REQUEST, f"body is not valid JSON: {e}")
        except RecursionError:
            return None, (HTTPStatus.BAD_REQUEST, "body is not valid JSON: nested too deeply")

    def _send(self, status: HTTPStatus, payload: Any, *, headers: dict[str, str] | None = None) -> None:
        body = (jsonutil.dumps(payload) + "\n").encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        headers = dict(headers or {})
        if self.close_connection:
            headers.setdefault("Connection", "close")  # tell the client not to reuse it
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
