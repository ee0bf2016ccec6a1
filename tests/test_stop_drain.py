"""A node that stops gracefully while its workers hold requests they cannot finish within their drain: every
request still gets exactly one answer at once (the result, or UNAVAILABLE that the SDK retries on another node),
never a silent drop that leaves the client waiting for its timeout. Real processes: two ``inferbus up`` nodes on
one NATS (free ports, the first node's embedded nats-server)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import time

import numpy as np
import pytest

from inferbus.client import Client
from inferbus.schemas import InferbusError
from inferbus.schemas._internal import FORWARD_TAG

from conftest import start_deployment, two_nodes
from conftest import uvloop_backend as anyio_backend  # noqa: F401 (process-heavy tests: one loop)
from test_reliability_lib import Reports, models_subset, reference, set_fault

PREFIX = "stopd"
DELAY_MS = 2500
"""Per batch at both workers while the requests arrive."""
SECOND_BATCH_MS = 8000
"""n2's second batch: still computing when its drain (3 s, from the node's quiesce notice, which follows the stop
of its ingress) ends."""


async def _publish_row(nc, row, inbox: str, request_id: str, worker: str | None = None) -> None:
    """Send ``digits`` one row as a raw JSON request (20 s budget) with its answer going to ``inbox``: to the
    ingresses, or with ``worker`` to that worker's own subject, as an ingress forwards it."""
    body = json.dumps({"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64],
                                   "data": row.tolist()}]}).encode()
    hdrs = {"Content-Type": "application/json", "Inferbus-Request-Id": request_id, "Inferbus-Timeout-Ms": "20000"}
    if worker is not None:
        hdrs.update({"Inferbus-Msg": FORWARD_TAG, "Inferbus-Model": "digits", "Inferbus-Version": "1"})
    await nc.publish(f"{PREFIX}._w.{worker}" if worker else f"{PREFIX}.infer.digits", body, reply=inbox, headers=hdrs)


