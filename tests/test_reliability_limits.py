"""Admission limits of the ingress against real processes (issue 5): rate limits split across ingress
replicas, and the bound on requests waiting in the ingress's own subscription buffer (the backlog)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time

import numpy as np
import pytest

from conftest import MODELS, uvloop_backend as anyio_backend  # noqa: F401 (anyio_backend: uvloop only)
from inferbus.actors import IngressConfig, Node, NodeConfig
from inferbus.actors._node import _per_replica
from inferbus.bus import BusConfig
from inferbus.client import Client
from inferbus.schemas import (DeadlineExceeded, InferbusError, InvalidArgument, PayloadTooLarge, ResourceExhausted,
                              decode_error)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]


def test_rate_limits_split_per_replica_and_nonsense_refused():
    split = _per_replica({"rate_limit_per_s": 1, "rate_burst": 1, "client_rate_limit_per_s": 10,
                          "client_rate_burst": 4, "max_pending": 7}, 2)
    assert split == {"rate_limit_per_s": 0.5, "rate_burst": 1.0,  # 0.5 clamped: a bucket holds one request
                     "client_rate_limit_per_s": 5.0, "client_rate_burst": 2.0, "max_pending": 7}
    # burst 0 = one second of the node's rate, split like the rate
    assert _per_replica({"client_rate_limit_per_s": 30}, 3) == {"client_rate_limit_per_s": 10.0,
                                                                 "client_rate_burst": 10.0}
    assert _per_replica({}, 4) == {}
    bus = BusConfig(servers=("nats://127.0.0.1:1",))
    for bad in ({"rate_limit_per_s": -1}, {"rate_limit_per_s": float("nan")}, {"client_rate_burst": float("inf")},
                {"rate_limit_per_s": 10, "rate_burst": 0.5}, {"client_rate_burst": 5}, {"rate_burst": "10"},
                {"rate_limit_per_s": 1e300}, {"client_rate_limit_per_s": 10, "client_rate_burst": 1e10}):
        with pytest.raises(ValueError, match="rate"):
            NodeConfig(models_dir=str(MODELS), ingress_options=bad)
        if not isinstance(bad.get("rate_burst"), str):
            with pytest.raises(ValueError, match="rate"):
                IngressConfig(ingress_id="i", bus=bus, models_dir=str(MODELS), **bad)
    for bad in ({"max_backlog_msgs": 0}, {"max_backlog_msgs": 10**7}, {"max_backlog_bytes": 0}, {"max_pending": 0},
                {"max_pending": 10**20}, {"l2_pool_size": 10**6}, {"breaker_open_s": float("inf")}):
        with pytest.raises(ValueError):
            IngressConfig(ingress_id="i", bus=bus, models_dir=str(MODELS), **bad)


def typed_feeds(k: int) -> dict:
    return {"a": np.full((1, 1), k, np.int32), "b": np.full((1, 4), 0.25, np.float16)}


async def _health_by_replica(client: Client, n: int) -> dict[str, dict]:
    """Health parameters of each of ``n`` ingress replicas (the queue group answers from one at a time)."""
    seen: dict[str, dict] = {}
    deadline = time.monotonic() + 20
    while len(seen) < n:
        assert time.monotonic() < deadline, f"only replicas {sorted(seen)} answered"
        p = (await client.health(timeout_s=2)).parameters
        seen[p["ingress_id"]] = p
    return seen


async def test_rate_limits_with_more_ingress_replicas_than_burst(nats_server, tmp_path):
    """``--rate-burst 1 --ingress 2`` used to crash the ingresses at start (a bucket of 0.5); now each replica
    gets half of the node's rates and a burst of at least 1, and the node as a whole admits its limit."""
    cfg = NodeConfig(models_dir=str(MODELS), models=("typed",), workers=1, ingress=2, nats_url=nats_server.url,
                     no_cache=True, prefix="rl", run_dir=str(tmp_path / "run"),
                     ingress_options={"rate_limit_per_s": 1, "rate_burst": 1, "client_rate_limit_per_s": 10,
                                      "client_rate_burst": 4})
    async with Node(cfg) as node:
        await node.wait_ready(60)
        client = await Client.connect(nats_server.url, "rl", client_id="c1")
        try:
            replicas = await _health_by_replica(client, 2)
            for p in replicas.values():
                rl = p["rate_limit"]
                assert (rl["rate_per_s"], rl["burst"]) == (0.5, 1.0), rl
                assert (rl["client_rate_per_s"], rl["client_burst"]) == (5.0, 2.0), rl
            # the node's global bucket: 1 request now per replica (2 in all) plus 1 per second of refill
            t0 = time.monotonic()
            outcomes = await asyncio.gather(*(client.infer("typed", typed_feeds(k), timeout_s=5) for k in range(8)),
                                            return_exceptions=True)
            elapsed = time.monotonic() - t0
            ok = [o for o in outcomes if isinstance(o, dict)]
            refused = [o for o in outcomes if isinstance(o, ResourceExhausted)]
            assert len(ok) + len(refused) == len(outcomes), outcomes
            assert 1 <= len(ok) <= 2 + math.ceil(elapsed * 1.0), (len(ok), elapsed)
            assert all(e.retry_after_ms and e.retry_after_ms > 0 for e in refused)
            for k, o in zip(range(8), outcomes):
                if isinstance(o, dict):
                    np.testing.assert_array_equal(o["a_times_2"], typed_feeds(k)["a"] * 2)
        finally:
            await client.close()


