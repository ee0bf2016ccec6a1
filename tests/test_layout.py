"""Request layouts (``inferbus.actors._layout``): a body that is a validated request's bytes with other tensor values
is taken apart by slicing, with the same request, arrays and cache key a full decode gives; anything else is not.

The unit cases run the real MessagePack encoder and decoder (msgspec, and plain ``msgpack`` for the bodies a
client in another language would send) on requests hypothesis draws; the end-to-end cases run a real deployment
(embedded nats-server, 1 ingress, 1 ONNX Runtime worker, ``digits``) and check every answer against in-process ONNX
Runtime, the ingress's ``layouts`` counts, and that a body of a learned length that is not a valid request of the
learned layout still gets its typed error.
"""

from __future__ import annotations

import json

import anyio
import msgpack
import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from inferbus.actors._cache import cache_key
from inferbus.actors._layout import RELEARN_AFTER_MISMATCHES, RequestLayouts
from inferbus.bus import _headers as H
from inferbus.client import Client
from inferbus.schemas import decode_request, input_to_numpy

from conftest import start_deployment, uvloop_backend as anyio_backend  # noqa: F401 (anyio_backend: uvloop only)
from test_reliability_lib import health_params, models_subset, reference

_DTYPES = {"FP32": "<f4", "FP64": "<f8", "INT64": "<i8", "INT32": "<i4", "UINT8": "u1", "FP16": "<f2"}


def _request(inputs: list[tuple[str, str, list[int], bytes]], rid=None, params=None, outputs=None) -> bytes:
    req = {"inputs": [{"name": n, "datatype": dt, "shape": shape, "raw": raw} for n, dt, shape, raw in inputs]}
    if rid is not None:
        req["id"] = rid
    if params is not None:
        req["parameters"] = params
    if outputs is not None:
        req["outputs"] = [{"name": o} for o in outputs]
    return msgpack.packb(req, use_bin_type=True)


def _full(body: bytes):
    """What the ingress gets from a full decode: the request, its arrays, its raw-form cache key."""
    req = decode_request(body)
    arrays = [input_to_numpy(t, field=f"inputs[{i}]") for i, t in enumerate(req.inputs)]
    outs = [o.name for o in req.outputs] if req.outputs else None
    return req, arrays, outs


def _learn(layouts: RequestLayouts, body: bytes, vtag="1"):
    req, arrays, outs = _full(body)
    return layouts.learn("m:1", body, req, arrays, outs, "m", vtag)


_tensor = st.tuples(st.sampled_from(sorted(_DTYPES)), st.lists(st.integers(0, 5), min_size=0, max_size=3))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=st.lists(_tensor, min_size=1, max_size=3), data=st.data(),
       rid=st.one_of(st.none(), st.text(max_size=12)), params=st.one_of(st.none(), st.dictionaries(
           st.text(max_size=5), st.integers(-2**63, 2**63 - 1), max_size=2)), outputs=st.one_of(st.none(), st.just(["y"])))
def test_a_taken_body_is_what_a_full_decode_gives(specs, data, rid, params, outputs):
    def body_with_values():
        inputs = []
        for i, (dt, shape) in enumerate(specs):
            n = int(np.prod(shape)) * np.dtype(_DTYPES[dt]).itemsize
            inputs.append((f"x{i}", dt, shape, data.draw(st.binary(min_size=n, max_size=n))))
        return _request(inputs, rid, params, outputs)

    first = body_with_values()
    layouts = RequestLayouts()
    learned = _learn(layouts, first)
    second = body_with_values()
    if learned is None:  # a payload whose bytes occur twice in the body (e.g. two equal inputs): not learned
        return
    assert len(second) == len(first)
    taken = layouts.get("m:1", second).take(second)
    assert taken is not None
    req, arrays, raws = taken
    full_req, full_arrays, outs = _full(second)
    assert req == full_req
    assert len(arrays) == len(full_arrays)
    for a, b in zip(arrays, full_arrays):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    assert raws == tuple(t.raw for t in full_req.inputs)
    key = layouts.get("m:1", second).cache_key("1", raws)
    assert key == cache_key("m", "1", full_req.inputs, full_arrays, outs, True, full_req.parameters)
    assert layouts.get("m:1", second).cache_key("1+pin", raws) is None  # another cache version: computed in full