@pytest.mark.anyio
@pytest.mark.timeout(90)
async def test_requests_a_stopping_worker_cannot_finish_are_answered_unavailable_at_once(tmp_path):
    """Two nodes, one worker each, both slowed to 2.5 s per batch (n2's second, 8 s); 8 SDK requests (one attempt
    per budget: only an error reply makes it retry) and 12 raw requests (own reply subjects, so every reply is counted), 20 s
    budgets, sent while each worker computes a first batch (one request sent to it directly, n1's first), so that
    n2's worker holds them in a second batch; then n2 gets SIGTERM and n1's worker is fast again. Before the fix,
    the requests n2's own ingress had forwarded to n2's worker were dropped when its drain ended: two SDK calls
    ended DEADLINE_EXCEEDED at 20 s, raw requests got no reply. n2's worker cannot finish its second batch within
    its 3 s drain: those requests are answered UNAVAILABLE (retry hint 0) when the drain ends, to the client and
    to the ingress that forwarded them, whichever node's. Every raw request gets exactly one reply (nothing
    dropped, no late second answer), every SDK call a correct answer, all well before the budget."""
    models = models_subset(tmp_path / "models", ["digits"], {"digits": {"cache_ttl_ms": 0}})
    common = ["--models", str(models), "--no-cache", "--fault-injection"]
    with two_nodes(tmp_path, PREFIX, common) as (n1, n2):
        client = await Client.connect(n1.nats_url, PREFIX, adaptive_attempt_timeout=False)
        nc = client.nc
        x = np.load(models / "digits" / "data" / "test.npz")["X"][:20].astype(np.float32)
        for _ in range(6):  # warm both nodes' paths
            await client.infer("digits", {"pixels": x[:1]}, timeout_s=5)

        replies: dict[str, list] = {}

        async def on_reply(msg) -> None:
            replies.setdefault(msg.subject, []).append(msg)

        async def one(row):
            t = time.monotonic()
            try:
                out = await client.infer("digits", {"pixels": x[row:row + 1]}, timeout_s=20)
            except InferbusError as err:
                return row, err, time.monotonic() - t
            return row, out, time.monotonic() - t

        sub = await nc.subscribe("_RAW.stopd.>", cb=on_reply)
        reports = await Reports.start(nc, PREFIX)
        raw = [f"_RAW.stopd.{k}" for k in range(12)]
        calls = []

        def computing(w: str, min_ms: float = 0.0):
            return lambda r: r.get(w) is not None and r[w].computing_ms > min_ms

        # first batches, n1's first and n2's 0.1 s or more later: one request each (rows 0 and 1), sent to the
        # worker's own subject as an ingress forwards it. The ingresses price a worker by the age of the batch it
        # computes (Router.on_report, a long batch), so what follows goes to n2's worker (the younger batch) and
        # queues behind it. Left to routing, the first batches began in either order, and what followed went to
        # whichever began later: n1's in two runs of three, and the refusal under test did not happen (CI,
        # 2026-12-05).
        t0 = time.monotonic()
        first = []
        for row, w in enumerate(("n1-w0", "n2-w0")):
            await set_fault(nc, PREFIX, w, compute_delay_ms=DELAY_MS)
            body = json.dumps({"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64],
                                           "data": x[row].tolist()}]}).encode()
            first.append(asyncio.ensure_future(nc.request(f"{PREFIX}._w.{w}", body, timeout=20, headers={
                "Inferbus-Msg": FORWARD_TAG, "Inferbus-Model": "digits", "Inferbus-Version": "1",
                "Inferbus-Timeout-Ms": "20000", "Content-Type": "application/json"})))
            await reports.wait(computing(w, 100), what=f"{w} computing its first batch for 0.1 s")
        await reports.stop()
        # n2's second batch (what follows) then takes 8 s, far past its drain's end however long the node's stop
        # of its ingress takes first (on a loaded box the 2.5 s batch ended within the drain: nothing refused)
        await set_fault(nc, PREFIX, "n2-w0", compute_delay_ms=SECOND_BATCH_MS)
        for j, inbox in enumerate(raw):  # half of them straight to n2's worker: whatever the ingresses choose for the
            # rest, it holds some of them behind its first batch (left to routing alone, all went to n1's worker in 2
            # CI runs of 3 on a loaded box, and nothing was refused)
            await _publish_row(nc, x[j], inbox, f"raw-{j}", worker="n2-w0" if j % 2 else None)
        calls += [asyncio.ensure_future(one(row)) for row in range(12, 20)]
        await asyncio.sleep(0.3)  # all forwarded: the second batches wait for the first
        await set_fault(nc, PREFIX, "n1-w0")  # n1's next batch is fast (the retries land there)
        n2.proc.send_signal(signal.SIGTERM)  # n2's second batch starts ~2 s later, ends long after its drain
        results = await asyncio.gather(*calls)
        for row, msg in enumerate(await asyncio.gather(*first)):  # computed within the drain: n2's first batch too
            out = json.loads(msg.data)["outputs"]
            probs = next(o for o in out if o["name"] == "probabilities")["data"]
            np.testing.assert_allclose(np.asarray(probs, np.float32).reshape(1, 10),
                                       reference("digits", {"pixels": x[row:row + 1]})["probabilities"],
                                       rtol=1e-5, atol=1e-6)
        sdk_done_s = time.monotonic() - t0
        while len(replies) < len(raw) and time.monotonic() - t0 < 12:
            await asyncio.sleep(0.05)
        await asyncio.sleep(3.0)  # a late second answer (the refused batch's result) would arrive meanwhile
        await sub.unsubscribe()

        assert await asyncio.to_thread(n2.proc.wait, 20) == 0
        wlog = (tmp_path / "n2" / "worker-n2-w0.log").read_text()
        m = re.search(r"answered (\d+) of them UNAVAILABLE", wlog)
        assert m and int(m.group(1)) > 0, wlog[-2000:]  # the case under test happened: n2's worker refused some

        bad = [r for _, r, _ in results if isinstance(r, Exception)]
        assert not bad, bad
        assert sorted(row for row, _, _ in results) == list(range(12, 20))
        for row, out, _ in results:
            np.testing.assert_allclose(out["probabilities"],
                                       reference("digits", {"pixels": x[row:row + 1]})["probabilities"],
                                       rtol=1e-5, atol=1e-6)
        assert sdk_done_s < 9.0, (sdk_done_s, [round(s, 2) for _, _, s in results])  # the budget was 20 s

        assert sorted(replies) == sorted(raw), sorted(replies)  # nothing dropped
        twice = {s: len(v) for s, v in replies.items() if len(v) != 1}
        assert not twice, twice  # nothing answered twice
        unavailable = 0
        for k, inbox in enumerate(raw):
            msg = replies[inbox][0]
            hdrs = msg.headers or {}
            assert hdrs.get("Inferbus-Request-Id") == f"raw-{k}", hdrs
            if "Nats-Service-Error-Code" in hdrs:
                err = json.loads(msg.data)["error"]
                assert err["code"] == "UNAVAILABLE" and "stopping" in err["message"], err
                unavailable += 1
            else:
                out = json.loads(msg.data)["outputs"]
                probs = next(o for o in out if o["name"] == "probabilities")["data"]
                np.testing.assert_allclose(np.asarray(probs, np.float32).reshape(1, 10),
                                           reference("digits", {"pixels": x[k:k + 1]})["probabilities"],
                                           rtol=1e-5, atol=1e-6)
        assert unavailable > 0
        await client.close()