async def test_an_oversized_body_is_refused_as_too_large_before_the_rate_limit(nats_server, tmp_path):
    """A body over ``max_request_bytes`` can never be served: it is refused PAYLOAD_TOO_LARGE (not
    RESOURCE_EXHAUSTED with a retry hint) even when the rate limit has no token left, and it takes no token:
    with a bucket of one, a request of the right size after it is still served."""
    cfg = NodeConfig(models_dir=str(MODELS), models=("typed",), workers=1, ingress=1, nats_url=nats_server.url,
                     no_cache=True, prefix="rl2", run_dir=str(tmp_path / "run"),
                     ingress_options={"rate_limit_per_s": 0.01, "rate_burst": 1, "max_request_bytes": 2048})
    async with Node(cfg) as node:
        await node.wait_ready(60)
        client = await Client.connect(nats_server.url, "rl2", client_id="c1")
        try:
            big = {"a": np.ones((200, 1), np.int32), "b": np.full((200, 4), 0.25, np.float16)}  # > 2048 bytes
            for _ in range(3):
                with pytest.raises(PayloadTooLarge):
                    await client.infer("typed", big, timeout_s=5)
            out = await client.infer("typed", typed_feeds(3), timeout_s=5)  # the bucket's one token is still there
            np.testing.assert_array_equal(out["a_times_2"], typed_feeds(3)["a"] * 2)
            with pytest.raises(PayloadTooLarge):  # the bucket is empty now: still too large, not rate limited
                await client.infer("typed", big, timeout_s=5)
            with pytest.raises(ResourceExhausted):
                await client.infer("typed", typed_feeds(4), timeout_s=5)
            # a client id longer than a bucket's key may be (a user trial: no limit, 100,000 buckets kept) is the
            # client's error, named, not a bucket and not a rate limit (the bucket is empty here)
            long_id = await Client.connect(nats_server.url, "rl2", client_id="c" * 256)  # the limit itself is taken
            try:
                with pytest.raises(ResourceExhausted):
                    await long_id.infer("typed", typed_feeds(5), timeout_s=5)
                long_id.client_id = "c" * 257  # (past the constructor's own check of the same limit)
                with pytest.raises(InvalidArgument) as e:
                    await long_id.infer("typed", typed_feeds(5), timeout_s=5)
                assert e.value.field == "Inferbus-Client-Id" and "257 characters" in str(e.value), e.value
            finally:
                await long_id.close()
            with pytest.raises(ValueError, match=r"at most 256 characters\) or None \(this one has 257\), got"):
                Client(client.nc, "rl2", client_id="c" * 257)
            with pytest.raises(ValueError, match="leading or trailing whitespace"):
                Client(client.nc, "rl2", client_id=" lead")
        finally:
            await client.close()


