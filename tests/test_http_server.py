"""The node's HTTP server itself (``inferbus/actors/_http.py``, waitress), against a real node (``inferbus up
--http-port 0 --http-infer --http-max-connections 2 --http-idle-timeout-s 2``, 1 ingress, 1 worker): HTTP/1.1
keep-alive (several infers and health calls on one TCP connection), pipelined requests answered in order, the
connection bound (a third connection waits until one of the two closes), ``Expect: 100-continue`` answered, a
request line or headers too long answered as JSON with ``Inferbus-Error-Code``, and the code on every error answer of
the ready and metadata paths.
Each failed on the node's server before 2026-12-07 (wsgiref: HTTP/1.0, a connection per request, no bound,
http.server's HTML error pages, no code on the probes' 4xx)."""

from __future__ import annotations

import http.client
import json
import re
import socket
import time

import numpy as np
import pytest

from conftest import MODELS, start_deployment
from test_http_infer import digits_request, http_address

pytestmark = pytest.mark.timeout(60)

IDLE_S = 2


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    dep = start_deployment(tmp_path_factory.mktemp("http_server") / "dep", workers=1, prefix="hs",
                           extra=["--ingress", "1", "--http-port", "0", "--http-host", "127.0.0.1", "--http-infer",
                                  "--http-max-connections", "2", "--http-idle-timeout-s", str(IDLE_S)])
    try:
        host, port = http_address(dep).rsplit(":", 1)
        dep.http = (host, int(port))
        yield dep
    finally:
        dep.stop()


@pytest.fixture(scope="module")
def body() -> bytes:
    x = np.load(MODELS / "digits" / "data" / "test.npz")["X"][:1].astype(np.float32)
    return json.dumps(digits_request(x)).encode()


def read_answer(s: socket.socket) -> bytes:
    """Everything the server writes until it closes the connection (what came before a reset, if one comes)."""
    got = b""
    try:
        while chunk := s.recv(65536):
            got += chunk
    except ConnectionResetError:  # (it closes with part of our long request unread: the kernel then resets)
        pass
    return got


def test_one_connection_serves_several_infers_and_health_calls(node, body):
    """http.client keeps one socket while the server keeps the connection (it reconnects silently otherwise: the
    socket object and its local port would change); 12 requests, one TCP connect, then closed by the server after
    ``--http-idle-timeout-s`` without a request."""
    conn = http.client.HTTPConnection(*node.http, timeout=10)
    try:
        conn.connect()
        sock, local = conn.sock, conn.sock.getsockname()
        for i in range(4):
            for method, path, data in (("POST", "/v2/models/digits/infer", body), ("GET", "/v2/health/ready", None),
                                       ("GET", "/v2/models/digits", None)):
                conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                got = resp.read()
                assert (resp.status, resp.version) == (200, 11), (path, resp.status, got[:300])
                assert not resp.will_close, resp.getheaders()
                assert conn.sock is sock and sock.getsockname() == local, (i, path)
        t0 = time.monotonic()
        sock.settimeout(IDLE_S + 5)
        assert sock.recv(1) == b""  # the server closed the idle connection
        assert IDLE_S - 0.1 <= time.monotonic() - t0 <= IDLE_S + 3
    finally:
        conn.close()


def test_pipelined_requests_are_answered_in_order(node, body):
    host, port = node.http
    requests = (b"GET /v2/models/digits/ready HTTP/1.1\r\nHost: x\r\n\r\n"
                b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body) +
                b"GET /v2/models/nosuch/ready HTTP/1.1\r\nHost: x\r\n\r\n"
                b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(requests)
        got = read_answer(s)
    statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", got)  # (a status line follows the previous answer's body)
    assert statuses == [b"200", b"200", b"404", b"200"], got[:2000]
    assert b'"model_name": "digits"' in got or b'"model_name":"digits"' in got, got[:2000]


