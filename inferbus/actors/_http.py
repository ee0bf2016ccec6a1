"""The node's HTTP server (``inferbus up --http-port``, alias ``--metrics-port``; docs/http.md): waitress, a
pure-Python WSGI server, serving the node's WSGI app (:func:`inferbus.actors._probes.node_app`: the OIP v2 REST API
and ``/metrics``) on threads of its own: one reads and writes every connection (waitress's loop), a fixed pool runs
the requests.

What it gives a Triton or KServe client, and a load balancer, that the standard library's ``wsgiref`` (HTTP/1.0, a
connection per request, a thread per connection, no bound) did not:

- **HTTP/1.1 with keep-alive**: a client sends request after request on one TCP connection (``tritonclient.http``
  and every load balancer keep connections); pipelined requests are answered in order. ``Expect: 100-continue`` is
  answered (curl no longer waits a second before a large body); a chunked request body is read (a chunk declared
  past :data:`MAX_BODY_BYTES` is 413 at once, a chunk-size line ended by a bare LF 400: :class:`_ChunkedReceiver`).
  A body framed
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
- **A graceful stop** (:meth:`HttpServer.drain`, the node's stop's first step): the listener is closed (new
  connections refused; those already in the kernel's backlog are taken first, not reset), a keep-alive connection
  idle after an answer is closed, a request received after the stop began is answered 503 UNAVAILABLE with
  ``Connection: close`` (not run), and the requests received before it are served, each answer with ``Connection:
  close``, while the node waits for them (docs/http.md, "A graceful stop"). waitress's own ``close()`` cut them all.
- **Every error answer of the server itself is JSON**, as the API's: ``{"error": "<message>"}`` with
  ``Inferbus-Error-Code`` (:func:`~inferbus.actors._gateway.error_code_of`): a request line over
  :data:`MAX_HEADER_BYTES` is 414, a request line and headers over it together 431 (both PAYLOAD_TOO_LARGE), a
  malformed request 400 (INVALID_ARGUMENT), a transfer coding other than chunked 501 and another major HTTP version
  (``HTTP/2.0``) 505 (both INVALID_ARGUMENT: waitress's 501 said INTERNAL, and it served ``HTTP/2.0`` as 1.0), a
  body over :data:`MAX_BODY_BYTES` 413, an application error 500. Its status line says the request's HTTP version,
  or HTTP/1.1 when the request line could not be read that far (a request line over the limit) or names another
  version: waitress's said HTTP/1.0 to an HTTP/1.1 request whose head it could not take.

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
from waitress.parser import HTTPRequestParser, ParsingError, TransferEncodingNotImplemented
from waitress.receiver import ChunkedReceiver
from waitress.server import TcpWSGIServer
from waitress.task import ErrorTask, ThreadedTaskDispatcher, WSGITask
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


class _ChunkedReceiver(ChunkedReceiver):
    """waitress's reader of a chunked body, refusing at once what it would wait on (a fresh-user trial: each hung
    until the idle timeout, then 408):

    - a chunk whose declared size takes the body over :data:`MAX_BODY_BYTES` (``ffffffffffffffffffff``): 413 as
      soon as its size line is read, the chunk unread (as a ``Content-Length`` over the bound), where waitress read
      on until the bound;
    - a chunk-size line ended by a bare LF (``5\nhello\n0\n\n``): 400 (RFC 9112 7.1 frames chunks with CRLF; a
      server MAY take a bare LF, waitress does not, and waited for a CRLF that never came). A bare LF after a chunk's
      data waitress refuses itself (400, ``Chunk not properly terminated``)."""

    def received(self, s: bytes) -> int:
        n = super().received(s)
        if self.error is None and self.chunk_remainder and len(self.buf) + self.chunk_remainder > MAX_BODY_BYTES:
            self.error = _NodeError(413, f"the request body is over {MAX_BODY_BYTES} bytes (128 MiB): its chunks "
                                         f"declare {len(self.buf) + self.chunk_remainder} bytes")
            self.all_chunks_received = True
        elif self.error is None and not self.all_chunks_received and b"\n" in self.control_line:
            self.error = _NodeError(400, "a chunk-size line of the chunked body ends with a bare LF: chunked framing "
                                         "ends each line with CRLF (RFC 9112 7.1)")
            self.all_chunks_received = True
        return n


_ANY_VERSION = re.compile(rb"[ \t]HTTP/([0-9])\.([0-9])(\r?)$")
"""The version at the end of a request line (RFC 9112 3: ``method SP request-target SP HTTP-version``; 2.3:
``HTTP-version = "HTTP/" DIGIT "." DIGIT``)."""

_TRANSFER_ENCODING = re.compile(rb"^transfer-encoding[ \t]*:[ \t]*(.*?)[ \t]*\r?$", re.I | re.M)


def _request_version(head: bytes) -> str:
    """The HTTP version (``"1.0"`` or ``"1.1"``) of the request whose first bytes are ``head``: its request line's,
    when that line ended within them and names 1.0 or 1.1; else ``"1.1"``, this server's (RFC 9110 6.2: a server
    answers with the highest version it conforms to within the request's major version, and every request this
    server takes is HTTP/1.x)."""
    line, nl, _ = head.lstrip().partition(b"\n")
    m = _ANY_VERSION.search(line) if nl else None
    return "1.0" if m is not None and m.group(1, 2) == (b"1", b"0") else "1.1"


class _Parser(HTTPRequestParser):
    """waitress's request parser, telling a request line too long (414) from headers too long (431), saying a body
    over :data:`MAX_BODY_BYTES` (413) with that bound (waitress's message names its own setting, one more), and
    answering a request whose head it could not take (414, 431, a malformed line or header: 400) in the request's
    HTTP version: waitress parses ``GET / HTTP/1.0`` in its stead, or stops before the version, so such answers said
    ``HTTP/1.0`` to an HTTP/1.1 client (until 2026-12-07)."""

    refusal: tuple[int, str] | None = None
    """The status and message of a request refused at its head (:meth:`parse_header`), None when it is not."""

    received_at: float | None = None
    """``time.monotonic()`` when the request's last byte came (None until then): a request received before a
    graceful stop began is served, one after it answered 503 (:meth:`_Channel.service`)."""

    def parse_header(self, header_plus: bytes) -> None:
        """waitress's, with refusals of its own (each answered by :meth:`received`; the connection closed after it,
        as the RFC asks: the rest of what the client sent is never read as a request):

        - a major version other than 1 (``HTTP/2.0``, ``HTTP/9.9``, ``HTTP/0.9``): 505 (RFC 9110 15.6.6; waitress
          served it as HTTP/1.0, a fresh-user trial); a higher minor version of 1 (``HTTP/1.2``) is served as
          HTTP/1.1, the highest this server conforms to (RFC 9110 6.2; waitress answered ``HTTP/1.0``);
        - a transfer coding other than chunked (``Transfer-Encoding: identity``, ``gzip, chunked``): 501 with
          INVALID_ARGUMENT (RFC 9112 6.1: a server that does not understand a transfer coding SHOULD answer 501; it
          is the client's request that cannot be read, not the server that failed: waitress's 501 said INTERNAL);
        - a body framed two ways (RFC 9112 6.1, 6.3): ``Transfer-Encoding: chunked`` and ``Content-Length`` together
          (a request smuggling vector: a proxy in front may read the length where this server reads the chunks;
          waitress took the chunks), or an HTTP/1.0 request with ``Transfer-Encoding`` (which HTTP/1.0 does not have:
          waitress framed it by ``Content-Length``): 400.

        Raises:
            ParsingError, TransferEncodingNotImplemented: the request is refused (:attr:`refusal` says how).
        """
        line, nl, rest = header_plus.partition(b"\n")
        m = _ANY_VERSION.search(line)
        if m is not None and m.group(1) != b"1":
            version = f"HTTP/{m.group(1).decode()}.{m.group(2).decode()}"
            self.refusal = (505, f"{version} is not supported: this server speaks HTTP/1.1 (and HTTP/1.0); send the "
                                 "request as HTTP/1.1")
            raise ParsingError(self.refusal[1])
        if m is not None and m.group(2) not in (b"0", b"1"):  # HTTP/1.2 ... 1.9: as HTTP/1.1
            header_plus = line[:m.start()] + b" HTTP/1.1" + m.group(3) + nl + rest
        try:
            super().parse_header(header_plus)
        except TransferEncodingNotImplemented:
            codings = b", ".join(_TRANSFER_ENCODING.findall(header_plus)).decode("latin-1")[:100]
            self.refusal = (501, f"Transfer-Encoding {codings!r} is not supported: this server reads the chunked "
                                 "transfer coding alone (RFC 9112 6.1); send the body with Content-Length, or with "
                                 "Transfer-Encoding: chunked (a compressed body, Content-Encoding, is not accepted "
                                 "either)")
            raise TransferEncodingNotImplemented(self.refusal[1]) from None
        if self.chunked:  # (waitress's receiver, with refusals of its own)
            self.body_rcv = _ChunkedReceiver(self.body_rcv.buf)
        if self.chunked and "CONTENT_LENGTH" in self.headers:  # (waitress popped Transfer-Encoding: set chunked)
            self.refusal = (400, "the request has both Transfer-Encoding: chunked and Content-Length; send one (RFC "
                                 "9112 6.3: such a message may be a request smuggling attempt)")
        elif self.version == "1.0" and "TRANSFER_ENCODING" in self.headers:
            self.refusal = (400, "an HTTP/1.0 request has no Transfer-Encoding (RFC 9112 6.1); send Content-Length, "
                                 "or the request as HTTP/1.1")
        if self.refusal is not None:
            self.expect_continue = False  # (no 100 Continue before the refusal)
            raise ParsingError(self.refusal[1])

    def received(self, data: bytes) -> int:
        before, had, in_head = self.header_plus, self.error, self.body_rcv is None
        n = super().received(data)
        if self.completed:
            self.received_at = time.monotonic()
        if self.error is not had and self.refusal is not None:
            self.error = _NodeError(*self.refusal)
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


class _Task(WSGITask):
    """waitress's task running the app for one request; during a graceful stop its answer says ``Connection:
    close``, and the connection is closed after it (the client learns it before it sends another request)."""

    def build_response_header(self):
        if self.channel.server.draining_since is not None:
            self.set_close_on_finish()
        return super().build_response_header()


class _Channel(HTTPChannel):
    parser_class = _Parser
    task_class = _Task
    error_task_class = _JsonErrorTask
    served = False
    """Whether a request of this connection was answered (a connection that never sent one is not "idle" at a
    graceful stop: its first request may be on its way; it is answered 503 rather than cut)."""

    def service(self) -> None:
        """waitress's, during a graceful stop (:meth:`HttpServer.drain`) answering a request that was not received
        whole before the stop began 503 UNAVAILABLE (``Connection: close``) instead of running it; then a connection
        left with nothing to answer and no request coming in is closed once its answers are written."""
        since = self.server.draining_since
        if since is not None:
            request = self.requests[0]
            if request.error is None and (request.received_at is None or request.received_at >= since):
                request.error = _NodeError(503, self.server.stopping_message)
        self.served = True
        try:
            super().service()
            if self.server.draining_since is not None:
                with self.requests_lock:
                    if not self.requests and self.request is None:
                        self.close_when_flushed = True
                self.server.pull_trigger()
        except OSError:
            if not self.server.closed:
                raise
            # the server was closed while this request ran (the node killed: a second Ctrl-C): its wake-up pipe is
            # gone with its connections, so there is no one to wake and nothing to write to; waitress logged each
            # such end as an error with its traceback (EBADF), an alert on an ordinary forced stop


class _Server(TcpWSGIServer):
    channel_class = _Channel
    draining_since: float | None = None
    """``time.monotonic()`` when a graceful stop began (:meth:`HttpServer.drain`), None before."""
    stopping_message = "the server is stopping"
    """The 503's message to a request received after that."""
    closed = False
    """:meth:`HttpServer.stop` closed the connections and the wake-up pipe (request threads may still be running)."""

    reuse_port = False
    """Set ``SO_REUSEPORT`` on the listening socket before it is bound (:meth:`HttpServer.start`'s ``reuse_port``):
    several processes listen on one port, and the kernel spreads the connections over them."""

    def set_reuse_addr(self) -> None:
        """waitress's ``SO_REUSEADDR``, and ``SO_REUSEPORT`` with :attr:`reuse_port` (Linux 3.9 on; socket(7))."""
        super().set_reuse_addr()
        if self.reuse_port:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)

    def pull_trigger(self) -> None:
        """waitress's wake-up of the server's loop, not once :attr:`closed`: the pipe's descriptor is closed then, and
        its number may already be another file's."""
        if not self.closed:
            super().pull_trigger()

    def stop_listening(self) -> None:
        """On the loop's thread: take the connections the kernel has accepted already (the listen backlog: each
        client among them has connected and may have sent its request; closing the listener would reset them), then
        close the listening socket (new connections are refused), then close every connection that is idle after an
        answer (a keep-alive one with no byte of a next request come: a peek says so). The others are left to
        finish: a request being served or queued, one being received (503 when whole), a connection that never sent
        a request (503 to its first)."""
        while True:
            try:
                got = self.accept()
            except OSError:
                break
            if got is None:
                break
            conn, addr = got
            try:
                self.set_socket_options(conn)
            except OSError:
                conn.close()
                continue
            self.channel_class(self, conn, self.fix_addr(addr), self.adj, map=self._map)
        self.accepting = False
        wasyncore.dispatcher.close(self)  # (not self.close(): the trigger stays, the loop still needs it)
        for channel in list(self.active_channels.values()):
            if channel.served and not channel.requests and channel.request is None and not channel.total_outbufs_len:
                try:
                    waiting = channel.socket.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
                except OSError:  # (BlockingIOError: nothing came)
                    waiting = b""
                if not waiting:
                    channel.will_close = True

    def busy(self) -> bool:
        """Whether a connection has a request being served or queued, or an answer not yet written out. Read from
        any thread (a snapshot: each channel's list and count as they are)."""
        return any(ch.requests or ch.total_outbufs_len for ch in list(self.active_channels.values()))

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


