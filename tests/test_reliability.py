"""Serving-path reliability against real processes (issue 5): health, circuit breakers, hedging, dedupe,
deadlines at every hop, overload shedding, abandoned requests.

One ``inferbus up`` deployment (2 CPU workers, fault injection on) is shared by the tests of this module;
each test sets its faults through the workers' control subject and clears them afterwards (the autouse
fixture also waits until both workers are healthy with closed breakers again).
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time
import uuid

import nats
import numpy as np
import pytest

from inferbus.actors import IngressConfig, WorkerConfig
from inferbus.bus import BusConfig
from inferbus.bus import headers as H
from inferbus.client import Client
from inferbus.schemas import (
    DeadlineExceeded, InferbusError, Internal, InvalidArgument, PayloadTooLarge, ResourceExhausted, Unavailable,
    decode_error, encode_request, input_from_numpy, InferRequest,
)
from inferbus.schemas._internal import FORWARD_TAG

from conftest import start_deployment, uvloop_backend as anyio_backend  # noqa: F401 (anyio_backend: uvloop only)
from test_reliability_lib import Reports, health_params, models_subset, reference, set_fault, wait_health

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

W0, W1 = "n1-w0", "n1-w1"
PREFIX = "rel"


@pytest.fixture(scope="module")
def dep(tmp_path_factory):
    root = tmp_path_factory.mktemp("rel")
    models = models_subset(root / "models", ["typed", "digits", "strings"], {
        "typed": {"cache_ttl_ms": 0}, "strings": {"cache_ttl_ms": 0},
        "digits": {"cache_ttl_ms": 0, "hedge_after_ms": "p95"},
    })
    d = start_deployment(root / "dep", workers=2, prefix=PREFIX, extra=[
        "--models", str(models), "--no-cache", "--fault-injection", "--health-window-s", "2",
        "--min-window-requests", "20", "--breaker-failures", "5", "--breaker-open-s", "1",
        "--health-timeout-s", "1.5", "--mailbox-size", "8", "--hedge-budget", "1.0"])
    yield d
    d.stop()


@pytest.fixture
async def env(dep):
    nc = await nats.connect(dep.nats_url)
    client = Client(nc, dep.prefix)
    reports = await Reports.start(nc, dep.prefix)
    await reports.wait(lambda r: {W0, W1} <= set(r), what="both workers reporting")
    pids = {w: r.pid for w, r in reports.latest.items()}
    yield nc, client, reports
    for w in (W0, W1):
        await set_fault(nc, dep.prefix, w)
    deadline = time.monotonic() + 15
    while True:  # healthy, breakers closed (a breaker closes only on a probe: keep a little traffic going)
        params = await health_params(client)
        if all(params["workers"][w]["health"] == "ok" and params["workers"][w]["breaker"] == "closed"
               for w in (W0, W1)):
            break
        assert time.monotonic() < deadline, f"workers not healthy again: {params['workers']}"
        try:
            await client.infer("typed", typed_input())
        except InferbusError:
            pass
        await asyncio.sleep(0.05)
    assert {w: r.pid for w, r in reports.latest.items()} == pids, "a worker process died"
    await reports.stop()
    await nc.close()


async def fresh_idle_reports(reports) -> dict:
    """Both workers' first reports sent after this call with nothing in flight (every computation finished
    before now is counted in them)."""
    old = dict(reports.latest)
    await reports.wait(lambda r: all(r[w] is not old.get(w) and r[w].in_flight == 0 for w in (W0, W1)),
                       what="fresh reports, nothing in flight")
    return {w: reports.latest[w] for w in (W0, W1)}


_counter = iter(range(10**9))


def typed_input(n: int = 1):
    """A typed-model input no other request sends (its answer is checkable: a*2 and sum(b))."""
    k = next(_counter) * 1000 + random.randrange(1000)
    a = (np.arange(n, dtype=np.int32) + k).reshape(n, 1)
    b = np.full((n, 4), 0.25, np.float16)
    return {"a": a, "b": b}


def check_typed(feeds, out):
    np.testing.assert_array_equal(out["a_times_2"], feeds["a"] * 2)
    np.testing.assert_array_equal(out["b_sum"], feeds["b"].astype(np.float32).sum(1, keepdims=True))


async def test_error_rate_takes_a_worker_out_and_back(env, dep):
    nc, client, reports = env
    await set_fault(nc, dep.prefix, W0, error_rate=0.15)
    internal = 0

    async def one():
        nonlocal internal
        try:
            await client.infer("typed", typed_input())
        except Internal:
            internal += 1

    for i in range(200):  # pairs: one in flight makes the other worker the cheaper pick, so w0 gets traffic
        await asyncio.gather(one(), one())  # (sequential requests could all go to w1 on a score tie-break)
        if i % 5 == 4 and (await health_params(client))["workers"][W0]["health"] == "error_rate":
            break
    else:
        pytest.fail("w0 never judged unhealthy by its error rate")
    assert internal >= 1
    # out of routing: every request is served by the healthy worker, none fails
    for _ in range(40):
        res = await client.infer_result("typed", typed_input())
        assert res.parameters["worker_id"] == W1
    # it recovers once its errors slide out of the 2 s window
    await set_fault(nc, dep.prefix, W0)
    await wait_health(client, lambda p: p["workers"][W0]["health"] == "ok", timeout_s=10, what="w0 healthy")
    seen = set()

    async def served_by():
        seen.add((await client.infer_result("typed", typed_input())).parameters["worker_id"])

    for _ in range(50):  # pairs, for the reason above
        await asyncio.gather(served_by(), served_by())
        if seen == {W0, W1}:
            break
    assert seen == {W0, W1}


async def test_breaker_opens_after_5_failures_probes_and_closes(env, dep):
    nc, client, reports = env
    # start from an empty error window, so the error-rate health check stays out of the breaker's way
    params = await wait_health(client, lambda p: p["workers"][W0]["window_requests"] == 0, timeout_s=5,
                               what="empty window")
    trips0 = params["workers"][W0]["breaker_trips"]
    await set_fault(nc, dep.prefix, W0, error_rate=1.0)
    failures = 0
    for _ in range(500):
        try:
            await client.infer("typed", typed_input())
        except Internal:
            failures += 1
            if failures == 4:
                assert (await health_params(client))["workers"][W0]["breaker"] == "closed"
            if failures == 5:
                break
    else:
        pytest.fail("w0 got fewer than 5 requests")
    # CLOSED -> OPEN after exactly 5 consecutive failures (the completion notice trails the reply a little)
    params = await wait_health(client, lambda p: p["workers"][W0]["breaker"] == "open", timeout_s=2, what="open")
    assert params["workers"][W0]["health"] == "breaker_open" and params["workers"][W0]["breaker_trips"] == trips0 + 1
    stats = json.loads((await nc.request("$SRV.STATS.inferbus-ingress", b"", timeout=2)).data)
    infer = next(e for e in stats["endpoints"] if e["name"] == "infer")
    assert infer["data"]["breakers"][W0] == "open" and infer["data"]["breakers"][W1] == "closed"
    t_open = time.monotonic()
    while time.monotonic() - t_open < 0.8:  # open: all traffic goes to w1
        res = await client.infer_result("typed", typed_input())
        assert res.parameters["worker_id"] == W1
    # after 1 s: half-open lets one probe through; it fails, the breaker opens again
    await wait_health(client, lambda p: p["workers"][W0]["breaker"] == "half_open", timeout_s=5, what="half-open")
    with pytest.raises(Internal):
        for _ in range(5):
            await client.infer("typed", typed_input())
    # opened again: its completion notice trails the reply a little, as for the trip above (a clean-clone CI run
    # read the health in between: 1 trip)
    params = await wait_health(client, lambda p: p["workers"][W0]["breaker_trips"] >= trips0 + 2, timeout_s=2,
                               what="open again")
    assert params["workers"][W0]["breaker_trips"] == trips0 + 2
    # the worker recovers; the next probe succeeds and closes the breaker
    await set_fault(nc, dep.prefix, W0)
    await wait_health(client, lambda p: p["workers"][W0]["breaker"] == "half_open", timeout_s=5, what="half-open")
    res = await client.infer_result("typed", typed_input())
    assert res.parameters["worker_id"] == W0  # the probe goes first
    # its completion notice, which closes the breaker, trails the reply a little (as for the trip above)
    await wait_health(client, lambda p: p["workers"][W0]["breaker"] == "closed", timeout_s=2, what="closed")


async def test_client_errors_never_trip_a_breaker(env, dep):
    nc, client, reports = env
    errors0 = {w: r.errors for w, r in reports.latest.items()}
    big = np.array([[b"x" * (4 * 1024 * 1024 + 512)]], dtype=object)  # 'doubled' answer over max_payload
    for _ in range(6):
        t0 = time.perf_counter()
        with pytest.raises(PayloadTooLarge):
            await client.infer("strings", {"s": big}, outputs=["doubled"], timeout_s=5)
        assert time.perf_counter() - t0 < 1.0  # an error reply, not a silent timeout
    for _ in range(6):  # refused by the worker's runtime as a client error (not UTF-8)
        with pytest.raises(InvalidArgument) as ei:
            await client.infer("strings", {"s": np.array([[b"\xff\xfe"]], dtype=object)})
        assert ei.value.field == "inputs[0].raw"
    params = await health_params(client)
    for w in (W0, W1):
        assert params["workers"][w]["breaker"] == "closed" and params["workers"][w]["consecutive_failures"] == 0
        # (quiet: a report later than 0.75 s on a loaded box, not an error verdict)
        assert params["workers"][w]["health"] in ("ok", "quiet")
    await asyncio.sleep(0.3)  # a report or two
    assert {w: r.errors for w, r in reports.latest.items()} == errors0  # nothing counted as the workers' fault


async def test_silent_worker_is_taken_out_and_back(env, dep):
    nc, client, reports = env
    await set_fault(nc, dep.prefix, W0, silent=True)
    t0 = time.monotonic()
    # quiet past half the health timeout (0.75 s): still live, no longer routable
    params = await wait_health(client, lambda p: p["workers"][W0]["health"] in ("quiet", "silent"), timeout_s=5,
                               what="w0 quiet")
    t_quiet = time.monotonic() - t0
    assert params["workers"][W0]["health"] == "quiet", params["workers"][W0]
    assert 0.5 <= t_quiet < 1.5 and params["workers"][W1]["health"] == "ok", (t_quiet, params["workers"])
    assert (await client.health(timeout_s=2)).ready  # W1 serves every model
    await wait_health(client, lambda p: p["workers"][W0]["health"] == "silent", timeout_s=5, what="w0 silent")
    assert time.monotonic() - t0 >= 1.0  # after health_timeout_s (1.5 s) without a report
    for _ in range(20):
        assert (await client.infer_result("typed", typed_input())).parameters["worker_id"] == W1
    await set_fault(nc, dep.prefix, W0)
    await wait_health(client, lambda p: p["workers"][W0]["health"] == "ok", timeout_s=5, what="w0 reporting")


async def test_hedge_beats_a_slow_worker_and_runs_the_model_at_most_twice(env, dep):
    nc, client, reports = env
    await set_fault(nc, dep.prefix, W0, compute_delay_ms=400)
    before = await fresh_idle_reports(reports)
    hedges0 = (await health_params(client))["counts"]["hedges"]
    n = 24
    latencies = []

    async def timed():
        feeds = typed_input()
        t0 = time.perf_counter()
        res = await client.infer_result("typed", feeds, hedge=30, timeout_s=3)
        latencies.append(time.perf_counter() - t0)
        check_typed(feeds, res.outputs)

    for _ in range(n // 2):  # pairs: with equal load the second of a pair goes to the other worker, so w0 gets half
        await asyncio.gather(timed(), timed())
    # concurrent hedged requests: every answer is its own (a loser's reply never reaches another request)
    sem = asyncio.Semaphore(4)

    async def one():
        async with sem:
            feeds = typed_input(3)
            check_typed(feeds, await client.infer("typed", feeds, hedge=30, timeout_s=3))
    await asyncio.gather(*(one() for _ in range(24)))
    params = await health_params(client)
    assert params["counts"]["hedges"] >= 1 and params["counts"]["hedge_cancels"] >= 1
    assert max(latencies) < 0.35, latencies  # never waited for the 400 ms worker
    await asyncio.sleep(0.6)  # let w0 finish its delayed batches and report
    await reports.wait(lambda r: r[W0].in_flight == 0, what="w0 idle")
    ran = sum(reports.latest[w].computed - before[w].computed for w in (W0, W1))
    cancelled = reports.latest[W0].cancelled - before[W0].cancelled
    hedges = params["counts"]["hedges"] - hedges0
    assert hedges <= n + 24  # one hedge per request at most
    assert ran <= (n + 24) + hedges, (ran, hedges)  # each request once, plus once per hedge sent: never more
    assert cancelled >= 1  # hedge losers still queued were dropped without running the model
    print(f"hedged: {n + 24} requests, model ran {ran} times, {cancelled} losers dropped before compute, "
          f"max sequential latency {max(latencies) * 1000:.0f} ms")


async def test_hedge_never_lets_a_shed_copy_answer_before_the_other_worker(env, dep):
    """A hedge-marked copy shed by its worker (mailbox full) is not answered RESOURCE_EXHAUSTED while
    another worker can answer: the ingress hedges it at once; a shed hedge copy never races the primary's
    answer; when every worker sheds, exactly one RESOURCE_EXHAUSTED per request, at once."""
    nc, client, reports = env
    await set_fault(nc, dep.prefix, W0, shed=True)  # sheds everything and reports an empty queue
    before = await fresh_idle_reports(reports)
    counts0 = (await health_params(client))["counts"]
    # without hedging, what w0 gets is refused: this is what hedging must hide. Concurrent pairs: the second
    # of a pair goes to the worker without the first (in flight counts), so w0 gets one of each pair; sequential
    # requests would all go to the worker with the lower EWMA but for the router's 10 % random tie-breaks.
    refused = 0

    async def unhedged():
        nonlocal refused
        try:
            await client.infer("typed", typed_input(), hedge="off")
        except ResourceExhausted:
            refused += 1

    for _ in range(10):
        await asyncio.gather(unhedged(), unhedged())
        if refused:
            break
    assert refused == 1, f"w0 got {refused} requests of a pair (expected exactly one): the test would prove nothing"

    async def one(hedge_ms=5000):  # 5 s: over the budget, so no timed hedge; only a shed one
        feeds = typed_input()
        check_typed(feeds, await client.infer("typed", feeds, hedge=hedge_ms, timeout_s=3))

    for _ in range(20):  # pairs: the shedding worker looks idle, so it gets a request of each pair
        await asyncio.gather(one(), one())
    await fresh_idle_reports(reports)
    counts = (await health_params(client))["counts"]
    shed = reports.latest[W0].shed - before[W0].shed - refused  # hedge-marked copies shed
    assert shed >= 15 and counts["held"] - counts0["held"] == shed, (shed, counts["held"] - counts0["held"])
    assert counts["hedges_on_refusal"] - counts0["hedges_on_refusal"] == shed

    # the hedge copy shed while the primary (slow) still runs: the client gets the primary's answer
    await set_fault(nc, dep.prefix, W1, compute_delay_ms=150)
    await set_fault(nc, dep.prefix, W0, shed=True)
    held0 = (await health_params(client))["counts"]["held"]
    for _ in range(4):
        await asyncio.gather(one(30), one(30))
    assert (await health_params(client))["counts"]["held"] > held0

    # both workers shed: one typed error per request, from the ingress, at once
    await set_fault(nc, dep.prefix, W1, shed=True)
    inbox = nc.new_inbox()
    got: list = []
    first = asyncio.Event()

    async def on_reply(m):
        got.append(m)
        first.set()

    sub = await nc.subscribe(inbox, cb=on_reply)
    body = encode_request(InferRequest(inputs=[input_from_numpy(k, v) for k, v in typed_input().items()]))
    t0 = time.perf_counter()
    await nc.publish("rel.infer.typed", body, reply=inbox, headers={H.HEDGE: "20", H.TIMEOUT_MS: "2000"})
    await asyncio.wait_for(first.wait(), 2)
    took = time.perf_counter() - t0
    err = decode_error(got[0].headers, got[0].data)
    assert isinstance(err, ResourceExhausted) and err.retry_after_ms, err
    assert took < 0.5, took  # at once, not after the hedge delay's budget
    # nothing else arrives: the ingress forgot the request (pending 0), and the workers replied to nobody
    await wait_health(client, lambda p: p["pending"] == 0, timeout_s=5, what="pending 0")
    await fresh_idle_reports(reports)
    await nc.flush()
    assert len(got) == 1, [m.data for m in got]
    await sub.unsubscribe()


async def test_hedge_after_observed_p95_per_model(env, dep):
    nc, client, reports = env
    x = np.load(dep.run_dir.parent / "models" / "digits" / "data" / "test.npz")["X"].astype(np.float32)
    for i in range(40):  # observations for the p95
        await client.infer("digits", {"pixels": x[i:i + 1] + np.float32(random.random() * 1e-3)})
    params = await health_params(client)
    p95 = params["latency"]["digits:1"]["p95_ms"]
    assert p95 is not None and p95 < 100
    hedges0 = params["counts"]["hedges"]
    await set_fault(nc, dep.prefix, W0, compute_delay_ms=300)
    worst = 0.0

    async def timed(i):
        nonlocal worst
        feeds = {"pixels": x[i:i + 1] + np.float32(random.random())}
        t0 = time.perf_counter()
        out = await client.infer("digits", feeds, timeout_s=3)
        worst = max(worst, time.perf_counter() - t0)
        np.testing.assert_allclose(out["logits"], reference("digits", feeds)["logits"], rtol=1e-5, atol=1e-5)

    # pairs first: with one request in flight on one worker the other is the cheaper pick, so the slow w0
    # gets work whatever its EWMA was before the fault (sequential requests could all go to w1: no hedge to
    # see); only 3, so w0's small mailbox (8) never fills with 300 ms computations on a loaded box
    for i in range(0, 6, 2):
        await asyncio.gather(timed(i), timed(i + 1))
    for i in range(6, 16):
        await timed(i)
    assert (await health_params(client))["counts"]["hedges"] > hedges0
    assert worst < 0.25, worst


async def test_timeout_then_retry_with_same_id_runs_the_model_once(env, dep):
    nc, client, reports = env
    for w in (W0, W1):
        await set_fault(nc, dep.prefix, w, compute_delay_ms=1500)
    await reports.wait(lambda r: all(r[w].in_flight == 0 for w in (W0, W1)), what="idle")
    ran0, joins0 = reports.computed(), sum(r.dedup_joins for r in reports.latest.values())
    feeds, rid = typed_input(), uuid.uuid4().hex
    t0 = time.perf_counter()
    with pytest.raises(DeadlineExceeded):
        await client.infer("typed", feeds, request_id=rid, timeout_s=1.0)
    assert 0.9 < time.perf_counter() - t0 < 1.3
    res = await client.infer_result("typed", feeds, request_id=rid, timeout_s=3.0)
    took = time.perf_counter() - t0
    check_typed(feeds, res.outputs)
    assert took < 2.4, took  # it joined the computation in progress (~1.5 s), it did not start another
    for w in (W0, W1):
        await set_fault(nc, dep.prefix, w)
    await reports.wait(lambda r: all(r[w].in_flight == 0 for w in (W0, W1)), what="idle")
    await reports.wait(lambda r: reports.computed() >= ran0 + 1, what="report of the run")
    assert reports.computed() - ran0 == 1  # the model ran once for every attempt of the two calls
    # the second call joined; so did the first call's own retry after its attempt timeout (same id)
    assert sum(r.dedup_joins for r in reports.latest.values()) - joins0 >= 1
    # the late reply of the first attempt never reaches a later request
    for _ in range(10):
        other = typed_input()
        check_typed(other, await client.infer("typed", other))


async def test_deadline_is_enforced_at_every_hop(env, dep):
    nc, client, reports = env
    p = dep.prefix
    feeds = typed_input()
    body = encode_request(InferRequest(inputs=[input_from_numpy(k, v) for k, v in feeds.items()]))
    await reports.wait(lambda r: all(r[w].in_flight == 0 for w in (W0, W1)), what="idle")
    ran0 = reports.computed()
    # 1. ingress: a spent budget is refused on arrival, nothing is forwarded
    msg = await nc.request(f"{p}.infer.typed", body, timeout=2, headers={"Inferbus-Timeout-Ms": "0"})
    assert isinstance(decode_error(msg.headers, msg.data), DeadlineExceeded)
    # 2. the ingress rewrites the remaining budget on the forwarded copy (sniffed off the worker subject)
    sniff = await nc.subscribe(f"{p}._w.*")
    ok = await nc.request(f"{p}.infer.typed", body, timeout=2, headers={"Inferbus-Timeout-Ms": "500"})
    assert decode_error(ok.headers, ok.data) is None
    fwd = await sniff.next_msg(timeout=2)
    await sniff.unsubscribe()
    assert set(fwd.headers) <= {"Inferbus-Fwd", "Content-Type", "Inferbus-Request-Id"}  # one routing header
    fields = H.parse_fwd(fwd.headers["Inferbus-Fwd"], fwd.headers)
    left = float(fields["Inferbus-Timeout-Ms"])
    assert 0 < left < 500 and "Inferbus-Deadline-Unix-Ms" in fields
    # 3. worker: a forwarded request whose budget is spent is answered without any work
    fwd_h = {"Inferbus-Msg": FORWARD_TAG, "Inferbus-Model": "typed", "Inferbus-Version": "1",
             "Inferbus-Timeout-Ms": "0"}
    expired0 = reports.latest[W0].expired
    msg = await nc.request(f"{p}._w.{W0}", body, timeout=2, headers=fwd_h)
    assert isinstance(decode_error(msg.headers, msg.data), DeadlineExceeded)
    # 4. worker: a request whose budget runs out while queued is dropped before compute
    await set_fault(nc, p, W0, compute_delay_ms=300)
    a = asyncio.create_task(nc.request(f"{p}._w.{W0}", body, timeout=3, headers={**fwd_h, "Inferbus-Timeout-Ms": "2000"}))
    await asyncio.sleep(0.05)
    t0 = time.perf_counter()
    b = await nc.request(f"{p}._w.{W0}", body, timeout=3, headers={**fwd_h, "Inferbus-Timeout-Ms": "100"})
    assert isinstance(decode_error(b.headers, b.data), DeadlineExceeded)
    assert time.perf_counter() - t0 < 1.0
    assert decode_error((await a).headers, (await a).data) is None
    await set_fault(nc, p, W0)
    await reports.wait(lambda r: r[W0].expired >= expired0 + 2 and r[W0].in_flight == 0, what="expired counted")
    await reports.wait(lambda r: reports.computed() >= ran0 + 2, what="runs reported")
    assert reports.computed() - ran0 == 2  # the sniffed request and request A; never the expired ones
    # 5. the client: its own budget covers everything (no answer in time -> DEADLINE_EXCEEDED, not a hang)
    await set_fault(nc, p, W0, compute_delay_ms=500)
    await set_fault(nc, p, W1, compute_delay_ms=500)
    t0 = time.perf_counter()
    with pytest.raises(DeadlineExceeded):
        await client.infer("typed", typed_input(), timeout_s=0.2)
    assert time.perf_counter() - t0 < 0.4


async def test_overload_is_shed_at_once_and_counts_return_to_zero(env, dep):
    nc, client, reports = env
    for w in (W0, W1):
        await set_fault(nc, dep.prefix, w, compute_delay_ms=200)
    strict = Client(nc, dep.prefix, retry_unavailable=False)
    outcomes = []

    async def one():
        feeds = typed_input()
        t0 = time.perf_counter()
        try:
            check_typed(feeds, await strict.infer("typed", feeds, timeout_s=5))
            outcomes.append(("ok", time.perf_counter() - t0, None))
        except InferbusError as err:
            outcomes.append((err.code.value, time.perf_counter() - t0, err.retry_after_ms))

    await asyncio.gather(*(one() for _ in range(80)))
    shed = [o for o in outcomes if o[0] == "RESOURCE_EXHAUSTED"]
    ok = [o for o in outcomes if o[0] == "ok"]
    assert len(shed) + len(ok) == len(outcomes), {o[0] for o in outcomes}
    assert shed and len(ok) >= 2 * 8
    # shed at once, not after queueing behind the 200 ms batches: the typical shed well under one batch, and
    # none near the 5 s budget (one scheduler stall of the loaded 2-core CI box once took a shed to 0.88 s)
    shed_s = sorted(dt for _, dt, _ in shed)
    assert shed_s[len(shed_s) // 2] < 0.2 and shed_s[-1] < 1.5, shed_s
    assert all(ra and ra > 0 for _, _, ra in shed)
    for w in (W0, W1):
        await set_fault(nc, dep.prefix, w)
    await reports.wait(lambda r: all(r[w].in_flight == 0 and r[w].queue_depth == 0 for w in (W0, W1)), what="drained")
    await wait_health(client, lambda p: p["pending"] == 0, timeout_s=5, what="ingress pending 0")
    print(f"overload: {len(ok)} ok, {len(shed)} shed (max {max(dt for _, dt, _ in shed) * 1000:.0f} ms)")


async def test_abandoned_requests_leave_nothing_in_flight(env, dep):
    nc, client, reports = env
    for w in (W0, W1):
        await set_fault(nc, dep.prefix, w, compute_delay_ms=20)
    rng = random.Random(5)

    async def abandon():
        for _ in range(25):
            task = asyncio.create_task(client.infer("typed", typed_input(), timeout_s=2))
            await asyncio.sleep(rng.uniform(0.005, 0.05))
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, InferbusError):
                pass

    await asyncio.gather(*(abandon() for _ in range(6)))
    # and one client that disconnects with requests in flight
    nc2 = await nats.connect(dep.nats_url)
    c2 = Client(nc2, dep.prefix)
    tasks = [asyncio.create_task(c2.infer("typed", typed_input(), timeout_s=2)) for _ in range(8)]
    await asyncio.sleep(0.01)
    await nc2.close()
    await asyncio.gather(*tasks, return_exceptions=True)
    for w in (W0, W1):
        await set_fault(nc, dep.prefix, w)
    await reports.wait(lambda r: all(r[w].in_flight == 0 and r[w].queue_depth == 0 for w in (W0, W1)),
                       timeout_s=10, what="workers' in-flight back to 0")
    await wait_health(client, lambda p: p["pending"] == 0 and all(p["workers"][w]["in_flight"] == 0 for w in (W0, W1)),
                      timeout_s=10, what="ingress in-flight back to 0")
    seen = set()
    sem = asyncio.Semaphore(4)

    async def one():
        async with sem:
            seen.add((await client.infer_result("typed", typed_input())).parameters["worker_id"])
    await asyncio.gather(*(one() for _ in range(60)))
    assert seen == {W0, W1}


# ---- readiness and no live worker: separate processes on a bare nats-server -------------------------------
@pytest.mark.timeout(90)
async def test_no_live_worker_fast_unavailable_then_ready_means_reachable(nats_server, tmp_path):
    prefix = "rdy"
    models = models_subset(tmp_path / "models", ["typed"])
    bus = BusConfig(servers=(nats_server.url,), prefix=prefix)
    ing = subprocess.Popen([sys.executable, "-m", "inferbus.actors", "ingress",
                            IngressConfig(ingress_id="i0", bus=bus, models_dir=str(models)).to_json()],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    wrk = None
    try:
        assert ing.stdout.readline().strip() == b"READY"
        client = await Client.connect(nats_server.url, prefix, retry_unavailable=False)
        assert not (await client.health()).ready
        for _ in range(3):
            t0 = time.perf_counter()
            with pytest.raises(Unavailable):
                await client.infer("typed", typed_input(), timeout_s=2)
            assert time.perf_counter() - t0 < 0.1
        assert (await client.health()).parameters["counts"]["unavailable"] == 3
        wrk = subprocess.Popen([sys.executable, "-m", "inferbus.actors", "worker",
                                WorkerConfig(worker_id="w0", bus=bus, models_dir=str(models)).to_json()],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not (await client.health()).ready:
            assert time.monotonic() < deadline, "never ready"
            await asyncio.sleep(0.01)
        feeds = typed_input()  # ready means the worker's subscription is visible: the first request succeeds
        check_typed(feeds, await client.infer("typed", feeds))
        await client.close()
    finally:
        for p in (wrk, ing):
            if p is not None:
                p.terminate()
                p.wait(10)


def _typed_body() -> bytes:
    return encode_request(InferRequest(inputs=[input_from_numpy(k, v) for k, v in typed_input().items()]))


async def test_requests_late_behind_a_long_legal_batch_do_not_open_the_breaker(env, dep):
    """A fresh-user trial (2026-12-02): small requests queued behind one legal multi-second request were counted
    lost past their deadline + ``pending_grace_s``, and five of them opened a busy, reporting worker's breaker.
    Now a request late behind a batch its worker is still computing within that batch's own budget is
    ``lost_while_busy`` (not blamed); a batch computing past every deadline in it still is ("lost")."""
    nc, client, reports = env
    p = dep.prefix
    await reports.wait(lambda r: all(r[w].in_flight == 0 for w in (W0, W1)), what="idle")
    for w in (W0, W1):
        await set_fault(nc, p, w, compute_delay_ms=3500)
    c0 = (await health_params(client))["counts"]
    # one long request per worker, 12 s budget each: computing within budget for 3.5 s
    longs = [asyncio.ensure_future(nc.request(f"{p}.infer.typed", _typed_body(), timeout=12,
                                              headers={"Inferbus-Timeout-Ms": "12000"})) for _ in range(2)]
    await reports.wait(lambda r: all(r[w].computing_ms > 0 for w in (W0, W1)), what="both computing")
    assert not any(reports.latest[w].computing_overdue for w in (W0, W1))
    # small requests, 0.3 s budget, queued behind them: late for a legal reason
    smalls = [asyncio.ensure_future(nc.request(f"{p}.infer.typed", _typed_body(), timeout=1,
                                               headers={"Inferbus-Timeout-Ms": "300"})) for _ in range(10)]
    await asyncio.gather(*smalls, return_exceptions=True)
    # every small request settled (a clean-clone run: 8 of the 10 forgotten as late, 2 answered otherwise), none
    # of them blamed on its worker
    params = await wait_health(client, lambda q: q["pending"] == 0 and q["counts"]["lost_while_busy"] > c0[
        "lost_while_busy"], timeout_s=5, what="the small requests forgotten as late behind a busy worker")
    assert params["counts"]["lost"] == c0["lost"], params["counts"]
    assert all(params["workers"][w]["breaker"] == "closed" for w in (W0, W1)), params["workers"]
    for f in longs:  # the long requests are answered
        msg = await f
        assert decode_error(msg.headers, msg.data) is None
    # the same wait with no request in the batch still within its budget: overdue, blamed
    await reports.wait(lambda r: all(r[w].in_flight == 0 for w in (W0, W1)), what="idle")
    c1 = (await health_params(client))["counts"]
    smalls = [asyncio.ensure_future(nc.request(f"{p}.infer.typed", _typed_body(), timeout=1,
                                               headers={"Inferbus-Timeout-Ms": "300"})) for _ in range(4)]
    await asyncio.gather(*smalls, return_exceptions=True)
    await reports.wait(lambda r: any(r[w].computing_overdue for w in (W0, W1)), what="an overdue batch reported")
    params = await wait_health(client, lambda q: q["counts"]["lost"] - c1["lost"] >= 4, timeout_s=3,
                               what="the requests behind an overdue batch counted lost")
    assert params["counts"]["lost_while_busy"] == c1["lost_while_busy"], params["counts"]
