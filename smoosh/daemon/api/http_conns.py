"""The admin API's connections: gathered by one thread without blocking, handled by a bounded few.

A thread per connection (``ThreadingHTTPServer``) lets any client pin a thread: a connection
that sends one byte a second never trips a per-``recv`` timeout, and a thousand of them hold a
thousand threads. Here one loop thread owns every connection that is idle or still sending:
it reads whatever has arrived (non-blocking), and hands a connection to a handler thread only
once its request is complete (the headers, and a body of up to :data:`MAX_GATHERED_BODY_BYTES`
as its ``Content-Length`` announces). So a handler never waits on a slow client, at most
``max_threads`` handlers run at once (more complete requests wait their turn, in order), and an
idle connection costs a socket and a small buffer, never a thread.

Each connection has one deadline, set when it is accepted and again after each answer: the
whole next request must arrive before it. Past it, a connection that has not finished its
headers is closed without an answer (idle keep-alive connections and slowloris alike); one
whose headers are complete but whose body is short is handed over at once, so the handler
answers 408. When ``max_connections`` are open, the one waiting longest is closed to make room:
a new client (an operator's ``GET /status``) gets in unless every open connection already has
a whole request in, or being answered; then the new one is closed at once (load shed).

Requests come in two lanes. A *heavy* one (``POST /enqueue``: up to 10,000 keys, each a few
system calls, bounded by its own deadline) never takes the last ``reserved_threads`` handler
threads: they stay for the light ones (``GET /status``, ``/metrics``, ``/jobs``, the operator's
verbs), which any free thread answers first. Ten floods of expensive keys used to hold all
eight threads for 40 s while ``/status`` waited behind them; now they hold at most the heavy
lane, and a light request waits for no heavy one. Each handler is told how long its request
waited for a thread, so a heavy request that waited too long is refused whole, unexamined
(the API answers 503 with ``Retry-After``), rather than answered long after its client gave up.
"""

from __future__ import annotations

import logging
import os
import re
import selectors
import socket
import threading
import time
from collections import deque
from typing import Callable

__all__ = [
    "ConnectionLoop",
    "RequestReader",
    "MAX_HANDLER_THREADS",
    "RESERVED_LIGHT_THREADS",
    "MAX_OPEN_CONNECTIONS",
    "MAX_GATHERED_HEAD_BYTES",
    "MAX_GATHERED_BODY_BYTES",
]

log = logging.getLogger(__name__)

#: Requests handled at once (threads); complete requests beyond it wait for a free one.
MAX_HANDLER_THREADS = 8
#: Handler threads a heavy request never takes: kept for the light ones (``GET /status``...).
RESERVED_LIGHT_THREADS = 2
#: Connections held open at once; past it the one waiting longest is closed.
MAX_OPEN_CONNECTIONS = 1024
#: Bytes of a request head gathered by the loop; a longer head goes to a handler, which answers
#: 414/431 (http.server's own line and header limits).
MAX_GATHERED_HEAD_BYTES = 256 * 1024
#: A body up to this size (bytes) is gathered by the loop; a larger one is read by its handler,
#: under the same deadline.
MAX_GATHERED_BODY_BYTES = 1024 * 1024
#: Bytes read from a socket per ``recv``.
RECV_BYTES = 64 * 1024
#: Pending connections the kernel queues before the loop accepts them.
LISTEN_BACKLOG = 1024
#: Seconds between two log lines about shed connections; the count in between goes in the
#: next line (and every one in the ``smoosh_http_connections_shed_total`` metric).
SHED_LOG_INTERVAL_S = 60.0

_CONTENT_LENGTH = re.compile(rb"\r?\ncontent-length:[ \t]*([0-9]+)[ \t]*\r?\n", re.IGNORECASE)
_HEAD_END = re.compile(rb"\r?\n\r?\n")

#: ``handle(sock, address, data, deadline, waited_s)`` answers one request (``waited_s``: how long
#: it waited for a handler thread); returns whether the connection stays open and the bytes it
#: received past that request.
Handle = Callable[[socket.socket, tuple, bytes, float, float], "tuple[bool, bytes]"]


class _Conn:
    __slots__ = ("sock", "address", "data", "deadline", "heavy", "queued_at")

    def __init__(self, sock: socket.socket, address: tuple, data: bytes, deadline: float) -> None:
        self.sock = sock
        self.address = address
        self.data = data
        self.deadline = deadline
        self.heavy = False  # set as it is dispatched: which lane its request waits in
        self.queued_at = 0.0  # when it was dispatched (clock seconds)