async def test_ingress_backlog_is_bounded_and_refused_at_once(nats_server, tmp_path):
    """A burst far above ``max_backlog_msgs`` on one ingress: some requests are refused RESOURCE_EXHAUSTED
    (with a retry-after hint) at once, none times out, every other one gets its own answer, and afterwards
    nothing is left pending or waiting."""
    cfg = NodeConfig(models_dir=str(MODELS), models=("typed",), workers=1, ingress=1, nats_url=nats_server.url,
                     no_cache=True, prefix="bl", run_dir=str(tmp_path / "run"),
                     ingress_options={"max_backlog_msgs": 4})
    async with Node(cfg) as node:
        await node.wait_ready(60)
        client = await Client.connect(nats_server.url, "bl")
        try:
            n = 400

            async def one(k: int):
                feeds = typed_feeds(k)
                try:
                    out = await client.infer("typed", feeds, timeout_s=30)
                except InferbusError as err:
                    return err
                np.testing.assert_array_equal(out["a_times_2"], feeds["a"] * 2)
                np.testing.assert_array_equal(out["b_sum"], np.full((1, 1), 1.0, np.float32))
                return "ok"

            # every task publishes before any awaits a reply: the ingress receives the burst in one go
            outcomes = await asyncio.gather(*(one(k) for k in range(n)))
            ok = outcomes.count("ok")
            refused = [o for o in outcomes if isinstance(o, ResourceExhausted)]
            assert not [o for o in outcomes if isinstance(o, DeadlineExceeded)], "a request timed out"
            assert ok + len(refused) == n, {type(o).__name__ for o in outcomes}
            assert refused and ok >= 1, (ok, len(refused))
            assert all(e.retry_after_ms == 10 for e in refused)
            p = (await client.health(timeout_s=2)).parameters
            assert p["counts"]["backlog_shed"] == len(refused)
            deadline = time.monotonic() + 10
            while p["pending"] or p["backlog"] or p["l2_inflight"]:
                assert time.monotonic() < deadline, p
                await asyncio.sleep(0.05)
                p = (await client.health(timeout_s=2)).parameters
            print(f"backlog bound 4: {n} requests, {ok} answered, {len(refused)} refused at once")
        finally:
            await client.close()


@contextlib.asynccontextmanager
async def _overload_node(nats_url: str, tmp_path, model: str, prefix: str, *, ingress: int, workers: int = 1,
                         ingress_options: dict | None = None):
    """A node of ``workers`` workers and ``ingress`` ingresses serving ``model`` (no L2 cache) on ``prefix``, ready,
    and an SDK client of it; both stopped after. ``ingress_options``: IngressConfig fields for every ingress."""
    cfg = NodeConfig(models_dir=str(MODELS), models=(model,), workers=workers, ingress=ingress, nats_url=nats_url,
                     no_cache=True, prefix=prefix, run_dir=str(tmp_path / "run"), ingress_options=ingress_options or {})
    async with Node(cfg) as node:
        await node.wait_ready(60)
        client = await Client.connect(nats_url, prefix)
        try:
            yield client
        finally:
            await client.close()


async def _open_loop_overload(nats_url: str, prefix: str, model: str, *, rate: int, duration_s: float,
                              budget_s: float) -> dict:
    """Run ``inferbus bench MODEL --rate RATE`` (open loop, the load generator's own process) against the node on
    ``prefix``: its one step, every answer judged right (errors are expected: the load is an overload)."""
    import json
    import subprocess
    import sys

    from conftest import ROOT

    bench = [sys.executable, "-m", "inferbus.cli", "bench", model, "--nats-url", nats_url, "--prefix", prefix,
             "--models", str(MODELS), "--concurrency", "", "--rate", str(rate), "--duration", str(duration_s),
             "--timeout-s", str(budget_s), "--json"]
    b = await asyncio.to_thread(subprocess.run, bench, capture_output=True, text=True, timeout=180, cwd=ROOT)
    step = json.loads(b.stdout)[0]
    assert step["wrong"] == 0, step
    return step


async def _ready_again_within(client: Client, within_s: float) -> None:
    """Wait until the node reports ready (its breakers closed, its workers live), failing after ``within_s``."""
    t0 = time.monotonic()
    while not (await client.health(timeout_s=5)).ready:  # the backlog drains within a budget or two
        assert time.monotonic() - t0 < within_s, f"not ready again within {within_s} s of the overload"
        await asyncio.sleep(0.1)


