"""Colocated workers (``inferbus up --colocate``): each CPU worker slot runs in one process with an ingress,
which hands it requests in-process. Real nats-server, Valkey and inferbus processes; answers checked against
in-process ONNX Runtime; router preference checked in-process."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import signal
import time

import msgpack
import nats
import numpy as np
import pytest

from inferbus.actors._ingress import _fwd_block
from inferbus.actors._router import Router
from inferbus.bus._fastpub import parse_block
from inferbus.client import Client
from inferbus.schemas import (
    DeadlineExceeded, InferbusError, InvalidArgument, NotFound, decode_error, decode_response,
)
from inferbus.schemas._internal import LoadReport, ProcessEvent, decode_internal

from conftest import MODELS, start_deployment
from conftest import uvloop_backend as anyio_backend  # noqa: F401 (process-heavy tests: one loop)
from test_e2e import digits_rows, reference

pytestmark = [pytest.mark.anyio]


@pytest.fixture(scope="module")
def colocated(tmp_path_factory):
    """``inferbus up --colocate --workers 2 --no-run-to-completion``: two processes, each an ingress with its
    worker, every request through the worker's queue (test_colocated_fastpath.py runs them to completion)."""
    dep = start_deployment(tmp_path_factory.mktemp("coloc"), workers=2, extra=["--colocate", "--no-run-to-completion"],
                           prefix="co")
    yield dep
    dep.stop()


async def _reports(nc, prefix, n: int) -> dict[str, LoadReport]:
    """The latest load report of each worker, once ``n`` workers reported."""
    latest: dict[str, LoadReport] = {}
    got = asyncio.Event()

    async def cb(msg):
        r = decode_internal(msg.data)
        if isinstance(r, LoadReport):
            latest[r.worker_id] = r
            if len(latest) >= n:
                got.set()

    sub = await nc.subscribe(f"{prefix}._load", cb=cb)
    await asyncio.wait_for(got.wait(), 10)
    await sub.unsubscribe()
    return latest


# ---- router (in-process) --------------------------------------------------------------------------
def _report(wid: str, queue_depth: int = 0) -> LoadReport:
    return LoadReport(worker_id=wid, pid=1, device_kind="cpu", device_name="cpu", backend="onnxruntime",
                      precision="fp32", models=["m:1"], queue_depth=queue_depth, in_flight=0, capacity=1024,
                      ewma_service_us=50.0, completed=0, errors=0)


@pytest.mark.timeout(30)
def test_router_prefers_local_worker_on_ties_and_spills_when_it_is_busier():
    for n_workers in (2, 12):  # full scan and power-of-two choices
        r = Router(local_worker_id="w1", local_hop_us=250.0)
        for i in range(n_workers):
            r.on_report(_report(f"w{i}"), now=0.0)
        # equal expected delay: always the local worker, exploration included
        assert {r.pick("m:1", now=0.1).worker_id for _ in range(200)} == {"w1"}
        # busier, but its queue (k x 50 µs) costs less than the bus hop (250 µs): still the local worker
        for _ in range(5):
            r.on_sent(r.workers["w1"])
        assert {r.pick("m:1", now=0.1).worker_id for _ in range(50)} == {"w1"}
        # one more and its queue costs more than the hop: a remote worker is picked
        r.on_sent(r.workers["w1"])
        assert r.pick("m:1", now=0.1).worker_id != "w1"
    r = Router(local_worker_id="w1", local_hop_us=0.0)  # hop not priced: ties only
    for i in range(2):
        r.on_report(_report(f"w{i}"), now=0.0)
    r.on_sent(r.workers["w1"])
    assert r.pick("m:1", now=0.1).worker_id == "w0"
    for n_workers in (2, 12):
        r = Router(local_worker_id="w1")
        for i in range(n_workers):
            r.on_report(_report(f"w{i}"), now=0.0)
        # and a busy remote one does not attract traffic either
        r.on_report(_report("w1", queue_depth=0), now=0.1)
        r.workers["w1"].in_flight = 0
        r.on_report(_report("w0", queue_depth=5), now=0.1)
        assert r.pick("m:1", now=0.2).worker_id == "w1"


