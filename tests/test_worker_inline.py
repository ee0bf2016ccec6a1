"""Inline execution of small models on the worker's event loop (issue 3), against real processes.

Three worker processes on one real nats-server, sent forwarded requests straight on their worker
subjects (the ten-header forward form, as an older ingress sends it): one with the default threshold
(its small models run inline), one whose threshold every model is over (1 µs), one with inline
execution disabled (0). The answers must be the same on every path; ``parameters.exec`` says which
path ran each one. The thread path's guarantees (deadline, dedupe, audit, accounting) are checked on
the inline path too, and an injected compute delay sends a model back to the thread.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid

import msgspec
import nats
import nats.errors
import numpy as np
import pytest

from inferbus.actors import WorkerConfig
from inferbus.bus import BusConfig
from inferbus.schemas import DeadlineExceeded, InferRequest, decode_error, decode_response, encode_request, input_from_numpy
from inferbus.schemas._internal import FORWARD_TAG

from conftest import uvloop_backend as anyio_backend  # noqa: F401 (process-heavy tests: one loop)
from test_reliability_lib import Reports, models_subset, reference, set_fault

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

PREFIX = "inl"
WORKERS = {"w-inline": None, "w-over": 1.0, "w-off": 0.0}
"""Worker id → ``inline_max_compute_us`` (None: the default)."""


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    """Three worker processes on a real nats-server; yields the server's URL."""
    from inferbus.bus import EmbeddedNats

    root = tmp_path_factory.mktemp("inline")
    models = models_subset(root / "models", ["typed", "digits"])
    with EmbeddedNats(run_dir=root / "nats") as srv:
        bus = BusConfig(servers=(srv.url,), prefix=PREFIX)
        procs = []
        try:
            for wid, limit in WORKERS.items():
                kw = {} if limit is None else {"inline_max_compute_us": limit}
                cfg = WorkerConfig(worker_id=wid, bus=bus, models_dir=str(models), audit=True, fault_control=True,
                                   **kw)
                procs.append(subprocess.Popen([sys.executable, "-m", "inferbus.actors", "worker", cfg.to_json()],
                                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
            for p in procs:
                assert p.stdout.readline().strip() == b"READY"
            yield srv.url
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(10)


def _fwd_headers(model: str, timeout_ms: float = 5000, request_id: str | None = None) -> dict:
    h = {"Inferbus-Msg": FORWARD_TAG, "Inferbus-Model": model, "Inferbus-Version": "1",
         "Inferbus-Timeout-Ms": str(timeout_ms)}
    if request_id:
        h["Inferbus-Request-Id"] = request_id
    return h


def _body(feeds: dict) -> bytes:
    return encode_request(InferRequest(inputs=[input_from_numpy(k, v) for k, v in feeds.items()]))


async def _ask(nc, worker: str, model: str, feeds: dict, **kw):
    msg = await nc.request(f"{PREFIX}._w.{worker}", _body(feeds), timeout=5, headers=_fwd_headers(model, **kw))
    err = decode_error(msg.headers, msg.data)
    if err is not None:
        raise err
    return decode_response(msg.data), msg.headers or {}


async def _prices(nc) -> dict:
    """Each worker's compute EWMA per model version (µs of CPU per request, what decides inline execution), from
    ``$SRV.STATS``: for the message of a failed ``exec`` check."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await nc.publish("$SRV.STATS.inferbus-worker", b"", reply=inbox)
    out = {}
    try:
        while True:
            m = await sub.next_msg(timeout=0.5)
            for ep in json.loads(m.data).get("endpoints") or ():
                d = ep.get("data") or {}
                if "compute_ewma_us" in d:
                    out[d.get("worker_id")] = d["compute_ewma_us"]
    except nats.errors.TimeoutError:
        pass
    finally:
        await sub.unsubscribe()
    return out


def _typed(k: int, n: int = 1) -> dict:
    return {"a": (np.arange(n, dtype=np.int32) + 1000 * k).reshape(n, 1), "b": np.full((n, 4), 0.25, np.float16)}


def _outputs(resp) -> dict:
    from inferbus.schemas import output_to_numpy

    return {o.name: output_to_numpy(o) for o in resp.outputs}


@pytest.fixture
async def nc(workers):
    conn = await nats.connect(workers)
    reports = await Reports.start(conn, PREFIX)
    await reports.wait(lambda r: set(WORKERS) <= set(r), what="all workers reporting")
    yield conn, reports
    for w in WORKERS:
        await set_fault(conn, PREFIX, w)
    await reports.stop()
    await conn.close()


async def test_small_model_runs_inline_and_others_on_the_thread_with_the_same_answers(nc):
    conn, reports = nc
    x = np.load(__import__("conftest").MODELS / "digits" / "data" / "test.npz")["X"].astype(np.float32)
    for i in range(5):
        feeds = {"pixels": x[i:i + 1]}
        answers = {}
        for w in WORKERS:
            resp, _ = await _ask(conn, w, "digits", feeds)
            answers[w] = _outputs(resp)["logits"]
            expect = "inline" if w == "w-inline" else "thread"
            assert resp.parameters["exec"] == expect, (w, resp.parameters)
            assert resp.parameters["worker_id"] == w
            assert {"queue", "worker_decode", "compute", "encode", "worker_total"} <= set(resp.parameters["timings_us"])
        np.testing.assert_allclose(answers["w-inline"], reference("digits", feeds)["logits"], rtol=1e-5, atol=1e-5)
        for w in WORKERS:  # same session options, batch 1: the same bytes whichever path ran it
            assert answers[w].tobytes() == answers["w-inline"].tobytes(), w
    # the load report still arrives and accounts for every request
    await reports.wait(lambda r: all(r[w].in_flight == 0 and r[w].queue_depth == 0 and r[w].computed >= 5
                                     for w in WORKERS), what="reports after the requests")


async def test_inline_path_batches_what_arrived_meanwhile_and_keeps_every_answer_its_own(nc):
    conn, reports = nc
    ks = list(range(100, 140))
    outs = await asyncio.gather(*(_ask(conn, "w-inline", "typed", _typed(k, n=1 + k % 3)) for k in ks))
    batched = 0
    for k, (resp, _) in zip(ks, outs):
        assert resp.parameters["exec"] == "inline"
        feeds = _typed(k, n=1 + k % 3)
        o = _outputs(resp)
        np.testing.assert_array_equal(o["a_times_2"], feeds["a"] * 2)
        np.testing.assert_array_equal(o["b_sum"], feeds["b"].astype(np.float32).sum(1, keepdims=True))
        batched += resp.parameters["batch_size"] > 1
    assert batched > 0, "40 concurrent requests and none ran in a zero-wait batch"
    await reports.wait(lambda r: r["w-inline"].in_flight == 0 and r["w-inline"].queue_depth == 0, what="idle")


async def test_inline_path_dedupes_audits_and_refuses_spent_budgets(nc):
    conn, reports = nc
    audited: list[str] = []

    async def on_audit(msg):
        audited.extend(msgspec.msgpack.decode(msg.data))

    sub = await conn.subscribe(f"{PREFIX}._audit", cb=on_audit)
    await reports.wait(lambda r: r["w-inline"].in_flight == 0, what="idle")
    before = reports.latest["w-inline"]
    rid = uuid.uuid4().hex
    feeds = _typed(7)
    # the same request id three times at once: one execution, three identical answers
    outs = await asyncio.gather(*(_ask(conn, "w-inline", "typed", feeds, request_id=rid) for _ in range(3)))
    bodies = {msgspec.msgpack.encode(_outputs(r)["a_times_2"].tolist()) for r, _ in outs}
    assert len(bodies) == 1
    assert sorted(h.get("Inferbus-Dedup", "") for _, h in outs)[0] == ""  # one of them was computed
    # and again later: answered from the recent results, not computed
    again, h = await _ask(conn, "w-inline", "typed", feeds, request_id=rid)
    assert h.get("Inferbus-Dedup") == "hit"
    # a spent budget is refused without running the model
    with pytest.raises(DeadlineExceeded):
        await _ask(conn, "w-inline", "typed", _typed(8), timeout_ms=0)
    await reports.wait(lambda r: r["w-inline"].in_flight == 0 and r["w-inline"].computed > before.computed,
                       what="runs reported")
    after = reports.latest["w-inline"]
    assert after.computed - before.computed == 1
    assert (after.dedup_joins - before.dedup_joins) + (after.dedup_hits - before.dedup_hits) == 3
    assert after.expired - before.expired == 1
    await conn.flush()
    for _ in range(50):
        if rid in audited:
            break
        await asyncio.sleep(0.02)
    assert audited.count(rid) == 1, audited
    await sub.unsubscribe()


async def test_a_model_that_becomes_slow_goes_back_to_the_thread_and_returns(nc):
    conn, reports = nc
    resp, _ = await _ask(conn, "w-inline", "typed", _typed(20))
    assert resp.parameters["exec"] == "inline"
    await set_fault(conn, PREFIX, "w-inline", compute_delay_ms=5)  # an injected delay sleeps: never on the loop
    outs = await asyncio.gather(*(_ask(conn, "w-inline", "typed", _typed(k)) for k in range(21, 25)))
    assert {r.parameters["exec"] for r, _ in outs} == {"thread"}
    for k, (r, _) in zip(range(21, 25), outs):
        np.testing.assert_array_equal(_outputs(r)["a_times_2"], _typed(k)["a"] * 2)
    await set_fault(conn, PREFIX, "w-inline")
    resp, _ = await _ask(conn, "w-inline", "typed", _typed(30))
    assert resp.parameters["exec"] == "inline"


async def test_a_request_far_larger_than_its_models_usual_runs_on_the_thread(nc):
    """A user trial: 30,000 rows (7.7 MB) of a model whose requests usually take ~100 µs ran inline, holding the
    worker's event loop for seconds (no load reports: its ingress counted it gone and the SDK retried elsewhere).
    A body over the model's inline bound (``inline_max_body_bytes``: 16 rows raw + 1 KiB, 4-64 KiB) goes to the
    inference thread; a few rows still run inline."""
    from inferbus.actors._worker import inline_max_body_bytes
    from inferbus.actors import ModelRepository

    conn, reports = nc
    x = np.load(__import__("conftest").MODELS / "digits" / "data" / "test.npz")["X"].astype(np.float32)
    mv = ModelRepository(__import__("conftest").MODELS, ["digits"]).get("digits").version("1")
    bound = inline_max_body_bytes(mv)
    assert bound == 16 * 64 * 4 + 1024, bound
    big = np.tile(x, (20_000 // len(x) + 1, 1))[:20_000]
    for rows, expect in ((1, "inline"), (8, "inline"), (20_000, "thread"), (1, "inline")):
        feeds = {"pixels": big[:rows]}
        assert (len(_body(feeds)) <= bound) == (expect == "inline"), (rows, len(_body(feeds)))
        resp, _ = await _ask(conn, "w-inline", "digits", feeds)
        assert resp.parameters["exec"] == expect, (rows, str(resp.parameters), await _prices(conn))
        np.testing.assert_allclose(_outputs(resp)["logits"], reference("digits", feeds)["logits"], rtol=1e-5,
                                   atol=1e-5)


def test_one_slow_run_does_not_reprice_a_model_but_a_slower_model_crosses_within_a_few_runs():
    """A CI run sent a ~40 µs model's small requests to the thread: one slow run (1-2 ms of CPU: a new shape, page
    faults, a busy hyperthread sibling) lifted its EWMA over ``inline_max_compute_us`` (250 µs) for several runs.
    A sample enters clipped at ``PRICE_CLIP_X`` × the EWMA; a model that really is slower crosses in a few runs."""
    from inferbus.actors._worker import PRICE_CLIP_X, price_ewma

    limit_us = WorkerConfig(worker_id="w", bus=BusConfig(), models_dir=".").inline_max_compute_us
    assert price_ewma(None, 2000.0) == 2000.0  # the first run is the price
    p = price_ewma(40.0, 2000.0)
    assert p == pytest.approx(0.8 * 40 + 0.2 * PRICE_CLIP_X * 40) and p < limit_us
    assert price_ewma(p, 40.0) < p
    for _ in range(2):  # three outliers in a row still stay under the bound
        p = price_ewma(p, 2000.0)
    assert p < limit_us, p
    p, runs = 40.0, 0
    while p <= limit_us:  # now every run takes 1 ms
        p, runs = price_ewma(p, 1000.0), runs + 1
    assert 3 <= runs <= 6, runs
    assert price_ewma(0.0, 500.0) == pytest.approx(100.0)  # not timed at load: unclipped

