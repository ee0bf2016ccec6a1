"""``inferbus up --metrics-port``: the Prometheus endpoint of a real node (2 ingresses, 2 workers), scraped over
HTTP with urllib and parsed with prometheus-client's own parser; the counters must move by exactly what the
requests sent here did (misses, L1 hits, refused requests), summed over the node's processes."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import MODELS, ROOT, start_deployment
from conftest import uvloop_backend as anyio_backend  # noqa: F401  (process-heavy: one loop is enough)
from inferbus.actors._metrics import Expected
from inferbus.client import Client
from inferbus.schemas import InvalidArgument, NotFound

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    dep = start_deployment(tmp_path_factory.mktemp("metrics"), workers=2, prefix="mt",
                           extra=["--ingress", "2", "--metrics-port", "0", "--metrics-host", "127.0.0.1"])
    try:
        deadline = time.monotonic() + 10
        while not (m := re.search(rb"metrics (http://127\.0\.0\.1:\d+/metrics)", dep.log.read_bytes())):
            assert time.monotonic() < deadline, dep.log.read_text()[-2000:]
            time.sleep(0.05)
        dep.metrics_url = m.group(1).decode()
        yield dep
    finally:
        dep.stop()


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of one scrape: ``{(sample name, frozenset of label items): value}``."""
    with urllib.request.urlopen(url, timeout=5) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in out, f"duplicate series {key}"
            out[key] = s.value
    return out


