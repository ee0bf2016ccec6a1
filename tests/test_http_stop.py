"""A graceful stop of ``inferbus up`` (SIGINT, SIGTERM) with HTTP requests in flight (docs/http.md, "A graceful
stop"): against real ``inferbus up`` processes (embedded NATS and Valkey, ``--http-infer``, one worker slowed by
``--fault-injection``'s compute delay so that requests are in flight when the signal comes).

What a client sees: every request the node had received before the stop began is answered 200 (with ``Connection:
close``); a request that arrives on an open connection after it began is 503 UNAVAILABLE with ``Connection:
close``; a new connection is refused (the listener is closed, as Triton's HTTP endpoint does); a keep-alive
connection idle at the stop is closed. Never a connection dropped with a request on it unanswered. Until
2026-12-07 the node closed its HTTP server first, at once: every request in flight got its connection closed without
an answer (a fresh-user trial: 6 of 6 ``RemoteDisconnected``), while the same requests over NATS were answered."""

from __future__ import annotations

import asyncio
import http.client
import json
import signal
import socket
import threading
import time

import nats
import numpy as np
import pytest

from conftest import start_deployment
from test_http_infer import digits_request, http_address
from test_reliability_lib import models_subset, set_fault

pytestmark = pytest.mark.timeout(120)

DELAY_MS = 600
"""The worker's injected compute delay per run (a batch), ms: what keeps requests in flight."""

DROPPED = (http.client.RemoteDisconnected, http.client.IncompleteRead, ConnectionResetError, BrokenPipeError)
"""A connection closed under a request that was sent: what must never happen."""


def _slow(dep, delay_ms: float) -> None:
    async def go():
        nc = await nats.connect(dep.nats_url)
        try:
            await set_fault(nc, dep.prefix, "n1-w0", compute_delay_ms=delay_ms)
        finally:
            await nc.close()

    asyncio.run(go())


class Client(threading.Thread):
    """One keep-alive client posting infers back to back until its connection is refused or dropped, or
    :attr:`halt` is set. :attr:`log`: one dict per request: ``written`` (when its last byte was written) and
    ``done`` (``time.monotonic()``), ``outcome`` (``answer``, ``refused``, ``dropped``), ``status``, ``close`` (the
    answer says ``Connection: close``), ``error`` (what a dropped one raised)."""

    def __init__(self, address: tuple[str, int], body: bytes, halt: threading.Event) -> None:
        super().__init__(daemon=True)
        self.address, self.body, self.halt = address, body, halt
        self.log: list[dict] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        conn = http.client.HTTPConnection(*self.address, timeout=30)
        try:
            while not self.halt.is_set():
                entry = {"written": None, "outcome": "answer", "status": None, "close": None}
                self.log.append(entry)
                try:
                    conn.request("POST", "/v2/models/digits/infer", body=self.body,
                                 headers={"Content-Type": "application/json", "Inferbus-Timeout-Ms": "10000"})
                    entry["written"] = time.monotonic()
                    resp = conn.getresponse()
                    resp.read()
                    entry.update(status=resp.status, close=resp.will_close)
                except ConnectionRefusedError:
                    entry["outcome"] = "refused"
                    return
                except DROPPED as exc:
                    entry.update(outcome="dropped", error=repr(exc))
                    return
                finally:
                    entry["done"] = time.monotonic()
        except BaseException as exc:  # (the test reads it)
            self.error = exc
        finally:
            conn.close()