class _ReusePortServer(_Server):
    reuse_port = True


class HttpServer:
    """The node's HTTP server on its own threads (docs above). Use :meth:`start`, then :meth:`stop`."""

    def __init__(self, server: _Server, socket_map: dict, thread: threading.Thread) -> None:
        self._server: _Server | None = server
        self._map = socket_map
        self._thread = thread
        self._cut = threading.Event()

    @property
    def port(self) -> int:
        """The TCP port it listens on (the one chosen when 0 was asked)."""
        return self._port

    @classmethod
    def start(cls, app, host: str, port: int, *, idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
              max_connections: int = DEFAULT_MAX_CONNECTIONS, reuse_port: bool = False) -> "HttpServer":
        """Listen on ``host:port`` and serve the WSGI ``app`` until :meth:`stop`.

        Args:
            app: a WSGI application (PEP 3333), called on the server's threads.
            host: the address (or a name: its first address, IPv6 too) to listen on.
            port: the TCP port, 0 = a free one (:attr:`port` says which).
            idle_timeout_s: seconds a connection may stay idle (module docstring), > 0.
            max_connections: open connections at most, and threads running requests, >= 1.
            reuse_port: listen with ``SO_REUSEPORT``, beside other processes' listeners on the same port that set it
                too (the node's HTTP processes, ``up --http-processes``; docs/http.md): the kernel gives each new
                connection to one of them (a hash of its addresses and ports), and a connection stays with it.

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
            server = (_ReusePortServer if reuse_port else _Server)(app, socket_map, dispatcher=dispatcher, adj=adj,
                                                                   sockinfo=adj.listen[0])
        except BaseException:
            wasyncore.close_all(socket_map, ignore_all=True)
            dispatcher.shutdown(timeout=1.0)
            raise
        thread = threading.Thread(target=server.run, name="inferbus-http", daemon=True)
        self = cls(server, socket_map, thread)
        self._port = server.effective_port
        thread.start()
        return self

    def drain(self, timeout_s: float, message: str = "the server is stopping") -> bool:
        """Begin a graceful stop, then wait ``timeout_s`` seconds at most for the requests received before it.

        At once (idempotent): the listening socket is closed (a new connection is refused; those the kernel had
        accepted already are taken first, so none is reset), a keep-alive connection idle after an answer is closed,
        and from now on a request received after this call is answered 503 UNAVAILABLE ``message`` with
        ``Connection: close`` (it is not run), as is every answer (the connection is closed after it). A request
        received whole before this call is served as usual. Then it waits until no request is served or queued and
        every answer is written, ``timeout_s`` at most, or until :meth:`cut`. Blocks the calling thread (not the
        server's).

        Returns:
            True when nothing was left to answer, False when the wait ended first (``timeout_s``, :meth:`cut`).
        """
        server = self._server
        if server is None:
            return True
        if server.draining_since is None:
            server.stopping_message = message
            server.draining_since = time.monotonic()
            done = threading.Event()

            def close_listener() -> None:
                try:
                    server.stop_listening()
                finally:
                    done.set()

            try:
                server.trigger.pull_trigger(close_listener)
            except OSError:  # the loop has ended already
                return True
            done.wait(max(timeout_s, 1.0))
        return self._wait_idle(server, timeout_s)

    def cut(self) -> None:
        """End a :meth:`drain`'s wait at once (the node is being killed). Callable from any thread."""
        self._cut.set()

    def _wait_idle(self, server: _Server, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while server.busy():
            left = deadline - time.monotonic()
            if left <= 0 or self._cut.wait(min(left, 0.02)):
                return False
        return True

    def stop(self, timeout_s: float = 5.0, grace_s: float = 1.0) -> None:
        """Close the listening socket and every connection, and join the server's loop thread, waiting ``timeout_s``
        seconds at most for it and as much for the request threads. Answers under way are given ``grace_s`` seconds
        to be written first (a :meth:`drain` that was not called is begun: a request that comes meanwhile is 503);
        what is still being served then has its connection closed with it. Idempotent."""
        server = self._server
        if server is None:
            return
        if grace_s > 0 and not self._cut.is_set():
            self.drain(grace_s, server.stopping_message)
        server, self._server = self._server, None
        if server is None:
            return
        server.closed = True
        try:  # (closed on the loop's own thread: waitress's channels are not thread-safe)
            server.trigger.pull_trigger(lambda: wasyncore.close_all(self._map, ignore_all=True))
        except OSError:  # the loop has ended already
            pass
        deadline = time.monotonic() + timeout_s
        self._thread.join(timeout_s)
        server.task_dispatcher.shutdown(timeout=max(0.0, deadline - time.monotonic()))
