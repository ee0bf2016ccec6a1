"""The node's HTTP server (``inferbus up --http-port``, alias ``--metrics-port``; docs/http.md): waitress, a
pure-Python WSGI server, serving the node's WSGI app (:func:`inferbus.actors._probes.node_app`: the OIP v2 REST API
and ``/metrics``) on threads of its own: one reads and writes every connection (waitress's loop), a fixed pool runs
the requests.

What it gives a Triton or KServe client, and a load balancer, that the standard library's ``wsgiref`` (HTTP/1.0, a
connection per request, a thread per connection, no bound) did not:

- **HTTP/1.1 with keep-alive**: a client sends request after request on one TCP connection (``tritonclient.http``
  and every load balancer keep connections); pipelined requests are answered in order. ``Expect: 100-continue`` is
  answered (curl no longer waits a second before a large body); a chunked request body is read. A body framed
  two ways (``Content-Length`` with ``Transfer-Encoding: chunked``, or ``Transfer-Encoding`` in HTTP/1.0) is 400
  and the connection closed (RFC 9112 6.1, 6.3; waitress took the chunks, or the length).
- **A bound**: at most ``max_connections`` open connections (:data:`DEFAULT_MAX_CONNECTIONS`); past it the server
  stops accepting and the kernel's listen backlog holds the next ones until a connection closes (they wait; none is
  refused while the backlog, ``net.core.somaxconn``, has room). The same number of threads runs the requests, and a
  connection has one request running at a time, so a request on an accepted connection never waits for another
  request to finish: it waits in waitress's task queue only until an idle thread wakes up to take it (waitress
  logs ``Task queue depth is N`` when a burst of requests is queued before the threads woke; a wake-up, not a
  shortage; such records come once per 30 s, :data:`inferbus._logs.WAITRESS_LOG_PERIOD_S`). An inference holds its
  thread while it waits for the ingress's answer, an idle keep-alive connection holds none, but it **holds a slot
  of the bound** until the idle timeout: with the defaults, 100 idle pooled client connections make a new connection
  (a liveness probe) wait up to 30 s. Size the bound above the clients' pool sizes, or lower the idle timeout.
- **The idle timeout** (``--http-idle-timeout-s``): a connection with no byte in or out for that long, and no request
  being served, is closed; one that sent its headers and part of its body is answered 408 first. The wait for an
  inference's answer does not count. Only silence is timed: a client that sends one byte a second is not cut.
  Checked every :data:`CLEANUP_INTERVAL_S`, so a connection is closed between the timeout and about 2 s after it.
- **Every error answer of the server itself is JSON**, as the API's: ``{"error": "<message>"}`` with
  ``Inferbus-Error-Code`` (:func:`~inferbus.actors._gateway.error_code_of`): a request line over
  :data:`MAX_HEADER_BYTES` is 414, a request line and headers over it together 431 (both PAYLOAD_TOO_LARGE), a
  malformed request 400 (INVALID_ARGUMENT), a body over :data:`MAX_BODY_BYTES` 413, an application error 500. Its
  status line says the request's HTTP version, or HTTP/1.1 when the request line could not be read that far (a
  request line over the limit): waitress's said HTTP/1.0 to an HTTP/1.1 request whose head it could not take.

Source: waitress (https://docs.pylonsproject.org/projects/waitress/), its documented ``Adjustments`` (``threads``,
``connection_limit``, ``channel_timeout``, ``cleanup_interval``, ``max_request_header_size``,
``max_request_body_size``, ``backlog``, ``asyncore_use_poll``) and three class hooks of its server and channel
(``channel_class``, ``parser_class``, ``error_task_class``) and its ``maintenance`` step, pinned to ``waitress>=3,<4``
in pyproject.toml. tests/test_http_server.py and tests/test_http_infer.py check these against a real node, the 128 MiB
body bound included (a ``Content-Length`` over it, a chunked body streamed past it).
"""

from __future__ import annotations

import re
import socket
import threading
import time

from waitress import wasyncore
from waitress.adjustments import Adjustments
from waitress.channel import HTTPChannel
from waitress.parser import HTTPRequestParser, ParsingError
from waitress.server import TcpWSGIServer
from waitress.task import ErrorTask, ThreadedTaskDispatcher
from waitress.utilities import Error, RequestEntityTooLarge, RequestHeaderFieldsTooLarge

from .._limits import MAX_MAX_PAYLOAD_BYTES

DEFAULT_IDLE_TIMEOUT_S = 30.0
"""How long a connection may stay without a byte in or out, and no request being served, seconds (the default of
``--http-idle-timeout-s``, ``NodeConfig.http_idle_timeout_s``)."""

DEFAULT_MAX_CONNECTIONS = 100
"""Open connections at most, and so threads running requests (the default of ``--http-max-connections``,
``NodeConfig.http_max_connections``; waitress's own default ``connection_limit``)."""

