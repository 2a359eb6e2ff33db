"""HTTP bodies and headers against a real in-process Server's admin API.

Every request gets a 2xx/4xx JSON answer (never a 5xx, never a dropped connection) and the
server keeps serving ``/status`` afterwards. Requests are written as raw bytes on a socket,
so Content-Length can lie, headers can repeat and bodies need not be UTF-8.
"""

from __future__ import annotations

import http.client
import json
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzz.conftest import Target
from fuzz.fuzzlib import FAST, SOAK_EXAMPLES, fuzz_settings
from helpers.daemon import HANG_S

#: Seconds a fuzzed request may take to be answered.
ANSWER_TIMEOUT_S = 10.0

PATHS = st.sampled_from(["/enqueue", "/enqueue", "/enqueue", "/suspend", "/resume", "/flush", "/status",
                         "/jobs", "/nope", "/enqueue?x=1", "/%00", "//enqueue", "/enqueue/../status"])
# Methods the API defines; others (PUT, HEAD, ...) are the subject of a test below.
METHODS = st.sampled_from(["POST", "POST", "POST", "GET"])
HEADER_NAMES = st.sampled_from(["Content-Type", "Authorization", "Accept", "X-Fuzz", "Connection", "Expect",
                                "Host", "User-Agent", "Content-Encoding"]) | st.from_regex(r"[A-Za-z][A-Za-z0-9-]{0,20}", fullmatch=True)
# Header values: latin-1 text without line breaks (what a socket can carry in a header).
HEADER_VALUES = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\r\n\x7f"), max_size=60) \
    | st.sampled_from(["Bearer ", "Bearer x", "application/json", "close", "keep-alive", "gzip", "100-continue"])

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=20,
)
KEY_TEXT = st.text(max_size=40) | st.sampled_from(["/", "/etc/passwd", "cleanup:/x.db", "../../x", "\x00", "\ud800"])


