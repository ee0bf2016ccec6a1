"""Accelerator backends: protocol, ONNX→JAX interpreter, precision checks and fallback, cross-backend answers,
device discovery, pinned-pool bookkeeping, TensorRT (skips where it does not import).

Cross-backend matrix: every available backend × precision on the real models (digits MLP, digits_cnn CNN,
fraud) against the FP32 ONNX Runtime reference, with the tolerances of
``inferbus.accelerators.TOLERANCES`` (normalized max error: max|y - ref| / max|ref|).
JAX runs on every device kind it has here (CPU in CI; GPU/TPU where present).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from inferbus.accelerators import (
    BACKENDS, TOLERANCES, BackendUnavailable, CheckedSession, ModelLoadError, PoolExhausted, PrecisionRefused,
    batch_buckets, check_precision, default_precision, get_backend, load_checked, load_reference,
    normalized_errors, plan_workers,
)
from inferbus.accelerators._devices import Discovery
from inferbus.accelerators._abc import DeviceInfo

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "models"
REAL = ("digits", "digits_cnn", "fraud")

try:
    import jax

    JAX_KINDS = sorted({{"cuda": "gpu", "rocm": "gpu"}.get(d.platform, d.platform) for d in jax.devices()} | {"cpu"})
except ImportError:  # the test extra installs jax; a bare install still runs the rest
    jax = None
    JAX_KINDS = []

needs_jax = pytest.mark.skipif(jax is None, reason="jax is not installed (pip install 'inferbus[jax]')")


def path(model: str, version: int = 1) -> Path:
    return MODELS / model / str(version) / "model.onnx"


def rows(model: str, n: int | None = None) -> np.ndarray:
    x = np.load(MODELS / model / "data" / "test.npz")["X"].astype(np.float32)
    return x if n is None else x[:n]


def input_name(model: str) -> str:
    return "features" if model == "fraud" else "pixels"


@pytest.fixture(scope="module")
def ort_reference():
    ref = {}
    ort = get_backend("onnxruntime")
    for m in REAL:
        s = ort.load(path(m), precision="fp32")
        ref[m] = s.infer({input_name(m): rows(m)})
        s.close()
    return ref


# ---------------------------------------------------------------------------------------- protocol basics
def test_backend_registry_and_precision_names():
    assert BACKENDS == ("onnxruntime", "jax", "tensorrt")
    with pytest.raises(BackendUnavailable, match="unknown backend"):
        get_backend("nope")
    assert default_precision("gpu") == default_precision("tpu") == "fp16"
    assert default_precision("cpu") == "fp32"
    assert check_precision("auto", "gpu") == "fp16" and check_precision("int8", "cpu") == "int8"
    with pytest.raises(ValueError, match="precision must be auto or one of"):
        check_precision("fp8", "gpu")
    assert batch_buckets(64) == (1, 2, 4, 8, 16, 32, 64)
    assert batch_buckets(5) == (1, 2, 4, 5) and batch_buckets(0) == (1,)


def test_normalized_errors_and_nan_rule():
    ref = {"y": np.array([[1.0, -2.0, 4.0]], np.float32)}
    assert normalized_errors({"y": ref["y"] + 0.04}, ref)["y"] == pytest.approx(0.01)
    assert normalized_errors({"y": np.array([[1.0, np.nan, 4.0]], np.float32)}, ref)["y"] == float("inf")
    # NaN where the reference is NaN too is not counted against the candidate
    both = {"y": np.array([[np.nan, 1.0]], np.float32)}
    assert normalized_errors(both, both)["y"] == 0.0
    assert normalized_errors({"y": np.zeros((2, 3), np.float32)}, ref)["y"] == float("inf")  # shape mismatch


def test_load_reference_maps_X_to_the_single_input():
    sess = get_backend("onnxruntime").load(path("digits"))
    feeds = load_reference(MODELS / "digits" / "data" / "test.npz", sess.inputs, rows=10)
    assert list(feeds) == ["pixels"] and feeds["pixels"].shape == (10, 64) and feeds["pixels"].dtype == np.float32
    assert load_reference(MODELS / "typed" / "data" / "test.npz", sess.inputs) is None  # no file


# ---------------------------------------------------------------------------------------- ONNX Runtime
def test_onnxruntime_int8_is_really_quantized():
    from inferbus.accelerators._onnxruntime import quantize_int8
    import onnx

    m = onnx.load_from_string(quantize_int8(path("digits")))
    ops = {n.op_type for n in m.graph.node}
    assert "MatMulInteger" in ops and "DynamicQuantizeLinear" in ops and "Gemm" not in ops


def test_onnxruntime_refuses_fp16_on_cpu_and_falls_back():
    s = load_checked(get_backend("onnxruntime"), path("fraud"), precision="fp16",
                     reference_path=MODELS / "fraud" / "data" / "test.npz")
    assert s.precision == "fp32" and s.report.requested == "fp16" and s.report.fell_back
    assert s.report.refused[0][0] == "fp16" and "fp32 and int8" in s.report.refused[0][1]


def test_gemm_rewrite_is_exact():
    import onnx
    import onnxruntime as ort

    from inferbus.accelerators._onnx_convert import gemm_to_matmul

    m = gemm_to_matmul(onnx.load(str(path("digits"))))
    assert {n.op_type for n in m.graph.node} == {"MatMul", "Add", "Relu", "Softmax"}
    x = rows("digits", 32)
    a = ort.InferenceSession(m.SerializeToString()).run(None, {"pixels": x})
    b = ort.InferenceSession(str(path("digits"))).run(None, {"pixels": x})
    np.testing.assert_allclose(a[0], b[0], rtol=1e-5, atol=1e-5)


def test_fp16_graph_rewrite_for_tensorrt_11(ort_reference):
    """to_fp16 (the strongly typed fp16 graph TensorRT 11 needs) checked on ONNX Runtime's CPU fp16 kernels."""
    import onnx
    import onnxruntime as ort

    from inferbus.accelerators._onnx_convert import to_fp16

    for m in REAL:
        g = to_fp16(onnx.load(str(path(m))))
        onnx.checker.check_model(g)
        assert all(i.data_type != 1 for i in g.graph.initializer if i.name != "image_shape")
        s = ort.InferenceSession(g.SerializeToString(), providers=["CPUExecutionProvider"])
        out = dict(zip([o.name for o in s.get_outputs()], s.run(None, {input_name(m): rows(m)})))
        assert all(v.dtype == np.float32 for v in out.values())  # fp32 at the edges
        assert max(normalized_errors(out, ort_reference[m]).values()) <= TOLERANCES["fp16"]