@pytest.mark.anyio
@pytest.mark.timeout(90)
async def test_a_stopping_node_quiesces_its_workers_together(tmp_path):
    """One node, two workers slowed to 2.5 s per batch, each holding a batch it computes and a second one it
    cannot finish; SIGTERM. The node sends both workers the quiesce notice when its ingress has exited: both
    stop taking requests and drain at once (their load reports say ``draining`` within the same report period,
    where before the second worker began its drain only when the first had finished its own, 3 s later, and took
    requests meanwhile), the node stops within about one drain, and each raw request gets exactly one reply: its
    result or UNAVAILABLE."""
    models = models_subset(tmp_path / "models", ["digits"], {"digits": {"cache_ttl_ms": 0}})
    dep = start_deployment(tmp_path / "n1", workers=2, prefix=PREFIX,
                           extra=["--models", str(models), "--no-cache", "--fault-injection"])
    try:
        client = await Client.connect(dep.nats_url, PREFIX, retry_unavailable=False, adaptive_attempt_timeout=False)
        nc = client.nc
        x = np.load(models / "digits" / "data" / "test.npz")["X"][:16].astype(np.float32)
        for _ in range(4):
            await client.infer("digits", {"pixels": x[:1]}, timeout_s=5)
        for w in ("n1-w0", "n1-w1"):
            await set_fault(nc, PREFIX, w, compute_delay_ms=DELAY_MS)
        replies: dict[str, list] = {}
        draining: dict[str, float] = {}
        t0 = time.monotonic()

        async def on_reply(msg) -> None:
            replies.setdefault(msg.subject, []).append(msg)

        async def on_load(msg) -> None:
            from inferbus.schemas._internal import LoadReport, decode_internal

            r = decode_internal(msg.data)
            if isinstance(r, LoadReport) and r.draining:
                draining.setdefault(r.worker_id, time.monotonic() - t0)

        subs = [await nc.subscribe("_RAW.stopd.>", cb=on_reply), await nc.subscribe(f"{PREFIX}._load", cb=on_load)]
        raw = [f"_RAW.stopd.{k}" for k in range(16)]
        for k, inbox in enumerate(raw):
            await _publish_row(nc, x[k], inbox, f"q-{k}")
            if k < 2:
                await nc.flush()
                await asyncio.sleep(0.15)  # a first batch at each worker; the others queue behind them
        await asyncio.sleep(0.3)
        t_term = time.monotonic()
        dep.proc.send_signal(signal.SIGTERM)
        rc = await asyncio.to_thread(dep.proc.wait, 20)
        stop_s = time.monotonic() - t_term
        await asyncio.sleep(0.5)
        for s in subs:
            await s.unsubscribe()
        text = dep.log.read_text()
        assert rc == 0, text[-3000:]
        assert "quiesce: 2 worker(s)" in (tmp_path / "n1" / "node.log").read_text() or "quiesce: 2 worker(s)" in text
        assert set(draining) == {"n1-w0", "n1-w1"}, draining
        assert abs(draining["n1-w0"] - draining["n1-w1"]) < 0.5, draining  # together, not one drain after the other
        assert stop_s < 5.5, stop_s  # the ingress's drain, one worker drain (3 s) and the exits

        assert sorted(replies) == sorted(raw), sorted(set(raw) - set(replies))
        twice = {s: len(v) for s, v in replies.items() if len(v) != 1}
        assert not twice, twice
        codes = [json.loads(replies[i][0].data)["error"]["code"] if "Nats-Service-Error-Code" in (
            replies[i][0].headers or {}) else "OK" for i in raw]
        assert codes.count("OK") >= 2 and codes.count("UNAVAILABLE") >= 2, codes
        assert set(codes) <= {"OK", "UNAVAILABLE"}, codes
        await client.close()
    finally:
        dep.stop()


