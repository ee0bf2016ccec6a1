"""The colocated fast path: a request the ingress hands to the worker in its own process arrives decoded, with
the forward's fields as values (no header block built and parsed back, no second decode of the body), and its
completion is settled at the ingress by a call. Everything the bus path checks still applies.

One ``inferbus up --colocate --workers 1 --fault-injection`` deployment: a single process (ingress ``n1-i0``
with worker ``n1-w0``), so every request through the public subject is forwarded in-process. Real
nats-server, Valkey and inferbus processes; answers checked against in-process ONNX Runtime.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid

import msgpack
import nats
import numpy as np
import pytest

from inferbus.actors._ingress import _fwd_block
from inferbus.bus._fastpub import parse_block
from inferbus.client import Client
from inferbus.schemas import (
    InferRequest, InvalidArgument, ResourceExhausted, decode_error, decode_response, encode_request,
    input_from_numpy, output_to_numpy,
)
from inferbus.schemas._region import RegionHeartbeat, encode_region

from conftest import start_deployment, uvloop_backend as anyio_backend  # noqa: F401 (anyio_backend: uvloop only)
from test_reliability_lib import (
    Reports, check_worker_error_counts_on_infer_at, health_params, models_subset, reference, set_fault,
)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

W = "n1-w0"
PREFIX = "cfp"


@pytest.fixture(scope="module")
def dep(tmp_path_factory):
    root = tmp_path_factory.mktemp("cfp")
    # typed and strings uncached (every request reaches the worker); digits cached, through the L2 lookup
    models = models_subset(root / "models", ["typed", "digits", "strings"], {
        "typed": {"cache_ttl_ms": 0}, "strings": {"cache_ttl_ms": 0}})
    d = start_deployment(root / "dep", workers=1, prefix=PREFIX, extra=[
        "--colocate", "--models", str(models), "--fault-injection"])
    yield d
    d.stop()


@pytest.fixture
async def env(dep):
    nc = await nats.connect(dep.nats_url)
    client = Client(nc, dep.prefix, retry_unavailable=False)
    reports = await Reports.start(nc, dep.prefix)
    await reports.wait(lambda r: W in r and r[W].in_flight == 0, what="the worker reporting, idle")
    pid = reports.latest[W].pid
    yield nc, client, reports
    await set_fault(nc, dep.prefix, W)
    assert reports.latest[W].pid == pid, "the colocated process died"
    await reports.stop()
    await nc.close()


_counter = iter(range(10**9))


def typed_input(n: int = 1) -> dict:
    """A typed-model input no other request sends (its answer is checkable: a*2 and sum(b))."""
    k = next(_counter) * 1000 + random.randrange(1000)
    return {"a": (np.arange(n, dtype=np.int32) + k).reshape(n, 1), "b": np.full((n, 4), 0.25, np.float16)}


def check_typed(feeds: dict, out: dict) -> None:
    np.testing.assert_array_equal(out["a_times_2"], feeds["a"] * 2)
    np.testing.assert_array_equal(out["b_sum"], feeds["b"].astype(np.float32).sum(1, keepdims=True))


def typed_body(feeds: dict) -> bytes:
    return encode_request(InferRequest(inputs=[input_from_numpy(k, v) for k, v in feeds.items()]))


def outputs_of(msg) -> dict[str, np.ndarray]:
    resp = decode_response(msg.data)
    from inferbus.schemas import output_to_numpy

    return {o.name: output_to_numpy(o) for o in resp.outputs}


async def idle_report(reports):
    """The worker's first report with nothing in flight sent after this call."""
    old = reports.latest[W]
    await reports.wait(lambda r: r[W] is not old and r[W].in_flight == 0, what="a fresh idle report")
    return reports.latest[W]


