"""``inferbus up --metrics-port``'s HTTP side beyond ``/metrics``, as a Triton user probes it: the KServe OIP v2
health paths (``/v2/health/live``, ``/v2/health/ready``, ``/v2/models/<name>[/versions/<v>]/ready``), ``HEAD``, and
every process's ``process_*`` CPU and memory figures. A real node (1 ingress, 2 workers, embedded NATS and Valkey)
asked over HTTP with http.client; readiness turned off by freezing (SIGSTOP) the workers or the nats-server."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import time
import urllib.parse

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import command_lines, start_deployment
from conftest import uvloop_backend as anyio_backend  # noqa: F401  (process-heavy: one loop is enough)
from inferbus.client import Client
from inferbus.schemas import NotFound, Unavailable

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    root = tmp_path_factory.mktemp("probes")
    # a worker silent for 2 s is out of routing (default 5 s): the frozen-workers test waits less
    dep = start_deployment(root / "dep", workers=2, prefix="hp",
                           extra=["--ingress", "1", "--metrics-port", "0", "--metrics-host", "127.0.0.1",
                                  "--health-timeout-s", "2"])
    try:
        deadline = time.monotonic() + 10
        while not (m := re.search(rb"metrics http://(127\.0\.0\.1:\d+)/metrics", dep.log.read_bytes())):
            assert time.monotonic() < deadline, dep.log.read_text()[-2000:]
            time.sleep(0.05)
        dep.http_address = m.group(1).decode()
        yield dep
    finally:
        dep.stop()


def ask(node, path: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    """``(status, headers, body)`` of one HTTP request to the node's metrics port (any status, no redirects)."""
    host, port = node.http_address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def pids_of(node, text: str) -> list[int]:
    """The pids of the node's processes whose command line holds ``text`` (and the node's run dir)."""
    return [pid for pid, cmd in command_lines() if text in cmd and str(node.run_dir) in cmd]


def wait_status(node, path: str, status: int, timeout_s: float = 20.0) -> tuple[int, dict, bytes]:
    deadline = time.monotonic() + timeout_s
    while True:
        got = ask(node, path)
        if got[0] == status:
            return got
        assert time.monotonic() < deadline, (path, got)
        time.sleep(0.1)


def test_live_and_ready_answer_200_with_no_body_on_a_serving_node(node):
    for path in ("/v2/health/live", "/v2/health/ready"):
        status, headers, body = ask(node, path)
        assert (status, body) == (200, b""), (path, status, body)
        assert headers["content-length"] == "0"


def test_model_ready_200_for_a_served_version_404_for_unknown_ones_400_for_malformed(node):
    for path in ("/v2/models/digits/ready", "/v2/models/digits/versions/1/ready", "/v2/models/digits/versions/2/ready",
                 "/v2/models/digits_cnn/ready"):
        status, _, body = ask(node, path)
        assert (status, body) == (200, b""), (path, status, body)
    for path, status, error in (
            ("/v2/models/no_such_model/ready", 404, "unknown model 'no_such_model'"),
            ("/v2/models/digits/versions/9/ready", 404, "model 'digits' has no version '9'; versions: 1, 2"),
            ("/v2/models/no_such_model/versions/1/ready", 404, "unknown model 'no_such_model'"),
            ("/v2/models/digits/versions/v1/ready", 400, "version 'v1' is not a number"),
            ("/v2/models/digits/versions/01/ready", 400, "leading zero"),
            ("/v2/models/a.b/ready", 400, "model 'a.b' must be a non-empty name without '.'"),
            ("/v2/models/" + urllib.parse.quote("a b") + "/ready", 400, "model 'a b' must be a non-empty name"),
            ("/v2/health/started", 404, "no such path: /v2/health/started")):
        got, headers, body = ask(node, path)
        assert got == status, (path, got, body)
        assert headers["content-type"] == "application/json"
        assert error in json.loads(body)["error"], (path, body)


