"""Models whose outputs do not carry the batch first are never merged, chunked or padded by rows.

A fresh-user trial (2026-12-05) served three such models with ``max_batch_size: 8``: ``aux`` (``y = -x`` and a
constant ``labels`` ``[4]``), ``tr`` (``x[N,4]`` transposed to ``[4,N]``) and ``gram`` (``x·xᵀ``, ``[N,N]``). The
worker merged concurrent requests and split the outputs by rows, checking only the first dimension: 60 of 195
``aux`` answers had a piece of ``labels`` (``[10, 20]``, ``[40]``), ``tr`` answers came back ``(2, 4)``, and ``gram``
answers ``(2, 6)`` held the products of other clients' rows. A ``gram`` request of more than ``--chunk-rows`` rows
was cut into chunks whose outputs did not join (INTERNAL, charged to the worker: ten opened both breakers and the
node refused every model for 30 s), or joined wrongly. Now a worker runs each model once at 1 and at 2 rows as it
loads it (:func:`inferbus.accelerators.rows_problem`) and serves one that fails with ``max_batch_size`` 0: each
request whole, alone. The JAX backend no longer pads such a model to a compiled batch size either.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from conftest import start_deployment
from inferbus.client import Client
from test_reliability_lib import models_subset, write_onnx_model

LABELS = np.array([10, 20, 30, 40], np.int32)


def _graphs() -> dict:
    """``name: (graph, reference(x) -> {output: array})`` of the three models of the trial and a row-wise one."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    return {
        "aux": (helper.make_graph(
            [helper.make_node("Neg", ["x"], ["y"]), helper.make_node("Identity", ["table"], ["labels"])], "aux", [x],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4]),
             helper.make_tensor_value_info("labels", TensorProto.INT32, [4])],
            initializer=[helper.make_tensor("table", TensorProto.INT32, [4], LABELS.tolist())]),
            lambda a: {"y": -a, "labels": LABELS}),
        "tr": (helper.make_graph([helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0])], "tr", [x],
                                 [helper.make_tensor_value_info("t", TensorProto.FLOAT, [4, "N"])]),
               lambda a: {"t": a.T}),
        "gram": (helper.make_graph([helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]),
                                    helper.make_node("MatMul", ["x", "xt"], ["g"])], "gram", [x],
                                   [helper.make_tensor_value_info("g", TensorProto.FLOAT, ["N", "N"])]),
                 lambda a: {"g": a @ a.T}),
        "rowwise": (helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "rowwise", [x],
                                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])]),
                    lambda a: {"y": -a}),
    }


def _write_models(root) -> dict:
    refs = {}
    for name, (graph, ref) in _graphs().items():
        write_onnx_model(root / name, graph, {"max_batch_size": 8, "cache_ttl_ms": 0})
        refs[name] = ref
    return refs


def test_rows_problem_names_the_output_and_passes_a_row_wise_model(tmp_path):
    from inferbus.accelerators import get_backend, rows_problem

    _write_models(tmp_path)
    backend = get_backend("onnxruntime")
    said = {name: rows_problem(backend.load(tmp_path / name / "1" / "model.onnx")) for name in _graphs()}
    assert said["rowwise"] is None, said
    assert said["aux"] == "output 'labels' has shape [4] for 1 row(s): its first dimension is not the batch", said
    assert said["tr"] == "output 't' has shape [4, 1] for 1 row(s): its first dimension is not the batch", said
    assert said["gram"] == ("output 'g' has shape [1, 1] for 1 row and [2, 2] for 2: the rest of its shape changes "
                            "with the batch"), said
    from conftest import MODELS

    for name in ("digits", "digits_cnn", "fraud", "strings", "typed"):  # the models shipped still batch
        assert rows_problem(backend.load(MODELS / name / "1" / "model.onnx")) is None, name