async def test_local_forward_is_not_decoded_again(env, dep):
    """Answers forwarded in-process say ``forward: local`` with ``worker_decode`` 0 and the full stage
    breakdown; the worker's decode count rises only for a forward that came over the bus."""
    nc, client, reports = env
    r0 = await idle_report(reports)
    n = 0
    for _ in range(6):  # uncached model: ingress -> worker directly
        feeds = typed_input(random.randint(1, 3))
        res = await client.infer_result("typed", feeds, timeout_s=5)
        check_typed(feeds, res.outputs)
        t = res.parameters["timings_us"]
        assert res.parameters["forward"] == "local" and res.parameters["worker_id"] == W
        assert t["worker_decode"] == 0, t
        assert {"decode", "validate", "cache", "route", "ingress_total", "queue", "compute", "forward_hop",
                "encode", "worker_total"} <= set(t), t
        assert t["forward_hop"] >= 0 and t["decode"] > 0
        n += 1
    x = np.load(dep.run_dir.parent / "models" / "digits" / "data" / "test.npz")["X"].astype(np.float32)
    for i in range(4):  # cached model: after the (missed) L2 lookup, handed over in-process as well
        feeds = {"pixels": x[i:i + 1] + np.float32(random.random())}
        res = await client.infer_result("digits", feeds, timeout_s=5)
        np.testing.assert_allclose(res.outputs["logits"], reference("digits", feeds)["logits"], rtol=1e-5,
                                   atol=1e-5)
        assert res.parameters["forward"] == "local" and res.parameters["timings_us"]["worker_decode"] == 0
        n += 1
    # the same worker still takes forwards over the bus (as from another ingress): those it decodes
    feeds = typed_input()
    fwd = (time.time() * 1000.0 + 5000.0, ("other", "typed", "1", "", "", "decode=0"), "")
    msg = await nc.request(f"{PREFIX}._w.{W}", typed_body(feeds), timeout=5,
                           headers=parse_block(_fwd_block(1, 5000.0, fwd, "")))
    check_typed(feeds, outputs_of(msg))
    assert decode_response(msg.data).parameters["forward"] == "bus"
    await reports.wait(lambda r: r[W].computed >= r0.computed + n + 1 and r[W].in_flight == 0,
                       what="a report counting every request")
    r1 = reports.latest[W]
    assert r1.computed - r0.computed == n + 1
    assert r1.decoded - r0.decoded == 1  # only the bus forward's body was decoded by the worker


async def test_an_idle_worker_runs_a_request_to_completion_and_keeps_its_result(env, dep):
    """One request at a time (nothing to batch with, nothing queued) is computed and answered in the call that
    received it (``run_now``): batch 1, inline, local, the full stage breakdown, counted computed by the worker
    and settled at the ingress (nothing pending). Its result fills the L1 (the same input again is a hit) and,
    with a request id, the worker's recent results (a retry of it is a dedupe ``hit``, not a second run)."""
    nc, client, reports = env
    r0 = await idle_report(reports)
    h0 = (await health_params(client))["counts"]
    for _ in range(5):
        feeds = typed_input(random.randint(1, 3))
        res = await client.infer_result("typed", feeds, timeout_s=5)
        check_typed(feeds, res.outputs)
        p = res.parameters
        assert (p["forward"], p["exec"], p["batch_size"], p["worker_id"]) == ("local", "inline", 1, W), p
        assert {"decode", "validate", "cache", "route", "ingress_total", "queue", "compute", "forward_hop",
                "encode", "worker_total"} <= set(p["timings_us"]), p["timings_us"]
    x = np.load(dep.run_dir.parent / "models" / "digits" / "data" / "test.npz")["X"].astype(np.float32)
    feeds = {"pixels": x[7:8] + np.float32(random.random())}
    first = await client.infer_result("digits", feeds, timeout_s=5)
    again = await client.infer_result("digits", feeds, timeout_s=5)
    for res in (first, again):
        np.testing.assert_allclose(res.outputs["logits"], reference("digits", feeds)["logits"], rtol=1e-5, atol=1e-5)
    assert first.parameters["cache_hit"] is False and again.parameters["cache_hit"] is True
    feeds, rid = typed_input(), uuid.uuid4().hex
    hdrs = {"Inferbus-Request-Id": rid, "Inferbus-Timeout-Ms": "5000"}
    once = await nc.request(f"{PREFIX}.infer.typed", typed_body(feeds), timeout=5, headers=hdrs)
    retry = await nc.request(f"{PREFIX}.infer.typed", typed_body(feeds), timeout=5, headers=hdrs)
    for m in (once, retry):
        assert decode_error(m.headers, m.data) is None
        check_typed(feeds, outputs_of(m))
        assert m.headers["Inferbus-Request-Id"] == rid
    assert "Inferbus-Dedup" not in once.headers and retry.headers["Inferbus-Dedup"] == "hit"
    h1 = (await health_params(client))["counts"]
    assert h1["run_now"] - h0["run_now"] == 5 + 1 + 1  # typed x5, the digits miss, the first copy of rid
    assert h1["l1_hits"] - h0["l1_hits"] == 1
    r1 = await idle_report(reports)
    assert r1.computed - r0.computed == 7 and r1.dedup_hits - r0.dedup_hits == 1
    assert (await health_params(client))["pending"] == 0


