"""The node's HTTP processes (``inferbus up --http-processes N``; docs/http.md, "HTTP processes"): the node's HTTP
port served by N processes of their own, so that OIP v2 inference over HTTP is not bounded by one process.

Why: with the port in the node process (the default, ``--http-processes 0``), every HTTP request runs on the node's
one Python interpreter: waitress's threads parse it and the node's event loop, which also supervises the actors,
sends it to an ingress and waits for the answer. On a 16-core host that port answered about 2.1k inferences/s at most,
0.08-0.22 x what NATS clients got from the same ingresses (docs/performance.md, the fifty-sixth session); a
``py-spy --gil`` profile put 90 % of that process's GIL time on the node's loop.

How: each HTTP process (an actor process of kind ``http``, ``python -m inferbus.actors http``, supervised by the
node as the ingresses are: permanent, restarted when it dies) listens on the node's HTTP address and port with
``SO_REUSEPORT`` (socket(7), Linux 3.9 on), so the kernel gives each new TCP connection to one of them (a hash of
the connection's addresses and ports: with few client connections the spread can be uneven, e.g. 3/2/2/1 over four
processes). A process serves ``POST /v2/models/<name>[/versions/<v>]/infer`` itself, with the node's own code
(:func:`~inferbus.actors._probes.node_app` and :class:`~inferbus.actors._gateway.NodeGateway`) on its own NATS
connection and event loop: the ingresses answer it as they answer the node. Every other request (health, metadata,
statistics, the model repository, ``/metrics``, ``OPTIONS``, a method a path does not take) is forwarded as it came
to the node's own HTTP server, which then listens on ``127.0.0.1`` at a free port of its own, and its answer is
relayed as it came (:class:`Forward`): those answers need what only the node knows (its children, its supervisors,
its disk), and they are not what a port is loaded with.

The HTTP server of each process is the node's (:class:`~inferbus.actors._http.HttpServer`: waitress, the same
parser, bounds and refusals), so every answer is the one the node would give.
"""

from __future__ import annotations

import asyncio
import http.client
import logging
import signal
import socket
import threading
import time

from ._common import announce_ready, connect_logged, log, run_actor, serving_gc, set_affinity
from ._config import HttpProcessConfig

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding",
                        "upgrade"})
"""Header fields of one connection, not of the request or answer (RFC 9110 7.6.1): not forwarded either way,
nor any field the ``Connection`` header names; nor a request's ``Expect`` (this process answered its
``100-continue`` and has the body)."""

FORWARD_SLACK_S = 5.0
"""How much longer than the request's budget a forwarded request waits for the node's answer, seconds."""

POOL_IDLE = 2
"""Idle connections to the node's HTTP server an HTTP process keeps for later forwarded requests, at most (the
others are closed after their answer): the node's server takes ``--http-max-connections`` connections in all, from
every process (until 2026-12-07 each server thread kept one: N processes x 100 threads held more than it takes, and
forwarded requests waited for an idle one to time out)."""

FORWARD_MIN_TIMEOUT_S = 60.0
"""The shortest wait for the node's answer to a forwarded request, seconds: the node's longest default budget (a
repository write's, :data:`~inferbus.actors._httpext.WRITE_TIMEOUT_S`); a larger ``Inferbus-Timeout-Ms`` waits that."""


def is_local(environ) -> bool:
    """Whether an HTTP process serves this request itself: a ``POST`` to ``/v2/models/<name>[/versions/<v>]/infer``
    (an origin-form or absolute-form target). Everything else is forwarded to the node."""
    if environ.get("REQUEST_METHOD") != "POST":
        return False
    parts = (environ.get("PATH_INFO") or "").split("/")
    # ["", "v2", "models", name, "infer"] or ["", "v2", "models", name, "versions", v, "infer"]
    if len(parts) == 5:
        ok = parts[4] == "infer"
    elif len(parts) == 7:
        ok = parts[4] == "versions" and parts[6] == "infer"
    else:
        return False
    return ok and parts[:3] == ["", "v2", "models"]


def _ascii_target(target: str) -> str:
    """The request-target as sent (PEP 3333: its bytes as latin-1), each byte above 0x7f percent-encoded, which
    the node reads back as the same path (http.client sends ASCII only)."""
    if target.isascii():
        return target
    return "".join(c if ord(c) < 0x80 else f"%{ord(c):02X}" for c in target)


class _Upstream(http.client.HTTPConnection):
    """``http.client``'s connection, sending the request-target as this server received it: ``http.client`` refuses
    a target with a control character (0x00-0x20, 0x7f: its guard against a caller's URL that would split the request
    line), which waitress takes from a client (``/v2/models/a%7Fb`` sent raw); the node's server, the same parser,
    reads it as this one did. A line break cannot be in a target waitress parsed, and is still refused."""

    def connect(self) -> None:
        """Connect with ``TCP_NODELAY``: ``http.client`` writes a request's headers and body in two writes, and with
        Nagle's algorithm the body would wait for the headers' ACK (a delayed ACK: up to ~40 ms)."""
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _validate_path(self, url: str) -> None:
        if "\n" in url or "\r" in url:
            raise http.client.InvalidURL(f"the request-target has a line break: {url!r}")


