"""The ingress's raw index (``RAW_INDEX_MAX_BODY_BYTES``): a repeated request body that has no request layout (the data
form here) is answered from L1 without being decoded, validated or hashed again, and never with another request's
answer; a repeated body of a layout (the raw form) is an L1 hit keyed through the layout.

Against one real deployment (embedded nats-server, 1 ingress, 1 ONNX Runtime worker, ``digits`` v1 and v2 with a
5 s cache TTL). Each case checks the answer against in-process ONNX Runtime of the right version and the ingress's
``l1_hits`` / ``l1_raw_hits`` counts, so a raw-index hit that served the wrong entry, or one that never happened,
fails.
"""

from __future__ import annotations

import anyio
import msgpack
import numpy as np
import pytest

from inferbus.bus import _headers as H
from inferbus.client import Client

from conftest import start_deployment, uvloop_backend as anyio_backend  # noqa: F401 (anyio_backend: uvloop only)
from test_reliability_lib import health_params, models_subset, reference, wait_health

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


def _body(x: np.ndarray, request_id: str | None = None, json_form: bool = False) -> bytes:
    """An OIP v2 request for ``digits`` in plain msgpack (no inferbus code): raw bytes or a JSON-style data list."""
    tensor = {"name": "pixels", "datatype": "FP32", "shape": list(x.shape)}
    if json_form:
        tensor["data"] = [float(v) for v in x.ravel()]
    else:
        tensor["raw"] = x.astype("<f4").tobytes()
    req = {"inputs": [tensor]}
    if request_id is not None:
        req["id"] = request_id
    return msgpack.packb(req, use_bin_type=True)


async def _ask(nc, subject: str, body: bytes) -> dict:
    msg = await nc.request(subject, body, timeout=5, headers={H.TIMEOUT_MS: "4000"})
    return msgpack.unpackb(msg.data, raw=False)


async def _filled(client) -> None:
    """Wait until the ingress holds no request in flight: the worker's completion notice, which fills L1, was
    processed. It is sent with the reply but travels on its own (docs/architecture.md, "Caches"), so a client
    that asks again the moment the reply arrives may, rarely, still find L1 empty."""
    await wait_health(client, lambda p: p["pending"] == 0, timeout_s=5, what="the completion notice (pending 0)")


def _probs(resp: dict) -> np.ndarray:
    out = {o["name"]: o for o in resp["outputs"]}["probabilities"]
    return np.frombuffer(out["raw"], "<f4").reshape(out["shape"]) if out.get("raw") is not None \
        else np.asarray(out["data"], np.float32).reshape(out["shape"])