def total(samples: dict, name: str, **labels) -> float:
    """Sum of the samples named ``name`` whose labels include ``labels`` (over ingresses, workers...)."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def digits_input(seed: int) -> dict[str, np.ndarray]:
    return {"pixels": np.random.default_rng(seed).random((1, 64), dtype=np.float32)}


async def test_counters_move_by_what_was_sent(node):
    # ready means every model has a worker on every ingress, not that each ingress has heard from both workers
    # yet (a clean-clone run: 3 breakers of 4 at the first scrape): wait for the second report
    deadline = time.monotonic() + 10
    while total(before := scrape(node.metrics_url), "inferbus_breaker_state", state="closed") < 4:
        assert time.monotonic() < deadline, "an ingress never heard from both workers"
        time.sleep(0.05)
    # every actor process of the node answered, and nothing else (one series per actor)
    up = {dict(ls)["actor"]: v for (n, ls), v in before.items() if n == "inferbus_actor_up"}
    assert up == {"n1-i0": 1, "n1-i1": 1, "n1-w0": 1, "n1-w1": 1, "n1-agg": 1}, up
    for ingress in ("n1-i0", "n1-i1"):
        assert before[("inferbus_model_ready", frozenset({"ingress": ingress, "model": "digits",
                                                          "version": "1"}.items()))] == 1
    assert total(before, "inferbus_breaker_state", state="closed") == 4  # 2 ingresses x 2 workers
    assert total(before, "inferbus_child_restarts_total") == 0

    client = await Client.connect(node.nats_url, node.prefix, retry_unavailable=False)
    hits = misses = 0
    try:
        seed0 = int(time.time() * 1000)  # inputs never sent before (the L1 lives across tests)
        for i in range(20):  # distinct inputs: misses
            r = await client.infer_result("digits", digits_input(seed0 + i))
            assert r.parameters["cache_hit"] is False
            misses += 1
        same = digits_input(seed0 - 1)  # one input again and again: misses until each ingress holds it, then hits
        for _ in range(60):
            r = await client.infer_result("digits", same)
            if r.parameters["cache_hit"]:
                hits += 1
            else:
                misses += 1
            if hits >= 3:
                break
        assert hits >= 3, "no L1 hits in 60 repeats"
        with pytest.raises(InvalidArgument):  # wrong shape: refused by the ingress
            await client.infer("digits", {"pixels": np.zeros((1, 63), np.float32)})
        with pytest.raises(NotFound):
            await client.infer("no_such_model", {"pixels": np.zeros((1, 64), np.float32)})
    finally:
        await client.close()
    sent, refused = misses + hits + 2, 2

    expected = {  # (sample, labels): exact increase
        ("inferbus_ingress_requests_total", ()): sent,
        ("inferbus_ingress_handler_seconds_count", (("endpoint", "infer"),)): sent,
        ("inferbus_cache_hits_total", (("level", "l1"),)): hits,
        ("inferbus_cache_hits_total", (("level", "l2"),)): 0,
        ("inferbus_ingress_forwards_total", ()): misses,
        ("inferbus_request_errors_total", ()): refused,
        ("inferbus_ingress_errors_total", ()): refused,
        ("inferbus_worker_received_total", ()): misses,
        ("inferbus_worker_computed_total", ()): misses,
        ("inferbus_worker_completed_total", ()): misses,
        ("inferbus_worker_errors_total", ()): 0,
        ("inferbus_cache_l2_fills_total", ()): misses,  # every computed answer is written to L2 in time
        ("inferbus_cache_l2_fill_failures_total", (("reason", "expired"),)): 0,
        # counted when the workers' completion notices reach the ingresses, just after the answers
        ("inferbus_forward_latency_window_samples", (("model", "digits"), ("version", "1"))): misses,
    }

    def deltas(after: dict) -> dict:
        return {k: total(after, k[0], **dict(k[1])) - total(before, k[0], **dict(k[1])) for k in expected}

    deadline = time.monotonic() + 5
    while True:
        after = scrape(node.metrics_url)
        got = deltas(after)
        if got == expected or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert got == expected
    assert total(after, "inferbus_ingress_handler_seconds_sum", endpoint="infer") > \
        total(before, "inferbus_ingress_handler_seconds_sum", endpoint="infer")
    for reason in ("error", "dropped", "expired"):  # expired fills had no series (a fresh-user trial)
        assert ("inferbus_cache_l2_fill_failures_total", frozenset({"aggregator": "n1-agg", "reason": reason}.items())) \
            in after, reason
    assert total(after, "inferbus_cache_l1_entries") >= 1
    assert total(after, "inferbus_worker_batches_total") - total(before, "inferbus_worker_batches_total") >= 1
    assert total(after, "inferbus_worker_queued_requests") == 0  # idle again
    assert total(after, "inferbus_worker_mailbox_capacity_requests") == 2 * 1024
    compute = total(after, "inferbus_model_compute_seconds", model="digits", version="1")
    assert 0 < compute < 0.1, compute  # seconds, not µs


def _up(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "inferbus.cli", "up", "--models", str(MODELS), "--nats-port", "0",
                           *args], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, "COLUMNS": "200"})


def test_metrics_options_refused_before_anything_starts():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = _up("--metrics-port", str(port), "--metrics-host", "127.0.0.1")
    assert r.returncode == 2, r.stderr
    assert f"--metrics-port {port}: cannot listen on 127.0.0.1:{port}" in r.stderr, r.stderr
    assert "inferbus up" not in r.stdout
    r = _up("--metrics-host", "127.0.0.1")
    assert r.returncode == 2 and "--metrics-host" in r.stderr and "needs --metrics-port" in r.stderr, r.stderr
    r = _up("--metrics-port", "70000")
    assert r.returncode == 2 and "--metrics-port must be 0 (any free port) to 65535" in r.stderr, r.stderr


def test_answers_of_other_nodes_and_prefixes_are_ignored():
    e = Expected("mt", ingress_ids=("n1-i0",), worker_ids=("n1-w0",))

    def ingress(iid: str, prefix: str) -> dict:
        return {"name": "inferbus-ingress", "metadata": {"ingress_id": iid},
                "endpoints": [{"name": "infer", "subject": f"{prefix}.infer.>"}]}

    assert e.identify(ingress("n1-i0", "mt")) == ("ingress", "n1-i0")
    assert e.identify(ingress("n1-i0", "other")) is None  # same id, another deployment's prefix
    assert e.identify(ingress("n2-i0", "mt")) is None  # another node on the same prefix
    worker = {"name": "inferbus-worker", "metadata": {"worker_id": "n1-w0"},
              "endpoints": [{"name": "infer", "subject": "mt._w.n1-w0"}]}
    assert e.identify(worker) == ("worker", "n1-w0")
    assert e.identify({**worker, "name": "something-else"}) is None


def test_a_scrape_with_nats_stopped_still_has_the_nodes_own_series(node):
    """A fresh-user trial: with the node's nats-server stopped (SIGSTOP), a scrape answered 200 with an empty body
    after 2 s: the gathering's flush waited for the server's PONG past the scrape's bound, and everything was dropped,
    the node's own series too (``inferbus_child_running``), so an alert on ``inferbus_actor_up == 0`` never fired.
    Now such a scrape has every actor at ``actor_up 0`` and the node's series, within about ``wait_s``."""
    import signal

    from conftest import command_lines

    pids = [pid for pid, cmd in command_lines() if "nats-server" in cmd and str(node.run_dir) in cmd]
    assert len(pids) == 1, pids
    os.kill(pids[0], signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        samples = scrape(node.metrics_url)
        took_s = time.monotonic() - t0
    finally:
        os.kill(pids[0], signal.SIGCONT)
    up = {dict(ls)["actor"]: v for (n, ls), v in samples.items() if n == "inferbus_actor_up"}
    assert up == {"n1-i0": 0, "n1-i1": 0, "n1-w0": 0, "n1-w1": 0, "n1-agg": 0}, up
    assert total(samples, "inferbus_child_running") >= 5, samples  # the node's children, nats and valkey included
    assert took_s < 2.0, took_s
    deadline = time.monotonic() + 15  # and the next scrapes see the actors again
    while total(scrape(node.metrics_url), "inferbus_actor_up") < 5:
        assert time.monotonic() < deadline, "the actors never answered a scrape again"
        time.sleep(0.2)