class Forward:
    """A WSGI app (PEP 3333) that forwards each request to the node's HTTP server at ``host:port`` and answers what
    the node answered: status, headers and body as they came, but the fields of one connection
    (:data:`HOP_BY_HOP`) and ``Date``/``Server`` (this server writes its own). Keep-alive ``http.client``
    connections, :data:`POOL_IDLE` at most kept idle between requests (shared by the server's threads), each closed
    once it has been idle for ``idle_s`` (the node closes idle ones) or the node closed it.

    Args:
        host, port: the node's HTTP server (``127.0.0.1`` and the port it chose).
        idle_s: the longest idle time after which a kept connection is still used, seconds.

    A request the node cannot be asked about is answered, JSON with ``Inferbus-Error-Code``: 503 UNAVAILABLE (no
    connection to the node: it is stopping or restarting its server; ``Retry-After: 1``), 504 DEADLINE_EXCEEDED (no
    answer within the request's budget plus :data:`FORWARD_SLACK_S`, at least :data:`FORWARD_MIN_TIMEOUT_S`), 502
    INTERNAL (the node's answer broke off). A ``GET``, ``HEAD`` or ``OPTIONS`` whose kept connection turns out to
    have been closed by the node is sent once more on a new one; any other request is not (it may have been
    served).
    """

    def __init__(self, host: str, port: int, idle_s: float) -> None:
        self.host, self.port, self.idle_s = host, port, idle_s
        self._idle: list[tuple[http.client.HTTPConnection, float]] = []  # (oldest first)
        self._lock = threading.Lock()

    def _connection(self, timeout_s: float) -> tuple[http.client.HTTPConnection, bool]:
        """``(a connection, whether it was kept from an earlier request)``: the most recently used idle one, else a
        new one; the idle ones that have been idle for ``idle_s`` are closed."""
        now, stale, conn = time.monotonic(), [], None
        with self._lock:
            while self._idle and now - self._idle[0][1] >= self.idle_s:
                stale.append(self._idle.pop(0)[0])
            if self._idle:
                conn = self._idle.pop()[0]
        for old in stale:
            old.close()
        if conn is not None:
            conn.timeout = timeout_s
            if conn.sock is not None:
                conn.sock.settimeout(timeout_s)
            return conn, True
        return _Upstream(self.host, self.port, timeout=timeout_s), False

    def _release(self, conn: http.client.HTTPConnection) -> None:
        """Keep ``conn`` for a later request, or close it when :data:`POOL_IDLE` are kept already."""
        with self._lock:
            if len(self._idle) < POOL_IDLE:
                self._idle.append((conn, time.monotonic()))
                return
        conn.close()

    def __call__(self, environ, start_response):
        from ..bus import _headers as H
        from ._gateway import error_answer, status_line
        from ._probes import _answer

        method = environ.get("REQUEST_METHOD", "GET")
        target = _ascii_target(environ.get("REQUEST_URI") or environ.get("PATH_INFO") or "/")
        named = {t.strip().lower() for t in environ.get("HTTP_CONNECTION", "").split(",")}
        headers = []
        for key, value in environ.items():
            if key.startswith("HTTP_"):
                name = key[5:].replace("_", "-")
                if name.lower() not in HOP_BY_HOP and name.lower() not in named and name.lower() != "expect":
                    headers.append((name, value))
        if environ.get("CONTENT_TYPE"):
            headers.append(("Content-Type", environ["CONTENT_TYPE"]))
        n = int(environ.get("CONTENT_LENGTH") or 0)  # (waitress has read the body whole, a chunked one too)
        body = environ["wsgi.input"].read(n) if n else b""
        try:
            budget_s = H.budget_ms(environ.get("HTTP_INFERBUS_TIMEOUT_MS"), 0.0, strict=True) / 1000.0
        except Exception:  # (the node answers a malformed budget itself: 400)
            budget_s = 0.0
        timeout_s = max(budget_s, FORWARD_MIN_TIMEOUT_S) + FORWARD_SLACK_S
        for attempt in (0, 1):
            conn, kept = self._connection(timeout_s)
            try:
                conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
                for name, value in headers:
                    conn.putheader(name, value)
                if body or method not in ("GET", "HEAD", "OPTIONS"):
                    conn.putheader("Content-Length", str(len(body)))
                conn.endheaders(body or None)
                resp = conn.getresponse()
                data = resp.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as exc:
                conn.close()
                if kept and attempt == 0 and method in ("GET", "HEAD", "OPTIONS"):
                    continue  # the node closed the kept connection (its idle timeout): nothing was served
                answer = error_answer(502, f"the node's HTTP server closed the connection without an answer "
                                           f"({type(exc).__name__})")
            except TimeoutError:
                conn.close()
                answer = error_answer(504, f"the node did not answer the forwarded request within {timeout_s:g} s")
            except OSError as exc:  # refused: the node is stopping (or its server is not up)
                conn.close()
                answer = error_answer(503, f"the node's HTTP server cannot be reached ({exc.strerror or exc}): it "
                                           "is stopping or restarting", (("Retry-After", "1"),))
            except http.client.HTTPException as exc:
                conn.close()
                answer = error_answer(502, f"the node's answer could not be read: {exc!r}")
            else:
                if resp.will_close:
                    conn.close()
                else:
                    self._release(conn)
                drop = HOP_BY_HOP | {"date", "server"} | {
                    t.strip().lower() for t in (resp.getheader("Connection") or "").split(",")}
                start_response(status_line(resp.status),
                               [(k, v) for k, v in resp.getheaders() if k.lower() not in drop])
                return [] if method == "HEAD" else [data]
            return _answer(start_response, method, answer)
        raise AssertionError("unreachable")  # pragma: no cover