def test_int8_qdq_artifact_for_tensorrt(ort_reference):
    """The explicit-quantization (Q/DQ) model TensorRT would build from, run as plain float math on ORT.

    digits passes the int8 tolerance; fraud (raw features spanning 0.05..2500) does not, so a TensorRT worker
    would refuse int8 for it and serve fp32: the check doing its job.
    """
    import onnxruntime as ort

    from inferbus.accelerators._onnx_convert import quantize_qdq

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # exact Q/DQ arithmetic
    errs = {}
    for m in ("digits", "fraud"):
        q = quantize_qdq(path(m), {input_name(m): rows(m, 128)})
        s = ort.InferenceSession(q, so, providers=["CPUExecutionProvider"])
        assert any(n.op_type == "QuantizeLinear" for n in __import__("onnx").load_from_string(q).graph.node)
        out = dict(zip([o.name for o in s.get_outputs()], s.run(None, {input_name(m): rows(m)})))
        errs[m] = max(normalized_errors(out, ort_reference[m]).values())
    assert errs["digits"] <= TOLERANCES["int8"] < errs["fraud"], errs


# ---------------------------------------------------------------------------------------- JAX interpreter
def _single_op_model(node, inputs, outputs, inits=()):
    from onnx import helper

    g = helper.make_graph([node], "t", inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _op_cases():
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    f = lambda name, shape: helper.make_tensor_value_info(name, T.FLOAT, shape)  # noqa: E731
    x4 = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    x2 = rng.standard_normal((4, 5)).astype(np.float32)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    shape = numpy_helper.from_array(np.array([0, -1], np.int64), "shape")
    mk = helper.make_node
    return {
        "Gemm transB alpha beta": (_single_op_model(
            mk("Gemm", ["x", "wt", "c"], ["y"], transB=1, alpha=0.5, beta=2.0), [f("x", [4, 5])], [f("y", [4, 3])],
            [numpy_helper.from_array(rng.standard_normal((3, 5)).astype(np.float32), "wt"),
             numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "c")]), {"x": x2}),
        "MatMul": (_single_op_model(mk("MatMul", ["x", "m"], ["y"]), [f("x", [4, 5])], [f("y", [4, 2])],
                                    [numpy_helper.from_array(rng.standard_normal((5, 2)).astype(np.float32), "m")]),
                   {"x": x2}),
        "Conv pads strides": (_single_op_model(mk("Conv", ["x", "w", "b"], ["y"], kernel_shape=[3, 3], pads=[1, 0, 1, 2],
                                                  strides=[2, 1]), [f("x", [2, 3, 6, 6])], [f("y", None)], [w, b]),
                              {"x": x4}),
        "Conv SAME_UPPER": (_single_op_model(mk("Conv", ["x", "w"], ["y"], auto_pad="SAME_UPPER", strides=[2, 2]),
                                             [f("x", [2, 3, 6, 6])], [f("y", None)], [w]), {"x": x4}),
        "MaxPool": (_single_op_model(mk("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
                                     [f("x", [2, 3, 6, 6])], [f("y", None)]), {"x": x4}),
        "AveragePool pads": (_single_op_model(mk("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                                              [f("x", [2, 3, 6, 6])], [f("y", None)]), {"x": x4}),
        "GlobalAveragePool": (_single_op_model(mk("GlobalAveragePool", ["x"], ["y"]), [f("x", [2, 3, 6, 6])],
                                               [f("y", None)]), {"x": x4}),
        "ReduceSum axes input": (_single_op_model(mk("ReduceSum", ["x", "axes"], ["y"], keepdims=0), [f("x", [4, 5])],
                                                  [f("y", None)], [axes]), {"x": x2}),
        "ReduceMean": (_single_op_model(mk("ReduceMean", ["x"], ["y"], axes=[0]), [f("x", [4, 5])], [f("y", None)]),
                       {"x": x2}),
        "Reshape+Flatten": (_single_op_model(mk("Reshape", ["x", "shape"], ["y"]), [f("x", [2, 3, 6, 6])],
                                             [f("y", None)], [shape]), {"x": x4}),
        "Transpose": (_single_op_model(mk("Transpose", ["x"], ["y"], perm=[1, 0]), [f("x", [4, 5])], [f("y", None)]),
                      {"x": x2}),
        "Softmax axis 0": (_single_op_model(mk("Softmax", ["x"], ["y"], axis=0), [f("x", [4, 5])], [f("y", None)]),
                           {"x": x2}),
        "LogSoftmax": (_single_op_model(mk("LogSoftmax", ["x"], ["y"]), [f("x", [4, 5])], [f("y", None)]), {"x": x2}),
        "Sigmoid": (_single_op_model(mk("Sigmoid", ["x"], ["y"]), [f("x", [4, 5])], [f("y", None)]), {"x": x2}),
        "Tanh": (_single_op_model(mk("Tanh", ["x"], ["y"]), [f("x", [4, 5])], [f("y", None)]), {"x": x2}),
        "Erf": (_single_op_model(mk("Erf", ["x"], ["y"]), [f("x", [4, 5])], [f("y", None)]), {"x": x2}),
        "LeakyRelu": (_single_op_model(mk("LeakyRelu", ["x"], ["y"], alpha=0.2), [f("x", [4, 5])], [f("y", None)]),
                      {"x": x2}),
        "Clip": (_single_op_model(mk("Clip", ["x", "lo", "hi"], ["y"]), [f("x", [4, 5])], [f("y", None)],
                                  [numpy_helper.from_array(np.array(-0.5, np.float32), "lo"),
                                   numpy_helper.from_array(np.array(0.5, np.float32), "hi")]), {"x": x2}),
        "Unsqueeze": (_single_op_model(mk("Unsqueeze", ["x", "axes"], ["y"]), [f("x", [4, 5])], [f("y", None)], [axes]),
                      {"x": x2}),
        "Div int truncates": (_single_op_model(
            mk("Div", ["a", "d"], ["y"]), [helper.make_tensor_value_info("a", T.INT32, [4])],
            [helper.make_tensor_value_info("y", T.INT32, [4])], [numpy_helper.from_array(np.array(2, np.int32), "d")]),
            {"a": np.array([-7, -1, 5, 8], np.int32)}),
    }


@needs_jax
def test_interpreter_ops_match_onnxruntime():
    import onnxruntime as ort

    from inferbus.accelerators._onnx_jax import OnnxJaxProgram

    failures = []
    for name, (model, feeds) in _op_cases().items():
        ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        prog = OnnxJaxProgram(model)
        got = np.asarray(jax.jit(prog)(prog.params, feeds)["y"])
        if got.shape != ref.shape or got.dtype != ref.dtype or not np.allclose(got, ref, rtol=1e-5, atol=1e-5):
            failures.append(f"{name}: got {got.dtype}{got.shape} ref {ref.dtype}{ref.shape}")
    assert not failures, failures


@needs_jax
def test_interpreter_refuses_unknown_ops_by_name():
    from onnx import TensorProto as T
    from onnx import helper

    from inferbus.accelerators._onnx_jax import OnnxJaxProgram, UnsupportedGraph

    m = _single_op_model(helper.make_node("NonZero", ["x"], ["y"], name="nz"),
                         [helper.make_tensor_value_info("x", T.FLOAT, [3])],
                         [helper.make_tensor_value_info("y", T.INT64, None)])
    with pytest.raises(UnsupportedGraph, match="node 'nz': op NonZero is not supported"):
        OnnxJaxProgram(m)


@needs_jax
def test_interpreter_matches_jaxonnxruntime_where_it_imports(ort_reference):
    jort = pytest.importorskip("jaxonnxruntime.call_onnx", reason="jaxonnxruntime not installed (optional)")
    import onnx

    x = rows("digits", 16)
    fn, params = jort.call_onnx_model(onnx.load(str(path("digits"))), [x])
    theirs = np.asarray(fn(params, [x])[0])
    s = load_checked(get_backend("jax"), path("digits"), precision="fp32")
    np.testing.assert_allclose(s.infer({"pixels": x})["logits"], theirs, rtol=1e-5, atol=1e-5)


@needs_jax
def test_jax_session_pads_to_compiled_batch_and_keeps_params_on_device():
    s = get_backend("jax").load(path("digits"), precision="fp32")
    s.warmup((1, 4, 8))
    assert s.compiled_batch_sizes == (1, 4, 8)
    x = rows("digits", 3)
    out = s.infer({"pixels": x}, ["probabilities"])
    assert list(out) == ["probabilities"] and out["probabilities"].shape == (3, 10)
    assert s.compiled_batch_sizes == (1, 4, 8)  # 3 rows ran padded on the batch-4 executable
    big = s.infer({"pixels": rows("digits", 21)})  # larger than any: chunks of 8, nothing compiled
    assert s.compiled_batch_sizes == (1, 4, 8)
    np.testing.assert_allclose(big["probabilities"], get_backend("onnxruntime").load(path("digits")).infer(
        {"pixels": rows("digits", 21)})["probabilities"], atol=1e-5)
    leaves = jax.tree_util.tree_leaves(s._params)
    assert leaves and all(isinstance(a, jax.Array) for a in leaves)
    ref = get_backend("onnxruntime").load(path("digits")).infer({"pixels": x})["probabilities"]
    np.testing.assert_allclose(out["probabilities"], ref, atol=1e-5)


@needs_jax
@pytest.mark.parametrize("model,feed", [("digits", "pixels"), ("digits_cnn", "pixels")])
def test_jax_parameters_as_constants_or_arguments_give_the_same_answers(model, feed):
    from inferbus.accelerators._jax import JaxBackend

    x = rows(model, 5)
    const = JaxBackend(params_as_constants=True).load(path(model), precision="fp32")
    args = JaxBackend(params_as_constants=False).load(path(model), precision="fp32")
    assert const.params_as_constants and not args.params_as_constants
    assert get_backend("jax").load(path(model), precision="fp32").params_as_constants  # small: constants by default
    for s in (const, args):
        s.warmup((1, 8))
        assert s.compiled_batch_sizes == (1, 8)
    a, b = const.infer({feed: x}), args.infer({feed: x})  # 5 rows padded on the batch-8 executable
    ref = get_backend("onnxruntime").load(path(model)).infer({feed: x})
    for k in ref:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-5)  # XLA may fold constants differently
        np.testing.assert_allclose(a[k], ref[k], rtol=1e-4, atol=1e-5)
    assert "fusion" in const.lowered_text(1)  # XLA's optimized HLO of the constants variant


@needs_jax
@pytest.mark.parametrize("transfer", ["memcpy", "hostmem"])
def test_jax_memcpy_transfer_matches_pjrt_across_batch_sizes_and_inputs(transfer):
    """``transfer="memcpy"`` (the session's own input arrays, copied in and out by address; memmove on the CPU
    device, cudaMemcpy on a GPU) and ``"hostmem"`` (inputs in ``pinned_host`` arrays, the copies inside the
    program) give PJRT's answers whatever the sequence of batch sizes, including padded and chunked ones, and a
    model with two inputs and two outputs of different datatypes (int32 and float32 bytes in one packed output);
    later calls never see earlier inputs."""
    from inferbus.accelerators._jax import JaxBackend

    mem = JaxBackend(transfer=transfer).load(path("digits"), precision="fp32")
    ref = JaxBackend(transfer="pjrt").load(path("digits"), precision="fp32")
    assert mem.transfer == transfer and ref.transfer == "pjrt"
    for s in (mem, ref):
        s.warmup((1, 4, 8))
    assert sorted(mem._packed) == [1, 4, 8]  # both outputs come back as one packed array at every size
    all_rows = rows("digits", 64)
    start = 0
    for n in (10, 2, 10, 1, 8, 3, 1, 21, 4):  # 10 and 21 chunk on the batch-8 executable; 2, 3 pad on batch-4
        x = np.ascontiguousarray(all_rows[start % 40:start % 40 + n])
        start += n
        a, b = mem.infer({"pixels": x}), ref.infer({"pixels": x})
        assert set(a) == set(b)
        for k in a:
            assert a[k].shape == b[k].shape == (n, 10)
            np.testing.assert_array_equal(a[k], b[k])
    assert mem.transfer == transfer  # no fallback happened
    out = mem.infer({"pixels": all_rows[:3]}, ["probabilities"])
    out["probabilities"][:] = -1  # the caller owns its arrays: the session's staging buffers are not exposed
    np.testing.assert_array_equal(mem.infer({"pixels": all_rows[:3]}, ["probabilities"])["probabilities"],
                                  ref.infer({"pixels": all_rows[:3]}, ["probabilities"])["probabilities"])
    typed = JaxBackend(transfer=transfer).load(path("typed"), precision="fp32")
    typed.warmup((1, 4))
    a = np.array([[0], [1], [-7], [2**30 - 1]], np.int32)
    b = np.array([[0, 0, 0, 0], [0.5, 1.5, -2, 4], [1e-3, 2, 3, 65504], [-1, -1, -1, -1]], np.float16)
    for n in (4, 3, 1):
        got = typed.infer({"a": a[:n], "b": b[:n]})
        assert typed.transfer == transfer and np.array_equal(got["a_times_2"], a[:n] * 2)
        np.testing.assert_allclose(got["b_sum"], b[:n].astype(np.float32).sum(1, keepdims=True), rtol=1e-6)
    assert sorted(typed._packed) == [1, 4]
    with pytest.raises(ValueError, match="memcpy"):
        JaxBackend(transfer="zerocopy")


@needs_jax
def test_jax_typed_model_datatypes():
    s = load_checked(get_backend("jax"), path("typed"), precision="fp32")
    a = np.array([[0], [1], [-7], [2**30 - 1]], np.int32)
    b = np.array([[0, 0, 0, 0], [0.5, 1.5, -2, 4], [1e-3, 2, 3, 65504], [-1, -1, -1, -1]], np.float16)
    out = s.infer({"a": a, "b": b})
    assert out["a_times_2"].dtype == np.int32 and np.array_equal(out["a_times_2"], a * 2)
    np.testing.assert_allclose(out["b_sum"], b.astype(np.float32).sum(1, keepdims=True), rtol=1e-6)


@needs_jax
def test_jax_int8_and_unverifiable_precisions_fall_back_to_fp32():
    s = load_checked(get_backend("jax"), path("digits"), precision="int8",
                     reference_path=MODELS / "digits" / "data" / "test.npz")
    assert s.precision == "fp32" and s.report.refused[0][0] == "int8"
    t = load_checked(get_backend("jax"), path("typed"), precision="fp16", reference_path=MODELS / "typed" / "data" / "test.npz")
    assert t.precision == "fp32" and "no reference inputs" in t.report.refused[0][1]


# ---------------------------------------------------------------------------------------- cross-backend
def _matrix():
    cases = [("onnxruntime", "cpu", p) for p in ("fp32", "int8")]
    for kind in JAX_KINDS:
        cases += [("jax", kind, p) for p in ("fp32", "fp16", "bf16")]
    return [pytest.param(m, b, k, p, id=f"{m}-{b}-{k}-{p}") for m in REAL for b, k, p in cases]


@pytest.mark.parametrize("model,backend,kind,precision", _matrix())
def test_cross_backend_same_answer_within_tolerance(model, backend, kind, precision, ort_reference):
    """Each backend × precision serves the FP32 ONNX Runtime answer within the precision's tolerance."""
    s = load_checked(get_backend(backend), path(model), precision=precision, device_kind=kind,
                     reference_path=MODELS / model / "data" / "test.npz")
    assert s.precision == precision, s.report.refused  # every one of these passes its check
    assert s.device.kind == kind and s.device.backend == backend
    out = s.infer({input_name(model): rows(model)})  # all rows, beyond the 256 checked at load
    errs = normalized_errors(out, ort_reference[model])
    assert max(errs.values()) <= TOLERANCES[precision], errs
    assert s.report.max_error is not None and s.report.max_error <= TOLERANCES[precision]
    if "probabilities" in out:  # classifiers keep their decisions
        agree = (out["probabilities"].argmax(1) == ort_reference[model]["probabilities"].argmax(1)).mean()
        assert agree >= (0.99 if precision != "int8" else 0.97), agree


# ---------------------------------------------------------------------------------------- precision policy
class _FakeSession:
    """A real-shaped session whose answers we control (for the fallback and NaN-guard paths)."""

    def __init__(self, inner, precision, corrupt):
        self.inner, self.precision, self.corrupt = inner, precision, corrupt
        self.inputs, self.outputs, self.device = inner.inputs, inner.outputs, inner.device

    def infer(self, inputs, output_names=None):
        out = self.inner.infer(inputs, output_names)
        return {k: self.corrupt(v) for k, v in out.items()}

    def warmup(self, batch_sizes=(1,)):
        pass

    def close(self):
        pass


class _Backend:
    """ONNX Runtime underneath; at the reduced precision its answers pass through ``corrupt``."""

    name = "corrupting"

    def __init__(self, corrupt, reduced="int8"):
        self.ort = get_backend("onnxruntime")
        self.corrupt, self.reduced = corrupt, reduced

    def load(self, p, *, precision="fp32", device_kind="cpu", device_index=0, threads=1):
        inner = self.ort.load(p, precision="fp32")
        return _FakeSession(inner, precision, self.corrupt if precision == self.reduced else (lambda v: v))


def test_over_tolerance_precision_is_refused_and_fp32_served():
    s = load_checked(_Backend(lambda v: v * 1.2), path("fraud"), precision="int8",
                     reference_path=MODELS / "fraud" / "data" / "test.npz")
    assert s.precision == "fp32" and s.report.fell_back
    (prec, reason), = s.report.refused
    assert prec == "int8" and "> tolerance 0.08" in reason and "score=" in reason
    assert s.report.max_error == 0.0 and s.report.tolerance == TOLERANCES["fp32"]


def test_nan_at_load_is_refused_even_within_numeric_tolerance():
    def one_nan(v):
        v = v.copy()
        v.flat[0] = np.nan
        return v

    s = load_checked(_Backend(one_nan), path("fraud"), precision="int8",
                     reference_path=MODELS / "fraud" / "data" / "test.npz")
    assert s.precision == "fp32" and "non-finite where FP32 is finite" in s.report.refused[0][1]


def test_nan_at_serve_time_is_recomputed_at_fp32():
    """A reduced-precision answer with NaN/Inf is never served: the FP32 twin's answer is."""
    state = {"poison": False}

    def maybe_inf(v):
        if state["poison"]:
            v = v.copy()
            v[...] = np.inf
        return v

    s = load_checked(_Backend(maybe_inf), path("fraud"), precision="int8",
                     reference_path=MODELS / "fraud" / "data" / "test.npz")
    assert isinstance(s, CheckedSession) and s.precision == "int8"
    x = rows("fraud", 4)
    state["poison"] = True
    out = s.infer({"features": x})
    assert np.isfinite(out["score"]).all() and s.nan_fallbacks == 1
    ref = get_backend("onnxruntime").load(path("fraud")).infer({"features": x})["score"]
    np.testing.assert_array_equal(out["score"], ref)


def test_fp32_mismatch_means_not_served():
    with pytest.raises(ModelLoadError, match="fp32"):
        load_checked(_Backend(lambda v: v + 1.0, reduced="fp32"), path("fraud"), precision="fp32",
                     reference_path=MODELS / "fraud" / "data" / "test.npz")


# ---------------------------------------------------------------------------------------- devices
def test_discovery_probe_runs_in_a_subprocess_and_plans_workers():
    cp = subprocess.run([sys.executable, "-m", "inferbus.accelerators._devices"], capture_output=True, text=True,
                        timeout=120)
    assert cp.returncode == 0, cp.stderr
    d = Discovery.from_dict(json.loads(cp.stdout.strip().splitlines()[-1]))
    assert d.cpus and "CPUExecutionProvider" in d.onnxruntime_providers
    assert d.serving("cpu") == "onnxruntime"
    plan = plan_workers(("onnxruntime",), d, cpu_workers=2)
    assert [(p.backend, p.device_kind, p.device_index) for p in plan] == [("onnxruntime", "cpu", 0),
                                                                         ("onnxruntime", "cpu", 1)]
    if d.jax is not None:
        assert plan_workers(("jax",), d)[0].backend == "jax"
    if d.tensorrt is None:
        with pytest.raises(BackendUnavailable, match="tensorrt"):
            plan_workers(("tensorrt",), d)


def test_plan_isolates_each_gpu_and_tpu_worker():
    gpus = tuple(DeviceInfo("gpu", f"gpu{i}", i, "", {"model": "H200"}) for i in range(2))
    d = Discovery(cpus=(0, 1), gpus=gpus, jax={"version": "x", "platform": "gpu", "devices": 2}, tensorrt="10.9")
    plan = plan_workers(("jax", "tensorrt", "onnxruntime"), d, cpu_workers=1)
    assert [p.label for p in plan] == ["jax:gpu0", "jax:gpu1", "tensorrt:gpu0", "tensorrt:gpu1", "onnxruntime:cpu0"]
    assert plan[1].env["CUDA_VISIBLE_DEVICES"] == "1" and plan[1].env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert d.serving("gpu") == "tensorrt" and d.serving("gpu", ("jax", "onnxruntime")) == "jax"
    tpus = tuple(DeviceInfo("tpu", f"tpu{i}", i, "jax") for i in range(4))
    t = Discovery(cpus=(0,), tpus=tpus, jax={"version": "x", "platform": "tpu", "devices": 4})
    tp = plan_workers(("jax",), t)
    assert [p.env["TPU_VISIBLE_CHIPS"] for p in tp] == ["0", "1", "2", "3"]
    assert len({p.env["TPU_PROCESS_PORT"] for p in tp}) == 4 and tp[0].env["TPU_PROCESS_BOUNDS"] == "1,1,1"
    with pytest.raises(BackendUnavailable, match="unknown backend"):
        plan_workers(("cuda",), t)


def test_devices_command_json():
    cp = subprocess.run([sys.executable, "-m", "inferbus.cli", "devices", "--json", "--backends", "onnxruntime"],
                        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert cp.returncode == 0, cp.stderr
    out = json.loads(cp.stdout)
    assert out["plan"] and out["plan"][0]["backend"] == "onnxruntime" and out["discovery"]["cpus"]


# ---------------------------------------------------------------------------------------- pinned pools (logic)
def test_pinned_pool_size_classes_spill_and_exhaust():
    from inferbus.accelerators._cuda import HostAllocator, PinnedBufferPool

    pool = PinnedBufferPool({64 * 1024: 2, 1 << 20: 1}, allocator=HostAllocator())
    assert pool.total_bytes == 2 * 64 * 1024 + (1 << 20) and not pool.pinned
    a, b = pool.acquire(100), pool.acquire(64 * 1024)
    assert a.nbytes == b.nbytes == 64 * 1024
    c = pool.acquire(10)  # 64 KiB class empty: spills to 1 MiB
    assert c.nbytes == 1 << 20
    with pytest.raises(PoolExhausted):
        pool.acquire(1)
    with pytest.raises(ValueError, match="exceed the largest"):
        pool.acquire((1 << 20) + 1)
    v = a.view(np.float32, (4, 4))
    v[...] = 3.0
    assert a.view(np.float32, (16,)).sum() == 48.0  # the same memory, no copy
    with pytest.raises(ValueError, match="needs"):
        a.view(np.float64, (64 * 1024,))
    a.release()
    with pytest.raises(ValueError, match="released twice"):
        a.release()
    with pool.buffer(1000) as d:
        assert d.nbytes == 64 * 1024
    st = {s.size_bytes: s for s in pool.stats()}
    assert st[64 * 1024].peak == 2 and st[64 * 1024].exhausted >= 1 and st[1 << 20].in_use == 1
    pool.close()


def test_cuda_wrappers_say_why_without_a_gpu():
    from inferbus.accelerators._cuda import PinnedBufferPool, StreamPool

    try:
        from cuda.bindings import runtime  # noqa: F401
        pytest.skip("cuda-python is installed here; tests/test_accelerators_gpu.py covers it")
    except ImportError:
        pass
    with pytest.raises(BackendUnavailable, match="cuda-python is not installed"):
        PinnedBufferPool()
    with pytest.raises(BackendUnavailable):
        StreamPool(2)


# ---------------------------------------------------------------------------------------- TensorRT
def test_engine_cache_key_has_every_fact_the_plan_depends_on():
    from inferbus.accelerators._tensorrt import engine_cache_key

    k = engine_cache_key(b"model", "fp16", "NVIDIA H200", "9.0", "10.9.0.34", 64)
    assert k.endswith("-fp16-NVIDIA_H200-sm90-trt10.9.0.34-b64.engine")
    assert k != engine_cache_key(b"model2", "fp16", "NVIDIA H200", "9.0", "10.9.0.34", 64)
    assert k != engine_cache_key(b"model", "int8", "NVIDIA H200", "9.0", "10.9.0.34", 64)


def test_tensorrt_backend_runs_or_says_why():
    try:
        import tensorrt  # noqa: F401
    except Exception as exc:
        with pytest.raises(BackendUnavailable, match="tensorrt"):
            get_backend("tensorrt").load(path("digits"), precision="fp16")
        pytest.skip(f"tensorrt does not import here ({type(exc).__name__}); this path has never been run here")
    s = load_checked(get_backend("tensorrt"), path("digits"), precision="fp16", device_kind="gpu",
                     reference_path=MODELS / "digits" / "data" / "test.npz")
    assert s.precision in ("fp16", "fp32")
    s.warmup((1, 8))
    out = s.infer({"pixels": rows("digits", 8)})
    assert out["probabilities"].shape == (8, 10)


@needs_jax
def test_jax_backend_cuda_schedule_names_and_environment(monkeypatch):
    """The CUDA wait schedule comes from the argument, else ``INFERBUS_CUDA_SCHEDULE``, else ``auto``; an unknown
    name is a ValueError at construction (not a failure later in a worker); ``auto`` never touches CUDA, so a
    CPU load with any schedule works on a machine without a GPU."""
    from inferbus.accelerators._cuda import set_device_schedule
    from inferbus.accelerators._jax import JaxBackend

    monkeypatch.delenv("INFERBUS_CUDA_SCHEDULE", raising=False)
    assert JaxBackend().cuda_schedule == "auto"
    monkeypatch.setenv("INFERBUS_CUDA_SCHEDULE", "spin")
    assert JaxBackend().cuda_schedule == "spin"
    assert JaxBackend(cuda_schedule="blocking").cuda_schedule == "blocking"
    monkeypatch.setenv("INFERBUS_CUDA_SCHEDULE", "fastest")
    with pytest.raises(ValueError, match="spin"):
        JaxBackend()
    with pytest.raises(ValueError, match="spin"):
        set_device_schedule("fastest")
    assert set_device_schedule("auto") == "auto"
    s = JaxBackend(cuda_schedule="spin").load(path("digits"), precision="fp32", device_kind="cpu")
    assert s.infer({"pixels": rows("digits", 2)})["probabilities"].shape == (2, 10)


@needs_jax
def test_jax_dlpack_without_a_gpu_serves_through_pjrt():
    """``transfer="dlpack"`` needs a GPU and CuPy; elsewhere the session logs it and serves through PJRT instead of
    failing the worker's start (a fresh user's INFERBUS_JAX_TRANSFER=dlpack on a CPU took the node down)."""
    from inferbus.accelerators._jax import JaxBackend

    s = JaxBackend(transfer="dlpack").load(path("digits"), precision="fp32", device_kind="cpu")
    ref = JaxBackend(transfer="pjrt").load(path("digits"), precision="fp32", device_kind="cpu")
    assert s.transfer == "pjrt"
    x = rows("digits", 3)
    np.testing.assert_array_equal(s.infer({"pixels": x})["probabilities"], ref.infer({"pixels": x})["probabilities"])


def test_onnxruntime_gives_back_the_arena_a_large_request_grew():
    """A fresh-user trial (2026-12-02): a worker that served a legal 30,000-row ``digits_cnn`` request held ~1.6 GB
    of RSS idle afterwards (ONNX Runtime's CPU arena keeps its largest size). A run over 4x the largest warm-up
    input, and the run after it, shrink the arena; warmed-up sizes never do; the answers are the same."""
    def rss_mb() -> float:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    sess = get_backend("onnxruntime").load(path("digits_cnn"))
    sess.warmup((1, 64))
    small = np.random.default_rng(1).random((64, 64), dtype=np.float32)
    want = sess.infer({"pixels": small})["logits"]
    assert sess.arena_shrinks == 0
    before = rss_mb()
    big = np.random.default_rng(2).random((30_000, 64), dtype=np.float32)
    out = sess.infer({"pixels": big})["logits"]
    assert out.shape == (30_000, 10) and sess.arena_shrinks == 1
    del big, out
    np.testing.assert_array_equal(sess.infer({"pixels": small})["logits"], want)  # the run after: shrinks too
    assert sess.arena_shrinks == 2
    sess.infer({"pixels": small})
    assert sess.arena_shrinks == 2
    # without the shrinkage this run left ~730 MB more than before it (measured: 57 MB -> 790 MB)
    assert rss_mb() - before < 200, (before, rss_mb())


def test_accelerator_option_errors_say_name_must_be_rule_got_value():
    """``precision``, ``StreamPool.size`` and the CUDA schedule are refused as ``<name> must be <rule>, got <value>``
    (they said ``...; got <value>``, ``CUDA schedule: one of ...``, or gave no value); before any device is
    touched."""
    from inferbus.accelerators._abc import check_precision
    from inferbus.accelerators._cuda import SCHEDULES, set_device_schedule

    with pytest.raises(ValueError) as info:
        check_precision("fp8", "cpu")
    assert str(info.value) == "precision must be auto or one of fp32, fp16, bf16, int8, got 'fp8'"
    with pytest.raises(ValueError) as info:
        set_device_schedule("busy")
    assert str(info.value) == f"CUDA schedule must be one of {', '.join(SCHEDULES)}, got 'busy'"
