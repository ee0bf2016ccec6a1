"""``inferbus up --metrics-port``: the Prometheus endpoint of a real node (2 ingresses, 2 workers), scraped over
HTTP with urllib and parsed with prometheus-client's own parser; the counters must move by exactly what the
requests sent here did (misses, L1 hits, refused requests), summed over the node's processes."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request

import anyio
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import MODELS, cli_in_process, start_deployment
from conftest import uvloop_backend as anyio_backend  # noqa: F401  (process-heavy: one loop is enough)
from inferbus.actors._metrics import Expected
from inferbus.client import Client
from inferbus.schemas import InvalidArgument, NotFound
from test_model_input_failures import _lookup_model
from test_reliability_lib import models_subset

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    root = tmp_path_factory.mktemp("metrics")
    # every model of models/, and ``lookup``, which fails at run time on an index out of its table (an error the
    # worker answers, not the ingress: test_a_worker_answered_error_is_counted_by_model_version)
    models = models_subset(root / "models", sorted(p.name for p in MODELS.iterdir() if (p / "config.json").is_file()))
    _lookup_model(models / "lookup")
    dep = start_deployment(root / "dep", workers=2, prefix="mt",
                           extra=["--models", str(models), "--ingress", "2", "--metrics-port", "0",
                                  "--metrics-host", "127.0.0.1"])
    try:
        dep.metrics_url = dep.printed_metrics_url()
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


async def settled_deltas(url: str, before: dict, expected: dict, timeout_s: float = 5.0, update=None):
    """Scrape ``url`` until the increase since ``before`` of each ``(sample name, labels)`` of ``expected`` (summed
    over the samples whose labels include those, :func:`total`) is the expected one, or ``timeout_s`` passed: the
    counts a completion notice moves land just after the answers. ``update(after)``, when given, may set expected
    values that depend on the scrape first. Returns ``(increases, the last scrape)``; the caller asserts
    ``increases == expected``."""
    deadline = time.monotonic() + timeout_s
    while True:
        after = scrape(url)
        if update is not None:
            update(after)
        got = {k: total(after, k[0], **dict(k[1])) - total(before, k[0], **dict(k[1])) for k in expected}
        if got == expected or time.monotonic() > deadline:
            return got, after
        await anyio.sleep(0.1)


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

    got, after = await settled_deltas(node.metrics_url, before, expected)
    assert got == expected
    assert total(after, "inferbus_ingress_handler_seconds_sum", endpoint="infer") > \
        total(before, "inferbus_ingress_handler_seconds_sum", endpoint="infer")
    for reason in ("error", "dropped", "expired"):  # expired fills had no series (a fresh-user trial)
        assert ("inferbus_cache_l2_fill_failures_total", frozenset({"aggregator": "n1-agg", "reason": reason}.items())) \
            in after, reason
    assert total(after, "inferbus_cache_l1_entries") >= 1
    assert total(after, "inferbus_worker_batches_total") - total(before, "inferbus_worker_batches_total") >= 1
    assert total(after, "inferbus_worker_queued_requests") == 0  # idle again
    for wid in ("n1-w0", "n1-w1"):  # the worker's subscription backlog (its load report's backlog_msgs)
        assert after[("inferbus_worker_backlog_requests", frozenset({"worker": wid}.items()))] >= 0
    assert total(after, "inferbus_worker_mailbox_capacity_requests") == 2 * 1024
    compute = total(after, "inferbus_model_compute_seconds", model="digits", version="1")
    assert 0 < compute < 0.1, compute  # seconds, not µs


def series(samples: dict, name: str, **labels) -> dict[frozenset, float]:
    """The samples named ``name`` whose labels include ``labels``: ``{frozenset of label items: value}``."""
    want = set(labels.items())
    return {ls: v for (n, ls), v in samples.items() if n == name and want <= ls}


def check_histograms(samples: dict, name: str) -> int:
    """Every series of histogram ``name`` is well formed: its buckets are cumulative (non-decreasing in ``le``), its
    ``+Inf`` bucket is its ``_count``, and it has a ``_sum``. Returns how many series there are."""
    by_series: dict[frozenset, list[tuple[float, float]]] = {}
    for ls, v in series(samples, f"{name}_bucket").items():
        labels = dict(ls)
        le = labels.pop("le")
        by_series.setdefault(frozenset(labels.items()), []).append((float(le), v))
    for ls, buckets in by_series.items():
        buckets.sort()
        values = [v for _, v in buckets]
        assert values == sorted(values), (name, dict(ls), buckets)
        assert buckets[-1][0] == float("inf"), (name, dict(ls))
        assert buckets[-1][1] == samples[(f"{name}_count", ls)], (name, dict(ls))
        assert (f"{name}_sum", ls) in samples, (name, dict(ls))
    return len(by_series)


async def test_per_model_counts_and_histograms(node):
    """Per model version (Triton's nv_inference_request_success/failure, nv_inference_count, exec_count and
    durations): the ingresses' success, cache hit and failure counts and forward-latency histogram, and the workers'
    computed and run counts and batch-size and compute-duration histograms move by exactly what was sent to each of
    two models; the histograms are cumulative with +Inf = _count."""
    deadline = time.monotonic() + 10
    while total(before := scrape(node.metrics_url), "inferbus_breaker_state", state="closed") < 4:
        assert time.monotonic() < deadline, "an ingress never heard from both workers"
        time.sleep(0.05)
    a, b = {"model": "digits", "version": "1"}, {"model": "digits_cnn", "version": "1"}
    for labels in (a, b):  # every served version has its series from the start (0 until used)
        for ingress in ("n1-i0", "n1-i1"):
            assert before[("inferbus_model_request_success_total",
                           frozenset({"ingress": ingress, **labels}.items()))] >= 0
    client = await Client.connect(node.nats_url, node.prefix, retry_unavailable=False)
    sent = {"digits": {"miss": 0, "hit": 0, "bad": 0}, "digits_cnn": {"miss": 0, "hit": 0, "bad": 0}}
    t0 = time.monotonic()
    try:
        seed0 = int(time.time() * 1000) + 10_000_000  # inputs never sent before (the other test's seeds differ)
        for model, n in (("digits", 12), ("digits_cnn", 7)):
            for i in range(n):
                r = await client.infer_result(model, digits_input(seed0 + i))
                assert r.parameters["cache_hit"] is False
                sent[model]["miss"] += 1
            seed0 += 1000
            same = digits_input(seed0 - 1)  # misses until each ingress holds it, then hits
            for _ in range(60):
                r = await client.infer_result(model, same)
                sent[model]["hit" if r.parameters["cache_hit"] else "miss"] += 1
                if sent[model]["hit"] >= 2:
                    break
            assert sent[model]["hit"] >= 2, "no L1 hits in 60 repeats"
        for model, n in (("digits", 3), ("digits_cnn", 1)):  # wrong shape: INVALID_ARGUMENT from the ingress
            for _ in range(n):
                with pytest.raises(InvalidArgument):
                    await client.infer(model, {"pixels": np.zeros((1, 63), np.float32)})
                sent[model]["bad"] += 1
        with pytest.raises(NotFound):  # no such version: no model version to count it under
            await client.infer("digits", digits_input(seed0), version=7)
    finally:
        await client.close()
    wall_s = time.monotonic() - t0

    expected = {}
    for model, labels in (("digits", a), ("digits_cnn", b)):
        s, ls = sent[model], tuple(labels.items())
        expected.update({
            ("inferbus_model_request_success_total", ls): s["miss"] + s["hit"],
            ("inferbus_model_cache_hits_total", ls + (("level", "l1"),)): s["hit"],
            ("inferbus_model_cache_hits_total", ls + (("level", "l2"),)): 0,
            ("inferbus_model_request_failure_total", ls + (("code", "INVALID_ARGUMENT"),)): s["bad"],
            ("inferbus_model_request_failure_total", ls): s["bad"],  # no other code
            ("inferbus_forward_latency_seconds_count", ls): s["miss"],
            ("inferbus_forward_latency_seconds_bucket", ls + (("le", "+Inf"),)): s["miss"],
            ("inferbus_model_computed_total", ls): s["miss"],
            ("inferbus_model_batch_size_sum", ls): s["miss"],
            ("inferbus_model_batch_size_bucket", ls + (("le", "+Inf"),)): None,  # = runs, below
        })
    expected[("inferbus_model_request_failure_total", (("model", "digits"), ("version", "2")))] = 0
    expected[("inferbus_worker_computed_total", ())] = sent["digits"]["miss"] + sent["digits_cnn"]["miss"]

    def runs_per_bucket(after: dict) -> None:
        for k in expected:
            if k[0] == "inferbus_model_batch_size_bucket":  # +Inf: every run, however many
                ls = dict(k[1])
                ls.pop("le")
                expected[k] = total(after, "inferbus_model_runs_total", **ls) - \
                    total(before, "inferbus_model_runs_total", **ls)

    got, after = await settled_deltas(node.metrics_url, before, expected, update=runs_per_bucket)
    assert got == expected
    for model, labels in (("digits", a), ("digits_cnn", b)):
        runs = total(after, "inferbus_model_runs_total", **labels) - \
            total(before, "inferbus_model_runs_total", **labels)
        assert 1 <= runs <= sent[model]["miss"], runs
        for name in ("inferbus_model_batch_size_count", "inferbus_model_compute_duration_seconds_count"):
            assert total(after, name, **labels) - total(before, name, **labels) == runs, name
        # the latencies' sum: more than nothing, less than the whole test's wall time for each forward
        fwd_sum = total(after, "inferbus_forward_latency_seconds_sum", **labels) - \
            total(before, "inferbus_forward_latency_seconds_sum", **labels)
        assert 0 < fwd_sum < wall_s * sent[model]["miss"], (fwd_sum, wall_s)
        compute_sum = total(after, "inferbus_model_compute_duration_seconds_sum", **labels) - \
            total(before, "inferbus_model_compute_duration_seconds_sum", **labels)
        assert 0 < compute_sum < fwd_sum, (compute_sum, fwd_sum)
        # the per-model counts add up to the per-process ones of the same ingresses
    assert total(after, "inferbus_model_request_success_total") == \
        total(after, "inferbus_cache_hits_total") + total(after, "inferbus_forward_latency_seconds_count")
    # over all versions, the worker's per-model computed counts are its computed count
    for wid in ("n1-w0", "n1-w1"):
        assert total(after, "inferbus_model_batch_size_sum", worker=wid) == \
            total(after, "inferbus_worker_computed_total", worker=wid)
        assert total(after, "inferbus_model_runs_total", worker=wid) == \
            total(after, "inferbus_worker_batches_total", worker=wid)
    for name in ("inferbus_forward_latency_seconds", "inferbus_model_batch_size",
                 "inferbus_model_compute_duration_seconds"):
        assert check_histograms(after, name) >= 4, name  # 2 ingresses or workers x 2 models at least
    les = {dict(ls)["le"] for ls in series(after, "inferbus_forward_latency_seconds_bucket", ingress="n1-i0", **a)}
    assert les == {"5e-05", "0.0001", "0.0002", "0.0005", "0.001", "0.002", "0.005", "0.01", "0.02", "0.05", "0.1",
                   "0.2", "0.5", "1.0", "2.0", "5.0", "+Inf"}, les
    # the worker's counts that had no metric: one series per worker, by event
    for wid in ("n1-w0", "n1-w1"):
        events = {dict(ls)["event"] for ls in series(after, "inferbus_worker_events_total", worker=wid)}
        assert events == {"decoded", "input_failures", "stop_refused"}, events
    assert total(after, "inferbus_worker_events_total", event="decoded") - \
        total(before, "inferbus_worker_events_total", event="decoded") == \
        sent["digits"]["miss"] + sent["digits_cnn"]["miss"]  # every miss's body decoded once at its worker


async def test_a_worker_answered_error_is_counted_by_model_version(node):
    """An error answered by a worker, not the ingress (``lookup`` given an index out of its table passes the
    ingress's validation and fails the model's run: the worker answers INVALID_ARGUMENT), is counted by the ingress
    when the completion comes back, under the request's model version and code
    (``_count_worker_error(..., model_key)``)."""
    deadline = time.monotonic() + 10
    while total(before := scrape(node.metrics_url), "inferbus_breaker_state", state="closed") < 4:
        assert time.monotonic() < deadline, "an ingress never heard from both workers"
        time.sleep(0.05)
    lookup = {"model": "lookup", "version": "1"}
    for ingress in ("n1-i0", "n1-i1"):  # served: its series are there from the start
        assert before[("inferbus_model_request_success_total", frozenset({"ingress": ingress, **lookup}.items()))] >= 0
    bad = 3
    client = await Client.connect(node.nats_url, node.prefix, retry_unavailable=False)
    try:
        for i in range(bad):
            with pytest.raises(InvalidArgument) as ei:
                await client.infer("lookup", {"idx": np.array([[7 + i]], np.int64)}, timeout_s=5.0)
            assert "failed on this input" in ei.value.message, ei.value.message  # the worker's words
        out = await client.infer("lookup", {"idx": np.array([[2]], np.int64)}, timeout_s=5.0)
        assert out["v"].tolist() == [[30.0]]
    finally:
        await client.close()
    ls = tuple(lookup.items())
    expected = {
        ("inferbus_model_request_failure_total", ls + (("code", "INVALID_ARGUMENT"),)): bad,
        ("inferbus_model_request_failure_total", ls): bad,  # no other code
        ("inferbus_model_request_success_total", ls): 1,
        ("inferbus_request_errors_total", ()): bad,
        ("inferbus_ingress_errors_total", ()): 0,  # none answered by the ingress itself
        ("inferbus_worker_events_total", (("event", "input_failures"),)): bad,  # each was the worker's
        ("inferbus_worker_errors_total", ()): 0,  # the client's error, not a server failure
    }
    got, _ = await settled_deltas(node.metrics_url, before, expected)
    assert got == expected


async def test_per_model_counts_of_run_to_completion(tmp_path):
    """The colocated run-to-completion path (``--colocate``: the ingress's ``_run_now`` and the worker's ``run_now``,
    which count apart from the forwards over the bus) counts each miss once in the ingress's forward-latency
    histogram and the worker's batch-size histogram (runs of one)."""
    dep = start_deployment(tmp_path / "dep", workers=1, prefix="mc",
                           extra=["--colocate", "--metrics-port", "0", "--metrics-host", "127.0.0.1"])
    try:
        url = dep.printed_metrics_url()
        before = scrape(url)
        client = await Client.connect(dep.nats_url, dep.prefix, retry_unavailable=False)
        n = 15
        try:
            seed0 = int(time.time() * 1000)
            for i in range(n):  # one at a time: nothing waits, each miss runs to completion in the ingress's call
                r = await client.infer_result("digits", digits_input(seed0 + i))
                assert r.parameters["cache_hit"] is False and r.parameters["forward"] == "local"
            with pytest.raises(InvalidArgument):
                await client.infer("digits", {"pixels": np.zeros((1, 63), np.float32)})
        finally:
            await client.close()
        after = scrape(url)
        # the OIP v2 readiness of a colocated node is its colocated processes' ingresses' (tests/test_http_probes.py)
        base = url.rsplit("/metrics", 1)[0]
        for path in ("/v2/health/ready", "/v2/models/digits/ready"):
            with urllib.request.urlopen(base + path, timeout=5) as resp:
                assert (resp.status, resp.read()) == (200, b""), path
    finally:
        dep.stop()
    # one process per colocated pair: its figures under its child id, as inferbus_child_running's
    assert after[("process_resident_memory_bytes", frozenset({"child": "colocated:n1-w0"}.items()))] > 1e6
    a = {"model": "digits", "version": "1"}

    def delta(name: str, **labels) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    assert delta("inferbus_ingress_events_total", event="run_now") == n  # the path under test
    assert delta("inferbus_forward_latency_seconds_count", **a) == n
    assert delta("inferbus_model_request_success_total", **a) == n
    assert delta("inferbus_model_request_failure_total", code="INVALID_ARGUMENT", **a) == 1
    assert delta("inferbus_model_batch_size_sum", **a) == n
    assert delta("inferbus_model_batch_size_bucket", le="1.0", **a) == n  # every run a batch of one
    assert delta("inferbus_model_runs_total", **a) == n
    assert check_histograms(after, "inferbus_forward_latency_seconds") >= 1