def test_jax_pads_only_models_whose_rows_follow_the_batch(tmp_path):
    """The JAX backend ran a request of n rows at the smallest compiled size >= n, zero-padded, and cut the outputs
    back to n rows: ``gram`` of 3 rows answered ``(3, 4)``, the products with the padding rows."""
    pytest.importorskip("jax")
    from inferbus.accelerators import get_backend

    refs = _write_models(tmp_path)
    backend = get_backend("jax")
    rng = np.random.default_rng(5)
    for name, batched in (("gram", False), ("tr", False), ("aux", False), ("rowwise", True)):
        sess = backend.load(tmp_path / name / "1" / "model.onnx", device_kind="cpu")
        sess.warmup((1, 2, 4, 8))
        assert sess._batched is batched, name
        for n in (1, 3, 5, 11):  # between compiled sizes, and past the largest
            a = rng.random((n, 4), dtype=np.float32)
            out, want = sess.infer({"x": a}), refs[name](a)
            for k in want:
                np.testing.assert_allclose(out[k], want[k], rtol=1e-5, err_msg=f"{name} {k} n={n}")


@pytest.mark.anyio
@pytest.mark.timeout(180)
async def test_concurrent_and_chunked_requests_get_their_own_answers(tmp_path):
    models = models_subset(tmp_path / "models", ["digits"])
    refs = _write_models(models)
    d = start_deployment(tmp_path / "dep", workers=1, prefix="rows",
                         extra=["--models", str(models), "--no-cache", "--inline-max-compute-us", "0",
                                "--chunk-rows", "16"])
    rng = np.random.default_rng(3)
    try:
        log = (tmp_path / "dep" / "node.log").read_text() if (tmp_path / "dep" / "node.log").exists() else ""
        async with await Client.connect(d.nats_url, "rows") as client:
            async def one(name: str, n: int):
                a = rng.random((n, 4), dtype=np.float32)
                return name, a, await client.infer(name, {"x": a}, timeout_s=20)

            calls = [one(name, 1 + i % 2) for i in range(48) for name in ("aux", "tr", "gram", "rowwise")]
            calls += [one("gram", 40), one("tr", 40), one("aux", 40), one("rowwise", 40)]  # past --chunk-rows 16
            wrong = []
            for name, a, out in await asyncio.gather(*calls):
                want = refs[name](a)
                for k, v in want.items():
                    if out[k].shape != v.shape or not np.allclose(out[k], v, rtol=1e-5):
                        wrong.append((name, a.shape, k, out[k].shape))
            assert wrong == [], wrong[:10]
            h = await client.health(timeout_s=5)
            assert h.ready and all(w["breaker"] == "closed" for w in h.parameters["workers"].values()), h.parameters
        log = "".join(p.read_text(errors="replace") for p in (tmp_path / "dep").rglob("*.log"))
        assert "gram:1: max_batch_size 8 not applied, its requests are never merged or cut by rows: output 'g'" \
            in log, log[-3000:]
        assert "rowwise:1: max_batch_size" not in log
    finally:
        d.stop()


@pytest.mark.parametrize("constants", [True, False])
def test_jax_serves_more_request_sizes_of_an_unpadded_model_than_it_keeps_compiled(tmp_path, constants):
    """A model that runs each request at its own size compiled every new size and, past ``max_compiled`` (16),
    refused every further size with "more than 16 compiled batch sizes; declare fewer" until the worker restarted.
    Now the least recently used size makes room (with parameters as constants, jit's cache is cleared)."""
    pytest.importorskip("jax")
    from inferbus.accelerators._jax import JaxBackend

    refs = _write_models(tmp_path)
    sess = JaxBackend(params_as_constants=constants).load(tmp_path / "gram" / "1" / "model.onnx", device_kind="cpu")
    sess._max_compiled = 4  # the default 16, reached in a quarter of the compiles
    sess.warmup((1,))
    rng = np.random.default_rng(7)
    for n in (2, 3, 4, 5, 2, 6, 7, 1, 8, 9):
        a = rng.random((n, 4), dtype=np.float32)
        np.testing.assert_allclose(sess.infer({"x": a})["g"], refs["gram"](a)["g"], rtol=1e-5, err_msg=f"n={n}")
        assert len(sess.compiled_batch_sizes) <= 4 and n in sess.compiled_batch_sizes, sess.compiled_batch_sizes
    assert sess.evictions > 0
    if not constants:  # least recently used out: 2 was used again after 3 and 4, so 3 went before it
        assert sess.compiled_batch_sizes == (1, 7, 8, 9), sess.compiled_batch_sizes