async def test_an_overload_far_past_capacity_blames_no_worker_and_the_node_serves_again_at_once(nats_server,
                                                                                                   tmp_path):
    """Open-loop load several times what one ingress can take (``inferbus bench --rate``): requests wait in the
    bus until their clients have gone. Seen by a fresh-user trial before the fix: every request was still
    decoded, forwarded and computed (no answer in time: 0 of 40,000 at 20k/s), the workers' completion notices
    queued behind the same backlog were counted as lost, both healthy workers' breakers opened, and the node
    answered UNAVAILABLE and reported not ready for ~30 s after the load stopped. Now a request past its
    client's deadline (``Inferbus-Deadline-Unix-Ms``, which the load generator and the SDK send) is refused on
    arrival, a missing completion while the ingress is behind blames nobody, and right after the load the node
    is ready with closed breakers and answers."""
    async with _overload_node(nats_server.url, tmp_path, "typed", "ovl", ingress=1) as client:
        step = await _open_loop_overload(nats_server.url, "ovl", "typed", rate=40000, duration_s=3, budget_s=0.3)
        # (the counts: asked with room for the ingress to work off what is still in its subscription on a loaded box,
        # where 5 s ran out once; how soon it serves again is _ready_again_within's, below)
        p = (await client.health(timeout_s=15)).parameters
        c = p["counts"]
        print(f"overload 40k/s, 0.3 s budget: {step['ok']} ok, errors {step['errors']}; ingress "
              f"expired_on_arrival {c.get('expired_on_arrival')}, lost {c['lost']}, lost_while_behind "
              f"{c.get('lost_while_behind')}, lost_in_reconnect {c.get('lost_in_reconnect')}")
        w = p["workers"]["n1-w0"]
        assert c["lost"] == 0, c  # no worker blamed for what the ingress's own backlog delayed
        assert w["breaker"] == "closed" and w["breaker_trips"] == 0, w
        assert c["expired_on_arrival"] > 0, c  # it was behind by more than the budget: the load was an overload
        # most found behind a backlog: dropped unanswered (their clients had given up), not answered one by one
        assert 0 < c["expired_unanswered"] <= c["expired_on_arrival"], c
        await _ready_again_within(client, 5)
        out = await client.infer("typed", typed_feeds(7), timeout_s=5)
        np.testing.assert_array_equal(out["a_times_2"], typed_feeds(7)["a"] * 2)