def process_app(local_app, forward):
    """The WSGI app of an HTTP process: :func:`is_local` requests to ``local_app`` (the node's app with this
    process's gateway), the others to ``forward`` (:class:`Forward`)."""

    def app(environ, start_response):
        return (local_app if is_local(environ) else forward)(environ, start_response)

    return app


class _ProcessNode:
    """What :class:`~inferbus.actors._gateway.NodeGateway` reads of a node, in an HTTP process: ``config``
    (``node_id``, ``prefix``, ``ingress_options``, ``http_infer``, ``http_model_control``, ``models_dir``), ``nc``
    (this process's NATS connection), ``http_calls`` and ``stopping``."""

    def __init__(self, config: HttpProcessConfig, nc) -> None:
        from ._probes import LoopCalls

        self.config = config
        self.nc = nc
        self.http_calls = LoopCalls()
        self.stopping = False


class HttpProcess:
    """One HTTP process of a node (module docstring). Run with :meth:`run` (``python -m inferbus.actors http
    @CONFIG``)."""

    def __init__(self, config: HttpProcessConfig) -> None:
        self.config = config

    async def run(self) -> None:
        """Connect to NATS, listen on the node's port (``SO_REUSEPORT``), say READY; serve until cancelled (SIGTERM),
        then stop gracefully: new connections refused, the requests received before it answered
        (``drain_timeout_s`` at most; :meth:`HttpServer.drain <inferbus.actors._http.HttpServer.drain>`), what is
        left 503, the connections closed, the NATS connection drained and closed.

        Raises:
            OSError: the port cannot be listened on (another program holds it without ``SO_REUSEPORT``): the process
                exits and its supervisor restarts it.
        """
        from ..bus import close_connection
        from ._gateway import NodeGateway
        from ._http import HttpServer
        from ._probes import node_app

        c = self.config
        set_affinity(c.cpu_affinity)
        name = f"http-{c.http_id}"
        nc = await connect_logged(c.bus, name)
        node = _ProcessNode(c, nc)
        loop = asyncio.get_running_loop()
        app = process_app(node_app(None, None, NodeGateway(node, loop)),
                          Forward("127.0.0.1", c.upstream_port, idle_s=min(c.idle_timeout_s / 2, 10.0)))
        try:
            server = HttpServer.start(app, c.host, c.port, idle_timeout_s=c.idle_timeout_s,
                                      max_connections=c.max_connections, reuse_port=True)
        except BaseException:
            await close_connection(nc)
            raise
        message = (f"node {c.node_id} is stopping: it answers the requests it had received and takes no new ones; "
                   "send this one to another node")
        began: list[float] = []
        beginning: list[threading.Thread] = []

        def begin_drain() -> None:  # SIGUSR1, the node's stop's first step (Node._drain_http_processes)
            if not began:
                began.append(time.monotonic())
                node.stopping = True
                beginning.append(threading.Thread(target=server.drain, args=(0.0, message),
                                                  name="inferbus-http-drain", daemon=True))
                beginning[0].start()

        loop.add_signal_handler(signal.SIGUSR1, begin_drain)  # (before READY: the node signals a ready process only)
        serving_gc()
        announce_ready()
        try:
            await asyncio.Event().wait()  # (until SIGTERM cancels this task: run_actor)
        finally:
            node.stopping = True
            if not began:
                began.append(time.monotonic())
            t0 = began[0]
            drained = False
            try:
                if beginning:  # (its listener closed already, or being closed: one drain at a time)
                    await asyncio.to_thread(beginning[0].join)
                # the requests received before the drain began: answered within its bound, counted from then
                drained = await asyncio.to_thread(server.drain, max(c.drain_timeout_s - (time.monotonic() - t0), 0.0),
                                                  message)
            except asyncio.CancelledError:  # a second SIGTERM: the rest is cut short
                server.cut()
            node.http_calls.close()  # what is still waiting on this loop: 503
            await asyncio.to_thread(server.stop)
            await close_connection(nc, drain=True, drain_timeout_s=1.0)
            log(f"{name}: stopped {time.monotonic() - t0:.2f} s after its drain began"
                f"{'' if drained else ' (requests were still unanswered at its bound: answered 503)'}",
                logging.INFO)


def main(config_json: str) -> None:
    """Process entry: ``python -m inferbus.actors http '<HttpProcessConfig JSON>'``."""
    run_actor(HttpProcess(HttpProcessConfig.from_json(config_json)).run)
