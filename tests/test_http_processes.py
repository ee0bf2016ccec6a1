"""``inferbus up --http-processes N`` (docs/http.md, "HTTP processes"): the node's HTTP port served by N processes
of their own, against real ``inferbus up`` processes (embedded NATS and Valkey, the ``digits`` model).

What is checked: the N processes all listen on the one port and the kernel spreads connections over them (read from
``/proc``: which process holds each accepted connection); an inference over HTTP is answered by them as the node
answers it (the same outputs as over NATS, the same typed errors); every other path is forwarded to the node and
answered as the node answers it (health, metadata, metrics, ``HEAD``, ``OPTIONS``, 405, 404, the repository index,
a percent-encoded UTF-8 name); a process killed with SIGKILL is restarted by the node's supervisor while the others
keep answering; a graceful stop answers the requests in flight and exits 0.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import signal
import socket
import threading
import time

import nats
import numpy as np
import pytest

from conftest import start_deployment
from inferbus import SyncClient
from inferbus.actors._httpproc import is_local
from test_http_infer import ask, digits_request, http_address, outputs_of
from test_http_stop import DROPPED, Client, _slow
from test_reliability_lib import models_subset

pytestmark = pytest.mark.timeout(150)


def _tree(dep) -> dict:
    async def go():
        nc = await nats.connect(dep.nats_url)
        try:
            return json.loads((await nc.request(f"{dep.prefix}.nodes", b"", timeout=5)).data)
        finally:
            await nc.close()

    return asyncio.run(go())


def http_children(dep) -> dict[str, dict]:
    """``{child id: child}`` of the node's HTTP processes (``http:<k>``), from its supervision tree."""
    return {ch["id"]: ch for sup in _tree(dep)["supervisors"] for ch in sup["children"]
            if ch["id"].startswith("http:")}


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _established_on(port: int, state: str = "01") -> set[str]:
    """Socket inodes of the TCP sockets whose local port is ``port`` in ``state`` (``/proc/net/tcp``'s code: ``01``
    ESTABLISHED, the server's ends of connections; ``0A`` LISTEN)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as fh:
            next(fh)
            for line in fh:
                f = line.split()
                if int(f[1].rsplit(":", 1)[1], 16) == port and f[3] == state:
                    inodes.add(f[9])
    return inodes


SLOW_S = 5.0
"""A forwarded request slower than this waited for a connection slot (the defect: ~30 s, an idle connection's
timeout); an ordinary one takes milliseconds."""


def _live_on_a_new_connection(address: tuple[str, int]) -> float:
    """Seconds for ``GET /v2/health/live`` (200) on a new connection (``Connection: close``)."""
    t0 = time.monotonic()
    conn = http.client.HTTPConnection(*address, timeout=60)
    try:
        conn.request("GET", "/v2/health/live", headers={"Connection": "close"})
        assert conn.getresponse().status == 200
    finally:
        conn.close()
    return time.monotonic() - t0




@pytest.fixture(scope="module")
def node(tmp_path_factory):
    root = tmp_path_factory.mktemp("http_processes")
    dep = start_deployment(root / "dep", workers=1, prefix="hp",
                           extra=["--ingress", "1", "--http-port", "0", "--http-host", "127.0.0.1", "--http-infer",
                                  "--http-processes", "2"])
    try:
        dep.http_address = http_address(dep)  # (test_http_infer.ask's)
        host, port = dep.http_address.rsplit(":", 1)
        dep.address = (host, int(port))
        yield dep
    finally:
        dep.stop()


def test_the_processes_share_the_port_and_the_kernel_spreads_connections_over_them(node):
    """Two HTTP processes run (``http:0``, ``http:1``, restart ``permanent``), neither is the node process, and 24
    connections opened at once are held by both (each answered an inference: each process served some)."""
    # (up's start line, wrapped between its parts where the run dir's path is long)
    assert ", 1 ingress, 2 HTTP processes," in " ".join(node.log.read_text().split())
    children = http_children(node)
    assert sorted(children) == ["http:0", "http:1"], children
    assert all(ch["status"] == "running" and ch["restart"] == "permanent" for ch in children.values()), children
    assert [ch["actors"] for ch in children.values()] == [["n1-h0"], ["n1-h1"]]
    pids = {cid: ch["pid"] for cid, ch in children.items()}
    assert node.proc.pid not in pids.values()
    body = json.dumps(digits_request(np.zeros((1, 64), np.float32))).encode()
    conns = []
    try:
        for _ in range(24):
            conn = http.client.HTTPConnection(*node.address, timeout=30)
            conn.request("POST", "/v2/models/digits/infer", body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            assert resp.status == 200, resp.read()
            resp.read()
            conns.append(conn)  # (kept open: the server's end is still held by the process that accepted it)
        on_port = _established_on(node.address[1])
        held = {cid: len(_socket_inodes(pid) & on_port) for cid, pid in pids.items()}
        assert sum(held.values()) == 24 and all(n >= 1 for n in held.values()), held
    finally:
        for conn in conns:
            conn.close()


def test_an_inference_over_http_is_what_nats_answers_and_errors_are_typed(node):
    """The same rows over HTTP (an HTTP process) and over NATS: the same outputs; an unknown model 404 NOT_FOUND with
    the field, a body that is not JSON 400 INVALID_ARGUMENT, a version that cannot be one 400 (each before or from
    the ingress, as the node process answers them)."""
    x = np.random.default_rng(3).random((4, 64), dtype=np.float32)
    status, headers, body = ask(node, "/v2/models/digits/versions/2/infer", "POST",
                                json.dumps(digits_request(x)).encode(), {"Content-Type": "application/json"})
    assert status == 200, body
    got = outputs_of(json.loads(body))
    with SyncClient.connect(node.nats_url, node.prefix) as client:
        want = client.infer("digits", {"pixels": x}, version="2")
    np.testing.assert_allclose(got["probabilities"], want["probabilities"], rtol=1e-6)
    status, headers, body = ask(node, "/v2/models/nope/infer", "POST", b"{}",
                                {"Content-Type": "application/json"})
    assert (status, headers["inferbus-error-code"], headers["inferbus-error-field"]) == (404, "NOT_FOUND", "model")
    status, headers, body = ask(node, "/v2/models/digits/infer", "POST", b"{nope",
                                {"Content-Type": "application/json"})
    assert (status, headers["inferbus-error-code"]) == (400, "INVALID_ARGUMENT"), body
    status, headers, body = ask(node, "/v2/models/digits/versions/v1/infer", "POST", b"{}")
    assert (status, headers["inferbus-error-field"]) == (400, "model_version"), body


def test_every_other_request_is_forwarded_to_the_node_and_answered_as_it_answers(node):
    """Health, server and model metadata, ``/metrics`` (its ``HEAD`` with the length and no body), ``OPTIONS`` of an
    infer path (the model's 404; a known one's ``Allow``), a method a path does not take (405 with ``Allow``), an
    unknown path (404), the repository index (a ``POST`` with a body), a percent-encoded UTF-8 name and one that is
    not UTF-8: each as the node's own server answers it."""
    assert ask(node, "/v2/health/ready", "GET")[0] == 200
    assert ask(node, "/v2/health/live", "GET")[0] == 200
    status, headers, body = ask(node, "/v2", "GET")
    assert status == 200 and json.loads(body)["name"] == "inferbus", body
    status, headers, body = ask(node, "/v2/models/digits", "GET")
    assert status == 200 and json.loads(body)["versions"] == ["1", "2"], body
    assert headers["server"] == "inferbus" and headers["content-length"] == str(len(body))
    status, headers, body = ask(node, "/metrics", "GET")
    assert status == 200 and b"inferbus_actor_up" in body
    assert headers["content-type"].startswith("text/plain")
    status, headers, body = ask(node, "/metrics", "HEAD")
    assert status == 200 and body == b"" and int(headers["content-length"]) > 1000, headers
    status, headers, body = ask(node, "/v2/models/nope/infer", "OPTIONS")
    assert (status, headers["inferbus-error-code"]) == (404, "NOT_FOUND"), body
    status, headers, body = ask(node, "/v2/models/digits/infer", "OPTIONS")
    assert (status, headers["allow"]) == (200, "OPTIONS, POST"), headers
    status, headers, body = ask(node, "/v2/models/digits/infer", "PUT", b"{}")
    assert (status, headers["allow"]) == (405, "OPTIONS, POST"), body
    assert "answers POST, not PUT" in json.loads(body)["error"]
    status, headers, body = ask(node, "/v2/nope", "GET")
    assert status == 404 and "no such path" in json.loads(body)["error"]
    status, headers, body = ask(node, "/v2/repository/index", "POST", b'{"ready": true}',
                                {"Content-Type": "application/json"})
    assert status == 200 and {m["name"] for m in json.loads(body)} >= {"digits"}, body
    status, headers, body = ask(node, "/v2/models/d%C3%A9", "GET")
    assert status == 404 and "'dé'" in json.loads(body)["error"], body
    status, headers, body = ask(node, "/v2/models/%FF", "GET")
    assert status == 400 and "not UTF-8" in json.loads(body)["error"], body