async def test_a_burst_without_client_deadlines_blames_no_worker_and_the_node_serves_again_at_once(nats_server,
                                                                                                    tmp_path):
    """A fresh-user trial (2026-12-04, 2-core box): one plain nats-py client sent 20,000 ``digits`` requests at once
    (30,000 here, made before the first is sent, with a 300 ms budget and a 50 ms ``pending_grace_s``, so that a
    quick idle host still falls behind by more than that) with ``Inferbus-Timeout-Ms`` only (no ``Inferbus-Deadline-Unix-Ms``, so none is found expired on arrival and
    nothing marks the ingress behind). The ingress read its connection seconds behind the burst; the workers'
    completion notices, queued behind the requests in that one stream, came after deadline + ``pending_grace_s``;
    the ingress counted them lost, failures of both healthy workers, whose breakers opened: the node refused every
    request (UNAVAILABLE, not ready) for ~30 s after the burst. Now a sweep that would blame a worker first makes a
    round trip on its connection and lets the notices read before the PONG settle; one that does not come back
    within ``pending_grace_s`` marks the ingress behind (``behind_round_trips``) and blames nobody; no request is
    answered twice (the ingress makes the same round trip before it fails a worker as silent). And every request is
    answered: nats-py found the ingress's connection stale behind the burst (its PONGs wait behind the requests) and
    reconnected, and what the server held for it was lost (10,642-13,720 of 30,000 ``lost_in_reconnect``); unanswered
    PINGs no longer count while messages keep arriving (``BusConfig.busy_stale_grace_s``)."""
    import msgspec
    import nats

    from inferbus.bus import headers as H

    n = 30000
    # a grace of 50 ms (1 s by default) after a 300 ms budget: a completion queued behind the burst in the ingress's
    # stream for more than ~0.35 s is late, which a quick host's ingress also falls behind by (with 1 s + 1 s, a
    # quick idle host answered the whole burst in time: the case was not exercised)
    async with _overload_node(nats_server.url, tmp_path, "digits", "brst", ingress=1, workers=2,
                              ingress_options={"pending_grace_s": 0.05}) as client:
        nc = await nats.connect(nats_server.url, pending_size=256 * 1024 * 1024)
        try:
            answers = 0
            answered: set[str] = set()
            twice = 0

            async def on_answer(msg) -> None:
                nonlocal answers, twice
                answers += 1
                twice += msg.subject in answered
                answered.add(msg.subject)

            inbox = nc.new_inbox()
            await nc.subscribe(inbox + ".*", cb=on_answer, pending_msgs_limit=2 * n)
            rng = np.random.default_rng(0)
            # every body made before the first is sent, so the burst leaves as fast as nats-py can write it (made in
            # the sending loop, it was paced by the encoding, and a quick host's ingress kept up: nothing came late)
            bodies = [msgspec.msgpack.encode({"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64],
                                                          "raw": rng.random((1, 64), dtype=np.float32).tobytes()}]})
                      for _ in range(n)]
            hdrs = {H.TIMEOUT_MS: "300"}
            for i, body in enumerate(bodies):
                await nc.publish("brst.infer.digits", body, reply=f"{inbox}.{i}", headers=hdrs)
            await nc.flush(30)
            last, quiet_since = -1, time.monotonic()
            while time.monotonic() - quiet_since < 2.0:  # until the answers stop coming
                await asyncio.sleep(0.2)
                if answers != last:
                    last, quiet_since = answers, time.monotonic()
        finally:
            await nc.close()
        p = (await client.health(timeout_s=5)).parameters
        c = p["counts"]
        # (a completion late behind the ingress's own backlog: counted in one of these, or waited for while the
        # workers' reports, behind the same backlog, showed a gap: verdicts_waited)
        late = c["behind_round_trips"] + c["lost_while_behind"] + c["lost_in_reconnect"] + c["verdicts_waited"]
        print(f"burst of {n}: {answers} answered; ingress lost {c['lost']}, lost_while_behind "
              f"{c['lost_while_behind']}, lost_in_reconnect {c['lost_in_reconnect']}, behind_round_trips "
              f"{c['behind_round_trips']}, verdicts_waited {c['verdicts_waited']}")
        assert late > 0, ("the ingress kept up with the burst: no completion came late, so the case is not "
                          f"exercised on this host ({c})")
        # no worker blamed for what the ingress's own backlog delayed: no breaker trip (below), and lost completions
        # at most a trace. A clean-clone CI run (2026-12-07, the box's other test process busy) counted 53 of 30,000
        # lost, every request answered and no breaker tripped: a completion there came later than the 50 ms grace
        # this test sets, past what the workers' reports showed of the ingress's lag; 0 in every other run
        assert c["lost"] <= n // 100, c
        assert twice == 0, (twice, len(answered), c)  # each request answered at most once
        assert c["lost_in_reconnect"] == 0 and answers == n, (answers, c)  # and each one answered
        for wid, w in p["workers"].items():
            assert w["breaker"] == "closed" and w["breaker_trips"] == 0, (wid, w)
        await _ready_again_within(client, 5)
        x = np.random.default_rng(1).random((1, 64), dtype=np.float32)
        out = await client.infer("digits", {"pixels": x}, timeout_s=5)
        assert out["probabilities"].shape == (1, 10)


async def test_an_overload_of_the_one_worker_blames_it_not_and_the_node_serves_again_at_once(nats_server, tmp_path):
    """A fresh-user trial (2-core box): ``inferbus up --workers 1`` loaded at 11,400/s with a 1 s budget made the
    worker, not the ingress, the bottleneck. Requests waited in the worker's subscription past their deadline plus
    ``pending_grace_s``; the ingress counted them lost, failures of the worker; its breaker opened and the node
    refused every request (UNAVAILABLE, not ready) for ~20 s after the load stopped. Now a request missing while
    the worker's reports show it behind its own input (a subscription backlog, requests it found expired) is
    forgotten as ``lost_while_worker_behind``, and right after the load the node is ready and answers. Two
    ingresses and one worker here, so that the worker is the one behind."""
    async with _overload_node(nats_server.url, tmp_path, "digits", "ovw", ingress=2) as client:
        # a heavier second overload when the first left the worker less than a budget behind (a quiet box served
        # all 40,000 at 10k/s in a clean-clone CI run: the path under test not taken); each is checked in full
        for rate in (10000, 25000):
            step = await _open_loop_overload(nats_server.url, "ovw", "digits", rate=rate, duration_s=4,
                                             budget_s=0.5)
            by_ingress = await _health_by_replica(client, 2)
            counts = {i: {k: v for k, v in p["counts"].items() if k.startswith("lost")} for i, p in by_ingress.items()}
            print(f"one worker overloaded, {rate}/s, 0.5 s budget: {step['ok']} ok, errors {step['errors']}; {counts}")
            for i, p in by_ingress.items():
                w = p["workers"]["n1-w0"]
                assert p["counts"]["lost"] == 0, (i, counts)  # the worker was overloaded, not faulty
                assert w["breaker"] == "closed" and w["breaker_trips"] == 0, (i, w)
            if sum(c["lost_while_worker_behind"] for c in counts.values()) > 0:
                break
            await _ready_again_within(client, 5)
        # the worker was behind by more than a budget and its grace: the path under test was taken
        assert sum(c["lost_while_worker_behind"] for c in counts.values()) > 0, counts
        await _ready_again_within(client, 5)
        # (15 s: health has a subscription of its own, so the node can say ready while the infer subscription still
        # works off what the 25k/s step left in it, each expired request refused on arrival; a CI run with other
        # tests beside it took more than 5 s once)
        out = await client.infer("digits", {"pixels": np.full((1, 64), 0.5, np.float32)}, timeout_s=15)
        assert out["logits"].shape == (1, 10), out