def test_past_the_connection_bound_a_connection_waits_until_one_closes(node):
    """``--http-max-connections 2``: two open keep-alive connections (each served once), a third connects (the
    kernel's backlog takes it) but its request is not read until one of the two closes, then it is answered."""
    host, port = node.http
    held = [http.client.HTTPConnection(host, port, timeout=10) for _ in range(2)]
    try:
        for conn in held:
            conn.request("GET", "/v2/health/live")
            resp = conn.getresponse()
            resp.read()  # (the connection is idle now, kept open)
            assert resp.status == 200
        with socket.create_connection((host, port), timeout=10) as third:
            third.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            third.settimeout(1.0)
            with pytest.raises(TimeoutError):
                third.recv(100)
            held[0].close()
            t0 = time.monotonic()
            third.settimeout(5.0)
            got = read_answer(third)
            assert got.startswith(b"HTTP/1.1 200 "), got[:300]
            assert time.monotonic() - t0 < 2.5
    finally:
        for conn in held:
            conn.close()


@pytest.mark.parametrize("what, status", [("line", 414), ("headers", 431)])
@pytest.mark.parametrize("version", ["1.1", "1.0"])
def test_a_request_line_or_headers_too_long_is_json_with_the_code(node, what, status, version):
    """Past 64 KiB: 414 for the request line alone, 431 for the line and headers; until 2026-12-07 http.server's HTML
    page, no ``Inferbus-Error-Code``. The status line says the request's version (HTTP/1.1 where the request line
    was too long to read it); until 2026-12-07 waitress's ``HTTP/1.0`` whatever the request's."""
    host, port = node.http
    v = version.encode()
    request = (b"GET /v2/models/" + b"a" * 70_000 + b"/ready HTTP/%s\r\nHost: x\r\n\r\n" % v if what == "line" else
               b"GET /v2/health/live HTTP/%s\r\nHost: x\r\n" % v
               + b"".join(b"X-Pad-%d: %s\r\n" % (i, b"b" * 8000) for i in range(10)) + b"\r\n")
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(request)
        got = read_answer(s)
    head, _, payload = got.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == str(status).encode(), got[:500]
    assert head.split(b" ")[0] == (b"HTTP/1.1" if what == "line" else b"HTTP/" + v), got[:500]
    headers = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
    assert headers[b"Inferbus-Error-Code"] == b"PAYLOAD_TOO_LARGE" and headers[b"Content-Type"] == b"application/json"
    assert "65536 bytes" in json.loads(payload)["error"], payload


@pytest.mark.parametrize("version", ["1.1", "1.0"])
def test_a_malformed_header_is_answered_in_the_requests_version(node, version):
    """A header line that is not ``name: value``: 400 (JSON, ``Inferbus-Error-Code``), the status line in the
    request's version; until 2026-12-07 ``HTTP/1.0`` to an HTTP/1.1 request (waitress stops before the version)."""
    with socket.create_connection(node.http, timeout=10) as s:
        s.sendall(b"GET /v2/health/live HTTP/%s\r\nHost: x\r\nno colon here\r\n\r\n" % version.encode())
        got = read_answer(s)
    assert got.startswith(b"HTTP/%s 400 " % version.encode()), got[:500]
    assert b"Inferbus-Error-Code: INVALID_ARGUMENT" in got and b"Connection: close" in got, got[:500]