def test_name_filter_answers_the_named_families_alone(node):
    """``/metrics?name[]=...`` (prometheus-client's filter, by series name) answered an empty body: the collector
    declared no names. Now it answers the named series, and nothing else."""
    def families(query: str) -> dict[str, set[str]]:
        with urllib.request.urlopen(f"{node.metrics_url}?{query}", timeout=5) as resp:
            assert resp.status == 200
            text = resp.read().decode()
        return {fam.name: {s.name for s in fam.samples} for fam in text_string_to_metric_families(text)}

    got = families("name[]=inferbus_ingress_requests_total")
    assert got == {"inferbus_ingress_requests": {"inferbus_ingress_requests_total"}}, got
    got = families("name[]=inferbus_forward_latency_seconds_bucket&name[]=inferbus_forward_latency_seconds_count"
                   "&name[]=inferbus_actor_up")
    assert got == {"inferbus_forward_latency_seconds": {"inferbus_forward_latency_seconds_bucket",
                                                        "inferbus_forward_latency_seconds_count"},
                   "inferbus_actor_up": {"inferbus_actor_up"}}, got
    assert families("name[]=no_such_metric") == {}


def test_every_family_is_described():
    """The collector's describe() (what the name[] filter finds it by) declares every family it can yield, with
    its type: a family missing there would be left out of every filtered scrape. Fed one answer of each kind of actor
    with every optional part (L2 lookups, a region manager, per-model counts, a worker's events)."""
    from inferbus.actors._metrics import _DESCRIBED, NodeCollector, ProcessFigures, families

    e = Expected("mt", ingress_ids=("n1-i0",), worker_ids=("n1-w0",), aggregator_ids=("n1-agg",), regions=("a",))
    ingress = {"name": "inferbus-ingress", "metadata": {"ingress_id": "n1-i0"}, "endpoints": [
        {"name": "infer", "subject": "mt.infer.>", "num_requests": 3, "num_errors": 1, "processing_time": 1000,
         "data": {"counts": {"requests": 3, "l1_hits": 1, "something_new": 2}, "pending": 0, "backlog": 0,
                  "l1_entries": 1, "l1_bytes": 10, "l2_inflight": 0, "l2_lookups": "closed", "l2_lookups_off_times": 0,
                  "models": ["digits:1"], "models_ready": ["digits:1"],
                  "latency_us": {"digits:1": {"0.5": 100, "0.95": 200, "0.99": 300, "samples": 30}},
                  "workers": {"n1-w0": {"breaker": "closed", "breaker_trips": 0, "health": "ok", "in_flight": 0}},
                  "per_model": {"digits:1": {"forward": {"le": [0] * 16, "count": 0, "sum_us": 0.0}, "l1_hits": 1,
                                             "errors": {"INVALID_ARGUMENT": 1}}}}},
        {"name": "infer_at", "subject": "mt.ingresses.n1-i0.infer.>", "num_requests": 0, "num_errors": 0,
         "processing_time": 0}]}
    worker = {"name": "inferbus-worker", "metadata": {"worker_id": "n1-w0"}, "endpoints": [
        {"name": "infer", "subject": "mt._w.n1-w0", "data": {
            "backend": "onnxruntime", "received": 1, "computed": 1, "batches": 1, "decoded": 1, "queue_depth": 0,
            "backlog_msgs": 0,
            "in_flight": 0, "capacity": 8, "ewma_service_us": 10.0, "error_rate": 0.0, "models": ["digits:1"],
            "precisions": {"digits:1": "fp32"}, "load_errors": {"x:1": "gone"}, "compute_ewma_us": {"digits:1": 10.0},
            "runs": {"digits:1": {"runs": 1, "requests": 1, "batch_le": [1] * 11, "compute_le": [1] * 16,
                                  "compute_sum_us": 10}}}}]}
    agg = {"name": "inferbus-aggregator", "metadata": {"aggregator_id": "n1-agg"},
           "endpoints": [{"name": "cache-fill", "subject": "mt._cache.fill", "data": {"fills": 1, "queued": 0}}]}
    region = {"name": "inferbus-region", "metadata": {"region": "a"}, "endpoints": [
        {"name": "control", "subject": "mt._region.ctl.a",
         "data": {"role": "primary", "term": 1, "renewals": 1, "model_writes": True}}]}
    stats = {}
    for st in (ingress, worker, agg, region):
        key = e.identify(st)
        assert key is not None, st["name"]
        stats[key] = st

    class Child:
        id, restarts, status = "nats", 0, "running"

    made = {fam.name: fam.type for fam in families(stats, e, [Child()], 0.01)}
    assert {"inferbus_model_request_failure", "inferbus_forward_latency_seconds", "inferbus_model_batch_size",
            "inferbus_worker_events", "inferbus_cache_l2_breaker_state", "inferbus_region_primary",
            "inferbus_worker_backlog_requests"} <= set(made)
    assert {n: t for n, t in made.items() if _DESCRIBED.get(n) != t} == {}
    # and the process figures, read from /proc of this test's own process
    processes = {fam.name: fam.type for fam in ProcessFigures().families({"node": os.getpid()})}
    assert {"process_cpu_seconds", "process_resident_memory_bytes", "process_open_fds"} <= set(processes), processes
    assert {n: t for n, t in processes.items() if _DESCRIBED.get(n) != t} == {}
    described = {fam.name: fam.type for fam in NodeCollector(None, None).describe()}
    assert described == _DESCRIBED