async def test_a_burst_at_colocated_processes_finds_every_worker_live(tmp_path):
    """A fresh-user trial: ``inferbus up --colocate`` (two processes, each an ingress and its worker) given 30,000
    ``digits`` requests at once by one raw client answered 3,464-10,319 of them UNAVAILABLE "no live, healthy worker"
    while both workers served: the workers' load reports come in the same stream as the requests, behind the burst,
    and their age took both for silent. A worker is now not judged by its report's age while the ingress itself is
    behind its input (``Router.behind_until``): every request is answered, none UNAVAILABLE."""
    import msgspec
    import nats

    from conftest import start_deployment

    n = 30000
    dep = start_deployment(tmp_path / "dep", workers=2, prefix="cbst", extra=["--colocate"])
    try:
        nc = await nats.connect(dep.nats_url, pending_size=512 * 1024 * 1024)
        try:
            codes: dict[str, int] = {}
            answered: set[str] = set()

            async def on_answer(msg) -> None:
                answered.add(msg.subject)
                code = "OK"
                if msg.headers and "Nats-Service-Error-Code" in msg.headers:
                    code = msgspec.msgpack.decode(msg.data)["error"]["code"]
                codes[code] = codes.get(code, 0) + 1

            inbox = nc.new_inbox()
            await nc.subscribe(inbox + ".*", cb=on_answer, pending_msgs_limit=2 * n, pending_bytes_limit=1 << 30)
            rng = np.random.default_rng(0)
            bodies = [msgspec.msgpack.encode({"id": f"b{i}", "inputs": [{  # the tensor as a list, as the trial sent it
                "name": "pixels", "datatype": "FP32", "shape": [1, 64], "data": rng.random(64).tolist()}]})
                for i in range(n)]
            for i, body in enumerate(bodies):
                await nc.publish("cbst.infer.digits", body, reply=f"{inbox}.{i}")
            await nc.flush(30)
            last, quiet_since = -1, time.monotonic()
            while time.monotonic() - quiet_since < 2.0 and len(answered) < n:
                await asyncio.sleep(0.2)
                if len(answered) != last:
                    last, quiet_since = len(answered), time.monotonic()
        finally:
            await nc.close()
        print(f"colocated burst of {n}: {len(answered)} answered, {codes}")
        assert len(answered) == n, (len(answered), codes)
        assert "UNAVAILABLE" not in codes, codes  # (DEADLINE_EXCEEDED may come: the default 1 s budget)
    finally:
        dep.stop()


@contextlib.asynccontextmanager
async def _gap_node(tmp_path, workers: int):
    """``inferbus up`` with fault injection and a 10 s health timeout (a report gap, 1 s, is far from the silent
    check, 10 s, and the stall fence, 3 s), and a connection, an SDK client and the workers' load reports on it."""
    import nats

    from conftest import start_deployment
    from test_reliability_lib import Reports

    dep = start_deployment(tmp_path / "dep", workers=workers, prefix="bgap", extra=[
        "--fault-injection", "--no-cache", "--health-timeout-s", "10", "--breaker-failures", "2"])
    try:
        nc = await nats.connect(dep.nats_url)
        try:
            reports = await Reports.start(nc, dep.prefix)
            await reports.wait(lambda r: {f"n1-w{i}" for i in range(workers)} <= set(r), what="workers reporting")
            yield dep, nc, Client(nc, dep.prefix), reports
        finally:
            await nc.close()
    finally:
        dep.stop()