def test_a_body_of_the_learned_length_that_differs_outside_the_payload_is_not_taken():
    layouts = RequestLayouts()
    x = np.arange(6, dtype="<f4").tobytes()
    first = _request([("x", "FP32", [2, 3], x)], rid="aa")
    assert _learn(layouts, first) is not None
    for other in (_request([("x", "FP32", [3, 2], x)], rid="aa"),  # another shape, same bytes
                  _request([("x", "FP64", [2, 3], x)], rid="aa"),  # another datatype (bytes too few for it)
                  _request([("x", "FP32", [2, 3], x)], rid="ab"),  # another id
                  _request([("y", "FP32", [2, 3], x)], rid="aa")):  # another input name
        assert len(other) == len(first)
        assert layouts.get("m:1", other).take(other) is None
    assert layouts.get("m:1", first).mismatches == 4


def test_payloads_that_are_not_unique_in_the_body_and_value_checked_datatypes_are_not_learned():
    layouts = RequestLayouts()
    same = np.ones(4, "<f4").tobytes()
    assert _learn(layouts, _request([("a", "FP32", [4], same), ("b", "FP32", [4], same)])) is None
    assert _learn(layouts, _request([("a", "BOOL", [4], b"\x00\x01\x00\x01")])) is None
    data_form = msgpack.packb({"inputs": [{"name": "a", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}]})
    assert _learn(layouts, data_form) is None
    assert len(layouts) == 0


def _map(*pairs: tuple[bytes, bytes]) -> bytes:
    """A MessagePack map of already-encoded keys and values (fixmap), in the order given, repeats allowed."""
    return bytes([0x80 | len(pairs)]) + b"".join(k + v for k, v in pairs)


def _s(text: str) -> bytes:
    return msgpack.packb(text)


def _lookalike_bodies(real: bytes, decoy: bytes) -> dict[str, bytes]:
    """Bodies whose full decode has ``real`` as the input's raw and that carry ``decoy`` with the minimal ``bin``
    header where the decoder ignores it (a fresh-user trial's two crafted forms)."""
    def tensor(raw_value: bytes) -> bytes:
        return _map((_s("name"), _s("x")), (_s("datatype"), _s("FP32")), (_s("shape"), msgpack.packb([1, 64])),
                    (_s("raw"), raw_value))

    bin32 = b"\xc6" + len(real).to_bytes(4, "big") + real  # legal, not minimal: the search cannot match it
    minimal_decoy = b"\xc5" + len(decoy).to_bytes(2, "big") + decoy
    return {
        "unknown key": _map((_s("inputs"), b"\x91" + tensor(bin32)), (_s("zz"), minimal_decoy)),
        "repeated key": _map((_s("inputs"), b"\x91" + tensor(minimal_decoy)), (_s("inputs"), b"\x91" + tensor(bin32))),
    }


@pytest.mark.parametrize("form", ["unknown key", "repeated key"])
def test_a_lookalike_payload_where_the_decoder_ignores_it_is_not_learned(form):
    """A body that carries the payload's bytes twice, once where the decoder reads them (behind a longer ``bin``
    header) and once where it ignores them (behind the minimal one), must not teach a span over the ignored copy:
    later bodies changing only that copy would be served with bytes they do not send as their input, and their
    answers cached under the real input's key (found by a fresh-user trial). The decoder's own probe refuses it."""
    t = np.arange(64, dtype="<f4").tobytes()
    u = np.ones(64, dtype="<f4").tobytes()
    layouts = RequestLayouts()
    first = _lookalike_bodies(t, t)[form]
    req, arrays, outs = _full(first)
    assert req.inputs[0].raw == t
    assert layouts.learn("m:1", first, req, arrays, outs, "m", "1") is None
    later = _lookalike_bodies(t, u)[form]
    assert len(later) == len(first) and _full(later)[0].inputs[0].raw == t  # the decoder reads t, not u
    assert layouts.get("m:1", later) is None


def test_a_layout_that_keeps_missing_is_learned_again():
    layouts = RequestLayouts()
    x = np.zeros(3, "<f4").tobytes()
    assert _learn(layouts, _request([("x", "FP32", [3], x)], rid="r0")) is not None
    for i in range(1, RELEARN_AFTER_MISMATCHES + 1):
        body = _request([("x", "FP32", [3], x)], rid=f"r{i}")
        assert layouts.get("m:1", body).take(body) is None
        learned = _learn(layouts, body)
        assert (learned is not None) == (i == RELEARN_AFTER_MISMATCHES)  # kept until it missed that many
    body = _request([("x", "FP32", [3], np.ones(3, "<f4").tobytes())], rid=f"r{RELEARN_AFTER_MISMATCHES}")
    assert layouts.get("m:1", body).take(body) is not None
    assert layouts.stats() == {"entries": 1, "learned": 2, "taken": 1}