# ---- deployment ---------------------------------------------------------------------------------
@pytest.mark.timeout(90)
async def test_answers_match_reference_and_use_the_local_hop(colocated):
    client = await Client.connect(colocated.nats_url, colocated.prefix)
    try:
        x = digits_rows(12)
        forwards = set()
        for i in range(len(x)):
            feeds = {"pixels": x[i:i + 1]}
            res = await client.infer_result("digits", feeds, timeout_s=5)
            ref = reference("digits", "1", feeds)
            np.testing.assert_allclose(res.outputs["logits"], ref["logits"], rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(res.outputs["probabilities"], ref["probabilities"], rtol=1e-5, atol=1e-6)
            forwards.add(res.parameters["forward"])
        assert "local" in forwards  # one request at a time: the colocated worker wins the tie
        # batched rows and another version, through the same path
        xb = digits_rows(4)
        v2 = await client.infer("digits", {"pixels": xb}, version="2", timeout_s=5)
        np.testing.assert_allclose(v2["logits"], reference("digits", "2", {"pixels": xb})["logits"], rtol=1e-5,
                                   atol=1e-5)
        # each ingress reports its local worker, and the local forwards it made (no publish for those)
        seen: dict[str, dict] = {}
        for _ in range(50):
            h = await client.health(timeout_s=2)
            seen[h.parameters["ingress_id"]] = h.parameters
            if len(seen) == 2:
                break
        assert len(seen) == 2, "the health requests did not reach both ingress replicas"
        assert {p["local_worker"] for p in seen.values()} == {"n1-w0", "n1-w1"}
        assert sum(p["counts"]["local_forwards"] for p in seen.values()) >= 1
        assert all(p["counts"]["run_now"] == 0 for p in seen.values())  # --no-run-to-completion
    finally:
        await client.close()


@pytest.mark.timeout(90)
async def test_colocated_worker_serves_forwards_from_other_ingresses(colocated):
    """A forward over NATS from an ingress outside the process (here: the test, as ingress ``other``)
    is answered by each colocated worker as by a separate worker process."""
    nc = await nats.connect(colocated.nats_url)
    try:
        reports = await _reports(nc, colocated.prefix, 2)
        x = digits_rows(1)
        body = msgpack.packb({"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64],
                                          "data": x.ravel().tolist()}]})
        for wid in sorted(reports):
            fwd = (time.time() * 1000.0 + 5000.0, ("other", "digits", "1", "", "", "decode=0"), "")
            hdrs = parse_block(_fwd_block(1, 5000.0, fwd, ""))
            msg = await nc.request(f"{colocated.prefix}._w.{wid}", body, timeout=5, headers=hdrs)
            resp = decode_response(msg.data)
            assert resp.parameters["worker_id"] == wid
            assert resp.parameters["forward"] == "bus"
            np.testing.assert_allclose(np.asarray(resp.outputs[0].data, np.float32).reshape(1, -1),
                                       reference("digits", "1", {"pixels": x})[resp.outputs[0].name],
                                       rtol=1e-5, atol=1e-5)
        # under concurrency an ingress also forwards to the other process's worker over the bus
        client = Client(nc, colocated.prefix)
        xs = digits_rows(64)
        bus = set()
        for round_ in range(40):
            batch = [client.infer_result("digits", {"pixels": xs[k:k + 1] + np.float32(round_ * 1e-3)}, timeout_s=5)
                     for k in range(32)]
            for res in await asyncio.gather(*batch):
                if res.parameters["forward"] == "bus":
                    bus.add(res.parameters["worker_id"])
            if bus:
                break
        assert bus, "no request was forwarded over the bus to a colocated worker"
    finally:
        await nc.close()


@pytest.mark.timeout(60)
async def test_bad_input_gets_typed_errors(colocated):
    client = await Client.connect(colocated.nats_url, colocated.prefix, retry_unavailable=False)
    try:
        with pytest.raises(InvalidArgument) as e:
            await client.infer("digits", {"pixels": np.zeros((1, 63), np.float32)}, timeout_s=5)
        assert e.value.field == "inputs[0].shape"
        with pytest.raises(InvalidArgument):
            await client.infer("digits", {"pixels": np.zeros((1, 64), np.float64)}, timeout_s=5)
        with pytest.raises(NotFound):
            await client.infer("no_such_model", {"pixels": np.zeros((1, 64), np.float32)}, timeout_s=5)
        with pytest.raises(InvalidArgument):
            await client.request(f"{colocated.prefix}.infer.digits", b"\xc1 not msgpack", timeout_s=5)
        msg = await client.nc.request(f"{colocated.prefix}.infer.digits", msgpack.packb({"inputs": []}), timeout=5,
                                      headers={"Inferbus-Timeout-Ms": "0"})
        assert isinstance(decode_error(msg.headers, msg.data), DeadlineExceeded)
        # still serving after all that
        out = await client.infer("digits", {"pixels": digits_rows(1)}, timeout_s=5)
        assert out["logits"].shape == (1, 10)
    finally:
        await client.close()