async def test_requests_that_wait_together_are_batched_not_run_one_by_one(env, dep):
    """64 requests published at once wait together in the ingress's subscription: the ingress holds each back
    while more wait (a burst) and the worker computes them as batches when the burst ends (some ``batch_size``
    > 1, each answer its own rows), all answered and settled (nothing pending). A copy of a request (same id and
    body) inside the burst is answered from the worker's recent results (a hit) or joins the original's run (a
    join, where the burst was split and the original still running): one model run for the two."""
    nc, client, reports = env
    r0 = await idle_report(reports)
    h0 = (await health_params(client))["counts"]
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    sent, rids = {}, {}
    for k in range(64):
        feeds = typed_input()
        sent[f"r{k}"] = feeds
        rids[k] = f"{uuid.uuid4().hex}-r{k}"
        await nc.publish(f"{PREFIX}.infer.typed", typed_body(feeds), reply=inbox,
                         headers={"Inferbus-Request-Id": rids[k], "Inferbus-Timeout-Ms": "5000"})
        if k == 40:  # a copy of request 5 in the same burst
            await nc.publish(f"{PREFIX}.infer.typed", typed_body(sent["r5"]), reply=inbox,
                             headers={"Inferbus-Request-Id": rids[5], "Inferbus-Timeout-Ms": "5000"})
    await nc.flush()
    sizes, dedup = [], []
    for _ in range(65):
        m = await sub.next_msg(timeout=10)
        assert decode_error(m.headers, m.data) is None
        check_typed(sent[m.headers["Inferbus-Request-Id"].rsplit("-", 1)[1]], outputs_of(m))
        sizes.append(decode_response(m.data).parameters["batch_size"])
        if "Inferbus-Dedup" in m.headers:
            dedup.append((m.headers["Inferbus-Request-Id"], m.headers["Inferbus-Dedup"]))
    await sub.unsubscribe()
    assert max(sizes) > 1, sizes
    # a hit where request 5's run had ended when its copy came; a join where it was still running (the burst was
    # split: a loaded host published the 65 slower than the worker ran them, 1 CI run in ~5): one run for both
    assert len(dedup) == 1 and dedup[0][0] == rids[5] and dedup[0][1] in ("hit", "join"), dedup
    h1 = (await health_params(client))["counts"]
    assert h1["burst_deferred"] > h0["burst_deferred"] and h1["burst_runs"] > h0["burst_runs"], h1
    assert h1["local_forwards"] - h0["local_forwards"] == 65
    r1 = await idle_report(reports)
    assert r1.computed - r0.computed == 64
    assert (r1.dedup_hits - r0.dedup_hits, r1.dedup_joins - r0.dedup_joins) == (
        (1, 0) if dedup[0][1] == "hit" else (0, 1))
    assert (await health_params(client))["pending"] == 0


async def test_a_burst_of_two_models_and_two_encodings_answers_each_in_its_own(env):
    """A burst that mixes models (``typed``, and ``strings`` with BYTES tensors) and encodings (msgpack, JSON with
    the id in the body): each request answered with its own rows, in its own content type, with its id."""
    nc, client, _ = env
    h0 = (await health_params(client))["counts"]
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    typed_sent = {}
    for k in range(30):
        if k % 3 == 2:
            body = json.dumps({"id": f"s{k}", "inputs": [
                {"name": "s", "datatype": "BYTES", "shape": [1, 1], "data": [f"w{k}"]}]}).encode()
            await nc.publish(f"{PREFIX}.infer.strings", body, reply=inbox,
                             headers={"Content-Type": "application/json", "Inferbus-Timeout-Ms": "5000"})
        else:
            feeds = typed_input()
            typed_sent[f"t{k}"] = feeds
            await nc.publish(f"{PREFIX}.infer.typed", typed_body(feeds), reply=inbox,
                             headers={"Inferbus-Request-Id": f"t{k}", "Inferbus-Timeout-Ms": "5000"})
    await nc.flush()
    seen = set()
    for _ in range(30):
        m = await sub.next_msg(timeout=10)
        assert decode_error(m.headers, m.data) is None
        rid = m.headers["Inferbus-Request-Id"]
        seen.add(rid)
        if rid.startswith("s"):
            assert m.headers["Content-Type"] == "application/json"
            resp = json.loads(m.data)
            assert resp["id"] == rid and resp["parameters"]["forward"] == "local"
            assert next(o for o in resp["outputs"] if o["name"] == "doubled")["data"] == [f"w{rid[1:]}" * 2]
        else:
            check_typed(typed_sent[rid], outputs_of(m))
    await sub.unsubscribe()
    assert len(seen) == 30
    h1 = (await health_params(client))["counts"]
    assert h1["local_forwards"] - h0["local_forwards"] == 30 and h1["burst_deferred"] > h0["burst_deferred"]
    assert (await health_params(client))["pending"] == 0


