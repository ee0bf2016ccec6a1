#!/usr/bin/env python
"""Deterministic training + ONNX export for the inferbus example model repository.

What this script does
---------------------
Running ``python models/build.py`` (from anywhere) rebuilds, bit-identically,
every artifact under ``models/``:

* ``digits/1/model.onnx``, ``digits/2/model.onnx`` -- a 64-256-256-10 ReLU MLP
  trained with scikit-learn's ``MLPClassifier`` on ``load_digits`` (version 1:
  ``random_state=0``, version 2: ``random_state=1``).  Inputs are the 8x8 pixel
  intensities divided by 16 (0..1).  Outputs are ``logits`` and softmax
  ``probabilities``.
* ``digits/data/test.npz`` -- the held-out split (``X`` float32 [N,64] already
  scaled, ``y`` int64 [N]).
* ``fraud/1/model.onnx`` -- a 30-32-1 ReLU MLP on ``load_breast_cancer``
  standing in for a fraud score.  The train-split mean/std standardisation is
  baked into the graph (Sub/Div), so it takes raw features.  Output ``score`` is
  the sigmoid probability of class 1.
* ``fraud/data/test.npz`` -- held-out split (``X`` float32 [N,30] raw, ``y`` int64).
* ``typed/1/model.onnx`` -- untrained arithmetic model for wire-format tests:
  ``a_times_2 = a * 2`` (INT32) and ``b_sum = ReduceSum(Cast(b, FLOAT), axis=1)``
  for an FP16 input ``b``.
* ``*/config.json`` -- Triton-like model configs.

Splits are ``train_test_split(test_size=0.2, random_state=0, stratify=y)``.
The ONNX graphs are written by hand with ``onnx.helper`` from the trained
weights (no skl2onnx), opset 17, IR version 8 (loadable by onnxruntime>=1.18).
After building, every model is checked with onnxruntime (if installed) against
the scikit-learn / numpy predictions: argmax identical on all test rows and max
abs probability difference < 1e-5.  Accuracies are printed.

Build-time dependencies: numpy, scikit-learn, onnx (onnxruntime optional, for the
verification step).  Nothing is downloaded: both datasets ship inside the
scikit-learn wheel.

Reproducibility: fixed seeds, BLAS/OpenMP limited to one thread (so float
reductions happen in a fixed order), ONNX protobufs contain no timestamps, and
the ``.npz`` files are written with a fixed zip timestamp and no compression.
Bit-identical output is expected for the same versions of numpy/scikit-learn/
onnx on the same platform.

Dataset provenance and licence
------------------------------
* ``sklearn.datasets.load_digits`` is a copy of the test set of the UCI ML
  "Optical Recognition of Handwritten Digits" dataset (optdigits; E. Alpaydin,
  C. Kaynak, 1998; https://archive.ics.uci.edu/dataset/80), 1797 8x8 images,
  10 classes.
* ``sklearn.datasets.load_breast_cancer`` is the UCI ML "Breast Cancer
  Wisconsin (Diagnostic)" dataset (WDBC; W. Wolberg, W. Street, O. Mangasarian,
  1995; https://archive.ics.uci.edu/dataset/17), 569 samples, 30 features.
  sklearn's target is 0 = malignant, 1 = benign.
* Both are distributed with scikit-learn (BSD-3-Clause) and are licensed by the
  UCI Machine Learning Repository under CC BY 4.0.  It is used here purely as a
  stand-in for a "fraud" tabular model; it has nothing to do with fraud.
"""

from __future__ import annotations

import os

# Single-threaded numerics for reproducibility; must happen before numpy import.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
             "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import io
import json
import sys
import warnings
import zipfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent
OPSET = 17
IR_VERSION = 8
SPLIT_SEED = 0
TEST_SIZE = 0.2
PRODUCER = "inferbus-models-build"


# --------------------------------------------------------------------------- io
def save_npz(path: Path, **arrays: np.ndarray) -> None:
    """np.savez equivalent with a fixed zip timestamp (np.savez embeds 'now')."""
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for name in sorted(arrays):
            arr_buf = io.BytesIO()
            np.lib.format.write_array(arr_buf, np.ascontiguousarray(arrays[name]),
                                      allow_pickle=False)
            info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_STORED
            info.external_attr = 0o644 << 16
            zf.writestr(info, arr_buf.getvalue())
    path.write_bytes(buf.getvalue())