def request_complete(data: bytes) -> bool:
    """Whether ``data`` holds a whole request head and as much body as the loop gathers.

    Parameters:
        data: the bytes received on a connection since its last answer.

    Returns:
        True when a handler can answer without reading more: the head has ended and its
        ``Content-Length`` body (none when absent) has arrived, or the head or body is
        longer than the loop gathers (the handler reads or refuses the rest).
    """
    end = _HEAD_END.search(data)
    if end is None:
        return len(data) > MAX_GATHERED_HEAD_BYTES
    match = _CONTENT_LENGTH.search(data, 0, end.end())
    if match is None:
        return True  # no body, or one the handler refuses (chunked, malformed length)
    length = int(match.group(1))
    return length > MAX_GATHERED_BODY_BYTES or len(data) - end.end() >= length


class RequestReader:
    """The ``rfile`` of one request: the bytes the loop gathered, then the socket, under the deadline.

    Parameters:
        data: the bytes gathered so far.
        sock: the connection (blocking reads with a timeout happen only past ``data``).
        deadline: when the request must have arrived (``clock`` seconds).
        clock: monotonic seconds.
    """

    def __init__(self, data: bytes, sock: socket.socket, deadline: float, clock: Callable[[], float]) -> None:
        self._buf = bytearray(data)
        self._sock = sock
        self._deadline = deadline
        self._clock = clock

    def _fill(self) -> bool:
        remaining = self._deadline - self._clock()
        if remaining <= 0:
            raise TimeoutError("the request was not received in time")
        self._sock.settimeout(remaining)
        chunk = self._sock.recv(RECV_BYTES)
        if not chunk:
            return False
        self._buf += chunk
        return True

    def readline(self, limit: int = -1) -> bytes:
        """One line (with its newline), at most ``limit`` bytes; shorter at the end of the stream.

        Raises:
            TimeoutError: the deadline passed before the line arrived.
        """
        idx = self._buf.find(b"\n")
        while idx < 0 and (limit < 0 or len(self._buf) < limit) and self._fill():
            idx = self._buf.find(b"\n")
        end = idx + 1 if idx >= 0 else len(self._buf)
        if limit >= 0:
            end = min(end, limit)
        line = bytes(self._buf[:end])
        del self._buf[:end]
        return line

    def read(self, size: int = -1) -> bytes:
        """``size`` bytes (fewer at the end of the stream); ``-1`` reads what was gathered.

        Raises:
            TimeoutError: the deadline passed before they arrived.
        """
        if size < 0:
            size = len(self._buf)
        while len(self._buf) < size and self._fill():
            pass
        out = bytes(self._buf[:size])
        del self._buf[:size]
        return out

    def leftover(self) -> bytes:
        """Bytes received past what was read: the start of a pipelined next request."""
        return bytes(self._buf)

    def close(self) -> None:
        """Nothing to release: the socket belongs to the loop."""