@st.composite
def bodies(draw: st.DrawFn, root: str) -> bytes:
    """A request body: raw bytes, non-UTF-8, random JSON, or an enqueue body of hostile keys."""
    kind = draw(st.sampled_from(["bytes", "json", "enqueue", "enqueue", "channel", "deep", "empty"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "json":
        return json.dumps(draw(JSON_VALUES)).encode()
    if kind == "enqueue":
        keys = draw(st.lists(KEY_TEXT | st.just(root + "/inside.db") | st.integers() | st.none(), max_size=8))
        return json.dumps({"keys": keys, **draw(st.dictionaries(st.text(max_size=5), JSON_VALUES, max_size=2))}).encode()
    if kind == "channel":
        return json.dumps({"channel": draw(JSON_VALUES | st.sampled_from(["ratio_dbs", "nope"]))}).encode()
    if kind == "deep":  # deep but within what a JSON decoder handles without recursion trouble
        depth = draw(st.integers(1, 200))
        return b"[" * depth + b"]" * depth
    return b""


@st.composite
def requests(draw: st.DrawFn, root: str) -> tuple[str, bytes, bool]:
    """(method, raw request bytes, whether the client half-closes after sending)."""
    method = draw(METHODS)
    path = draw(PATHS)
    body = draw(bodies(root))
    headers = draw(st.lists(st.tuples(HEADER_NAMES, HEADER_VALUES), max_size=5))
    length_kind = draw(st.sampled_from(["exact", "exact", "none", "short", "long", "garbage", "negative", "huge", "twice"]))
    half_close = False
    if length_kind == "exact":
        headers.append(("Content-Length", str(len(body))))
    elif length_kind == "short":
        headers.append(("Content-Length", str(draw(st.integers(0, max(0, len(body) - 1))))))
    elif length_kind == "long":
        # More than is sent: the client half-closes, so the server reads to EOF and answers.
        headers.append(("Content-Length", str(len(body) + draw(st.integers(1, 1000)))))
        half_close = True
    elif length_kind == "garbage":
        # Some of these parse with int() ("+5", "1_0"): half-close so a server that believes
        # them reads EOF instead of waiting (the wait itself is a test below).
        headers.append(("Content-Length", draw(st.sampled_from(["abc", "1e3", "", " ", "0x10", "½", "+5", "1_0", " 7 "]))))
        half_close = True
    elif length_kind == "negative":
        headers.append(("Content-Length", str(-draw(st.integers(1, 10**6)))))
    elif length_kind == "huge":
        headers.append(("Content-Length", str(draw(st.integers(2**26 + 1, 10**30)))))
    elif length_kind == "twice":
        headers += [("Content-Length", str(len(body))), ("Content-Length", str(draw(st.integers(0, 50))))]
    # Headers the fuzzer drew must not replace the framing chosen above with one the server
    # would wait on: drop a stray Content-Length / Transfer-Encoding / Expect it made up.
    head = [f"{method} {path} HTTP/1.1", "Host: localhost"]
    for name, value in headers:
        if name.lower() in ("content-length",) and (name, value) not in headers[-2:]:
            continue
        if name.lower() in ("transfer-encoding", "expect"):
            continue
        head.append(f"{name}: {value}")
    head.append("Connection: close")
    raw = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
    return method, raw, half_close


def send_raw(target: Target, method: str, raw: bytes, *, half_close: bool = False) -> tuple[int, dict[str, str], bytes]:
    """Send ``raw`` on a new connection; return status, headers and body of the answer."""
    with socket.create_connection((target.host, target.port), timeout=ANSWER_TIMEOUT_S) as sock:
        sock.sendall(raw)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        response = http.client.HTTPResponse(sock, method=method)
        response.begin()
        body = response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, body


def assert_serving(target: Target) -> None:
    """The daemon still answers GET /status with its status table."""
    status, _, body = send_raw(target, "GET", b"GET /status HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    assert status == 200
    assert json.loads(body)["node"] == "testnode"


def http_property(target: Target, method: str, raw: bytes, half_close: bool) -> None:
    try:
        status, headers, body = send_raw(target, method, raw, half_close=half_close)
    except (http.client.RemoteDisconnected, ConnectionResetError) as e:
        pytest.fail(f"the server dropped the connection without an answer ({e!r}) for {raw[:300]!r}")
    assert 200 <= status < 500, f"{status} for {raw[:300]!r}: {body[:300]!r}"
    assert headers.get("content-type") == "application/json", f"{status} {headers} for {raw[:200]!r}"
    assert isinstance(json.loads(body), dict)
    assert_serving(target)


@fuzz_settings(FAST * 3)
@given(data=st.data())
def test_any_request_gets_a_json_answer_below_500_and_the_server_keeps_serving(target: Target, data: st.DataObject) -> None:
    method, raw, half_close = data.draw(requests(str(target.root)))
    http_property(target, method, raw, half_close)


def test_a_body_larger_than_the_limit_is_refused_unread(target: Target) -> None:
    raw = b"POST /enqueue HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 99999999999999999999\r\n\r\n{"
    status, _, body = send_raw(target, "POST", raw)
    assert status == 413 and "larger than" in json.loads(body)["error"]
    assert_serving(target)


def test_an_enqueue_of_non_utf8_and_surrogate_keys_reports_them_rejected(target: Target) -> None:
    body = json.dumps({"keys": [str(target.root) + "/\ud800.db", str(target.root) + "/inside.db"]}).encode()
    raw = b"POST /enqueue HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    status, _, answer = send_raw(target, "POST", raw)
    assert status == 202
    decoded = json.loads(answer)
    assert decoded["accepted"] == 1
    assert decoded["rejected"] == [{"key": str(target.root) + "/\ud800.db", "reason": "not valid UTF-8"}]


def test_a_deeply_nested_json_body_is_refused_with_400(target: Target) -> None:
    body = b"[" * 100_000 + b"]" * 100_000
    raw = b"POST /enqueue HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    try:
        status, _, answer = send_raw(target, "POST", raw)
    finally:
        assert_serving(target)
    assert status == 400 and "JSON" in json.loads(answer)["error"]


def test_a_body_shorter_than_its_content_length_times_out_with_408(target: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    from smoosh.daemon.api.http import _Handler

    shipped_s = getattr(_Handler, "timeout", None)
    assert shipped_s is not None and 0 < shipped_s <= 60, f"the request timeout is {shipped_s!r}"
    monkeypatch.setattr(_Handler, "timeout", 1.0)  # a short one for the test; new connections read it
    raw = b"POST /enqueue HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"keys\": []}"
    with socket.create_connection((target.host, target.port), timeout=HANG_S) as sock:
        sock.sendall(raw)  # and keeps the connection open, sending nothing more
        response = http.client.HTTPResponse(sock, method="POST")
        response.begin()
        assert response.status == 408
        assert "error" in json.loads(response.read())


def test_a_content_length_that_is_not_plain_digits_is_refused_with_400(target: Target) -> None:
    for value in ("+5", "1_0", "5_5"):
        raw = f"POST /enqueue HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {value}\r\n\r\n".encode() + b'{"keys":[]}'
        with socket.create_connection((target.host, target.port), timeout=ANSWER_TIMEOUT_S) as sock:
            sock.sendall(raw)
            sock.shutdown(socket.SHUT_WR)
            response = http.client.HTTPResponse(sock, method="POST")
            response.begin()
            assert response.status == 400, (value, response.status)
            assert json.loads(response.read()) == {"error": "invalid Content-Length"}


def test_a_method_the_api_does_not_define_gets_a_json_405(target: Target) -> None:
    for method in ("PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"):
        raw = f"{method} /enqueue HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: 0\r\n\r\n".encode()
        status, headers, body = send_raw(target, method, raw)
        assert status == 405, (method, status)
        if method != "HEAD":
            assert headers.get("content-type") == "application/json"
            assert "error" in json.loads(body)
    assert_serving(target)


def test_an_oversized_header_gets_a_json_431(target: Target) -> None:
    for raw in (b"POST /enqueue HTTP/1.1\r\nX: " + b"a" * 70_000 + b"\r\n\r\n",
                b"POST /enqueue HTTP/1.1\r\n" + b"".join(b"H%d: v\r\n" % i for i in range(150)) + b"\r\n"):
        status, headers, body = send_raw(target, "POST", raw)
        assert status == 431
        assert headers.get("content-type") == "application/json"
        assert "error" in json.loads(body)
    assert_serving(target)


def test_a_chunked_body_gets_411_and_its_chunks_are_never_read_as_a_request(target: Target) -> None:
    # The chunk below would be a valid /suspend request if the server kept reading the stream.
    # (The daemon is shared with the fuzz tests, which may have suspended it: resume first.)
    resume = b"POST /resume HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"
    assert send_raw(target, "POST", resume)[0] == 200
    smuggled = b"POST /suspend HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
    raw = (b"POST /enqueue HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
           + b"%x\r\n" % len(smuggled) + smuggled + b"\r\n0\r\n\r\n")
    with socket.create_connection((target.host, target.port), timeout=ANSWER_TIMEOUT_S) as sock:
        sock.sendall(raw)
        response = http.client.HTTPResponse(sock, method="POST")
        response.begin()
        assert response.status == 411
        assert "Content-Length" in json.loads(response.read())["error"]
        assert response.getheader("Connection") == "close"
        assert sock.recv(1024) == b""  # closed: nothing else was answered
    status, _, body = send_raw(target, "GET", b"GET /status HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    channels = json.loads(body)["channels"]
    assert status == 200 and channels and not any(c["suspended"] for c in channels.values())


def test_malformed_request_lines_are_answered_and_the_server_keeps_serving(target: Target) -> None:
    # A request line http.server cannot parse is answered the HTTP/0.9 way (a body, no status
    # line); an HTTP version it does not speak gets 505 (HTTP's own answer for it). What
    # matters: an answer, no reset, and the daemon goes on.
    for raw in (b"GARBAGE\r\n\r\n", b"\xff\xfe\r\n\r\n", b"POST /enqueue HTTP/9.9\r\n\r\n",
                b"POST /enqueue HTTP/1.1\r\nX: " + b"a" * 70_000 + b"\r\n\r\n",
                b"POST /enqueue HTTP/1.1\r\n" + b"".join(b"H%d: v\r\n" % i for i in range(150)) + b"\r\n"):
        with socket.create_connection((target.host, target.port), timeout=ANSWER_TIMEOUT_S) as sock:
            sock.sendall(raw)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        assert answer, f"no answer to {raw[:60]!r}"
        if answer.startswith(b"HTTP/"):
            status = int(answer.split(b" ", 2)[1])
            assert 400 <= status < 500 or (status == 505 and b"HTTP/9.9" in raw), (status, raw[:60])
    assert_serving(target)


@pytest.mark.slow
@fuzz_settings(SOAK_EXAMPLES)
@given(data=st.data())
def test_any_request_gets_a_json_answer_below_500_and_the_server_keeps_serving_soak(target: Target, data: st.DataObject) -> None:
    method, raw, half_close = data.draw(requests(str(target.root)))
    http_property(target, method, raw, half_close)