def save_model(model: onnx.ModelProto, path: Path) -> None:
    onnx.checker.check_model(model, full_check=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString(deterministic=True))


def save_config(name: str, cfg: dict) -> None:
    path = ROOT / name / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")


def make_model(graph: onnx.GraphProto, doc: str) -> onnx.ModelProto:
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name=PRODUCER,
        producer_version="1",
        doc_string=doc,
    )
    model.ir_version = IR_VERSION
    return model


def f32(name: str, arr: np.ndarray) -> TensorProto:
    return numpy_helper.from_array(np.asarray(arr, dtype=np.float32), name)


# --------------------------------------------------------------------- helpers
def split(X: np.ndarray, y: np.ndarray):
    from sklearn.model_selection import train_test_split
    return train_test_split(X, y, test_size=TEST_SIZE, random_state=SPLIT_SEED,
                            stratify=y)


def mlp_nodes(clf, input_name: str, prefix: str = "fc"):
    """Gemm(+Relu) nodes and initializers for a fitted relu MLPClassifier.

    Returns (nodes, initializers, name of the final pre-activation output).
    """
    assert clf.activation == "relu"
    nodes, inits = [], []
    cur = input_name
    n_layers = len(clf.coefs_)
    for i, (W, b) in enumerate(zip(clf.coefs_, clf.intercepts_)):
        w_name, b_name = f"{prefix}{i}.weight", f"{prefix}{i}.bias"
        inits += [f32(w_name, W), f32(b_name, b)]
        out = f"{prefix}{i}.out"
        nodes.append(helper.make_node("Gemm", [cur, w_name, b_name], [out],
                                      name=f"{prefix}{i}"))
        cur = out
        if i < n_layers - 1:
            relu_out = f"{prefix}{i}.relu"
            nodes.append(helper.make_node("Relu", [cur], [relu_out],
                                          name=f"{prefix}{i}_relu"))
            cur = relu_out
    return nodes, inits, cur


def fit_mlp(X, y, hidden, seed, **kw):
    from sklearn.neural_network import MLPClassifier
    from threadpoolctl import threadpool_limits

    clf = MLPClassifier(hidden_layer_sizes=hidden, activation="relu",
                        solver="adam", random_state=seed, **kw)
    with threadpool_limits(limits=1), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning is irrelevant here
        clf.fit(X, y)
    return clf


def ort_run(path: Path, feeds: dict):
    try:
        import onnxruntime as ort
    except ImportError:  # pragma: no cover - verification is optional
        return None
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


# ---------------------------------------------------------------------- digits
DIGITS_HIDDEN = (256, 256)