@pytest.mark.anyio
@pytest.mark.timeout(180)
async def test_a_worker_stopped_in_the_middle_of_a_chunked_batch_exits_cleanly(tmp_path):
    """A fresh-user trial: SIGTERM to a worker computing 30,000-row batches in chunks whose drain ran out: its held
    requests were answered UNAVAILABLE, and then the process died of SIGABRT (ONNX Runtime torn down while the
    inference thread still ran a chunk; "terminate called without an active exception"), 2 of 3 runs. The thread now
    stops at the next chunk once the worker stops, and the worker waits for it. Eight 30,000-row requests sent to
    the worker's own subject (as an ingress forwards them) in one batch held back 2.8 s by an injected compute
    delay (no CPU spent: the box's other tests run beside this one), SIGTERM at once: the chunks start about when
    the 3 s drain ends, the requests are answered UNAVAILABLE, and the worker exits with status 0."""
    import os

    import nats

    from inferbus.schemas import InferRequest, encode_request, input_from_numpy

    d = start_deployment(tmp_path / "dep", workers=1, prefix="stopc",
                         extra=["--no-cache", "--model", "digits_cnn", "--inline-max-compute-us", "0",
                                "--fault-injection"])
    rng = np.random.default_rng(5)
    bigs = [rng.random((30_000, 64), dtype=np.float32) for _ in range(8)]  # ~4 s of chunks: past the stop
    nc = await nats.connect(d.nats_url)
    try:
        async with await Client.connect(d.nats_url, "stopc") as client:
            pid = (await client.health(timeout_s=5.0)).parameters["workers"]["n1-w0"]["pid"]
            await set_fault(nc, "stopc", "n1-w0", compute_delay_ms=2800)
            hdrs = {"Inferbus-Msg": FORWARD_TAG, "Inferbus-Model": "digits_cnn", "Inferbus-Version": "1",
                    "Inferbus-Timeout-Ms": "60000", "Content-Type": "application/msgpack"}
            bodies = [encode_request(InferRequest(inputs=[input_from_numpy("pixels", b, raw=True)])) for b in bigs]
            calls = [asyncio.ensure_future(nc.request("stopc._w.n1-w0", body, timeout=60, headers=hdrs))
                     for body in bodies]
            await asyncio.sleep(0)  # (the calls publish)
            # every request at the server before the stop: on a loaded box the last of the 61 MB were still being
            # written when the worker unsubscribed, and that request met "no responders" (a clean-clone CI run)
            await nc.flush(timeout=30)
            deadline = time.monotonic() + 30
            while (await client.health(timeout_s=2.0)).parameters["workers"]["n1-w0"].get("computing_ms", 0) <= 0:
                assert time.monotonic() < deadline, "the worker never took the batch"
                await asyncio.sleep(0.05)
            os.kill(pid, signal.SIGTERM)
            outcomes = await asyncio.gather(*calls, return_exceptions=True)
        # a request may meet "no responders" on a loaded box (a clean-clone CI run, 2026-12-06, after the flush above:
        # the worker's connection, busy reading the 61 MB, was found stale and reconnecting when it was routed); what
        # is under test is the refusals of what the worker held and its clean exit
        replies = [o for o in outcomes if not isinstance(o, nats.errors.NoRespondersError)]
        assert all(not isinstance(o, BaseException) for o in replies), outcomes
        refused = sum(1 for msg in replies if (msg.headers or {}).get("Nats-Service-Error-Code"))
        assert refused >= 1, "the drain finished everything: the case under test did not happen"
        deadline = time.monotonic() + 20
        gone = f"child 'worker:n1-w0' (pid {pid}) exited: "
        node_log = ""
        while gone not in node_log:  # the node saw it exit (and restarts it)
            node_log = (d.run_dir / "node.log").read_text(errors="replace")
            assert time.monotonic() < deadline, node_log[-3000:]
            await asyncio.sleep(0.2)
        wlog = (d.run_dir / "worker-n1-w0.log").read_text(errors="replace")
        assert "terminate called" not in wlog, wlog[-2000:]
        assert gone + "exit code 0" in node_log, node_log[-2000:]  # not "killed by signal 6 (SIGABRT)"
    finally:
        await nc.close()
        d.stop()