def _upstream_port(dep) -> int:
    """The port of the node's own HTTP server on ``127.0.0.1``, where the HTTP processes forward (their config)."""
    return json.loads((dep.run_dir / "http-0.config.json").read_text())["upstream_port"]


def test_forwarding_holds_few_connections_to_the_node_and_never_waits_for_its_connection_bound(node):
    """300 forwarded requests, one new client connection each (a probe, a scrape): each is answered within 5 s, and
    the HTTP processes hold at most a few connections to the node's own server afterwards. Until 2026-12-07 each
    process kept one connection per server thread (100 each by default), so after about 100 requests the two
    processes held more than the node's server takes (``--http-max-connections``, 100): waitress logged "total open
    connections reached the connection limit" and forwarded requests waited 3-20 s and more for an idle one to
    time out (a fresh-user trial)."""
    slow = []
    for i in range(300):
        took_s = _live_on_a_new_connection(node.address)
        if took_s > SLOW_S:
            slow.append((i, round(took_s, 2)))
    assert not slow, slow
    held = _established_on(_upstream_port(node))
    assert len(held) <= 4, len(held)  # (the node's ends: at most 2 kept by each process)


def test_the_nodes_server_takes_the_connections_the_processes_keep_besides_its_bound(tmp_path):
    """3 HTTP processes with ``--http-max-connections 4``: each keeps up to 2 connections to the node's own server idle
    between forwarded requests (6 in all, past the bound of 4), and the node's server takes them beside its bound:
    6 clients sending 25 forwarded requests each (a new connection each) are each answered within 5 s. Until
    2026-12-07 the node's server took ``--http-max-connections`` alone, and once the processes' idle connections held
    them all a forwarded request waited for one to time out (30 s; with the default 100 it took 64 processes: a
    fresh-user trial's waited 27 s)."""
    models = models_subset(tmp_path / "models", ["digits"])
    dep = start_deployment(tmp_path / "dep", workers=1, prefix="hpmany", extra=[
        "--models", str(models), "--ingress", "1", "--http-port", "0", "--http-host", "127.0.0.1",
        "--http-processes", "3", "--http-max-connections", "4"])
    try:
        host, port = http_address(dep).rsplit(":", 1)
        slow, errors = [], []

        def client() -> None:
            try:
                for _ in range(25):
                    if slow:  # (one is enough: the others would wait as long)
                        return
                    took_s = _live_on_a_new_connection((host, int(port)))
                    if took_s > SLOW_S:
                        slow.append(round(took_s, 2))
            except Exception as exc:  # (reported below)
                errors.append(repr(exc))

        threads = [threading.Thread(target=client) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors and not slow, (errors, slow)
    finally:
        dep.stop()


def _raw(address, request: bytes) -> bytes:
    """Send ``request`` as it is on a new connection; what came back until the server closed it, ``Date`` left out."""
    sock = socket.create_connection(address, timeout=10)
    try:
        sock.sendall(request)
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    finally:
        sock.close()
    return re.sub(rb"Date: [^\r]*\r\n", b"", got)


def test_a_target_with_a_control_character_is_answered_as_the_node_answers_it(node):
    """A request-target with a control character (DEL, SOH, a tab; in the path or the query), which waitress takes:
    the port (an HTTP process, forwarding) answers what the node's own server answers for the same bytes (400 for
    such a model name, 200 for ``/v2`` with such a query). Until 2026-12-07 the forward's ``http.client`` refused the
    target (its guard against a request line split by the caller) and the HTTP process answered 502 INTERNAL "the
    node's answer could not be read" (a fresh-user trial)."""
    upstream = ("127.0.0.1", _upstream_port(node))
    for target in (b"/v2/models/a\x7fb", b"/v2/models/a\x01b", b"/v2/models/a\tb", b"/v2?a=\x01", b"/v2\x7f",
                   b"/v2/models/digits/infer\x7f"):
        for method in (b"GET", b"POST"):
            request = method + b" " + target + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            got, want = _raw(node.address, request), _raw(upstream, request)
            assert not got.startswith(b"HTTP/1.1 502"), (request, got)
            if b"/metrics" not in want and b"# HELP" not in want:  # (a scrape's numbers differ from one to the next)
                assert got == want, (request, got, want)


def test_the_http_processes_own_refusals_are_the_node_servers(node):
    """A request line over the header bound (414) and a body over the ingresses' limit are refused by the HTTP
    process's server itself, as the node's server refuses them (JSON, ``Inferbus-Error-Code``)."""
    status, headers, body = ask(node, "/v2/models/" + "a" * 70_000, "GET")
    assert (status, headers["inferbus-error-code"]) == (414, "PAYLOAD_TOO_LARGE"), body
    sock = socket.create_connection(node.address, timeout=10)
    try:
        sock.sendall(b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999999\r\n\r\n")
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    finally:
        sock.close()
    assert got.startswith(b"HTTP/1.1 413 "), got[:300]


def test_where_a_request_is_served(node):
    """Only ``POST`` to an infer path is served in the HTTP process (a pure function of the request line)."""
    def env(method, path):
        return {"REQUEST_METHOD": method, "PATH_INFO": path}

    assert is_local(env("POST", "/v2/models/digits/infer"))
    assert is_local(env("POST", "/v2/models/digits/versions/2/infer"))
    assert not is_local(env("GET", "/v2/models/digits/infer"))
    assert not is_local(env("OPTIONS", "/v2/models/digits/infer"))
    assert not is_local(env("POST", "/v2/repository/index"))
    assert not is_local(env("POST", "/v2/models/digits/versions/2/stats"))
    assert not is_local(env("POST", "/v2/models/digits/x/infer"))
    assert not is_local(env("POST", "/v3/models/digits/infer"))


def test_a_killed_http_process_is_restarted_and_the_port_answers_meanwhile(node):
    """SIGKILL to ``http:0``: once it is dead (its sockets closed: a connection the kernel had queued on its
    listener at that moment is reset, as for any process that dies), new connections are answered 200 by the other
    process (none refused), and the node's supervisor starts ``http:0`` again (a new pid, one restart), which then
    serves connections too."""
    before = http_children(node)
    pid = before["http:0"]["pid"]
    listener = _socket_inodes(pid) & _established_on(node.address[1], "0A")
    assert len(listener) == 1, listener
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    # its listening socket released (the kernel releases it a little after the process's descriptors are gone)
    while listener & _established_on(node.address[1], "0A"):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    body = json.dumps(digits_request(np.zeros((1, 64), np.float32))).encode()
    for _ in range(20):
        status, _, got = ask(node, "/v2/models/digits/infer", "POST", body,
                             {"Content-Type": "application/json"})
        assert status == 200, got
    deadline = time.monotonic() + 60
    while True:
        now = http_children(node)["http:0"]
        if now["status"] == "running" and now["pid"] != before["http:0"]["pid"]:
            break
        assert time.monotonic() < deadline, now
        time.sleep(0.2)
    assert now["restarts"] == before["http:0"]["restarts"] + 1, now
    assert "SIGKILL" in now["last_exit"] or "signal 9" in now["last_exit"] or now["last_exit"], now
    # the restarted process takes connections again
    pid = now["pid"]
    deadline = time.monotonic() + 30
    conns = []
    try:
        while True:
            conn = http.client.HTTPConnection(*node.address, timeout=30)
            conn.request("GET", "/v2/health/live")
            assert conn.getresponse().read() == b""
            conns.append(conn)
            if _socket_inodes(pid) & _established_on(node.address[1]):
                break
            assert time.monotonic() < deadline and len(conns) < 200, len(conns)
    finally:
        for conn in conns:
            conn.close()


def test_a_graceful_stop_with_http_processes_answers_the_requests_in_flight(tmp_path):
    """4 keep-alive clients posting infers (0.6 s runs) over 2 HTTP processes; SIGINT to ``up``: every request
    received before it is answered 200, none is dropped, later connections are refused, the HTTP processes log
    their drain, and ``up`` exits 0 within the drain's bounds, with no warning or traceback in its output."""
    models = models_subset(tmp_path / "models", ["digits"])
    dep = start_deployment(tmp_path / "dep", workers=1, prefix="hpstop", extra=[
        "--models", str(models), "--ingress", "1", "--http-port", "0", "--http-host", "127.0.0.1", "--http-infer",
        "--no-cache", "--fault-injection", "--http-processes", "2"])
    try:
        host, port = http_address(dep).rsplit(":", 1)
        address = (host, int(port))
        body = json.dumps(digits_request(np.random.default_rng(7).random((8, 64), dtype=np.float32))).encode()
        _slow(dep, 600)
        halt = threading.Event()
        clients = [Client(address, body, halt) for _ in range(4)]
        for c in clients:
            c.start()
        deadline = time.monotonic() + 20
        while sum(1 for c in clients for e in c.log if e["status"] == 200) < 6:
            assert time.monotonic() < deadline and all(c.is_alive() for c in clients), [c.log for c in clients]
            time.sleep(0.05)
        time.sleep(0.3)  # (mid-run: each client has a request in flight)
        signalled = time.monotonic()
        dep.proc.send_signal(signal.SIGINT)
        assert dep.proc.wait(30) == 0, dep.log.read_text()[-3000:]
        stopped_s = time.monotonic() - signalled
        halt.set()
        for c in clients:
            c.join(10)
            assert c.error is None, c.error
        log = [e for c in clients for e in c.log]
        assert not [e for e in log if e["outcome"] == "dropped"], log
        before = [e for e in log if e["written"] is not None and e["written"] < signalled - 0.1]
        assert before and all(e["outcome"] == "answer" and e["status"] == 200 for e in before), before
        in_flight = [e for e in before if e["done"] > signalled]  # (answered during the stop)
        assert len(in_flight) >= 2 and all(e["close"] for e in in_flight), (in_flight, log)
        assert all(c.log[-1]["outcome"] == "refused" for c in clients), [c.log[-3:] for c in clients]
        assert stopped_s < 15, stopped_s
        text = dep.log.read_text()
        assert "Traceback" not in text, text[-3000:]
        # (up's second Node.stop, its finally's, once stopped the HTTP processes again on the stopped supervisor: a
        # warning "HTTP process http:0: SupervisorNotRunning(...)" per process on every Ctrl-C, until 2026-12-07)
        assert "SupervisorNotRunning" not in text and "HTTP process http:" not in text, text[-3000:]
        for k in (0, 1):
            assert re.search(r"http-n1-h%d: stopped [\d.]+ s after its drain began" % k,
                             (dep.run_dir / f"http-{k}.log").read_text()), k
    finally:
        dep.stop()


def test_http_processes_need_the_http_port_and_a_bounded_count(tmp_path):
    """``--http-processes`` without ``--http-port`` and a count past the bound are usage errors (exit 2), before
    anything starts."""
    import subprocess
    import sys

    from inferbus._limits import MAX_HTTP_PROCESSES

    for argv, said in ((["--http-processes", "2"], "--http-processes serves the HTTP port and needs --metrics-port"),
                       (["--http-port", "0", "--http-processes", str(MAX_HTTP_PROCESSES + 1)],
                        f"--http-processes must be in [0, {MAX_HTTP_PROCESSES}]")):
        r = subprocess.run([sys.executable, "-m", "inferbus.cli", "up", "--run-dir", str(tmp_path / "run"), *argv],
                           capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "300"})
        assert r.returncode == 2 and said in r.stderr, (argv, r.stderr)
        assert not (tmp_path / "run" / "node.log").exists()


def test_the_port_is_not_shared_with_another_programs_listener_even_one_with_so_reuseport():
    """The node reserves its HTTP port (``_reserve_port``) only when no socket listens there, one with
    ``SO_REUSEPORT`` included (another node's HTTP processes would otherwise share the port with this node's, each
    taking some of the other's connections); a free port is reserved, and the processes' listeners join it."""
    from inferbus.actors._node import _reserve_port

    other = socket.socket()
    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    other.bind(("127.0.0.1", 0))
    other.listen()
    try:
        with pytest.raises(OSError):
            _reserve_port("127.0.0.1", other.getsockname()[1])
    finally:
        other.close()
    mine = _reserve_port("127.0.0.1", 0)
    try:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        listener.bind(("127.0.0.1", mine.getsockname()[1]))
        listener.listen()
        listener.close()
    finally:
        mine.close()