def test_content_length_with_chunked_is_400_and_the_connection_closed(node, body):
    """RFC 9112 6.3: a request with both ``Transfer-Encoding: chunked`` and ``Content-Length`` (a request smuggling
    vector: a proxy in front may frame it by the length) is refused, 400 as JSON with the code, and the connection
    closed after the answer: the request pipelined after it is never answered. Until 2026-12-07 waitress read the
    chunks, served the infer (200) and kept the connection (the next request answered too)."""
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    with socket.create_connection(node.http, timeout=10) as s:
        s.sendall(b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n%s" % (len(chunked), chunked)
                  + b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        got = read_answer(s)
    assert got.startswith(b"HTTP/1.1 400 "), got[:500]
    assert re.findall(rb"HTTP/1\.[01] \d{3} ", got) == [b"HTTP/1.1 400 "], got[:2000]  # the second: never answered
    head, _, payload = got.partition(b"\r\n\r\n")
    assert b"Inferbus-Error-Code: INVALID_ARGUMENT" in head and b"Connection: close" in head, head
    assert "both Transfer-Encoding: chunked and Content-Length" in json.loads(payload)["error"], payload


def test_an_http_1_0_request_with_transfer_encoding_is_400(node, body):
    """RFC 9112 6.1: HTTP/1.0 has no ``Transfer-Encoding``; a request with one has faulty framing, even with a
    ``Content-Length``: 400 and closed. Until 2026-12-07 waitress framed it by the ``Content-Length`` and served it."""
    with socket.create_connection(node.http, timeout=10) as s:
        s.sendall(b"POST /v2/models/digits/infer HTTP/1.0\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        got = read_answer(s)
    assert got.startswith(b"HTTP/1.0 400 ") and b"Inferbus-Error-Code: INVALID_ARGUMENT" in got, got[:500]
    assert "HTTP/1.0 request has no Transfer-Encoding" in json.loads(got.partition(b"\r\n\r\n")[2])["error"]


@pytest.mark.parametrize("coding", ["identity", "gzip, chunked", "chunked, gzip", "deflate"])
def test_a_transfer_coding_other_than_chunked_is_501_invalid_argument_and_closed(node, body, coding):
    """RFC 9112 6.1: a transfer coding the server does not understand is 501. It is the client's request that cannot
    be read: ``Inferbus-Error-Code: INVALID_ARGUMENT``, JSON naming the coding, the connection closed (the body's
    framing is unknown). Until 2026-12-07 the 501 said INTERNAL (a server fault) and waitress's words alone."""
    with socket.create_connection(node.http, timeout=10) as s:
        s.sendall(b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: %s\r\n\r\n%s" % (coding.encode(), body))
        got = read_answer(s)
    head, _, payload = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 501 "), got[:500]
    assert b"Inferbus-Error-Code: INVALID_ARGUMENT" in head and b"Connection: close" in head, head
    error = json.loads(payload)["error"]
    assert error.startswith(f"Transfer-Encoding {coding!r} is not supported: "), error


@pytest.mark.parametrize("version", ["2.0", "9.9", "0.9", "3.1"])
def test_a_request_line_of_another_major_http_version_is_505(node, version):
    """RFC 9110 15.6.6: a major version the server does not serve is 505 HTTP Version Not Supported (answered in
    HTTP/1.1, JSON, ``INVALID_ARGUMENT``, closed). Until 2026-12-07 waitress served ``HTTP/2.0`` or ``HTTP/9.9``
    and answered ``HTTP/1.0 200`` (a fresh-user trial)."""
    with socket.create_connection(node.http, timeout=10) as s:
        s.sendall(b"GET /v2/health/live HTTP/%s\r\nHost: x\r\n\r\n" % version.encode())
        got = read_answer(s)
    head, _, payload = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 505 HTTP Version Not Supported\r\n"), got[:500]
    assert b"Inferbus-Error-Code: INVALID_ARGUMENT" in head and b"Connection: close" in head, head
    assert json.loads(payload)["error"].startswith(f"HTTP/{version} is not supported"), payload


def test_a_higher_minor_version_of_http_1_is_answered_as_http_1_1(node):
    """RFC 9110 6.2: an ``HTTP/1.2`` request is answered with the highest 1.x this server conforms to, 1.1, and kept
    alive as 1.1 (until 2026-12-07 waitress answered it ``HTTP/1.0`` and closed)."""
    with socket.create_connection(node.http, timeout=10) as s:
        s.sendall(b"GET /v2/health/live HTTP/1.2\r\nHost: x\r\n\r\nGET /v2/health/live HTTP/1.1\r\nHost: x\r\n"
                  b"Connection: close\r\n\r\n")
        got = read_answer(s)
    assert re.findall(rb"HTTP/1\.\d \d{3} ", got) == [b"HTTP/1.1 200 ", b"HTTP/1.1 200 "], got[:1000]


@pytest.mark.parametrize("method, path, status, code", [
    ("GET", "/v2/models/nosuch/ready", 404, "NOT_FOUND"),
    ("GET", "/v2/models/a.b/ready", 400, "INVALID_ARGUMENT"),
    ("GET", "/v2/models/digits/versions/01/ready", 400, "INVALID_ARGUMENT"),
    ("POST", "/v2/health/ready", 405, "INVALID_ARGUMENT"),
    ("GET", "/v2/nosuch", 404, "NOT_FOUND"),
    ("GET", "/v2/models/nosuch", 404, "NOT_FOUND"),
    ("HEAD", "/v2/models/nosuch/ready", 404, "NOT_FOUND"),
    ("DELETE", "/metrics", 405, "INVALID_ARGUMENT"),
])
def test_every_error_of_the_ready_and_metadata_paths_has_the_code(node, method, path, status, code):
    conn = http.client.HTTPConnection(*node.http, timeout=10)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        resp.read()
        assert (resp.status, resp.getheader("Inferbus-Error-Code")) == (status, code), resp.getheaders()
    finally:
        conn.close()


@pytest.mark.parametrize("method", ["DELETE", "POST", "PUT"])
def test_a_405_of_metrics_is_json_as_every_other_error(node, method):
    """A method other than GET, HEAD or OPTIONS on ``/metrics`` (any path outside ``/v2/``): 405 with ``Allow`` and
    the API's JSON error body, as a ``/v2`` path's 405; until 2026-12-07 its body was text (``# HTTP 405 ...``)."""
    conn = http.client.HTTPConnection(*node.http, timeout=10)
    try:
        conn.request(method, "/metrics", body=b"x" if method != "DELETE" else None)
        resp = conn.getresponse()
        payload = resp.read()
        assert resp.status == 405, (resp.status, payload[:300])
        assert resp.getheader("Allow") == "OPTIONS, GET, HEAD"
        assert resp.getheader("Inferbus-Error-Code") == "INVALID_ARGUMENT"
        assert resp.getheader("Content-Type") == "application/json", resp.getheaders()
        assert json.loads(payload) == {"error": f"/metrics (the Prometheus scrape) answers GET and HEAD, not {method}"}
        assert not resp.will_close  # (an answer of the app: the connection is kept, as after a /v2 path's 405)
    finally:
        conn.close()


def test_expect_100_continue_is_answered_before_the_body(node, body):
    """curl sends ``Expect: 100-continue`` before a body over 1 KiB and waits a second for ``100 Continue``; until
    2026-12-07 the server never sent it (docs/http.md told curl users to add ``-H 'Expect:'``)."""
    host, port = node.http
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Expect: 100-continue\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body))
        s.settimeout(0.9)
        assert s.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        s.settimeout(10)
        s.sendall(body)
        got = read_answer(s)
    assert got.startswith(b"HTTP/1.1 200 "), got[:300]


def _served(node, body: bytes) -> None:
    """An infer on a new connection is answered 200 (the server serves on after a refusal)."""
    conn = http.client.HTTPConnection(*node.http, timeout=10)
    try:
        conn.request("POST", "/v2/models/digits/infer", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()[:300]
        assert json.loads(resp.read())["model_name"] == "digits"
    finally:
        conn.close()


def _refused_over_the_bound(got: bytes, more: str = "") -> None:
    """``got`` (all the server wrote) is one 413 of the server itself: JSON naming the bound, PAYLOAD_TOO_LARGE
    (then ``more``)."""
    from inferbus.actors._http import MAX_BODY_BYTES

    head, _, payload = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413 "), got[:500]
    headers = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
    assert headers[b"Inferbus-Error-Code"] == b"PAYLOAD_TOO_LARGE" and headers[b"Content-Type"] == b"application/json"
    assert headers[b"Connection"] == b"close", headers
    assert json.loads(payload)["error"] == f"the request body is over {MAX_BODY_BYTES} bytes (128 MiB){more}", payload


def test_a_content_length_over_128_mib_is_413_unread_and_the_server_serves_on(node, body):
    """docs/http.md, "Size": a ``Content-Length`` over 128 MiB is 413 at once, the body unread (none is sent here:
    the answer comes without it), as JSON with the code; the connection is closed after it, and the next request is
    served."""
    from inferbus.actors._http import MAX_BODY_BYTES

    assert MAX_BODY_BYTES == 128 * 1024 * 1024
    with socket.create_connection(node.http, timeout=10) as s:
        s.sendall(b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % (MAX_BODY_BYTES + 1))
        got = read_answer(s)  # (to the server's close: a kept connection would time out here)
    _refused_over_the_bound(got)
    _served(node, body)


def test_a_chunked_body_past_128_mib_is_413_once_it_gets_there_and_the_server_serves_on(node, body):
    """A chunked body has no length to refuse up front: the server reads it until 128 MiB, then answers 413 (JSON,
    the code) and closes. Streamed from one 1 MiB buffer (the server spools what it read to a temporary file)."""
    from inferbus.actors._http import MAX_BODY_BYTES

    chunk = b"%x\r\n%s\r\n" % (1 << 20, b" " * (1 << 20))
    sent = 0
    with socket.create_connection(node.http, timeout=10) as s:
        s.sendall(b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n")
        try:
            while sent <= MAX_BODY_BYTES:  # (one more chunk than the bound, unless refused before)
                s.sendall(chunk)
                sent += 1 << 20
        except (BrokenPipeError, ConnectionResetError):  # refused, closed while chunks were still coming
            pass
        got = read_answer(s)
    _refused_over_the_bound(got)
    assert sent >= MAX_BODY_BYTES - (8 << 20), sent  # (refused at the bound, not before: a few chunks in flight)
    _served(node, body)


@pytest.mark.parametrize("chunks, declared", [
    (b"ffffffffffffffffffff\r\n", 0xffffffffffffffffffff),
    (b"%x\r\n" % ((128 << 20) + 1), (128 << 20) + 1),
    (b"100000\r\n%s\r\n%x;ext=1\r\n" % (b" " * (1 << 20), (127 << 20) + 1), (1 << 20) + ((127 << 20) + 1)),
])
def test_a_chunk_declared_past_128_mib_is_413_at_once(node, body, chunks, declared):
    """A chunk whose size line takes the body over the bound is 413 as soon as that line is read, the chunk unread
    (as a ``Content-Length`` over it); until 2026-12-07 the server waited for its bytes: 408 after the idle
    timeout."""
    t0 = time.monotonic()
    with socket.create_connection(node.http, timeout=10) as s:
        s.sendall(b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n" + chunks)
        got = read_answer(s)
    assert time.monotonic() - t0 < IDLE_S, got[:500]
    _refused_over_the_bound(got, f": its chunks declare {declared} bytes")
    _served(node, body)


@pytest.mark.parametrize("chunks", [b"5\nhello\n0\n\n", b"5\r\nhello\n0\r\n\r\n"])
def test_chunked_framing_with_a_bare_lf_is_400_at_once(node, body, chunks):
    """RFC 9112 7.1 ends each chunk line with CRLF; a chunk-size line ended by a bare LF waited for its CRLF until
    the idle timeout (408); it is 400 at once, as a bare LF after a chunk's data was."""
    t0 = time.monotonic()
    with socket.create_connection(node.http, timeout=10) as s:
        s.sendall(b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n" + chunks)
        got = read_answer(s)
    assert time.monotonic() - t0 < IDLE_S, got[:500]
    assert got.startswith(b"HTTP/1.1 400 "), got[:500]
    assert b"Inferbus-Error-Code: INVALID_ARGUMENT" in got and b"Connection: close" in got, got[:500]
    _served(node, body)


def test_a_body_of_exactly_128_mib_is_read_then_refused_by_the_ingress_limit_on_a_kept_connection(node, body):
    """The bound is "over 128 MiB" (docs/http.md, "Size": a body up to 128 MiB is read and then refused, the client
    reading the 413 rather than a reset): one of exactly 128 MiB is read whole and answered 413 by the gateway (over
    the ingresses' limit, 8 MiB here), on a connection kept open, which then serves an infer. Streamed from one 1 MiB
    buffer."""
    from inferbus.actors._http import MAX_BODY_BYTES

    block = b" " * (1 << 20)
    with socket.create_connection(node.http, timeout=10) as s:
        s.sendall(b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % MAX_BODY_BYTES)
        for _ in range(MAX_BODY_BYTES // len(block)):
            s.sendall(block)
        resp = http.client.HTTPResponse(s)  # (read off this socket: the next request goes on it)
        resp.begin()
        doc = json.loads(resp.read())
        assert resp.status == 413 and resp.getheader("Inferbus-Error-Code") == "PAYLOAD_TOO_LARGE", doc
        assert doc["error"].startswith(f"request body of {MAX_BODY_BYTES} bytes is over the limit of "), doc
        assert not resp.will_close, resp.getheaders()
        s.sendall(b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        resp = http.client.HTTPResponse(s)
        resp.begin()
        assert resp.status == 200 and json.loads(resp.read())["model_name"] == "digits"


def test_a_request_still_running_when_the_server_is_closed_logs_no_error(caplog):
    """A request thread that finishes after the server was closed (a second Ctrl-C: the node killed, the HTTP server
    closed with its wake-up pipe while the request waited on the node's loop) used to have waitress log "Exception
    when servicing ... OSError: [Errno 9] Bad file descriptor" at error level, ~15 lines each (a fresh-user trial):
    an alert on an ordinary forced stop. Here the server alone (waitress, real sockets), its one request held by the
    app until the server is stopped with no grace."""
    import logging
    import threading

    from inferbus.actors._http import HttpServer

    release, entered = threading.Event(), threading.Event()

    def app(environ, start_response):
        entered.set()
        release.wait(10)
        start_response("200 OK", [("Content-Length", "2")])
        return [b"ok"]

    server = HttpServer.start(app, "127.0.0.1", 0, max_connections=4)
    conn = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    try:
        conn.sendall(b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n")
        assert entered.wait(5)
        with caplog.at_level(logging.WARNING, logger="waitress"):
            drainer = threading.Thread(target=server.drain, args=(10.0, "stopping"))  # a graceful stop's first step
            drainer.start()
            time.sleep(0.2)
            server.cut()  # the second signal: the drain's wait ends, the server is closed
            drainer.join(5)
            stopper = threading.Thread(target=server.stop, kwargs={"timeout_s": 5.0, "grace_s": 1.0})
            stopper.start()
            time.sleep(0.3)  # the server's sockets and wake-up pipe closed; the request still running
            release.set()
            stopper.join(10)
            time.sleep(0.3)  # (the request thread's end)
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert not errors, [r.getMessage() + str(r.exc_info) for r in errors]
    finally:
        release.set()
        conn.close()


@pytest.mark.parametrize("line, status, allow, text", [
    (b"CONNECT x:80 HTTP/1.1", 405, b"OPTIONS, GET, HEAD, POST", "CONNECT 'x:80' is not served"),
    (b"OPTIONS * HTTP/1.1", 200, b"OPTIONS, GET, HEAD, POST", None),
    (b"GET * HTTP/1.1", 400, None, "the request-target '*' is for OPTIONS alone"),
    (b"GET x:80 HTTP/1.1", 400, None, "the request-target 'x:80' is not a path"),
])
def test_a_request_target_that_is_not_a_path_is_answered_naming_it(node, line, status, allow, text):
    """RFC 9112 3.2: ``CONNECT host:port`` (authority-form) is 405, ``OPTIONS *`` (asterisk-form) 200 with the
    server's methods, another such target 400, each message naming the target as sent; until 2026-12-07 ``CONNECT
    x:80`` was read as the path ``80``: ``80 (the Prometheus scrape) answers GET and HEAD, not CONNECT``."""
    with socket.create_connection(node.http, timeout=10) as s:
        s.sendall(line + b"\r\nHost: x\r\nConnection: close\r\n\r\n")
        got = read_answer(s)
    head, _, payload = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d " % status), got[:500]
    headers = dict(h.split(b": ", 1) for h in head.split(b"\r\n")[1:])
    assert headers.get(b"Allow") == allow, got[:500]
    if text is None:
        assert payload == b"", got[:500]
    else:
        assert headers[b"Inferbus-Error-Code"] == b"INVALID_ARGUMENT", got[:500]
        assert json.loads(payload)["error"].startswith(text), payload


@pytest.mark.parametrize("path", ["/v2/models/%FF", "/v2/models/" + "%FF" * 5000, "/v2/models/a%C3/ready",
                                  "/metrics%FE"])
def test_a_path_that_is_not_utf_8_after_percent_decoding_is_400(node, path):
    """Until 2026-12-07 such a path was read with replacement characters: ``/v2/models/%FF`` was ``unknown model
    '\\ufffd'``, 404, and ``%FF`` 5000 times ``is 15000 bytes of UTF-8`` (the replacement characters counted)."""
    conn = http.client.HTTPConnection(*node.http, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        payload = resp.read()
        assert resp.status == 400, (resp.status, payload[:300])
        assert resp.getheader("Inferbus-Error-Code") == "INVALID_ARGUMENT"
        assert json.loads(payload)["error"].startswith("the path is not UTF-8 after percent-decoding"), payload[:300]
    finally:
        conn.close()