def test_histogram_folds():
    """The raw values recorded on the request path fold into cumulative buckets (``le`` inclusive), exactly,
    runs of several models apart, and runs recorded during a fold wait for the next one."""
    from inferbus.actors._modelstats import BATCH_BOUNDS, LATENCY_BOUNDS_US, ForwardStats, fold_runs

    fs = ForwardStats()
    for us in (10.0, 50.0, 50.5, 999.0, 7e6):
        fs.add(us)
    fs.fold()
    h = fs.histogram()
    assert h["count"] == 5 and h["sum_us"] == 10.0 + 50.0 + 50.5 + 999.0 + 7e6
    assert h["le"][:6] == [2, 3, 3, 3, 4, 4] and h["le"][-1] == 4  # 7 s only in +Inf
    assert len(h["le"]) == len(LATENCY_BOUNDS_US) and fs.pending == [] and len(fs.samples) == 5
    fs.add(60.0)
    fs.fold()
    assert fs.histogram()["le"][:2] == [2, 4] and fs.count == 6
    runs = [("b:1", 3, 40), ("a:1", 1, 100), ("b:1", 64, 2000), ("a:1", 1, 60)]
    into = {}
    fold_runs(runs, into)
    assert runs == [] and sorted(into) == ["a:1", "b:1"]
    a, b = into["a:1"], into["b:1"]
    assert (a.runs, a.requests, a.compute_sum_us) == (2, 2, 160) and a.batch_le == [2] * len(BATCH_BOUNDS)
    assert a.compute_le[:3] == [0, 2, 2]  # 60 and 100 <= 100 (le is inclusive)
    assert (b.runs, b.requests) == (2, 67) and b.batch_le[:7] == [0, 0, 1, 1, 1, 1, 2]
    assert b.compute_le[0] == 1 and b.compute_le[5] == 2
    fold_runs(runs, into)  # nothing new: nothing changes
    assert into["a:1"].runs == 2


def _up(*args: str) -> subprocess.CompletedProcess:
    """``inferbus up`` of a refusal, in this process (parsing alone; a process costs ~0.5 s of imports): an ``up``
    that is not refused starts here, and its test fails by its assertions or its timeout."""
    return cli_in_process(["up", "--models", str(MODELS), "--nats-port", "0", *args])


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
    assert r.returncode == 2 and "--metrics-port must be in [0, 65535] (0 = any free port), got " in r.stderr, r.stderr
    r = _up("--http-port", "70000")  # the option as typed, not its other name (--metrics-port was said)
    assert r.returncode == 2 and "--http-port must be in [0, 65535] (0 = any free port), got 70000" in r.stderr, r.stderr
    r = _up("--http-host", "127.0.0.1")
    assert r.returncode == 2 and "--http-host is the HTTP endpoint's address and needs --http-port" in r.stderr, r.stderr
    r = _up("--http-infer")
    assert r.returncode == 2 and "--http-infer" in r.stderr and "needs --metrics-port" in r.stderr, r.stderr
    r = _up("--http-model-control")
    assert r.returncode == 2 and "--http-model-control serves model load and unload on the HTTP port and needs " \
        "--metrics-port" in r.stderr, r.stderr


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