def test_head_answers_like_get_without_a_body(node):
    """prometheus-client's app answered HEAD /metrics 405 (``use OPTIONS or GET``)."""
    status, headers, body = ask(node, "/metrics", "HEAD")
    assert (status, body) == (200, b"")
    assert headers["content-type"].startswith("text/plain")
    get_status, _, get_body = ask(node, "/metrics")
    assert get_status == 200 and b"inferbus_actor_up" in get_body
    assert int(headers["content-length"]) > 1000  # the length the GET's body has (a scrape of the same node)
    for path, want in (("/v2/health/live", 200), ("/v2/health/ready", 200), ("/v2/models/digits/ready", 200),
                       ("/v2/models/no_such_model/ready", 404)):
        status, headers, body = ask(node, path, "HEAD")
        assert (status, body) == (want, b""), (path, status, body)
        assert status == ask(node, path)[0]
    status, headers, _ = ask(node, "/v2/health/ready", "POST")
    assert status == 405 and headers["allow"] == "OPTIONS, GET, HEAD"
    status, headers, _ = ask(node, "/metrics", "OPTIONS")
    assert status == 200 and "HEAD" in headers["allow"]


def test_process_series_of_every_process_of_the_node(node):
    status, _, body = ask(node, "/metrics")
    assert status == 200
    fams = {f.name: {s.labels["child"]: s.value for s in f.samples} for f in text_string_to_metric_families(body.decode())
            if f.name.startswith("process_")}
    children = {"node", "nats", "valkey", "aggregator", "ingress:0", "worker:n1-w0", "worker:n1-w1"}
    for name in ("process_cpu_seconds", "process_resident_memory_bytes", "process_open_fds",
                 "process_start_time_seconds"):
        assert set(fams.get(name, {})) == children, (name, fams.get(name))
    now = time.time()
    for child in children:
        assert fams["process_resident_memory_bytes"][child] > 1e6, child
        # every Python process has spent CPU time importing; an idle nats-server or Valkey may be below one tick
        assert fams["process_cpu_seconds"][child] > 0 or child in ("nats", "valkey"), child
        assert fams["process_cpu_seconds"][child] >= 0, child
        assert fams["process_open_fds"][child] >= 3, child
        assert now - 600 < fams["process_start_time_seconds"][child] <= now + 1, child
    # the series of a child are its own process's: its RSS as the kernel states it for that pid, within a margin
    [worker_pid] = pids_of(node, "worker-n1-w1.config.json")
    with open(f"/proc/{worker_pid}/status") as fh:
        rss_kib = int(re.search(r"^VmRSS:\s+(\d+) kB", fh.read(), re.M).group(1))
    assert 0.5 < fams["process_resident_memory_bytes"]["worker:n1-w1"] / (rss_kib * 1024) < 2.0
    assert fams["process_start_time_seconds"]["node"] <= fams["process_start_time_seconds"]["worker:n1-w1"]


@pytest.mark.anyio
async def test_client_model_ready_asks_one_ingress(node):
    client = await Client.connect(node.nats_url, node.prefix, retry_unavailable=False)
    try:
        assert await client.model_ready("digits", ingress="n1-i0") is True
        assert await client.model_ready("digits", "2", ingress="n1-i0") is True
        with pytest.raises(NotFound):
            await client.model_ready("no_such_model", ingress="n1-i0")
        with pytest.raises(Unavailable):  # no ingress of that id: no responders, not "any ingress"
            await client.model_ready("digits", ingress="n9-i0", timeout_s=0.5)
    finally:
        await client.close()


def test_ready_turns_503_while_the_workers_are_frozen_and_200_again_after(node):
    """The workers frozen (SIGSTOP: no load reports, no answers): after the health timeout (2 s here) the ingress
    has no live worker, and ready and model ready answer 503 saying so, while live stays 200; thawed, 200 again."""
    pids = pids_of(node, "inferbus.actors worker")
    assert len(pids) == 2, pids
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        _, headers, body = wait_status(node, "/v2/health/ready", 503)
        assert headers["content-type"] == "application/json"
        assert headers["inferbus-error-code"] == "UNAVAILABLE"  # (as the infer paths' 503; none before 2026-12-07)
        assert json.loads(body)["error"] == ("no ingress of node n1 is ready: n1-i0: not ready (model versions with a "
                                             "live worker: none; live workers: 0)"), body
        status, headers, body = ask(node, "/v2/models/digits/ready")
        assert (status, headers["inferbus-error-code"]) == (503, "UNAVAILABLE"), body
        assert "model 'digits' (its default version) is not ready at n1-i0" in json.loads(body)["error"]
        assert ask(node, "/v2/models/no_such_model/ready")[0] == 404  # unknown is still unknown, not "not ready"
        assert ask(node, "/v2/health/live")[:3:2] == (200, b"")
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    wait_status(node, "/v2/health/ready", 200)
    wait_status(node, "/v2/models/digits/ready", 200)