async def test_a_merged_run_holds_at_most_max_batch_size_rows(env, dep):
    """Requests of 10 rows that wait together are merged into model runs of at most ``max_batch_size`` (64) rows:
    6 requests a run at most; a request of 70 rows runs alone. Each answer its own rows."""
    nc, _, _ = env
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    sent = {}
    for k in range(40):
        feeds = typed_input(70 if k == 20 else 10)
        sent[f"m{k}"] = feeds
        await nc.publish(f"{PREFIX}.infer.typed", typed_body(feeds), reply=inbox,
                         headers={"Inferbus-Request-Id": f"m{k}", "Inferbus-Timeout-Ms": "5000"})
    await nc.flush()
    sizes = {}
    for _ in range(40):
        m = await sub.next_msg(timeout=10)
        assert decode_error(m.headers, m.data) is None
        rid = m.headers["Inferbus-Request-Id"]
        check_typed(sent[rid], outputs_of(m))
        sizes[rid] = decode_response(m.data).parameters["batch_size"]
    await sub.unsubscribe()
    assert sizes["m20"] == 1, sizes
    assert max(sizes.values()) > 1 and max(v for k, v in sizes.items() if k != "m20") <= 6, sizes


async def test_an_error_the_local_worker_answers_for_a_request_sent_to_this_ingress_counts_on_infer_at(env):
    """As on the bus path (test_bad_input): an error the colocated worker answered within the ingress's call (run to
    completion) for a request on ``<p>.ingresses.<id>.infer.<model>`` counts on ``infer_at``, not on ``infer``. (The
    fault: every computed request answered INTERNAL; the fixture clears it.)"""
    nc, _, _ = env
    await set_fault(nc, PREFIX, W, error_rate=1.0)
    feeds = typed_input()
    body = {"inputs": [{"name": k, "datatype": "INT32" if k == "a" else "FP16", "shape": list(v.shape),
                        "data": v.ravel().tolist()} for k, v in feeds.items()]}
    await check_worker_error_counts_on_infer_at(nc, PREFIX, "typed", body, "INTERNAL")


async def test_json_bytes_and_body_id_through_the_local_path(env):
    """A JSON request whose id is in the body only, for a BYTES model: answered in JSON with that id (body
    and header), the text conversion done for the runtime; non-UTF-8 bytes refused naming the field."""
    nc, _, _ = env
    body = json.dumps({"id": "body-id-1", "inputs": [
        {"name": "s", "datatype": "BYTES", "shape": [2, 1], "data": ["héllo", "wörld"]}]}).encode()
    msg = await nc.request(f"{PREFIX}.infer.strings", body, timeout=5, headers={"Content-Type": "application/json"})
    assert decode_error(msg.headers, msg.data) is None
    assert msg.headers["Content-Type"] == "application/json"
    assert msg.headers["Inferbus-Request-Id"] == "body-id-1"
    resp = json.loads(msg.data)
    assert resp["id"] == "body-id-1" and resp["parameters"]["forward"] == "local"
    doubled = next(o for o in resp["outputs"] if o["name"] == "doubled")
    assert doubled["data"] == ["héllohéllo", "wörldwörld"]
    msg = await nc.request(f"{PREFIX}.infer.strings", msgpack.packb({"inputs": [
        {"name": "s", "datatype": "BYTES", "shape": [1, 1], "data": [b"\xff\xfe\x00"]}]}), timeout=5,
        headers={"Inferbus-Request-Id": "bad-utf8"})
    err = decode_error(msg.headers, msg.data)
    assert isinstance(err, InvalidArgument) and err.field == "inputs[0].data" and "UTF-8" in err.message
    assert msg.headers["Inferbus-Request-Id"] == "bad-utf8"