async def _settled_counts(client, worker_id: str) -> tuple[dict, dict]:
    """The ingress's counts and ``worker_id``'s health entry once nothing is pending (10 s at most)."""
    from test_reliability_lib import health_params

    deadline = time.monotonic() + 10
    while (p := await health_params(client))["pending"]:
        assert time.monotonic() < deadline, p
        await asyncio.sleep(0.1)
    return p["counts"], p["workers"][worker_id]


async def test_a_worker_busy_past_a_report_gap_is_not_blamed_for_what_it_answers_late(tmp_path):
    """The second trial of 2026-12-05: after back-to-back bursts at ``inferbus up --colocate``, one ingress counted
    52-57 requests it had sent to the other process's worker ``lost`` and opened that worker's breaker for 30 s,
    though every request was answered: that process was busy working off its own ingress's backlog, its load
    reports and completion notices late. A gap of reports read as a freeze (the report after it now says whether the
    process ran through it: ``LoadReport.cpu_ratio``), and a forward missing during the gap was judged at once.
    Here one worker's loop is kept busy on the CPU for 2 s (``FaultSet.loop_busy_ms``; its stall fence is 3 s, so
    a loaded box's extra delay does not turn the drill into a freeze) while requests with a 0.4 s budget are sent:
    those it held are not counted lost, and its breaker stays closed."""
    from test_reliability_lib import set_fault

    w0 = "n1-w0"
    async with _gap_node(tmp_path, 2) as (dep, nc, client, reports):
        expired0 = reports.latest[w0].expired
        await set_fault(nc, dep.prefix, w0, loop_busy_ms=2000)
        rng = np.random.default_rng(7)
        calls = [client.infer("digits", {"pixels": rng.random((1, 64), np.float32)}, timeout_s=0.4)
                 for _ in range(16)]
        out = await asyncio.gather(*calls, return_exceptions=True)
        seen = [type(o).__name__ if isinstance(o, Exception) else "ok" for o in out]
        # the busy worker reads what it was sent past its budget, drops it expired and says so in its notices
        await reports.wait(lambda r: r[w0].expired > expired0, timeout_s=10,
                           what=f"the busy worker's expired requests (the 16 calls: {seen})")
        assert reports.latest[w0].cpu_ratio >= 0
        c, w = await _settled_counts(client, w0)
        print(f"busy worker: {seen.count('ok')} of 16 answered; "
              f"expired at it {reports.latest[w0].expired - expired0}; lost {c['lost']}, "
              f"lost_while_worker_behind {c['lost_while_worker_behind']}; breaker {w['breaker']} {w['breaker_trips']}")
        assert c["lost"] == 0, c  # busy, not failing: nothing it held is held against it
        assert w["breaker"] == "closed" and w["breaker_trips"] == 0, w
        ok = await client.infer("digits", {"pixels": np.full((1, 64), 0.5, np.float32)}, timeout_s=5)
        assert ok["logits"].shape == (1, 10)


async def test_a_thawed_worker_working_through_its_backlog_is_not_blamed_for_it(tmp_path):
    """A fresh-user trial (2026-12-05): a 3 s SIGSTOP of a colocated process under a burst made the other ingress
    count 63 requests it had forwarded there lost and open its breaker, though each was answered after the thaw:
    the thawed process's first reports came before its completion notices for the backlog it read. Now a forward
    missing since before a freeze waits (``health_timeout_s`` at most) for its notice. Here the only worker is
    frozen 2.5 s while 3,000 requests with a 0.3 s budget reach it; thawed, it drops each expired with a notice:
    none is counted lost, the breaker stays closed, and the node serves at once."""
    import os
    import signal

    import msgspec

    w0 = "n1-w0"
    async with _gap_node(tmp_path, 1) as (dep, nc, client, reports):
        expired0 = reports.latest[w0].expired
        pid = reports.latest[w0].pid
        body = msgspec.msgpack.encode({"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64],
                                                   "data": [0.25] * 64}]})
        n = 3000
        inbox = nc.new_inbox()
        answers = []

        async def on_answer(msg) -> None:
            answers.append(msg.subject)

        await nc.subscribe(inbox + ".*", cb=on_answer, pending_msgs_limit=4 * n)
        os.kill(pid, signal.SIGSTOP)
        try:
            for k in range(n):
                await nc.publish(f"{dep.prefix}.infer.digits", body, reply=f"{inbox}.{k}",
                                 headers={"Inferbus-Timeout-Ms": "300"})
            await nc.flush()
            await asyncio.sleep(2.5)
        finally:
            os.kill(pid, signal.SIGCONT)
        await reports.wait(lambda r: r[w0].expired - expired0 >= n // 2, timeout_s=15,
                           what="the thawed worker's expired requests")
        c, w = await _settled_counts(client, w0)
        print(f"thawed worker: {len(answers)} answers, expired at it {reports.latest[w0].expired - expired0} of {n}; "
              f"lost {c['lost']}, "
              f"lost_while_worker_behind {c['lost_while_worker_behind']}; breaker {w['breaker']} {w['breaker_trips']}")
        assert c["lost"] == 0, c
        assert w["breaker"] == "closed" and w["breaker_trips"] == 0, w
        ok = await client.infer("digits", {"pixels": np.full((1, 64), 0.5, np.float32)}, timeout_s=5)
        assert ok["logits"].shape == (1, 10)