async def test_repeated_bodies_are_l1_hits_without_decoding_and_never_cross(tmp_path):
    models = models_subset(tmp_path / "models", ["digits"], {"digits": {"cache_ttl_ms": 5000}})
    dep = await anyio.to_thread.run_sync(lambda: start_deployment(
        tmp_path / "dep", workers=1, prefix="rawidx", extra=["--models", str(models), "--no-cache"]))
    try:
        client = await Client.connect(dep.nats_url, "rawidx")
        nc = client.nc
        X = np.load(models / "digits" / "data" / "test.npz")["X"][:4].astype(np.float32)
        v1, v2 = "rawidx.infer.digits.1", "rawidx.infer.digits.2"

        async def counts():
            c = (await health_params(client))["counts"]
            return c["l1_hits"], c["l1_raw_hits"]

        x = X[:1]
        ref1, ref2 = reference("digits", {"pixels": x})["probabilities"], \
            reference("digits", {"pixels": x}, version="2")["probabilities"]
        assert not np.allclose(ref1, ref2)  # the two versions answer differently: a crossed entry would show
        # the raw index serves bodies that have no request layout (inferbus.actors._layout): here the data form
        base = await counts()
        first = await _ask(nc, v1, _body(x, json_form=True))
        assert not first["parameters"].get("cache_hit")
        await _filled(client)
        again = await _ask(nc, v1, _body(x, json_form=True))
        assert again["parameters"]["cache_hit"] and again["parameters"]["cache_level"] == "l1"
        np.testing.assert_allclose(_probs(first), ref1, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(_probs(again), _probs(first))
        assert await counts() == (base[0] + 1, base[1] + 1)  # the hit came from the raw index
        # the same bytes for version 2: a miss computed by v2, then its own raw hit
        other = await _ask(nc, v2, _body(x, json_form=True))
        assert not other["parameters"].get("cache_hit")
        await _filled(client)
        np.testing.assert_allclose(_probs(other), ref2, rtol=1e-5, atol=1e-6)
        other_again = await _ask(nc, v2, _body(x, json_form=True))
        assert other_again["parameters"]["cache_hit"]
        np.testing.assert_array_equal(_probs(other_again), _probs(other))
        assert await counts() == (base[0] + 2, base[1] + 2)
        # a body with an id is other bytes: an L1 hit by the tensors' cache key (decoded), answering its own id
        with_id = await _ask(nc, v1, _body(x, "req-7", json_form=True))
        assert with_id["parameters"]["cache_hit"] and with_id["id"] == "req-7"
        np.testing.assert_array_equal(_probs(with_id), _probs(first))
        assert await counts() == (base[0] + 3, base[1] + 2)
        with_id_again = await _ask(nc, v1, _body(x, "req-7", json_form=True))  # now the raw index knows it, id too
        assert with_id_again["id"] == "req-7" and with_id_again["parameters"]["cache_hit"]
        assert await counts() == (base[0] + 4, base[1] + 3)
        no_id = await _ask(nc, v1, _body(x, json_form=True))  # the entry is shared: no earlier hit's id leaks into it
        assert no_id.get("id") is None and no_id["parameters"]["cache_hit"]
        assert await counts() == (base[0] + 5, base[1] + 4)
        # many distinct rows, each asked twice in a row: every answer is its own row's
        for k in range(1, 4):
            row = X[k:k + 1]
            a = await _ask(nc, v1, _body(row, json_form=True))
            assert "error" not in a and not a["parameters"].get("cache_hit"), a.get("error") or a["parameters"]
            await _filled(client)
            b = await _ask(nc, v1, _body(row, json_form=True))
            assert b["parameters"]["cache_hit"], (b["parameters"], await health_params(client))
            np.testing.assert_allclose(_probs(b), reference("digits", {"pixels": row})["probabilities"],
                                       rtol=1e-5, atol=1e-6)
        assert await counts() == (base[0] + 8, base[1] + 7)
        # the raw form is another cache entry (the reply's form differs) and has a layout: the repeat is an L1 hit
        # keyed through the layout, not the raw index, and every answer is its own row's
        for k in range(0, 3):
            row = X[k:k + 1]
            r1 = await _ask(nc, v1, _body(row))
            assert not r1["parameters"].get("cache_hit") and r1["outputs"][0].get("raw") is not None
            await _filled(client)
            r2 = await _ask(nc, v1, _body(row))
            assert r2["parameters"]["cache_hit"] and r2["outputs"] == r1["outputs"]
            np.testing.assert_allclose(_probs(r2), reference("digits", {"pixels": row})["probabilities"],
                                       rtol=1e-5, atol=1e-6)
        assert await counts() == (base[0] + 11, base[1] + 7)
        assert (await health_params(client))["layouts"]["taken"] >= 5
        # an invalid body is never remembered: the same bad bytes are refused again, naming the field
        for bad in (msgpack.packb({"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 63],
                                               "raw": b"\0" * 252}]}, use_bin_type=True),
                    msgpack.packb({"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 63],
                                               "data": [0.0] * 63}]}, use_bin_type=True)):
            for _ in range(2):
                err = await _ask(nc, v1, bad)
                assert err["error"]["code"] == "INVALID_ARGUMENT" and "shape" in err["error"]["field"]
        # the SDK sends the request id as a header only, so that its repeated inputs are the same bytes: hits
        before = await counts()
        r1 = await client.infer_result("digits", {"pixels": X[3:4]}, request_id="sdk-1", timeout_s=5)
        await _filled(client)
        r2 = await client.infer_result("digits", {"pixels": X[3:4]}, request_id="sdk-2", timeout_s=5)
        assert r2.parameters["cache_hit"] and (r1.id, r2.id) == ("sdk-1", "sdk-2")
        assert (await counts())[0] >= before[0] + 1
        await client.close()
    finally:
        await anyio.to_thread.run_sync(dep.stop)