async def test_request_id_duplicates_join_and_hit_through_the_local_path(env, dep):
    """A duplicate (same request id and body) arriving while the first copy computes joins it (one model run,
    two answers, the second marked ``join``); one arriving after it finished is answered from the worker's
    recent results (``hit``), with no second run."""
    nc, client, reports = env
    await set_fault(nc, dep.prefix, W, compute_delay_ms=600)
    r0 = await idle_report(reports)
    h0 = (await health_params(client))["counts"]
    feeds, rid = typed_input(), uuid.uuid4().hex
    body = typed_body(feeds)
    hdrs = {"Inferbus-Request-Id": rid, "Inferbus-Timeout-Ms": "5000"}
    first = asyncio.ensure_future(nc.request(f"{PREFIX}.infer.typed", body, timeout=5, headers=hdrs))
    await reports.wait(lambda r: r[W].in_flight >= 1, what="the first copy at the worker")
    second = await nc.request(f"{PREFIX}.infer.typed", body, timeout=5, headers=hdrs)
    first = await first
    for m in (first, second):
        assert decode_error(m.headers, m.data) is None
        check_typed(feeds, outputs_of(m))
        assert m.headers["Inferbus-Request-Id"] == rid
        assert decode_response(m.data).parameters["forward"] == "local"
    assert "Inferbus-Dedup" not in first.headers and second.headers["Inferbus-Dedup"] == "join"
    await set_fault(nc, dep.prefix, W)
    third = await nc.request(f"{PREFIX}.infer.typed", body, timeout=5, headers=hdrs)
    check_typed(feeds, outputs_of(third))
    assert third.headers["Inferbus-Dedup"] == "hit"
    r1 = await idle_report(reports)
    assert r1.computed - r0.computed == 1  # three answers, one model run
    assert r1.dedup_joins - r0.dedup_joins == 1 and r1.dedup_hits - r0.dedup_hits == 1
    h1 = (await health_params(client))["counts"]
    assert h1["local_forwards"] - h0["local_forwards"] == 3
    # the second copy went where the first was pending; the third, sent after the answer, also goes to the worker
    # that computed it (the ingress's memory of completed request ids) when that worker's report is fresh
    # (< 0.5 s; the fault's 600 ms compute can leave it older), else it is routed afresh — to the same, only worker
    assert h1["sticky_retries"] - h0["sticky_retries"] in (1, 2)
    assert (await health_params(client))["pending"] == 0  # every copy settled at the ingress


async def test_hedge_marked_copy_shed_locally_is_held_and_answered_once_by_the_ingress(env, dep):
    """A hedge-eligible request (``Inferbus-Hedge``) that the local worker sheds is not answered by the worker
    (held): the ingress, with no other worker to hedge to, answers the client itself, once. Without the
    mark the worker answers the shed itself."""
    nc, client, _ = env
    await set_fault(nc, dep.prefix, W, shed=True)
    h0 = (await health_params(client))["counts"]
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await nc.publish(f"{PREFIX}.infer.typed", typed_body(typed_input()), reply=inbox,
                     headers={"Inferbus-Hedge": "200", "Inferbus-Timeout-Ms": "2000"})
    msg = await sub.next_msg(timeout=5)
    err = decode_error(msg.headers, msg.data)
    assert isinstance(err, ResourceExhausted) and "no other worker could take it" in err.message, err
    # the plain request is shed by the worker itself (its own message)
    await nc.publish(f"{PREFIX}.infer.typed", typed_body(typed_input()), reply=inbox,
                     headers={"Inferbus-Timeout-Ms": "2000"})
    plain = decode_error((m := await sub.next_msg(timeout=5)).headers, m.data)
    assert isinstance(plain, ResourceExhausted) and "mailbox full" in plain.message, plain
    await sub.unsubscribe()  # nothing else arrived between the two: the held copy was answered once
    h1 = (await health_params(client))["counts"]
    assert h1["held"] - h0["held"] == 1 and h1["local_forwards"] - h0["local_forwards"] == 2


