"""A mixed deployment through the bus: ONNX Runtime CPU + JAX workers (`inferbus up --backends onnxruntime,jax`).

Real nats-server, real worker processes. Checks: every worker announces its device, backend and per-model
precision; both kinds serve; the same request gets the same answer (within tolerance) whichever served it;
a model one backend cannot load is routed only to the workers that loaded it.
"""

from __future__ import annotations

import asyncio
import os
import shutil

import nats
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import MODELS, start_deployment
from inferbus.accelerators import TOLERANCES, get_backend, normalized_errors
from inferbus.client import Client
from inferbus.schemas._internal import LoadReport, decode_internal

jax = pytest.importorskip("jax", reason="jax is not installed (pip install 'inferbus[jax]')")
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]


def _cumsum_model(folder):
    """A model using CumSum: ONNX Runtime runs it, the JAX interpreter does not implement it."""
    import json

    axis = numpy_helper.from_array(np.array(1, np.int64), "axis")
    g = helper.make_graph([helper.make_node("CumSum", ["x", "axis"], ["y"], name="cumsum")], "cumsum",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], initializer=[axis])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.onnx").write_bytes(m.SerializeToString())
    (folder / "config.json").write_text(json.dumps({"name": "cumsum", "max_batch_size": 8, "cache_ttl_ms": 0}))


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    for m in ("digits", "digits_cnn"):
        shutil.copytree(MODELS / m / "data", repo / m / "data")
        shutil.copytree(MODELS / m / "1", repo / m / "1")
        shutil.copy(MODELS / m / "config.json", repo / m / "config.json")
    _cumsum_model(repo / "cumsum")
    # JAX on its CPU platform on any host (on a GPU host it would take the GPU; test_accelerators_gpu covers that)
    before = os.environ.get("JAX_PLATFORMS")
    os.environ["JAX_PLATFORMS"] = "cpu"
    try:
        dep = start_deployment(tmp_path_factory.mktemp("mixed"), workers=1, timeout_s=170,
                               extra=["--backends", "onnxruntime,jax", "--models", str(repo), "--no-cache"])
    finally:
        if before is None:
            del os.environ["JAX_PLATFORMS"]
        else:
            os.environ["JAX_PLATFORMS"] = before
    yield dep
    dep.stop()


async def _reports(url: str, prefix: str, n_workers: int) -> dict[str, LoadReport]:
    nc = await nats.connect(url)
    got: dict[str, LoadReport] = {}
    done = asyncio.Event()

    async def cb(msg):
        r = decode_internal(msg.data)
        got[r.worker_id] = r
        if len(got) >= n_workers:
            done.set()

    await nc.subscribe(f"{prefix}._load", cb=cb)
    await asyncio.wait_for(done.wait(), 20)
    await nc.close()
    return got


async def test_workers_announce_device_backend_precision(mixed):
    reps = await _reports(mixed.nats_url, mixed.prefix, 2)
    by_backend = {r.backend: r for r in reps.values()}
    assert set(by_backend) == {"onnxruntime", "jax"}
    j, o = by_backend["jax"], by_backend["onnxruntime"]
    assert j.device_kind == "cpu" and j.device_name == "cpu0" and o.device_kind == "cpu"
    assert j.precisions == {"digits:1": "fp32", "digits_cnn:1": "fp32"}  # auto on CPU = fp32
    assert "cumsum:1" in o.models and "cumsum:1" not in j.models
    assert j.precision == "fp32"


async def test_both_backends_serve_the_same_answers(mixed):
    ref_sess = get_backend("onnxruntime").load(MODELS / "digits_cnn" / "1" / "model.onnx")
    X = np.load(MODELS / "digits_cnn" / "data" / "test.npz")["X"].astype(np.float32)
    served: dict[str, int] = {}
    worst = 0.0
    async with await Client.connect(mixed.nats_url, mixed.prefix) as c:
        async def one(i):
            nonlocal worst
            x = X[i % len(X)][None, :]
            r = await c.infer_result("digits_cnn", {"pixels": x}, timeout_s=10)
            p = r.parameters
            served[p["backend"]] = served.get(p["backend"], 0) + 1
            assert p["precision"] == "fp32" and p["device"] == "cpu0"
            worst = max(worst, max(normalized_errors(r.outputs, ref_sess.infer({"pixels": x})).values()))

        for start in range(0, 240, 24):  # bursts of 24 concurrent requests: the router spreads them
            await asyncio.gather(*[one(i) for i in range(start, start + 24)])
    assert served.get("jax", 0) > 0 and served.get("onnxruntime", 0) > 0, served
    assert worst <= TOLERANCES["fp32"], worst


async def test_model_routed_only_to_workers_that_loaded_it(mixed):
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    async with await Client.connect(mixed.nats_url, mixed.prefix) as c:
        rs = await asyncio.gather(*[c.infer_result("cumsum", {"x": x}, timeout_s=10) for _ in range(30)])
    assert {r.parameters["backend"] for r in rs} == {"onnxruntime"}
    np.testing.assert_allclose(rs[0].outputs["y"], np.cumsum(x, axis=1))
