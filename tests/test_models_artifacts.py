"""Checks on the shipped model repository under models/ (built by models/build.py).

Only needs numpy + onnxruntime; no inferbus code.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")

MODELS = Path(__file__).resolve().parents[1] / "models"
MAX_ONNX_BYTES = 1_500_000


def session(name: str, version: int):
    path = MODELS / name / str(version) / "model.onnx"
    assert path.is_file(), path
    assert path.stat().st_size < MAX_ONNX_BYTES
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def signature(args):
    """[(name, type, shape)] with the dynamic batch dim normalised to -1."""
    return [(a.name, a.type, [d if isinstance(d, int) else -1 for d in a.shape])
            for a in args]


def load_test(name: str):
    with np.load(MODELS / name / "data" / "test.npz", allow_pickle=False) as z:
        return z["X"], z["y"]


@pytest.mark.parametrize("name", ["digits", "fraud", "typed"])
def test_config(name):
    cfg = json.loads((MODELS / name / "config.json").read_text())
    assert cfg["name"] == name
    assert cfg["platform"] == "onnxruntime_onnx"
    assert cfg["max_batch_size"] == 64
    assert cfg["cache_ttl_ms"] == 100
    assert cfg["default_version"] == 1
    assert isinstance(cfg["description"], str) and cfg["description"]
    assert (MODELS / name / str(cfg["default_version"]) / "model.onnx").is_file()


@pytest.mark.parametrize("version", [1, 2])
def test_digits_signature(version):
    s = session("digits", version)
    assert signature(s.get_inputs()) == [("pixels", "tensor(float)", [-1, 64])]
    assert signature(s.get_outputs()) == [
        ("logits", "tensor(float)", [-1, 10]),
        ("probabilities", "tensor(float)", [-1, 10]),
    ]


def test_digits_test_split():
    X, y = load_test("digits")
    assert X.dtype == np.float32 and X.ndim == 2 and X.shape[1] == 64
    assert y.dtype == np.int64 and y.shape == (X.shape[0],)
    assert X.min() >= 0.0 and X.max() <= 1.0
    assert set(np.unique(y).tolist()) == set(range(10))


@pytest.mark.parametrize("version", [1, 2])
def test_digits_accuracy(version):
    X, y = load_test("digits")
    logits, probs = session("digits", version).run(None, {"pixels": X})
    assert logits.shape == probs.shape == (len(y), 10)
    assert logits.dtype == probs.dtype == np.float32
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    assert np.array_equal(logits.argmax(1), probs.argmax(1))
    acc = float((probs.argmax(1) == y).mean())
    assert acc >= 0.95, acc


def test_digits_dynamic_batch():
    X, _ = load_test("digits")
    s = session("digits", 1)
    full = s.run(["logits"], {"pixels": X[:5]})[0]
    for i in range(5):
        one = s.run(["logits"], {"pixels": X[i:i + 1]})[0]
        np.testing.assert_allclose(one[0], full[i], rtol=1e-5, atol=1e-5)


def test_digits_versions_differ():
    X, _ = load_test("digits")
    l1 = session("digits", 1).run(["logits"], {"pixels": X})[0]
    l2 = session("digits", 2).run(["logits"], {"pixels": X})[0]
    # Every single row differs, so any input distinguishes the versions.
    assert (np.abs(l1 - l2).max(axis=1) > 1e-3).all()


def test_fraud_signature():
    s = session("fraud", 1)
    assert signature(s.get_inputs()) == [("features", "tensor(float)", [-1, 30])]
    assert signature(s.get_outputs()) == [("score", "tensor(float)", [-1, 1])]


def test_fraud_accuracy():
    X, y = load_test("fraud")
    assert X.dtype == np.float32 and X.shape[1] == 30
    assert y.dtype == np.int64 and y.shape == (X.shape[0],)
    (score,) = session("fraud", 1).run(None, {"features": X})
    assert score.shape == (len(y), 1) and score.dtype == np.float32
    assert ((score >= 0) & (score <= 1)).all()
    acc = float(((score[:, 0] > 0.5).astype(np.int64) == y).mean())
    assert acc >= 0.93, acc


def test_typed_signature():
    s = session("typed", 1)
    assert signature(s.get_inputs()) == [
        ("a", "tensor(int32)", [-1, 1]),
        ("b", "tensor(float16)", [-1, 4]),
    ]
    assert signature(s.get_outputs()) == [
        ("a_times_2", "tensor(int32)", [-1, 1]),
        ("b_sum", "tensor(float)", [-1, 1]),
    ]


def test_typed_arithmetic():
    a = np.array([[0], [1], [-7], [123456], [2**30 - 1]], dtype=np.int32)
    b = np.array([[0, 0, 0, 0],
                  [0.5, 1.5, -2, 4],
                  [1, 2, 3, 4],
                  [65504, 1, -1, 0.25],
                  [-1, -1, -1, -1]], dtype=np.float16)
    a2, bs = session("typed", 1).run(None, {"a": a, "b": b})
    assert a2.dtype == np.int32 and a2.shape == (5, 1)
    assert bs.dtype == np.float32 and bs.shape == (5, 1)
    assert a2[:, 0].tolist() == [0, 2, -14, 246912, 2**31 - 2]
    assert bs[:, 0].tolist() == [0.0, 4.0, 10.0, 65504.25, -4.0]