def test_a_graceful_stop_answers_the_http_requests_in_flight_and_refuses_new_ones(tmp_path):
    """4 keep-alive clients posting infers back to back (0.6 s runs), a keep-alive connection idle, one with a request
    half sent; SIGINT to ``up``: each request in flight is answered 200 with ``Connection: close``, the half-sent one
    completed after the signal is 503 UNAVAILABLE with ``Connection: close``, a new connection is refused, the idle
    one is closed, and no client has a request dropped; ``up`` exits 0. Until 2026-12-07 the half-sent request and
    every one in flight had their connection closed unanswered."""
    models = models_subset(tmp_path / "models", ["digits"])
    dep = start_deployment(tmp_path / "dep", workers=1, prefix="hstop", extra=[
        "--models", str(models), "--ingress", "1", "--http-port", "0", "--http-host", "127.0.0.1", "--http-infer",
        "--no-cache", "--fault-injection"])
    try:
        host, port = http_address(dep).rsplit(":", 1)
        address = (host, int(port))
        x = np.random.default_rng(7).random((8, 64), dtype=np.float32)
        body = json.dumps(digits_request(x)).encode()
        _slow(dep, DELAY_MS)
        # a keep-alive connection that is idle when the stop comes, and one with a request half sent
        idle = http.client.HTTPConnection(*address, timeout=10)
        idle.request("GET", "/v2/health/ready")
        assert idle.getresponse().read() == b""
        half = socket.create_connection(address, timeout=10)
        half.sendall(b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body))
        halt = threading.Event()
        clients = [Client(address, body, halt) for _ in range(4)]
        for c in clients:
            c.start()
        deadline = time.monotonic() + 20
        while sum(1 for c in clients for e in c.log if e["status"] == 200) < 6:  # (serving: answers came)
            assert time.monotonic() < deadline and all(c.is_alive() for c in clients), [c.log for c in clients]
            time.sleep(0.05)
        time.sleep(DELAY_MS / 2000)  # (mid-run: each client has a request in flight)
        signalled = time.monotonic()
        dep.proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        half.sendall(body)  # the rest of a request that had begun: it arrives after the stop began
        got = b""
        while chunk := half.recv(65536):
            got += chunk
        half.close()
        head, _, answer = got.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 "), got[:500]
        assert b"\r\nConnection: close" in head and b"Inferbus-Error-Code: UNAVAILABLE" in head, head
        assert "stopping" in json.loads(answer)["error"], answer
        with pytest.raises(ConnectionRefusedError):  # a new connection
            socket.create_connection(address, timeout=5).close()
        idle.sock.settimeout(5)
        assert idle.sock.recv(1) == b""  # the idle keep-alive connection was closed
        idle.close()
        assert dep.proc.wait(30) == 0, dep.log.read_text()[-3000:]
        halt.set()
        for c in clients:
            c.join(10)
            assert c.error is None, c.error
        log = [e for c in clients for e in c.log]
        assert not [e for e in log if e["outcome"] == "dropped"], log
        # received before the stop began (written 0.1 s before the signal, at least): each answered 200; those
        # still in flight at the signal (a request per client) with Connection: close
        before = [e for e in log if e["written"] is not None and e["written"] < signalled - 0.1]
        assert all(e["outcome"] == "answer" and e["status"] == 200 for e in before), before
        in_flight = [e for e in before if e["done"] > signalled]
        assert len(in_flight) >= 2 and all(e["close"] for e in in_flight), (in_flight, log)
        # written about when the signal came: 200 or 503, with Connection: close; then the client's next connection
        # refused
        for c in clients:
            after = [e for e in c.log if e not in before]
            assert after[-1]["outcome"] == "refused", c.log
            assert all(e["status"] in (200, 503) and e["close"] for e in after[:-1]), c.log
        text = dep.log.read_text()
        assert "Traceback" not in text, text[-3000:]
        assert "inferbus stopped in" in text, text[-3000:]
    finally:
        dep.stop()


def _one_slow_request(tmp_path, delay_ms: float):
    """A node whose worker takes ``delay_ms`` per run, with one HTTP infer in flight on it (its thread started):
    ``(dep, thread, result dict: status, close, body or dropped)``."""
    models = models_subset(tmp_path / "models", ["digits"])
    dep = start_deployment(tmp_path / "dep", workers=1, prefix="hstop", extra=[
        "--models", str(models), "--ingress", "1", "--http-port", "0", "--http-host", "127.0.0.1", "--http-infer",
        "--no-cache", "--fault-injection"])
    host, port = http_address(dep).rsplit(":", 1)
    body = json.dumps(digits_request(np.zeros((1, 64), np.float32))).encode()
    _slow(dep, delay_ms)
    result: dict = {}

    def ask() -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        try:
            conn.request("POST", "/v2/models/digits/infer", body=body,
                         headers={"Content-Type": "application/json", "Inferbus-Timeout-Ms": "60000"})
            resp = conn.getresponse()
            result.update(status=resp.status, close=resp.will_close, body=resp.read(),
                          code=resp.getheader("Inferbus-Error-Code"))
        except DROPPED as exc:
            result["dropped"] = repr(exc)
        finally:
            conn.close()

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    time.sleep(1.0)  # (sent, received, computing)
    assert thread.is_alive() and not result, result
    return dep, thread, result


def test_a_request_still_unanswered_past_the_drain_is_answered_503_not_dropped(tmp_path):
    """A request whose run outlasts the stop's HTTP drain (3 s, the workers' ``drain_timeout_s``) and the workers'
    own drain: the node stops anyway, within its bounds, and the request is answered 503 UNAVAILABLE (``Connection:
    close``), not left with its connection closed under it (until 2026-12-07 it was, at once)."""
    dep, thread, result = _one_slow_request(tmp_path, 30_000)
    try:
        t0 = time.monotonic()
        dep.proc.send_signal(signal.SIGTERM)
        thread.join(30)
        assert not thread.is_alive()
        assert "dropped" not in result, result
        assert result["status"] == 503 and result["close"] and result["code"] == "UNAVAILABLE", result
        assert "stopping" in json.loads(result["body"])["error"], result
        assert dep.proc.wait(30) == 0, dep.log.read_text()[-3000:]
        assert time.monotonic() - t0 < 15, time.monotonic() - t0  # (3 s of HTTP drain, then the actors' stop)
        node_log = (dep.run_dir / "node.log").read_text()
        assert "still unanswered after 3.0 s" in node_log, node_log[-3000:]
        assert "Traceback" not in dep.log.read_text() + node_log
    finally:
        dep.stop()


def test_a_second_signal_during_the_http_drain_kills_at_once(tmp_path):
    """Ctrl-C twice: the second, during the wait for the HTTP requests in flight, kills the node at once (exit 130),
    as during the actors' drain: the wait ends (it does not run its 3 s out)."""
    dep, thread, result = _one_slow_request(tmp_path, 30_000)
    try:
        dep.proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        t0 = time.monotonic()
        dep.proc.send_signal(signal.SIGINT)
        assert dep.proc.wait(30) == 130, dep.log.read_text()[-3000:]
        assert time.monotonic() - t0 < 2.0, time.monotonic() - t0
        thread.join(30)
        assert "inferbus killed" in dep.log.read_text(), dep.log.read_text()[-3000:]
    finally:
        dep.stop()