def build_digits() -> list[str]:
    from sklearn.datasets import load_digits

    ds = load_digits()
    X = (ds.data / 16.0).astype(np.float32)  # 0..16 -> 0..1, fp32 as served
    y = ds.target.astype(np.int64)
    X_tr, X_te, y_tr, y_te = split(X, y)
    save_npz(ROOT / "digits" / "data" / "test.npz", X=X_te, y=y_te)

    report = []
    logits_by_version = {}
    for version, seed in ((1, 0), (2, 1)):
        clf = fit_mlp(X_tr.astype(np.float64), y_tr, DIGITS_HIDDEN, seed,
                      alpha=1e-4, batch_size=64, learning_rate_init=1e-3,
                      max_iter=200)
        assert list(clf.classes_) == list(range(10))
        nodes, inits, last = mlp_nodes(clf, "pixels")
        nodes[-1].output[0] = "logits"
        nodes.append(helper.make_node("Softmax", ["logits"], ["probabilities"],
                                      axis=-1, name="softmax"))
        graph = helper.make_graph(
            nodes, "digits_mlp",
            inputs=[helper.make_tensor_value_info("pixels", TensorProto.FLOAT,
                                                  ["batch", 64])],
            outputs=[
                helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10]),
                helper.make_tensor_value_info("probabilities", TensorProto.FLOAT,
                                              ["batch", 10]),
            ],
            initializer=inits,
        )
        model = make_model(graph, f"MLP 64-256-256-10 (ReLU) on sklearn load_digits "
                                  f"(UCI optdigits), MLPClassifier random_state={seed}. "
                                  f"Input: pixel intensities / 16.")
        path = ROOT / "digits" / str(version) / "model.onnx"
        save_model(model, path)

        ref_proba = clf.predict_proba(X_te.astype(np.float64))
        ref_pred = clf.predict(X_te.astype(np.float64))
        acc = float((ref_pred == y_te).mean())
        line = f"digits v{version}: sklearn test acc {acc:.4f} (n={len(y_te)})"
        out = ort_run(path, {"pixels": X_te})
        if out is not None:
            ort_pred = out["probabilities"].argmax(1)
            assert np.array_equal(ort_pred, ref_pred), "argmax mismatch"
            assert np.array_equal(out["logits"].argmax(1), ref_pred)
            diff = float(np.abs(out["probabilities"] - ref_proba).max())
            assert diff < 1e-5, diff
            ort_acc = float((ort_pred == y_te).mean())
            line += f", onnxruntime acc {ort_acc:.4f}, max|dp| {diff:.2e}"
            logits_by_version[version] = out["logits"]
        assert acc >= 0.95, acc
        report.append(line + f", {path.stat().st_size} bytes")

    if len(logits_by_version) == 2:
        assert not np.allclose(logits_by_version[1], logits_by_version[2])

    save_config("digits", {
        "name": "digits",
        "platform": "onnxruntime_onnx",
        "max_batch_size": 64,
        "cache_ttl_ms": 100,
        "default_version": 1,
        "description": "Handwritten digit classifier (8x8 images, sklearn load_digits / "
                       "UCI optdigits). MLP 64-256-256-10 ReLU. Input 'pixels' = pixel "
                       "intensity / 16 (0..1). v1: seed 0, v2: seed 1.",
        "input": [{"name": "pixels", "data_type": "TYPE_FP32", "dims": [64]}],
        "output": [
            {"name": "logits", "data_type": "TYPE_FP32", "dims": [10]},
            {"name": "probabilities", "data_type": "TYPE_FP32", "dims": [10]},
        ],
    })
    return report


# ----------------------------------------------------------------------- fraud
def build_fraud() -> list[str]:
    from sklearn.datasets import load_breast_cancer

    ds = load_breast_cancer()
    X = ds.data.astype(np.float32)  # served as fp32
    y = ds.target.astype(np.int64)
    X_tr, X_te, y_tr, y_te = split(X, y)
    save_npz(ROOT / "fraud" / "data" / "test.npz", X=X_te, y=y_te)

    mean = X_tr.astype(np.float64).mean(axis=0).astype(np.float32)
    std = X_tr.astype(np.float64).std(axis=0).astype(np.float32)
    assert (std > 0).all()

    def standardize(a):  # same fp32 constants as baked into the graph
        return ((a.astype(np.float64) - mean.astype(np.float64))
                / std.astype(np.float64))

    clf = fit_mlp(standardize(X_tr), y_tr, (32,), 0, alpha=1e-3,
                  learning_rate_init=1e-3, max_iter=500)
    assert list(clf.classes_) == [0, 1]
    assert clf.coefs_[-1].shape == (32, 1)  # single logistic output unit

    nodes = [
        helper.make_node("Sub", ["features", "scaler.mean"], ["centered"], name="center"),
        helper.make_node("Div", ["centered", "scaler.std"], ["standardized"], name="scale"),
    ]
    mlp, inits, last = mlp_nodes(clf, "standardized")
    nodes += mlp
    nodes.append(helper.make_node("Sigmoid", [last], ["score"], name="sigmoid"))
    inits = [f32("scaler.mean", mean), f32("scaler.std", std)] + inits
    graph = helper.make_graph(
        nodes, "fraud_mlp",
        inputs=[helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 30])],
        outputs=[helper.make_tensor_value_info("score", TensorProto.FLOAT, ["batch", 1])],
        initializer=inits,
    )
    model = make_model(graph, "Stand-in fraud score: MLP 30-32-1 (ReLU, sigmoid) on "
                              "sklearn load_breast_cancer (UCI WDBC), raw features, "
                              "standardisation baked in. score = P(class 1).")
    path = ROOT / "fraud" / "1" / "model.onnx"
    save_model(model, path)

    ref_p1 = clf.predict_proba(standardize(X_te))[:, 1]
    ref_pred = clf.predict(standardize(X_te))
    acc = float((ref_pred == y_te).mean())
    line = f"fraud v1: sklearn test acc {acc:.4f} (n={len(y_te)})"
    out = ort_run(path, {"features": X_te})
    if out is not None:
        score = out["score"][:, 0]
        ort_pred = (score > 0.5).astype(np.int64)
        assert np.array_equal(ort_pred, ref_pred), "argmax mismatch"
        diff = float(np.abs(score - ref_p1).max())
        assert diff < 1e-5, diff
        line += (f", onnxruntime acc {float((ort_pred == y_te).mean()):.4f}, "
                 f"max|dp| {diff:.2e}")
    assert acc >= 0.93, acc

    save_config("fraud", {
        "name": "fraud",
        "platform": "onnxruntime_onnx",
        "max_batch_size": 64,
        "cache_ttl_ms": 100,
        "default_version": 1,
        "description": "Stand-in 'fraud score': binary MLP 30-32-1 trained on sklearn "
                       "load_breast_cancer (UCI WDBC). Input 'features' = 30 raw features "
                       "(standardisation is inside the graph). Output 'score' = sigmoid "
                       "P(class 1).",
        "input": [{"name": "features", "data_type": "TYPE_FP32", "dims": [30]}],
        "output": [{"name": "score", "data_type": "TYPE_FP32", "dims": [1]}],
    })
    return [line + f", {path.stat().st_size} bytes"]