async def test_fencing_term_reaches_the_answer_through_the_local_path(env, dep):
    """The fencing term a primary region manager announces is stamped by the ingress and returned by the local
    worker (``parameters.term``), as over the bus. Last in this module: the deployment keeps the term."""
    nc, client, _ = env
    hb = RegionHeartbeat(region="ra", role="primary", term=7, lease_rev=7, seq=1, manager_id="test")
    for _ in range(100):
        await nc.publish(f"{PREFIX}._region.hb.ra", encode_region(hb))
        feeds = typed_input()
        res = await client.infer_result("typed", feeds, timeout_s=5)
        check_typed(feeds, res.outputs)
        assert res.parameters["forward"] == "local"
        if res.parameters["term"] == 7:
            break
    else:
        pytest.fail("the term never reached a local answer")


async def test_a_bus_forward_whose_budget_runs_out_in_the_workers_decode_is_refused(env):
    """A forward over the bus is decoded by the worker; a BYTES body of 600k elements takes it hundreds of ms.
    With 60 ms of budget left on arrival the worker refuses it DEADLINE_EXCEEDED after decoding, naming the
    stage, instead of running the model for an answer nobody waits for; the worker serves on."""
    nc, client, reports = env
    n = 600_000
    body = encode_request(InferRequest(inputs=[input_from_numpy("s", np.full((n, 1), b"x", dtype=object))]))
    fwd = (time.time() * 1000.0 + 60.0, ("other", "strings", "1", "", "", "decode=0"), "")
    msg = await nc.request(f"{PREFIX}._w.{W}", body, timeout=10, headers=parse_block(_fwd_block(7, 60.0, fwd, "")))
    err = decode_error(msg.headers, msg.data)
    assert err is not None and err.code.value == "DEADLINE_EXCEEDED", err
    assert "while the worker decoded the request" in err.message, err.message
    feeds = typed_input()
    check_typed(feeds, (await client.infer_result("typed", feeds, timeout_s=5)).outputs)


async def test_a_bus_forward_with_a_deadline_or_term_out_of_range_is_served_as_without_one(env):
    """A fresh-user trial sent the worker subject forwards whose ``deadline_unix_ms`` was ``inf`` or ``1e309``: the
    answer was a bare NATS 500 (``OverflowError``, no body, no typed error); a term of 20 digits ran the model and
    then failed the answer's encoding (INVALID_ARGUMENT for a request that was fine). A field out of range is now
    malformed, served as a forward without it (the deadline from ``timeout_ms``; no term, ``parameters.term`` 0)."""
    nc, client, _ = env
    feeds = typed_input()
    body = encode_request(InferRequest(inputs=[input_from_numpy(k, v) for k, v in feeds.items()]))
    ok_dl = f"{time.time() * 1000.0 + 5000.0:.1f}"
    for dl, term in (("inf", ""), ("1e309", ""), ("nan", ""), ("-inf", ""), (ok_dl, "99999999999999999999"),
                     (ok_dl, "-3")):
        fwd = f"v1;1;other;typed;1;5000;{dl};{term};;"
        msg = await nc.request(f"{PREFIX}._w.{W}", body, timeout=10, headers={"Inferbus-Fwd": fwd})
        assert decode_error(msg.headers, msg.data) is None, (fwd, msg.headers, msg.data[:300])
        res = decode_response(msg.data)
        assert res.parameters["term"] == 0, (fwd, res.parameters)
        check_typed(feeds, {o.name: output_to_numpy(o) for o in res.outputs})


async def test_a_request_far_larger_than_the_models_usual_is_not_run_on_the_loop(env, dep):
    """A user trial: 30,000 rows of a model priced at ~100 µs per request ran to completion on the colocated
    process's event loop (its ingress and worker frozen for seconds). Over the model's inline body bound it goes
    through the worker's queue to the inference thread; the next small request runs to completion again."""
    nc, client, reports = env
    x = np.load(dep.run_dir.parent / "models" / "digits" / "data" / "test.npz")["X"].astype(np.float32)
    big = np.tile(x, (20_000 // len(x) + 1, 1))[:20_000] + np.float32(random.random())  # uncached: a new input
    h0 = (await health_params(client))["counts"]
    for rows, expect in ((20_000, "thread"), (1, "inline")):
        feeds = {"pixels": big[:rows] + np.float32(rows)}
        res = await client.infer_result("digits", feeds, timeout_s=20)
        assert (res.parameters["forward"], res.parameters["exec"]) == ("local", expect), (rows, res.parameters)
        np.testing.assert_allclose(res.outputs["logits"], reference("digits", feeds)["logits"], rtol=1e-4, atol=1e-4)
    h1 = (await health_params(client))["counts"]
    assert h1["run_now"] - h0["run_now"] == 1, (h0, h1)  # the small one only
