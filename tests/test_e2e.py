"""End-to-end: real nats-server, Valkey and inferbus processes; answers checked against in-process ONNX Runtime."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time

import msgpack
import nats
import numpy as np
import pytest
import onnxruntime as ort

from inferbus.client import Client
from inferbus.schemas import (
    DeadlineExceeded, InvalidArgument, NotFound, PayloadTooLarge, decode_error,
)

from conftest import MODELS, embedded_valkey_url
from test_reliability_lib import wait_health

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


def reference(model: str, version: str, feeds: dict) -> dict:
    sess = ort.InferenceSession(str(MODELS / model / version / "model.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def digits_rows(n=8):
    return np.load(MODELS / "digits" / "data" / "test.npz")["X"][:n].astype(np.float32)


@pytest.fixture
async def client(deployment):
    c = await Client.connect(deployment.nats_url, deployment.prefix)
    yield c
    await c.close()


async def test_digits_matches_in_process_reference(client):
    x = digits_rows(16)
    for i in range(len(x)):
        feeds = {"pixels": x[i:i + 1]}
        res = await client.infer_result("digits", feeds, timeout_s=2)
        ref = reference("digits", "1", feeds)
        np.testing.assert_allclose(res.outputs["probabilities"], ref["probabilities"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(res.outputs["logits"], ref["logits"], rtol=1e-5, atol=1e-5)
        assert res.model_version == "1"
        p = res.parameters
        for k in ("worker_id", "device", "backend", "precision", "cache_hit", "region", "term", "timings_us"):
            assert k in p, k
        for k in ("queue", "compute"):
            assert k in p["timings_us"]
        if not p["cache_hit"]:  # a hit's timings are the ingress's own (total, queue 0, compute 0)
            assert_ingress_stages_tile(p["timings_us"])


INGRESS_STAGES = ("decode", "validate", "cache", "route")
"""The ingress's stages in order; they tile ``ingress_total`` (callback start → the forward)."""


def assert_ingress_stages_tile(t: dict) -> None:
    """The ingress's stages add up to its total: each is a difference of consecutive stamps truncated to whole
    µs, so their sum is ``ingress_total`` or at most 3 µs short (4 truncations against 1); more means a gap
    between two stages (time the ingress spent that no stage counts)."""
    assert set(INGRESS_STAGES) | {"ingress_total"} <= set(t), t
    assert all(t[k] >= 0 for k in INGRESS_STAGES), t
    gap = t["ingress_total"] - sum(t[k] for k in INGRESS_STAGES)
    assert 0 <= gap <= 3, (gap, t)


PICK_DELAY_S = 0.02
"""What the router's pick is made to take (a busy wait) in the test below: far above the stages' own µs."""