# ----------------------------------------------------------------------- typed
def build_typed() -> list[str]:
    two = numpy_helper.from_array(np.array(2, dtype=np.int32), "two")
    axes = numpy_helper.from_array(np.array([1], dtype=np.int64), "sum_axes")
    nodes = [
        helper.make_node("Mul", ["a", "two"], ["a_times_2"], name="double"),
        helper.make_node("Cast", ["b"], ["b_f32"], to=TensorProto.FLOAT, name="cast"),
        helper.make_node("ReduceSum", ["b_f32", "sum_axes"], ["b_sum"], keepdims=1,
                         name="sum"),
    ]
    graph = helper.make_graph(
        nodes, "typed",
        inputs=[
            helper.make_tensor_value_info("a", TensorProto.INT32, ["batch", 1]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT16, ["batch", 4]),
        ],
        outputs=[
            helper.make_tensor_value_info("a_times_2", TensorProto.INT32, ["batch", 1]),
            helper.make_tensor_value_info("b_sum", TensorProto.FLOAT, ["batch", 1]),
        ],
        initializer=[two, axes],
    )
    model = make_model(graph, "Wire-format test model: a_times_2 = a * 2 (INT32); "
                              "b_sum = sum(Cast(b: FP16 -> FP32), axis=1).")
    path = ROOT / "typed" / "1" / "model.onnx"
    save_model(model, path)

    line = "typed v1"
    a = np.array([[0], [1], [-7], [2**30 - 1]], dtype=np.int32)
    b = np.array([[0, 0, 0, 0], [0.5, 1.5, -2, 4], [1e-3, 2, 3, 65504],
                  [-1, -1, -1, -1]], dtype=np.float16)
    out = ort_run(path, {"a": a, "b": b})
    if out is not None:
        assert out["a_times_2"].dtype == np.int32
        assert np.array_equal(out["a_times_2"], a * 2)
        assert out["b_sum"].dtype == np.float32
        np.testing.assert_allclose(out["b_sum"],
                                   b.astype(np.float32).sum(1, keepdims=True), rtol=1e-6)
        line += ": onnxruntime arithmetic OK"

    save_config("typed", {
        "name": "typed",
        "platform": "onnxruntime_onnx",
        "max_batch_size": 64,
        "cache_ttl_ms": 100,
        "default_version": 1,
        "description": "Untrained deterministic model for wire-format tests: "
                       "a_times_2 = a * 2 (INT32), b_sum = sum over axis 1 of "
                       "float32(b) for FP16 b.",
        "input": [
            {"name": "a", "data_type": "TYPE_INT32", "dims": [1]},
            {"name": "b", "data_type": "TYPE_FP16", "dims": [4]},
        ],
        "output": [
            {"name": "a_times_2", "data_type": "TYPE_INT32", "dims": [1]},
            {"name": "b_sum", "data_type": "TYPE_FP32", "dims": [1]},
        ],
    })
    return [line + f", {path.stat().st_size} bytes"]


def main() -> int:
    lines = build_digits() + build_fraud() + build_typed()
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
