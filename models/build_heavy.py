#!/usr/bin/env python
"""Build ``digits_cnn``: a small CNN on sklearn's digits, the heavier second model (issue 4, item 6).

What this script does
---------------------
``python models/build_heavy.py`` trains, deterministically, a convolutional
network on the same split of ``sklearn.datasets.load_digits`` that
``build.py`` uses for ``digits``, and writes:

* ``digits_cnn/1/model.onnx`` — opset 17, IR 8, written by hand with
  ``onnx.helper`` (no exporter): Reshape(pixels → N×1×8×8) → Conv 3×3 (32) →
  Relu → Conv 3×3 (64) → Relu → MaxPool 2×2 → Flatten (1024) → Gemm (128) →
  Relu → Gemm (10) = ``logits`` → Softmax = ``probabilities``. Same inputs and
  outputs as ``digits`` (``pixels`` FP32 [-1, 64], values 0..1), so every
  client, benchmark and test set of ``digits`` works with it unchanged.
* ``digits_cnn/data/test.npz`` — the held-out split (identical to ``digits``').
* ``digits_cnn/config.json``.

About 1.3 M multiply-adds per image against the MLP's 84 k: ~15× the compute,
with convolutions, pooling and reshapes instead of matmuls only, so the GPU and
precision paths are measured on more than an MLP.

Training: JAX on CPU (``pip install 'inferbus[jax,train]'``), He-normal
initialisation from ``jax.random.PRNGKey(0)``, Adam (lr 1e-3, β 0.9/0.999) on
softmax cross-entropy with weight decay 1e-4, batches of 64 in an order drawn
from ``numpy.random.RandomState(0)``, 40 epochs, float32. XLA on CPU is
deterministic for a given jax/jaxlib version and machine, so a rebuild with the
same versions gives the same bytes (checked: two builds compared equal with
jax 0.10.2 on x86-64).

After writing, the model is checked with ONNX Runtime against the JAX forward
pass (max |Δ probability| < 1e-4, identical argmax) and its held-out accuracy
is printed (asserted ≥ 0.97).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "XLA_FLAGS"):
    os.environ.setdefault(_var, "1" if _var != "XLA_FLAGS" else
                          "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

import build  # noqa: E402  (the shared helpers of models/build.py)

NAME = "digits_cnn"
EPOCHS = 40
BATCH = 64
LR = 1e-3
WEIGHT_DECAY = 1e-4
C1, C2, HIDDEN = 32, 64, 128


def init_params(key):
    import jax
    import jax.numpy as jnp

    k = jax.random.split(key, 4)

    def he(kk, shape, fan_in):
        return jax.random.normal(kk, shape, jnp.float32) * jnp.sqrt(2.0 / fan_in)

    return {
        "conv1.weight": he(k[0], (C1, 1, 3, 3), 9), "conv1.bias": jnp.zeros((C1,), jnp.float32),
        "conv2.weight": he(k[1], (C2, C1, 3, 3), 9 * C1), "conv2.bias": jnp.zeros((C2,), jnp.float32),
        "fc1.weight": he(k[2], (C2 * 16, HIDDEN), C2 * 16), "fc1.bias": jnp.zeros((HIDDEN,), jnp.float32),
        "fc2.weight": he(k[3], (HIDDEN, 10), HIDDEN), "fc2.bias": jnp.zeros((10,), jnp.float32),
    }


def forward(p, x):
    """Logits for ``x`` [N, 64]; the exact op sequence the ONNX graph encodes."""
    import jax.numpy as jnp
    from jax import lax

    hi = lax.Precision.HIGHEST
    h = x.reshape(-1, 1, 8, 8)
    h = lax.conv_general_dilated(h, p["conv1.weight"], (1, 1), ((1, 1), (1, 1)),
                                 dimension_numbers=("NCHW", "OIHW", "NCHW"), precision=hi)
    h = jnp.maximum(h + p["conv1.bias"].reshape(1, -1, 1, 1), 0)
    h = lax.conv_general_dilated(h, p["conv2.weight"], (1, 1), ((1, 1), (1, 1)),
                                 dimension_numbers=("NCHW", "OIHW", "NCHW"), precision=hi)
    h = jnp.maximum(h + p["conv2.bias"].reshape(1, -1, 1, 1), 0)
    h = lax.reduce_window(h, -jnp.inf, lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")
    h = h.reshape(h.shape[0], -1)
    h = jnp.maximum(jnp.matmul(h, p["fc1.weight"], precision=hi) + p["fc1.bias"], 0)
    return jnp.matmul(h, p["fc2.weight"], precision=hi) + p["fc2.bias"]


def train(X_tr: np.ndarray, y_tr: np.ndarray):
    import jax
    import jax.numpy as jnp

    params = init_params(jax.random.PRNGKey(0))

    def loss_fn(p, x, y):
        logits = forward(p, x)
        nll = -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(y.shape[0]), y])
        l2 = sum(jnp.sum(v * v) for k, v in p.items() if k.endswith("weight"))
        return nll + WEIGHT_DECAY * 0.5 * l2

    @jax.jit
    def step(p, m, v, t, x, y):
        g = jax.grad(loss_fn)(p, x, y)
        m = jax.tree.map(lambda a, b: 0.9 * a + 0.1 * b, m, g)
        v = jax.tree.map(lambda a, b: 0.999 * a + 0.001 * b * b, v, g)
        mh = jax.tree.map(lambda a: a / (1 - 0.9 ** t), m)
        vh = jax.tree.map(lambda a: a / (1 - 0.999 ** t), v)
        p = jax.tree.map(lambda w, a, b: w - LR * a / (jnp.sqrt(b) + 1e-8), p, mh, vh)
        return p, m, v

    m = jax.tree.map(jnp.zeros_like, params)
    v = jax.tree.map(jnp.zeros_like, params)
    rng = np.random.RandomState(0)
    t = 0
    n = len(X_tr)
    for _ in range(EPOCHS):
        order = rng.permutation(n)
        for i in range(0, n - BATCH + 1, BATCH):  # full batches only: one compiled shape
            idx = order[i:i + BATCH]
            t += 1
            params, m, v = step(params, m, v, jnp.float32(t), X_tr[idx], y_tr[idx])
    return {k: np.asarray(val, dtype=np.float32) for k, val in params.items()}


def export(params: dict[str, np.ndarray]):
    from onnx import TensorProto, helper

    f32 = build.f32
    inits = [f32(k, v) for k, v in params.items()]
    inits.append(build.numpy_helper.from_array(np.array([-1, 1, 8, 8], dtype=np.int64), "image_shape"))
    nodes = [
        helper.make_node("Reshape", ["pixels", "image_shape"], ["image"], name="to_image"),
        helper.make_node("Conv", ["image", "conv1.weight", "conv1.bias"], ["conv1.out"], name="conv1",
                         kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv1.out"], ["conv1.relu"], name="conv1_relu"),
        helper.make_node("Conv", ["conv1.relu", "conv2.weight", "conv2.bias"], ["conv2.out"], name="conv2",
                         kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv2.out"], ["conv2.relu"], name="conv2_relu"),
        helper.make_node("MaxPool", ["conv2.relu"], ["pool"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["pool"], ["flat"], name="flatten", axis=1),
        helper.make_node("Gemm", ["flat", "fc1.weight", "fc1.bias"], ["fc1.out"], name="fc1"),
        helper.make_node("Relu", ["fc1.out"], ["fc1.relu"], name="fc1_relu"),
        helper.make_node("Gemm", ["fc1.relu", "fc2.weight", "fc2.bias"], ["logits"], name="fc2"),
        helper.make_node("Softmax", ["logits"], ["probabilities"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes, "digits_cnn",
        inputs=[helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["batch", 64])],
        outputs=[helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10]),
                 helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", 10])],
        initializer=inits,
    )
    return build.make_model(graph, "CNN conv3x3(32)-conv3x3(64)-maxpool2-fc128-fc10 on sklearn load_digits "
                                   "(UCI optdigits), trained with JAX from PRNGKey(0). Input: pixel intensities / 16.")


def main() -> int:
    import jax
    from sklearn.datasets import load_digits

    ds = load_digits()
    X = (ds.data / 16.0).astype(np.float32)
    y = ds.target.astype(np.int64)
    X_tr, X_te, y_tr, y_te = build.split(X, y)
    build.save_npz(ROOT / NAME / "data" / "test.npz", X=X_te, y=y_te)
    params = train(X_tr, y_tr.astype(np.int32))
    model = export(params)
    path = ROOT / NAME / "1" / "model.onnx"
    build.save_model(model, path)

    ref_logits = np.asarray(forward(params, X_te))
    ref_proba = np.asarray(jax.nn.softmax(ref_logits))
    acc = float((ref_proba.argmax(1) == y_te).mean())
    line = f"{NAME} v1: jax test acc {acc:.4f} (n={len(y_te)})"
    out = build.ort_run(path, {"pixels": X_te})
    if out is not None:
        assert np.array_equal(out["probabilities"].argmax(1), ref_proba.argmax(1)), "argmax mismatch"
        diff = float(np.abs(out["probabilities"] - ref_proba).max())
        assert diff < 1e-4, diff
        line += f", onnxruntime acc {float((out['probabilities'].argmax(1) == y_te).mean()):.4f}, max|dp| {diff:.2e}"
    assert acc >= 0.97, acc
    build.save_config(NAME, {
        "name": NAME,
        "platform": "onnxruntime_onnx",
        "max_batch_size": 64,
        "cache_ttl_ms": 100,
        "default_version": 1,
        "description": "Handwritten digit classifier, small CNN (conv3x3 32, conv3x3 64, maxpool 2, fc 128, fc 10) "
                       "on sklearn load_digits / UCI optdigits, trained with JAX. Same tensors as 'digits': input "
                       "'pixels' = 64 pixel intensities / 16 (0..1), row-major 8x8.",
        "input": [{"name": "pixels", "data_type": "TYPE_FP32", "dims": [64]}],
        "output": [{"name": "logits", "data_type": "TYPE_FP32", "dims": [10]},
                   {"name": "probabilities", "data_type": "TYPE_FP32", "dims": [10]}],
    })
    print(line + f", {path.stat().st_size} bytes, jax {jax.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