@contextlib.asynccontextmanager
async def _ingress_in_process(nats_url: str, prefix: str):
    """An in-process ingress (its state open to the test) and one real worker process serving ``digits``, on a
    real nats-server; yields the ingress once the worker is routable."""
    import asyncio
    import subprocess
    import sys

    from inferbus.actors import WorkerConfig
    from inferbus.actors._config import IngressConfig
    from inferbus.actors._ingress import Ingress
    from inferbus.bus import BusConfig

    bus = BusConfig(servers=(nats_url,), prefix=prefix)
    wcfg = WorkerConfig(worker_id=f"w-{prefix}", bus=bus, models_dir=str(MODELS), models=("digits",))
    proc = subprocess.Popen([sys.executable, "-m", "inferbus.actors", "worker", wcfg.to_json()],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    ingress = Ingress(IngressConfig(ingress_id=f"i-{prefix}", bus=bus, models_dir=str(MODELS), models=("digits",)))
    task = None
    try:
        assert await asyncio.to_thread(proc.stdout.readline) == b"READY\n"
        ready = asyncio.Event()
        task = asyncio.ensure_future(ingress.run(ready=ready.set))
        await asyncio.wait_for(ready.wait(), 30)
        deadline = time.monotonic() + 20
        while ingress.router.pick("digits:1") is None:  # the worker's first load report reached the router
            assert time.monotonic() < deadline, "the worker never became routable"
            await asyncio.sleep(0.02)
        yield ingress
    finally:
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        proc.terminate()
        proc.wait(10)


async def test_route_stage_includes_the_worker_choice(nats_server, tmp_path):
    """``route`` covers choosing the worker: with the router's ``pick`` made to take 20 ms (a busy wait in an
    in-process ingress; a real worker process on a real nats-server), every answer's ``route`` and
    ``ingress_total`` are at least that long and the ingress's stages still tile its total. Before, the stamp
    that ends both was taken before the pick, so the pick was in no stage (``route`` read ~0 here)."""
    async with _ingress_in_process(nats_server.url, "e2eroute") as ingress:
        pick = ingress.router.pick

        def slow_pick(*args, **kwargs):
            end = time.monotonic() + PICK_DELAY_S
            while time.monotonic() < end:
                pass
            return pick(*args, **kwargs)

        ingress.router.pick = slow_pick
        c = await Client.connect(nats_server.url, "e2eroute")
        try:
            x = digits_rows(4)
            for i in range(len(x)):  # distinct inputs: every one a miss, forwarded
                res = await c.infer_result("digits", {"pixels": x[i:i + 1]}, timeout_s=5)
                np.testing.assert_allclose(res.outputs["logits"], reference("digits", "1", {"pixels": x[i:i + 1]})[
                    "logits"], rtol=1e-5, atol=1e-5)
                t = res.parameters["timings_us"]
                assert res.parameters["cache_hit"] is False, res.parameters
                assert t["route"] >= PICK_DELAY_S * 1e6, t
                assert t["ingress_total"] >= PICK_DELAY_S * 1e6, t
                assert_ingress_stages_tile(t)
        finally:
            await c.close()


async def test_answered_requests_leave_no_trace_in_the_ingress(nats_server):
    """A request identified only by the ``id`` in its body (no ``Inferbus-Request-Id`` header: what a plain KServe
    client sends) stayed in the ingress's request-id index after its answer: one entry per request, for good (the
    index was cleaned by the header's id only). Now every answered request, by either id, leaves the index and
    the pending map empty."""
    async with _ingress_in_process(nats_server.url, "e2etrace") as ingress:
        nc = await nats.connect(nats_server.url)
        try:
            x = digits_rows(40)
            for i in range(len(x)):  # distinct inputs: every one a miss, forwarded to the worker
                body = json.dumps({"id": f"body-{i}", "inputs": [{"name": "pixels", "datatype": "FP32",
                                   "shape": [1, 64], "data": x[i].tolist()}]}).encode()
                hdrs = {"Content-Type": "application/json"}
                if i % 2:
                    hdrs["Inferbus-Request-Id"] = f"hdr-{i}"
                msg = await nc.request("e2etrace.infer.digits", body, timeout=5, headers=hdrs)
                assert json.loads(msg.data)["id"] == f"body-{i}", msg.data
            deadline = time.monotonic() + 5
            while ingress.pending:  # (its completion notice may come just after the answer)
                assert time.monotonic() < deadline, ingress.pending
                await asyncio.sleep(0.02)
            assert ingress._by_rid == {}, list(ingress._by_rid.items())[:5]
        finally:
            await nc.close()


async def test_version_routing_and_batch_rows(client):
    x = digits_rows(4)
    v2 = await client.infer("digits", {"pixels": x}, version="2", timeout_s=2)
    np.testing.assert_allclose(v2["logits"], reference("digits", "2", {"pixels": x})["logits"], rtol=1e-5, atol=1e-5)
    v1 = await client.infer("digits", {"pixels": x}, version="1", timeout_s=2)
    assert not np.allclose(v1["logits"], v2["logits"])
    as_int = await client.infer_result("digits", {"pixels": x}, version=2, timeout_s=2)  # an int version is "2"
    assert as_int.model_version == "2"
    np.testing.assert_array_equal(as_int.outputs["logits"], v2["logits"])


async def test_json_and_data_forms_give_the_same_answer(client):
    x = digits_rows(1)
    a = await client.infer("digits", {"pixels": x}, raw=True)
    b = await client.infer("digits", {"pixels": x}, raw=False)
    c = await client.infer("digits", {"pixels": x}, raw=False, json=True)
    np.testing.assert_allclose(a["logits"], b["logits"], rtol=1e-6)
    np.testing.assert_allclose(a["logits"], c["logits"], rtol=1e-6)


async def test_output_subset(client):
    out = await client.infer("digits", {"pixels": digits_rows(1)}, outputs=["probabilities"])
    assert list(out) == ["probabilities"]


async def test_plain_nats_and_msgpack_client(deployment):
    """The contract every other language relies on: no inferbus code on the client side."""
    nc = await nats.connect(deployment.nats_url)
    try:
        row = digits_rows(1)[0]
        body = msgpack.packb({"id": "plain-1", "inputs": [
            {"name": "pixels", "datatype": "FP32", "shape": [1, 64], "data": [float(v) for v in row]}]})
        msg = await nc.request(f"{deployment.prefix}.infer.digits", body, timeout=2)
        resp = msgpack.unpackb(msg.data)
        assert resp["id"] == "plain-1" and resp["model_name"] == "digits"
        outs = {o["name"]: o for o in resp["outputs"]}
        probs = np.array(outs["probabilities"]["data"], dtype=np.float32).reshape(outs["probabilities"]["shape"])
        ref = reference("digits", "1", {"pixels": row[None, :]})["probabilities"]
        np.testing.assert_allclose(probs, ref, rtol=1e-5, atol=1e-6)
        # raw bytes form, JSON form by hand
        body = json.dumps({"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64],
                                       "data": [[float(v) for v in row]]}]}).encode()
        msg = await nc.request(f"{deployment.prefix}.infer.digits", body, timeout=2,
                               headers={"Content-Type": "application/json"})
        resp = json.loads(msg.data)
        assert resp["outputs"][0]["shape"] == [1, 10] and "data" in resp["outputs"][0]
        # a JSON request whose tensors come raw (base64) is answered raw too: its answers were always `data`,
        # and 24,000 rows that fit max_payload on the way in were PAYLOAD_TOO_LARGE on the way out (a fresh-user
        # trial, 2026-12-05)
        import base64

        base = digits_rows(1000)
        rows = np.tile(base, (-(-24_000 // len(base)), 1))[:24_000]
        body = json.dumps({"inputs": [{"name": "pixels", "datatype": "FP32", "shape": list(rows.shape),
                                       "raw": base64.b64encode(rows.tobytes()).decode()}]}).encode()
        assert nc.max_payload * 0.9 < len(body) < nc.max_payload, (len(body), nc.max_payload)
        msg = await nc.request(f"{deployment.prefix}.infer.digits", body, timeout=20,
                               headers={"Content-Type": "application/json"})
        resp = json.loads(msg.data)
        assert "error" not in resp, resp.get("error")
        outs = {o["name"]: o for o in resp["outputs"]}
        assert "data" not in outs["probabilities"] and outs["probabilities"]["shape"] == [24_000, 10]
        probs = np.frombuffer(base64.b64decode(outs["probabilities"]["raw"]), "<f4").reshape(24_000, 10)
        ref = reference("digits", "1", {"pixels": base})["probabilities"]
        np.testing.assert_allclose(probs[:len(base)], ref, rtol=1e-5, atol=1e-6)
        # an error reply by hand: NATS micro headers plus a typed body
        msg = await nc.request(f"{deployment.prefix}.infer.nosuchmodel", body, timeout=2,
                               headers={"Content-Type": "application/json"})
        assert msg.headers["Nats-Service-Error-Code"] == "404"
        assert json.loads(msg.data)["error"]["code"] == "NOT_FOUND"
        # an unknown version is NOT_FOUND; tokens past the version name no version at all: INVALID_ARGUMENT
        msg = await nc.request(f"{deployment.prefix}.infer.digits.9", body, timeout=2,
                               headers={"Content-Type": "application/json"})
        err = json.loads(msg.data)["error"]
        assert err["code"] == "NOT_FOUND" and err["field"] == "model_version", err
        # a version with a leading zero is refused as the SDK and `models load` refuse it (a fresh-user trial: a raw
        # client got NOT_FOUND with no hint), on the inference and the metadata subjects alike
        for subj, said in (("infer.digits.01", "has a leading zero: write it '1'"),
                           ("models.digits.01", "has a leading zero: write it '1'"),
                           ("models.digits.007.ready", "has a leading zero: write it '7'"),
                           # other spellings no folder has were NOT_FOUND here, INVALID_ARGUMENT in the SDK
                           ("infer.digits.+1", "is not a number"), ("infer.digits.v1", "is not a number"),
                           ("infer.digits.\u0661", "is not a number")):
            subj = subj.encode().decode("unicode_escape")
            msg = await nc.request(f"{deployment.prefix}.{subj}", body if subj.startswith("infer") else b"",
                                   timeout=2, headers={"Content-Type": "application/json"})
            err = json.loads(msg.data)["error"]
            assert err["code"] == "INVALID_ARGUMENT" and err["field"] == "model_version", (subj, err)
            assert said in err["message"], err
        msg = await nc.request(f"{deployment.prefix}.infer.digits.1.x", body, timeout=2,
                               headers={"Content-Type": "application/json"})
        err = json.loads(msg.data)["error"]
        assert err["code"] == "INVALID_ARGUMENT" and err["field"] == "model_version", err
        assert err["message"] == (f"subject '{deployment.prefix}.infer.digits.1.x' has tokens after the version: send "
                                  f"inference requests to {deployment.prefix}.infer.digits[.<version>]"), err
        # the same sent to one ingress: named as sent (it named the queue group's subject, a fresh-user trial)
        iid = (await nc.request(f"{deployment.prefix}.ingresses", b"", timeout=2)).data.decode()
        at = f"{deployment.prefix}.ingresses.{iid}.infer.digits"
        msg = await nc.request(f"{at}.1.x", body, timeout=2, headers={"Content-Type": "application/json"})
        err = json.loads(msg.data)["error"]
        assert err["message"] == (f"subject '{at}.1.x' has tokens after the version: send inference requests to "
                                  f"{at}[.<version>]"), err
        # metadata and health replies say their encoding, like inference replies
        for subj in ("models", "models.digits", "health", "server", "models.digits.ready", "models.digits.2.ready"):
            msg = await nc.request(f"{deployment.prefix}.{subj}", b"", timeout=2,
                                   headers={"Content-Type": "application/json"})
            assert msg.headers["Content-Type"] == "application/json" and json.loads(msg.data)
            msg = await nc.request(f"{deployment.prefix}.{subj}", b"", timeout=2)
            assert msg.headers["Content-Type"] == "application/msgpack" and msgpack.unpackb(msg.data)
        assert json.loads((await nc.request(f"{deployment.prefix}.models.digits", b"", timeout=2, headers={
            "Content-Type": "application/json"})).data)["parameters"]["default_version"] == "1"
        # OIP model ready by subject: the version read is named; past the version, only "ready" is a read
        ask = lambda subj: nc.request(f"{deployment.prefix}.{subj}", b"", timeout=2,  # noqa: E731
                                      headers={"Content-Type": "application/json"})
        assert json.loads((await ask("models.digits.ready")).data) == {"name": "digits", "version": "1", "ready": True}
        assert json.loads((await ask("models.digits.2.ready")).data) == {"name": "digits", "version": "2",
                                                                         "ready": True}
        for subj, code, field in (("models.digits.9.ready", "NOT_FOUND", "model_version"),
                                  ("models.nope.ready", "NOT_FOUND", "model"),
                                  ("models.digits.2.ready.x", "NOT_FOUND", "op")):
            err = json.loads((await ask(subj)).data)["error"]
            assert (err["code"], err.get("field")) == (code, field), (subj, err)
        server = json.loads((await ask("server")).data)
        assert server["name"] == "inferbus" and server["extensions"] == ["model_repository"], server
    finally:
        await nc.close()


async def test_trace_context_is_forwarded_when_well_formed(client, deployment):
    """W3C trace context reaches the worker (docs/architecture.md, headers) only when ``traceparent`` parses, and
    ``tracestate`` only beside it: a garbage or 5,000-character ``traceparent`` and a lone ``tracestate`` were
    forwarded as they came (a fresh-user trial, 2026-12-05). Their names are read in any case (a ``Traceparent``
    was dropped). The SDK sends it through ``headers`` (it could not)."""
    seen = []

    async def on_forward(msg) -> None:
        seen.append(dict(msg.headers or {}))

    sub = await client.nc.subscribe(f"{deployment.prefix}._w.>", cb=on_forward)
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    cases = [({"traceparent": tp, "tracestate": "v=1"}, {"traceparent": tp, "tracestate": "v=1"}),
             ({"traceparent": "garbage;;\"<script>", "tracestate": "v=1"}, {}),
             ({"traceparent": tp + "x" * 5000}, {}),
             ({"traceparent": tp.upper()}, {}),
             ({"traceparent": "00-" + "0" * 32 + "-00f067aa0ba902b7-01"}, {}),
             ({"tracestate": "v=1"}, {}),
             ({"traceparent": tp, "tracestate": "k=" + "v" * 600}, {"traceparent": tp}),
             # W3C: the names in any case (Go's http.Header writes "Traceparent"); forwarded in lower case
             ({"Traceparent": tp, "Tracestate": "v=1"}, {"traceparent": tp, "tracestate": "v=1"}),
             ({"TRACEPARENT": tp}, {"traceparent": tp}),
             ({"traceparent": tp, "TraceState": "v=1"}, {"traceparent": tp, "tracestate": "v=1"})]
    try:
        for i, (sent, forwarded) in enumerate(cases):
            seen.clear()
            x = np.random.default_rng().random((1, 64), dtype=np.float32)  # a miss each: forwarded to a worker
            await client.infer("digits", {"pixels": x}, headers=sent, timeout_s=5)
            await client.nc.flush()
            got = [{k: v for k, v in h.items() if k in ("traceparent", "tracestate")} for h in seen]
            assert got == [forwarded], (sent, got)
    finally:
        await sub.unsubscribe()
    for bad in ({"Inferbus-Timeout-Ms": "5"}, {"content-type": "application/json"}, {"a b": "x"}, {"x": "1\r\n"},
                ["traceparent"]):
        with pytest.raises(InvalidArgument) as ei:
            await client.infer("digits", {"pixels": digits_rows(1)}, headers=bad)
        assert ei.value.field == "headers", ei.value


async def test_metadata_and_health(client):
    ml = await client.models()
    names = {m.name for m in ml.models}
    assert {"digits", "fraud", "typed"} <= names
    md = await client.model("digits")
    assert md.inputs[0].name == "pixels" and md.inputs[0].datatype == "FP32" and md.inputs[0].shape == [-1, 64]
    assert md.versions == ["1", "2"]
    # the model's config.json facts a client needs (a fresh-user trial: not shown anywhere)
    assert (md.parameters["max_batch_size"], md.parameters["cache_ttl_ms"]) == (64, 100), md.parameters
    assert md.parameters["description"].startswith("Handwritten digit classifier"), md.parameters
    with pytest.raises(NotFound):
        await client.model("nope")
    h = await client.health()
    assert h.live and h.ready
    # OIP server metadata and model ready (Triton's get_server_metadata, is_model_ready)
    from inferbus._version import __version__

    sm = await client.server_metadata()
    assert (sm.name, sm.version, sm.extensions) == ("inferbus", __version__, ["model_repository"]), sm
    assert await client.model_ready("digits") is True and await client.model_ready("digits", 2) is True
    for call, field in ((client.model_ready("nope"), "model"), (client.model_ready("digits", 9), "model_version")):
        with pytest.raises(NotFound) as ei:
            await call
        assert ei.value.field == field, ei.value


async def _timed_error(coro):
    t0 = time.perf_counter()
    try:
        await coro
    except Exception as exc:
        return exc, time.perf_counter() - t0
    raise AssertionError("expected an error")


async def test_error_replies_are_typed_and_fast(client):
    x = digits_rows(1)
    err, dt = await _timed_error(client.infer("nosuch", {"pixels": x}, timeout_s=2))
    assert isinstance(err, NotFound) and dt < 0.1
    err, _ = await _timed_error(client.infer("digits", {"pixels": x}, version="9"))
    # the versions, input and output names listed as the CLI lists them, "1, 2" (they were Python reprs, ['1', '2'])
    assert isinstance(err, NotFound) and err.message == "model 'digits' has no version '9'; versions: 1, 2", err
    err, _ = await _timed_error(client.infer("digits", {"pixels": x.astype(np.float64)}))
    assert isinstance(err, InvalidArgument) and err.field == "inputs[0].datatype"
    err, _ = await _timed_error(client.infer("digits", {"pixels": np.zeros((1, 63), np.float32)}))
    assert isinstance(err, InvalidArgument) and err.field == "inputs[0].shape"
    err, _ = await _timed_error(client.infer("digits", {"pixels": x, "extra": x}))
    assert isinstance(err, InvalidArgument) and err.field == "inputs[1].name"
    assert err.message == "unexpected input 'extra'; model digits takes pixels", err
    err, _ = await _timed_error(client.infer("typed", {"a": np.zeros((1, 1), np.int32)}))
    assert isinstance(err, InvalidArgument) and "b" in err.message
    err, _ = await _timed_error(client.infer("digits", {"pixels": x}, outputs=["nope"]))
    assert isinstance(err, InvalidArgument) and err.field == "outputs[0].name"
    assert err.message == "unknown output 'nope'; model has logits, probabilities", err
    # a spent budget
    msg = await client.nc.request(client.subjects.infer("digits"), b"\x80", timeout=1,
                                  headers={"Inferbus-Timeout-Ms": "0"})
    assert isinstance(decode_error(msg.headers, msg.data), DeadlineExceeded)
    # too large before sending
    big = np.zeros((1, 64), np.float32)
    err, _ = await _timed_error(client.infer("digits", {"pixels": np.zeros((40_000, 64), np.float32)}))
    assert isinstance(err, PayloadTooLarge)
    # the actors survived all of it
    out = await client.infer("digits", {"pixels": big})
    assert out["logits"].shape == (1, 10)


_PIXELS = {"name": "pixels", "datatype": "FP32", "shape": [1, 64], "data": [0.0] * 64}


@pytest.mark.parametrize("body,field", [
    (b"", "body"), (b"\xc1", "body"), (b"not msgpack at all", "body"), (msgpack.packb([1, 2, 3]), "body"),
    (msgpack.packb({"inputs": "x"}), "inputs"),
    (msgpack.packb({"inputs": [{"name": "pixels", "datatype": "FP32", "shape": "ab"}]}), "inputs[0].shape"),
    # parameters: at most 128 entries, each value a string, number or boolean (OIP v2's $parameter); a map of 600,000
    # entries froze the workers for 1.5-1.9 s (a fresh-user trial): refused from its header, nothing decoded
    (msgpack.packb({"inputs": [_PIXELS], "parameters": {str(i): i for i in range(600_000)}}), "parameters"),
    # a refused value is named by its key (msgspec's path says "[...]"), a name that is no string by its map
    (msgpack.packb({"inputs": [_PIXELS], "parameters": {"t": 1, "a": [1, 2]}}), 'parameters["a"]'),
    (msgpack.packb({"inputs": [{**_PIXELS, "parameters": {"a": None}}]}), 'inputs[0].parameters["a"]'),
    (msgpack.packb({"inputs": [_PIXELS], "outputs": [{"name": "logits", "parameters": {"a": {"b": 1}}}]}),
     'outputs[0].parameters["a"]'),
    (json.dumps({"inputs": [_PIXELS], "parameters": {"temperature": {"b": 1}}}).encode(),
     'parameters["temperature"]'),
    (json.dumps({"inputs": [{**_PIXELS, "parameters": {"k": [1]}}]}).encode(), 'inputs[0].parameters["k"]'),
    (msgpack.packb({"inputs": [_PIXELS], "parameters": {1: 2}}), "parameters"),
    (msgpack.packb({"inputs": [{**_PIXELS, "parameters": {"a": 1, b"k": 2}}]}), "inputs[0].parameters"),
    # and at most 4,096 inputs or outputs (150,000 took 0.22 s to decode)
    (msgpack.packb({"inputs": [{"name": "p", "datatype": "FP32", "shape": [1], "raw": bytes(4)}] * 150_000}), "inputs"),
    (msgpack.packb({"inputs": [_PIXELS], "outputs": [{"name": "logits"}] * 4097}), "outputs"),
])
async def test_undecodable_bodies(client, body, field):
    ct = "application/json" if body[:1] == b"{" else None
    err, dt = await _timed_error(client.request(client.subjects.infer("digits"), body, timeout_s=2, content_type=ct))
    assert isinstance(err, InvalidArgument), err
    assert err.field == field, (err.field, err.message)
    assert dt < 0.5


async def test_typed_model_datatypes(client):
    a = np.array([[3], [-7]], np.int32)
    b = np.array([[1, 2, 3, 4], [0.5, 0.25, 0, 65504]], np.float16)
    for raw in (True, False):
        out = await client.infer("typed", {"a": a, "b": b}, raw=raw)
        np.testing.assert_array_equal(out["a_times_2"], a * 2)
        np.testing.assert_allclose(out["b_sum"], b.astype(np.float32).sum(1, keepdims=True))


async def test_cache_hit_and_key_separation(client):
    """The same input again is a hit once its miss filled L1; another version or another outputs subset is not.

    L1 is filled when the worker's completion notice reaches the ingress, off the reply's path
    (docs/architecture.md, "Caches"), so the test waits for the ingress's ``pending 0`` before asking again. The
    TTL is 100 ms, which a loaded 2-core box can outlast between the fill and the next request: up to three fresh
    inputs are tried, each first ask must be a miss, and one second ask must be a hit."""
    rng = np.random.default_rng()
    for _ in range(3):
        x = digits_rows(1) + np.float32(rng.random())  # an input no other test sends
        first = await client.infer_result("digits", {"pixels": x})
        assert first.parameters["cache_hit"] is False
        await wait_health(client, lambda p: p["pending"] == 0, timeout_s=5, what="the completion notice (pending 0)")
        second = await client.infer_result("digits", {"pixels": x})
        if second.parameters["cache_hit"]:
            break
    assert second.parameters["cache_hit"] is True
    np.testing.assert_array_equal(first.outputs["logits"], second.outputs["logits"])
    assert second.id != first.id
    other_version = await client.infer_result("digits", {"pixels": x}, version="2")
    assert other_version.parameters["cache_hit"] is False
    subset = await client.infer_result("digits", {"pixels": x}, outputs=["logits"])
    assert subset.parameters["cache_hit"] is False and list(subset.outputs) == ["logits"]


async def test_l2_cache_filled_in_valkey(client, deployment):
    import redis.asyncio as aioredis

    # printed with its password masked (the embedded Valkey requires one): the URL from the run dir's 0600 files
    shown = re.search(r"L2 cache\s+(redis://\S+)", deployment.log.read_text().replace("\n", " ")).group(1)
    assert shown.startswith("redis://:***@127.0.0.1:"), shown
    url = embedded_valkey_url(deployment.run_dir)
    x = digits_rows(1) + np.float32(np.random.default_rng().random())
    r = aioredis.from_url(url)
    # the write seen as Valkey's keyspace events, subscribed before the request: the key lives 100 ms, and a scan
    # polled after it (a loaded CI box) found nothing (a clean-clone CI run)
    await r.config_set("notify-keyspace-events", "KEA")
    events = r.pubsub()
    await events.psubscribe("__keyevent@*__:*")
    try:
        await client.infer("digits", {"pixels": x})
        written, deadline = [], time.monotonic() + 5
        while not written and time.monotonic() < deadline:
            m = await events.get_message(ignore_subscribe_messages=True, timeout=0.2)
            if m is not None and m["data"].decode().startswith(f"{deployment.prefix}:"):
                written.append((m["channel"].decode(), m["data"].decode()))
        assert written, "aggregator wrote nothing to Valkey"
        ttl = await r.pttl(written[0][1])
        assert -2 <= ttl <= 100  # 100 ms default TTL (-2: already expired)
    finally:
        await events.aclose()
        await r.config_set("notify-keyspace-events", "")
        await r.aclose()


async def test_micro_service_discovery(deployment):
    nc = await nats.connect(deployment.nats_url)
    try:
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        await nc.publish("$SRV.PING", b"", reply=inbox)
        names = set()
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline and not {"inferbus-ingress", "inferbus-worker", "inferbus-aggregator"} <= names:
            try:
                msg = await sub.next_msg(timeout=0.5)
            except nats.errors.TimeoutError:
                break
            names.add(json.loads(msg.data)["name"])
        assert {"inferbus-ingress", "inferbus-worker", "inferbus-aggregator"} <= names
        stats = await nc.request("$SRV.STATS.inferbus-ingress", b"", timeout=1)
        assert any(e["name"] == "infer" for e in json.loads(stats.data)["endpoints"])
        # $SRV.INFO of every actor kind: every instance answers, with its id and its endpoints' subjects
        p = deployment.prefix
        kinds = {  # service name: (metadata id key, instances, {endpoint: subject})
            "inferbus-ingress": ("ingress_id", 1, {"infer": f"{p}.infer.>", "models": f"{p}.models",
                                                   "model": f"{p}.models.>", "health": f"{p}.health",
                                                   "server": f"{p}.server", "infer_at": None}),
            "inferbus-worker": ("worker_id", 2, {"infer": None}),
            "inferbus-aggregator": ("aggregator_id", 1, {"cache-fill": f"{p}._cache.fill"}),
        }
        for name, (id_key, count, endpoints) in kinds.items():
            infos = await _all_replies(nc, f"$SRV.INFO.{name}", count)
            assert len(infos) == count, (name, infos)
            assert len({i["metadata"][id_key] for i in infos}) == count, infos  # one answer per instance
            for info in infos:
                assert info["type"] == "io.nats.micro.v1.info_response", info
                assert info["name"] == name and info["version"] and info["description"] and info["id"], info
                got = {e["name"]: e["subject"] for e in info["endpoints"]}
                assert set(got) == set(endpoints), (name, got)
                for ep, subject in endpoints.items():
                    assert got[ep] == subject if subject else got[ep].startswith(f"{p}."), (name, got)
            if name == "inferbus-ingress":  # the retries sent to it alone, on its own subject (wire.md)
                for info in infos:
                    got = {e["name"]: e["subject"] for e in info["endpoints"]}
                    assert got["infer_at"] == f"{p}.ingresses.{info['metadata']['ingress_id']}.infer.>", got
            if name == "inferbus-worker":  # each worker on its own subject
                for info in infos:
                    assert info["metadata"]["backend"] == "onnxruntime", info
                    assert info["endpoints"][0]["subject"] == f"{p}._w.{info['metadata']['worker_id']}", info
    finally:
        await nc.close()


async def _all_replies(nc, subject: str, expected: int, timeout_s: float = 2.0) -> list[dict]:
    """Every JSON reply to one request on ``subject`` (a micro discovery subject answered by each instance)."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await nc.publish(subject, b"", reply=inbox)
    replies = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(replies) < expected and time.monotonic() < deadline:
            try:
                msg = await sub.next_msg(timeout=max(0.05, deadline - time.monotonic()))
            except nats.errors.TimeoutError:
                break
            replies.append(json.loads(msg.data))
        try:  # one more within a short wait: an extra instance would be a wrong count
            replies.append(json.loads((await sub.next_msg(timeout=0.2)).data))
        except nats.errors.TimeoutError:
            pass
    finally:
        await sub.unsubscribe()
    return replies


async def test_a_body_under_a_content_type_neither_msgpack_nor_json_says_how_it_was_read(client):
    """Every Content-Type but JSON's is read as MessagePack; a body that then fails to decode says so, naming the
    type it came with (a demanding user's `text/csv` or `application/octet-stream` got only MessagePack's words),
    answered at once; a MessagePack type under another name (`application/x-msgpack`) gets no such hint."""
    for ct, hinted in (("text/csv", True), ("application/octet-stream; q=1", True), ("application/x-msgpack", False),
                       ("application/msgpack", False), (None, False)):
        err, dt = await _timed_error(client.request(client.subjects.infer("digits"), b"\xc1 not msgpack", timeout_s=2,
                                                    content_type=ct))
        assert isinstance(err, InvalidArgument) and err.field == "body", err
        said = (f"Content-Type {ct!r} is neither application/msgpack nor application/json: the body was read as "
                "MessagePack")
        assert (said in err.message) is hinted, (ct, err.message)
        assert dt < 0.5