class ConnectionLoop:
    """Listens on ``address`` and runs the loop of the module docstring until :meth:`stop`.

    Parameters:
        address: ``(host, port)`` to bind (port 0: any free port).
        family: ``socket.AF_INET`` or ``socket.AF_INET6``.
        handle: answers one complete request on a handler thread (see :data:`Handle`).
        timeout_s: the request deadline in seconds, read for every connection (so a live
            change applies to new ones).
        max_threads: handler threads at most.
        max_connections: open connections at most.
        clock: monotonic seconds.
        on_shed: called with ``"full"`` (a new connection closed at once: every open one has a
            request in) or ``"evicted"`` (the longest-waiting closed to admit a new one), on the
            loop thread, for each connection shed.
        heavy: whether the request whose bytes begin with the given ones goes in the heavy
            lane (None: every request is light).
        reserved_threads: handler threads a heavy request never takes (below ``max_threads``).
    """

    def __init__(
        self,
        address: tuple[str, int],
        family: int,
        handle: Handle,
        *,
        timeout_s: Callable[[], float],
        max_threads: int = MAX_HANDLER_THREADS,
        max_connections: int = MAX_OPEN_CONNECTIONS,
        clock: Callable[[], float] = time.monotonic,
        on_shed: Callable[[str], None] | None = None,
        heavy: Callable[[bytes], bool] | None = None,
        reserved_threads: int = 0,
    ) -> None:
        if max_threads < 1 or max_connections < 1:
            raise ValueError("max_threads and max_connections must be at least 1")
        if not 0 <= reserved_threads < max_threads:
            raise ValueError("reserved_threads must be at least 0 and below max_threads")
        self._handle = handle
        self._is_heavy = heavy
        self._heavy_limit = max_threads - reserved_threads
        self._timeout_s = timeout_s
        self._max_threads = max_threads
        self._max_connections = max_connections
        self._clock = clock
        self._on_shed = on_shed
        # Shedding is logged at most once per SHED_LOG_INTERVAL_S, with the count since the last
        # line (loop thread only): a flood must not flood the log too.
        self._shed_unlogged: dict[str, int] = {}
        self._shed_logged_at: float | None = None
        self.listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            # SO_REUSEADDR: a restart binds at once, even with TIME_WAIT sockets.
            self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.listener.bind(address)
            self.listener.listen(LISTEN_BACKLOG)
            self.listener.setblocking(False)
        except OSError:
            self.listener.close()
            raise
        self._wake_r, self._wake_w = os.pipe()
        self._stopping = False
        self._lock = threading.Lock()
        # Complete requests waiting for a handler thread, one queue per lane (see the module docstring).
        self._ready_light: deque[_Conn] = deque()
        self._ready_heavy: deque[_Conn] = deque()
        self._returned: deque[_Conn] = deque()  # kept-alive connections back from handlers
        self._handlers = 0
        self._heavy_running = 0  # handler threads answering a heavy request now
        self._handled_open = 0  # connections a handler holds or that wait for one
        # Connections the loop watches, oldest deadline first (one timeout: insertion order).
        self._waiting: dict[socket.socket, _Conn] = {}
        self._selector: selectors.BaseSelector | None = None

    @property
    def server_address(self) -> tuple:
        """The address actually bound."""
        return self.listener.getsockname()

    @property
    def open_connections(self) -> int:
        """Connections open now: watched by the loop, waiting for a handler, or being answered."""
        with self._lock:
            return len(self._waiting) + self._handled_open

    def serve(self) -> None:
        """Accept, gather and dispatch until :meth:`stop` (run it on a thread of its own)."""
        with selectors.DefaultSelector() as selector:
            self._selector = selector
            selector.register(self.listener, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            while not self._stopping:
                for key, _events in selector.select(self._wait_s()):
                    if key.fileobj is self.listener:
                        self._accept()
                    elif key.fileobj == self._wake_r:
                        os.read(self._wake_r, 4096)
                        self._take_returned()
                    else:
                        self._receive(key.data)
                self._expire()
            for conn in list(self._waiting.values()):
                self._close(conn)

    def stop(self) -> None:
        """End :meth:`serve` (from another thread)."""
        self._stopping = True
        os.write(self._wake_w, b"x")

    def close(self) -> None:
        """Close the listening socket and the wake-up pipe (after :meth:`serve` has returned)."""
        self.listener.close()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    # ------------------------------------------------------------------ the loop

    def _wait_s(self) -> float | None:
        if not self._waiting:
            return None
        first = next(iter(self._waiting.values()))
        return max(0.0, first.deadline - self._clock())

    def _accept(self) -> None:
        while True:
            try:
                sock, address = self.listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                # Out of descriptors (EMFILE): make room; the pending client is accepted next time.
                log.warning("Accepting an admin API connection failed: %s; closing the longest-waiting one.", exc)
                if not self._evict_oldest():
                    return
                continue
            while self.open_connections >= self._max_connections and self._evict_oldest():
                self._shed("evicted")
            if self.open_connections >= self._max_connections:
                # Every open connection has a whole request in or being answered: shed this one.
                log.debug("Refusing admin API connection from %s: %d connections open.", address, self._max_connections)
                sock.close()
                self._shed("full")
                continue
            sock.setblocking(False)
            self._watch(_Conn(sock, address, b"", self._clock() + self._timeout_s()))

    def _shed(self, reason: str) -> None:
        """Count one connection shed, and say so in the log (at most once per interval)."""
        if self._on_shed is not None:
            self._on_shed(reason)
        self._shed_unlogged[reason] = self._shed_unlogged.get(reason, 0) + 1
        now = self._clock()
        if self._shed_logged_at is not None and now - self._shed_logged_at < SHED_LOG_INTERVAL_S:
            return
        since = "" if self._shed_logged_at is None else f" in the last {now - self._shed_logged_at:.0f} s"
        self._shed_logged_at = now
        counts, self._shed_unlogged = self._shed_unlogged, {}
        log.warning(
            "The admin API shed connections%s (%d at most stay open): %d closed at once with every open "
            "connection answering or waiting to be answered, %d idle or slow ones closed to admit new ones.",
            since, self._max_connections, counts.get("full", 0), counts.get("evicted", 0),
        )

    def _watch(self, conn: _Conn) -> None:
        if request_complete(conn.data) and conn.data:
            self._dispatch(conn)
            return
        assert self._selector is not None
        with self._lock:
            self._waiting[conn.sock] = conn
        self._selector.register(conn.sock, selectors.EVENT_READ, conn)

    def _unwatch(self, conn: _Conn) -> None:
        assert self._selector is not None
        with self._lock:
            self._waiting.pop(conn.sock, None)
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass

    def _receive(self, conn: _Conn) -> None:
        try:
            chunk = conn.sock.recv(RECV_BYTES)
        except BlockingIOError:
            return
        except OSError:  # reset by the client: nobody is left to answer
            self._unwatch(conn)
            self._close(conn)
            return
        if not chunk:
            self._unwatch(conn)
            if conn.data:
                self._dispatch(conn)  # half-closed after a partial request: it still gets an answer
            else:
                self._close(conn)
            return
        conn.data += chunk
        if request_complete(conn.data):
            self._unwatch(conn)
            self._dispatch(conn)

    def _expire(self) -> None:
        now = self._clock()
        while self._waiting:
            conn = next(iter(self._waiting.values()))
            if conn.deadline > now:
                return
            self._unwatch(conn)
            if _HEAD_END.search(conn.data):
                self._dispatch(conn)  # a short body: its handler answers 408 at once
            else:
                log.debug("Closing admin API connection from %s: no request within the timeout.", conn.address)
                self._close(conn)

    def _evict_oldest(self) -> bool:
        if not self._waiting:
            return False
        conn = next(iter(self._waiting.values()))
        self._unwatch(conn)
        self._close(conn)
        return True

    def _take_returned(self) -> None:
        while True:
            with self._lock:
                if not self._returned:
                    return
                conn = self._returned.popleft()
            if self._stopping:
                self._close(conn)
                continue
            try:
                conn.sock.setblocking(False)
            except OSError:
                self._close(conn)
                continue
            self._watch(conn)

    @staticmethod
    def _close(conn: _Conn) -> None:
        try:
            conn.sock.close()
        except OSError:
            pass

    # ------------------------------------------------------------------ handler threads

    def _dispatch(self, conn: _Conn) -> None:
        conn.heavy = self._is_heavy is not None and self._is_heavy(conn.data)
        conn.queued_at = self._clock()
        with self._lock:
            (self._ready_heavy if conn.heavy else self._ready_light).append(conn)
            self._handled_open += 1
            if self._handlers >= self._max_threads:
                return  # a running handler takes it when it is done
            if conn.heavy and self._heavy_running >= self._heavy_limit:
                return  # the heavy lane is full: the next heavy handler to finish takes it
            self._handlers += 1
            n = self._handlers
        threading.Thread(target=self._run_handlers, name=f"smoosh-http-{n}", daemon=True).start()

    def _take(self) -> _Conn | None:
        """The next request a handler thread may answer (under the lock): light ones first; a heavy
        one while the heavy lane has room. None: nothing this thread may take."""
        if self._ready_light:
            return self._ready_light.popleft()
        if self._ready_heavy and self._heavy_running < self._heavy_limit:
            self._heavy_running += 1
            return self._ready_heavy.popleft()
        return None

    def _run_handlers(self) -> None:
        # A handler thread answers ready requests until none is left that it may take, then
        # ends: an idle API keeps no thread but the loop's.
        while True:
            with self._lock:
                conn = self._take()
                if conn is None:
                    self._handlers -= 1
                    return
            keep, leftover = False, b""
            try:
                conn.sock.setblocking(True)
                keep, leftover = self._handle(conn.sock, conn.address, conn.data, conn.deadline,
                                              max(0.0, self._clock() - conn.queued_at))
            except OSError as exc:  # the client went away mid-answer, or the write timed out
                log.debug("Admin API connection from %s ended mid-answer: %s", conn.address, exc)
            except Exception:
                log.exception("The admin API failed to answer a request from %s.", conn.address)
            returned = keep and not self._stopping
            with self._lock:
                if conn.heavy:
                    self._heavy_running -= 1
                self._handled_open -= 1
                if returned:
                    conn.data = leftover
                    conn.deadline = self._clock() + self._timeout_s()
                    self._returned.append(conn)
            if not returned:
                self._close(conn)
                continue
            try:
                os.write(self._wake_w, b"x")  # the loop watches it again
            except OSError:
                self._close(conn)  # the loop is gone