def test_a_layout_learned_under_another_tag_is_learned_again():
    """The worker tags a layout with the model metadata it checked the body against; after a load replaced that
    metadata, the next full decode learns the layout again at once (no stale layout keeps skipping the checks)."""
    layouts = RequestLayouts()
    body = _request([("x", "FP32", [3], np.zeros(3, "<f4").tobytes())])
    req, arrays, outs = _full(body)
    old_spec, new_spec = {"x": 1}, {"x": 2}
    first = layouts.learn("m:1", body, req, arrays, outs, "m", None, old_spec)
    assert first is not None and first.tag is old_spec
    assert layouts.learn("m:1", body, req, arrays, outs, "m", None, old_spec) is None  # same tag: kept
    again = layouts.learn("m:1", body, req, arrays, outs, "m", None, new_spec)
    assert again is not None and again.tag is new_spec and layouts.get("m:1", body) is again


def _digits_body(x: np.ndarray, datatype: str = "FP32") -> bytes:
    return _request([("pixels", datatype, list(x.shape), x.astype("<f4").tobytes())])


@pytest.mark.anyio
@pytest.mark.timeout(120)
async def test_served_answers_through_layouts_are_right_and_a_lookalike_gets_its_error(tmp_path):
    """Distinct inputs of one layout are answered right (each against in-process ONNX Runtime), through the
    layout after the first (the ingress's ``layouts.taken``, and the worker's for the bodies it takes from the bus);
    a body of the learned length with another datatype gets INVALID_ARGUMENT at once, and the next good body is still
    right."""
    models = models_subset(tmp_path / "models", ["digits"], {"digits": {"cache_ttl_ms": 5000}})
    dep = await anyio.to_thread.run_sync(lambda: start_deployment(
        tmp_path / "dep", workers=1, prefix="lay", extra=["--models", str(models), "--no-cache"]))
    try:
        client = await Client.connect(dep.nats_url, "lay")
        nc = client.nc
        X = np.load(models / "digits" / "data" / "test.npz")["X"][:40].astype(np.float32)
        before = (await health_params(client))["layouts"]
        for i in range(len(X)):
            x = X[i:i + 1]
            msg = await nc.request("lay.infer.digits", _digits_body(x), timeout=5, headers={H.TIMEOUT_MS: "4000"})
            resp = msgpack.unpackb(msg.data, raw=False)
            assert "error" not in resp, resp
            out = {o["name"]: o for o in resp["outputs"]}["probabilities"]
            got = np.frombuffer(out["raw"], "<f4").reshape(out["shape"])
            np.testing.assert_allclose(got, reference("digits", {"pixels": x})["probabilities"], rtol=1e-5, atol=1e-6)
            assert not resp["parameters"]["cache_hit"]
        after = (await health_params(client))["layouts"]
        assert after["taken"] - before["taken"] >= len(X) - 1, (before, after)
        # the worker (its own process: not colocated) decodes bodies from the bus through its own layouts
        msg = await nc.request("$SRV.STATS.inferbus-worker", b"", timeout=5)
        data = next(e for e in json.loads(msg.data)["endpoints"] if e["name"] == "infer")["data"]
        assert data["layouts"]["taken"] >= len(X) - 1 and data["layouts"]["entries"] == 1, data["layouts"]

        bad = _digits_body(X[:1], datatype="FP64")  # the learned body's length, a datatype its bytes do not fit
        assert len(bad) == len(_digits_body(X[:1]))
        msg = await nc.request("lay.infer.digits", bad, timeout=5, headers={H.TIMEOUT_MS: "4000"})
        err = msgspec.msgpack.decode(msg.data)["error"]
        assert err["code"] == "INVALID_ARGUMENT" and err["field"] == "inputs[0].raw", err

        x = X[:1] * 0.5  # a new input after the refusal: still right, still through the layout
        msg = await nc.request("lay.infer.digits", _digits_body(x), timeout=5, headers={H.TIMEOUT_MS: "4000"})
        resp = msgpack.unpackb(msg.data, raw=False)
        out = {o["name"]: o for o in resp["outputs"]}["probabilities"]
        np.testing.assert_allclose(np.frombuffer(out["raw"], "<f4").reshape(out["shape"]),
                                   reference("digits", {"pixels": x})["probabilities"], rtol=1e-5, atol=1e-6)
        assert (await health_params(client))["layouts"]["taken"] == after["taken"] + 1
        await client.close()
    finally:
        await anyio.to_thread.run_sync(dep.stop)