MAX_HEADER_BYTES = 64 * 1024
"""The request line and headers together, bytes at most (http.server's limit of one line, which the node's server
had before): past it 431, or 414 when the request line alone does not end within it."""

MAX_BODY_BYTES = 2 * MAX_MAX_PAYLOAD_BYTES
"""A request body over this many bytes is refused with 413 by the server before it is read (its
``Content-Length``; a chunked body once it gets there, its chunks' framing counted). Smaller bodies are read whole
(spooled to a temporary file past 512 KiB, waitress's ``inbuf_overflow``) before the application sees them, which
answers 413 for a body over the ingresses' limit (``--max-request-bytes``, at most nats-server's ceiling, 64 MiB): the
bytes above it let a client that sends a body a little over the limit read that answer rather than a reset (one of
exactly this many bytes too: until 2026-12-07 waitress's own bound, which refuses a body of its size or more, cut
it)."""

CLEANUP_INTERVAL_S = 1.0
"""How often the server looks for idle connections to close, seconds (waitress's ``cleanup_interval``)."""


class _NodeError(Error):
    """An error answer of the server itself with our message (waitress's carry ``reason: body`` text)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


_VERSION = re.compile(rb"[ \t]HTTP/(1\.[01])\r?$")
"""The version at the end of a request line (RFC 9112 3: ``method SP request-target SP HTTP-version``)."""


def _request_version(head: bytes) -> str:
    """The HTTP version (``"1.0"`` or ``"1.1"``) of the request whose first bytes are ``head``: its request line's,
    when that line ended within them and names 1.0 or 1.1; else ``"1.1"``, this server's (RFC 9110 6.2: a server
    answers with the highest version it conforms to within the request's major version, and every request this
    server takes is HTTP/1.x)."""
    line, nl, _ = head.lstrip().partition(b"\n")
    m = _VERSION.search(line) if nl else None
    return m.group(1).decode() if m else "1.1"


class _Parser(HTTPRequestParser):
    """waitress's request parser, telling a request line too long (414) from headers too long (431), saying a body
    over :data:`MAX_BODY_BYTES` (413) with that bound (waitress's message names its own setting, one more), and
    answering a request whose head it could not take (414, 431, a malformed line or header: 400) in the request's
    HTTP version: waitress parses ``GET / HTTP/1.0`` in its stead, or stops before the version, so such answers said
    ``HTTP/1.0`` to an HTTP/1.1 client (until 2026-12-07)."""

    framing: str | None = None
    """Why the request's body framing is refused (:meth:`parse_header`), None when it is not."""

    def parse_header(self, header_plus: bytes) -> None:
        """waitress's, then a refusal of a body framed two ways (RFC 9112 6.1, 6.3): ``Transfer-Encoding: chunked``
        and ``Content-Length`` together (a request smuggling vector: a proxy in front may read the length where
        this server reads the chunks; waitress took the chunks), or an HTTP/1.0 request with ``Transfer-Encoding``
        (which HTTP/1.0 does not have: waitress framed it by ``Content-Length``). Either is 400 and the connection
        closed after it, as the RFC asks (the rest of what the client sent is never read as a request).

        Raises:
            ParsingError: the framing is refused (:attr:`framing` says why; :meth:`received` answers it).
        """
        super().parse_header(header_plus)
        if self.chunked and "CONTENT_LENGTH" in self.headers:  # (waitress popped Transfer-Encoding: set chunked)
            self.framing = ("the request has both Transfer-Encoding: chunked and Content-Length; send one (RFC 9112 "
                            "6.3: such a message may be a request smuggling attempt)")
        elif self.version == "1.0" and "TRANSFER_ENCODING" in self.headers:
            self.framing = ("an HTTP/1.0 request has no Transfer-Encoding (RFC 9112 6.1); send Content-Length, or "
                            "the request as HTTP/1.1")
        if self.framing is not None:
            self.expect_continue = False  # (no 100 Continue before the refusal)
            raise ParsingError(self.framing)

    def received(self, data: bytes) -> int:
        before, had, in_head = self.header_plus, self.error, self.body_rcv is None
        n = super().received(data)
        if self.error is not had and self.framing is not None:
            self.error = _NodeError(400, self.framing)
        if self.error is not had and in_head:
            self.version = _request_version(before + data)
        if self.error is not had and isinstance(self.error, RequestEntityTooLarge):
            self.error = _NodeError(413, f"the request body is over {MAX_BODY_BYTES} bytes (128 MiB)")
        elif self.error is not had and isinstance(self.error, RequestHeaderFieldsTooLarge):
            limit = self.adj.max_request_header_size
            end = (before + data).find(b"\n")
            if end < 0 or end >= limit:
                self.error = _NodeError(414, f"the request line (method, path and query) is over {limit} bytes")
            else:
                self.error = _NodeError(431, f"the request line and headers are over {limit} bytes together")
        return n


class _JsonErrorTask(ErrorTask):
    """waitress's answer to a request it could not take (malformed, too large, timed out) or whose application
    raised: the API's JSON error (:func:`~inferbus.actors._gateway.error_answer`) instead of waitress's text; the
    connection is closed after it, as waitress does."""

    def execute(self) -> None:
        from ._gateway import error_answer, status_line

        e = self.request.error
        message = e.body if isinstance(e, _NodeError) else f"{e.reason}: {e.body}"
        answer = error_answer(e.code, message)
        self.status = status_line(e.code)
        self.response_headers.extend(answer.headers)
        self.set_close_on_finish()
        self.content_length = len(answer.body)
        self.write(answer.body)


class _Channel(HTTPChannel):
    parser_class = _Parser
    error_task_class = _JsonErrorTask


class _Server(TcpWSGIServer):
    channel_class = _Channel

    def maintenance(self, now: float) -> None:
        """Before waitress closes the idle connections: one that sent its headers and part of its body is answered
        408 (then closed, as every error answer), as the node's server did before (a client that reads it learns
        why). Runs on the server's loop thread, as every change to a channel's requests but a task's own."""
        cutoff = now - self.adj.channel_timeout
        for channel in list(self.active_channels.values()):
            req = channel.request
            if channel.requests or req is None or not req.headers_finished or req.completed \
                    or channel.last_activity >= cutoff:
                continue
            with channel.requests_lock:
                req.error = _NodeError(408, f"the body did not arrive: no byte came for "
                                            f"{self.adj.channel_timeout:g} s")
                req.completed = True
                channel.request = None
                channel.requests.append(req)
                channel.last_activity = now
            self.add_task(channel)
        super().maintenance(now)


class HttpServer:
    """The node's HTTP server on its own threads (docs above). Use :meth:`start`, then :meth:`stop`."""

    def __init__(self, server: _Server, socket_map: dict, thread: threading.Thread) -> None:
        self._server: _Server | None = server
        self._map = socket_map
        self._thread = thread

    @property
    def port(self) -> int:
        """The TCP port it listens on (the one chosen when 0 was asked)."""
        return self._port

    @classmethod
    def start(cls, app, host: str, port: int, *, idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
              max_connections: int = DEFAULT_MAX_CONNECTIONS) -> "HttpServer":
        """Listen on ``host:port`` and serve the WSGI ``app`` until :meth:`stop`.

        Args:
            app: a WSGI application (PEP 3333), called on the server's threads.
            host: the address (or a name: its first address, IPv6 too) to listen on.
            port: the TCP port, 0 = a free one (:attr:`port` says which).
            idle_timeout_s: seconds a connection may stay idle (module docstring), > 0.
            max_connections: open connections at most, and threads running requests, >= 1.

        Raises:
            OSError: the address cannot be bound (port in use, no such address or name).
        """
        # its first address, as prometheus-client's server chose (waitress would listen on each, and say a name it
        # cannot resolve with a ValueError)
        address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][4][0]
        socket_map: dict = {}
        adj = Adjustments(host=address, port=port, threads=max_connections,
                          # waitress counts its listening socket and its wake-up pipe among the connections
                          connection_limit=max_connections + 2,
                          channel_timeout=idle_timeout_s, cleanup_interval=CLEANUP_INTERVAL_S,
                          max_request_header_size=MAX_HEADER_BYTES,
                          # (waitress refuses a body of max_request_body_size bytes or more; the bound is "over")
                          max_request_body_size=MAX_BODY_BYTES + 1,
                          # the kernel caps it at net.core.somaxconn: a burst of clients waits there, not refused
                          backlog=socket.SOMAXCONN,
                          asyncore_use_poll=True,  # (select() cannot watch a descriptor above 1023)
                          ident="inferbus", clear_untrusted_proxy_headers=False)
        dispatcher = ThreadedTaskDispatcher()
        dispatcher.set_thread_count(max_connections)
        try:
            server = _Server(app, socket_map, dispatcher=dispatcher, adj=adj, sockinfo=adj.listen[0])
        except BaseException:
            wasyncore.close_all(socket_map, ignore_all=True)
            dispatcher.shutdown(timeout=1.0)
            raise
        thread = threading.Thread(target=server.run, name="inferbus-http", daemon=True)
        self = cls(server, socket_map, thread)
        self._port = server.effective_port
        thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Close the listening socket and every connection (a request being served has its answer dropped), and
        join the server's loop thread, waiting ``timeout_s`` seconds at most for it and as much for the request
        threads. Idempotent."""
        server, self._server = self._server, None
        if server is None:
            return
        try:  # (closed on the loop's own thread: waitress's channels are not thread-safe)
            server.trigger.pull_trigger(lambda: wasyncore.close_all(self._map, ignore_all=True))
        except OSError:  # the loop has ended already
            pass
        deadline = time.monotonic() + timeout_s
        self._thread.join(timeout_s)
        server.task_dispatcher.shutdown(timeout=max(0.0, deadline - time.monotonic()))