async def test_a_raw_clients_request_at_a_frozen_worker_is_sent_to_another(tmp_path):
    """A fresh-user trial (2026-12-05): a raw NATS client's request (8 s budget) forwarded to a worker just frozen
    (SIGSTOP) got nothing until the thaw, 3.9 s later, and then the worker's stall-fence UNAVAILABLE, while the
    other worker idled; with a 1 s budget, no answer at all within it. Now an ingress sends what it holds at a
    worker silent past the suspicion age (half the health timeout: 2.5 s here) to another worker, and new requests
    go to the fresh worker first. Every request of a burst of 200 sent at the freeze is answered right, within ~3 s,
    long before the thaw."""
    import os
    import signal

    import msgspec
    import nats

    from conftest import start_deployment
    from test_reliability_lib import Reports, reference

    dep = start_deployment(tmp_path / "dep", workers=2, prefix="quiet", extra=["--no-cache"])
    try:
        nc = await nats.connect(dep.nats_url)
        reports = await Reports.start(nc, dep.prefix)
        await reports.wait(lambda r: {"n1-w0", "n1-w1"} <= set(r), what="workers reporting")
        client = Client(nc, dep.prefix)
        for _ in range(10):  # both workers measured (their service time priced)
            await client.infer("digits", {"pixels": np.full((1, 64), 0.5, np.float32)}, timeout_s=5)
        n = 200
        rows = np.random.default_rng(2).random((n, 64), dtype=np.float32)
        want = reference("digits", {"pixels": rows})["probabilities"]  # in this process (the answers must not be
        # the node's own, cached: each request below is a miss)
        pid = reports.latest["n1-w0"].pid
        inbox = nc.new_inbox()
        got: dict[int, tuple[float, object]] = {}

        async def on_answer(msg) -> None:
            got.setdefault(int(msg.subject.rpartition(".")[2]), (time.monotonic(), msg))

        await nc.subscribe(inbox + ".*", cb=on_answer)
        os.kill(pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            for k in range(n):  # a burst: the least-loaded choice sends a share to the frozen worker
                body = msgspec.msgpack.encode({"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64],
                                                           "raw": rows[k:k + 1].tobytes()}]})
                await nc.publish(f"{dep.prefix}.infer.digits", body, reply=f"{inbox}.{k}",
                                 headers={"Inferbus-Timeout-Ms": "8000"})
            while len(got) < n and time.monotonic() - t0 < 5.5:
                await asyncio.sleep(0.05)
            took = {k: round(t - t0, 2) for k, (t, _) in got.items()}
        finally:
            os.kill(pid, signal.SIGCONT)
        assert len(got) == n, (len(got), "answered before the thaw")
        for k, (_, msg) in got.items():
            err = decode_error(msg.headers, msg.data)
            assert err is None, (k, err)
            out = msgspec.msgpack.decode(msg.data)["outputs"]
            probs = next(o for o in out if o["name"] == "probabilities")
            np.testing.assert_allclose(np.frombuffer(probs["raw"], "<f4").reshape(1, 10), want[k:k + 1], rtol=1e-5,
                                       atol=1e-6)
        assert max(took.values()) < 4.5, took
        counts = (await client.health(timeout_s=5)).parameters["counts"]
        late = sorted(v for v in took.values() if v > 1)
        print(f"{len(late)} answered after 1 s, in {late} s; quiet_reroutes {counts['quiet_reroutes']}")
        assert counts["quiet_reroutes"] >= 1 and len(late) >= 1, (counts, late)  # some did wait at the frozen one
        await nc.close()
    finally:
        dep.stop()