def test_probes_answer_within_their_bound_with_nats_frozen(node):
    """The node's nats-server frozen (SIGSTOP): ready and model ready cannot ask the ingress, and answer 503 naming
    the silence within the probe's bound (0.5 s for the ingress, 1 s in all) rather than hanging the prober; live
    does not need the bus and stays 200."""
    [pid] = pids_of(node, "nats-server")
    os.kill(pid, signal.SIGSTOP)
    try:
        for path in ("/v2/health/ready", "/v2/models/digits/ready"):
            t0 = time.monotonic()
            status, _, body = ask(node, path)
            took_s = time.monotonic() - t0
            assert status == 503, (path, body)
            assert "n1-i0: DEADLINE_EXCEEDED: no answer within 500 ms" in json.loads(body)["error"], body
            assert took_s < 2.0, (path, took_s)  # the bound (1 s) plus scheduling on a busy box
        assert ask(node, "/v2/health/live")[:3:2] == (200, b"")
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_status(node, "/v2/health/ready", 200)


def test_inference_over_http_is_off_without_http_infer_and_says_how_to_turn_it_on(node):
    """The HTTP port has no authentication: a node started without ``--http-infer`` answers an infer 403
    PERMISSION_DENIED naming the flag (the body read and dropped), while metadata is served; the ``up`` line says
    infer is off. (Without the gate anyone reaching the port ran the models without NATS credentials.)"""
    doc = {"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64], "data": [0.0] * 64}]}
    host, port = node.http_address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("POST", "/v2/models/digits/infer", body=json.dumps(doc).encode(),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        status, headers, body = resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()
    assert status == 403 and headers["inferbus-error-code"] == "PERMISSION_DENIED", (status, body)
    assert "--http-infer" in json.loads(body)["error"]
    status, _, body = ask(node, "/v2/models/digits")
    assert status == 200 and json.loads(body)["name"] == "digits"
    assert b"infer off: --http-infer" in node.log.read_bytes()


def test_model_load_and_unload_over_http_are_off_without_http_model_control(node):
    """Triton's model repository writes change what every node on the NATS serves, and the port has no
    authentication: without ``--http-model-control`` a load or unload is 403 PERMISSION_DENIED naming the flag, and
    nothing changes; the index and the statistics (reads) are served; the ``up`` line says model control is off.
    (Before 2026-12-07 these paths were 404: the extensions were not served over HTTP.)"""
    host, port = node.http_address.rsplit(":", 1)
    for op in ("load", "unload"):
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        try:
            conn.request("POST", f"/v2/repository/models/digits/{op}", body=b"{}",
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            status, headers, body = resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()
        assert status == 403 and headers["inferbus-error-code"] == "PERMISSION_DENIED", (op, status, body)
        assert "--http-model-control" in json.loads(body)["error"], body
    status, _, body = ask(node, "/v2/models/digits")
    assert status == 200 and json.loads(body)["versions"] == ["1", "2"], body
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("POST", "/v2/repository/index", body=b"")
        resp = conn.getresponse()
        status, body = resp.status, resp.read()
    finally:
        conn.close()
    assert status == 200 and {"name": "digits", "version": "2", "state": "READY", "reason": ""} in json.loads(body)
    status, _, body = ask(node, "/v2/models/digits/stats")
    assert status == 200 and [s["version"] for s in json.loads(body)["model_stats"]] == ["1", "2"], body
    assert b"model control off: --http-model-control" in node.log.read_bytes()