@pytest.mark.timeout(200)
async def test_killed_colocated_process_is_restarted_and_service_resumes(tmp_path):
    dep = start_deployment(tmp_path / "dep", workers=2, extra=["--colocate"], prefix="ck")
    try:
        nc = await nats.connect(dep.nats_url)
        reports = await _reports(nc, dep.prefix, 2)
        victim = sorted(reports)[0]
        old_pid = reports[victim].pid
        events: list[ProcessEvent] = []
        got_down = asyncio.Event()

        async def on_event(msg):
            ev = decode_internal(msg.data)
            if isinstance(ev, ProcessEvent):
                events.append(ev)
                if ev.kind == "down" and ev.worker_id == victim:
                    got_down.set()

        await nc.subscribe(f"{dep.prefix}._events", cb=on_event)
        client = Client(nc, dep.prefix)
        x = digits_rows(64)
        outcomes: list[str] = []
        stop = asyncio.Event()

        async def caller(k):
            i = k
            while not stop.is_set():
                i += 7
                try:
                    # (3 s: with 1 s a CI run with other tests beside it once failed a request the kill had no
                    # part in; the SDK retries an UNAVAILABLE within the budget either way)
                    await client.infer("digits", {"pixels": x[i % len(x)][None] + np.float32(i * 1e-4)}, timeout_s=3.0)
                    outcomes.append("ok")
                except InferbusError as err:
                    outcomes.append(err.code.value)

        tasks = [asyncio.create_task(caller(k)) for k in range(4)]
        while len(outcomes) < 20:
            await asyncio.sleep(0.05)
        os.kill(old_pid, signal.SIGKILL)
        # the node reports the process's worker down (so every ingress fails what it forwarded there) ...
        await asyncio.wait_for(got_down.wait(), 20)
        assert any(e.pid == old_pid and e.child_id == f"colocated:{victim}" for e in events if e.kind == "down")
        # ... and restarts the process: a report from the same worker id with a new pid
        while True:
            r = (await _reports(nc, dep.prefix, 2)).get(victim)
            if r is not None and r.pid != old_pid:
                break
        n_before = len(outcomes)
        while len(outcomes) < n_before + 40:
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.gather(*tasks)
        failed = [o for o in outcomes if o != "ok"]
        # only requests the dead process held (its ingress's, at most one per caller) may fail, and typed
        assert len(failed) <= 4, failed
        assert set(failed) <= {"UNAVAILABLE", "DEADLINE_EXCEEDED"}, failed
        assert outcomes[-20:] == ["ok"] * 20
        # the restarted process serves again, through its own ingress's local hop (the queue group gives its ingress
        # about every other request; time, not a count: a loaded CI box). When the kill caught a model run, the run's
        # requests are remembered as a crash's, and while a crash of the model is remembered every colocated ingress
        # sends its requests to another process's worker (docs/failure-semantics.md, "A request that kills its
        # worker"): up to QUERY_OF_DEATH_TTL_S (a CI run, 2026-12-06: 7,573 requests in 20 s, all over the bus)
        from inferbus.actors._crashes import QUERY_OF_DEATH_TTL_S

        deadline = time.monotonic() + QUERY_OF_DEATH_TTL_S + 20
        seen: list[tuple[str, str]] = []
        while time.monotonic() < deadline:
            res = await client.infer_result("digits", {"pixels": x[:1] + np.float32(np.random.rand())}, timeout_s=2)
            seen.append((res.parameters["worker_id"], res.parameters["forward"]))
            if seen[-1] == (victim, "local"):
                break
        else:
            pytest.fail(f"restarted colocated process {victim} served no request locally in {len(seen)}: "
                        f"{collections.Counter(seen)}")
        await nc.close()
    finally:
        dep.stop()


@pytest.mark.timeout(120)
async def test_a_colocated_ingress_knows_its_own_worker_from_its_first_request(tmp_path):
    """A CI run: a colocated process restarted beside a live worker took requests before its ingress had heard
    its own worker's load report (the first went out before the ingress subscribed to them), and sent them all
    over the bus to the other worker. Its ingress now takes that first report in-process: here, beside a
    deployment's worker and with its own worker's reports 30 s apart, the colocated process's own worker is known,
    alive, and picked the moment its ingress serves. (In-process, as test_model_pinning.py runs one; the first
    version of this test ran the other worker in-process too, and a CI run hung in its teardown.)"""
    from inferbus.actors import IngressConfig, WorkerConfig
    from inferbus.actors._colocated import Colocated, ColocatedConfig
    from inferbus.bus import BusConfig

    dep = start_deployment(tmp_path / "dep", workers=1, extra=["--no-cache", "--models", str(MODELS)], prefix="kn")
    bus = BusConfig(servers=(dep.nats_url,), prefix="kn")
    col = Colocated(ColocatedConfig(
        IngressConfig(ingress_id="kn-i", bus=bus, models_dir=str(MODELS), models=("digits",)),
        WorkerConfig(worker_id="kn-local", bus=bus, models_dir=str(MODELS), models=("digits",),
                     report_interval_ms=30_000)))
    task = asyncio.create_task(col.run())
    try:
        deadline = time.monotonic() + 60
        while col.ingress._infer_sub is None:
            assert not task.done() and time.monotonic() < deadline, task
            await asyncio.sleep(0.005)
        router = col.ingress.router
        assert "kn-local" in router.workers and router.workers["kn-local"].alive, sorted(router.workers)
        assert router.pick("digits:1").worker_id == "kn-local"
    finally:
        task.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(task, 20)
        dep.stop()
